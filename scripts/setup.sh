#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 machine, run as root by `make run` / `make test`.
#   scripts/setup.sh run    apt packages the agent needs, the venv with the project
#   scripts/setup.sh test   the same plus test-only services and tools
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-run}

RUN_PKGS=(python3 python3-venv python3-bpfcc linux-headers-amd64 bpfcc-tools)
TEST_PKGS=(mosquitto prometheus stress-ng chromium fuse3 libfuse3-3 procps util-linux)
# tests/node: a real container runtime (started privately by the tests, never as a service)
TEST_PKGS+=(containerd runc busybox-static)
# tests/node: a real VMM (QEMU/KVM) in Kata- and KubeVirt-shaped pod cgroups
TEST_PKGS+=(qemu-system-x86)
# tests/node/test_image.py, make image: the agent's image built with podman (runc) on a base from mmdebstrap
TEST_PKGS+=(podman mmdebstrap)
# tests/node: a cgroup-v2-only guest (Debian's 6.1 kernel under virtme-ng; only adds it to /boot)
TEST_PKGS+=(linux-image-amd64)
# tests/collectors/test_btf.py: an independent reading of the kernel's BTF to check our offsets against
TEST_PKGS+=(bpftool)

pkgs=("${RUN_PKGS[@]}")
[ "$MODE" = test ] && pkgs+=("${TEST_PKGS[@]}")

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing apt packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The distribution enables these services on install; the tests start their own instances.
if [ "$MODE" = test ]; then
    for svc in mosquitto prometheus containerd; do
        systemctl disable --now "$svc" >/dev/null 2>&1 || true
    done
fi

PY=/usr/bin/python3          # Debian's python: python3-bpfcc is built for it
VENV=.venv
if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV"
    "$PY" -m venv "$VENV"
fi
# bcc is pure Python over libbcc; expose only that package from Debian's dist-packages.
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ -d /usr/lib/python3/dist-packages/bcc ] && [ ! -e "$SITE/bcc" ]; then
    ln -s /usr/lib/python3/dist-packages/bcc "$SITE/bcc"
fi

EXTRA="[nri,demo]"       # demo: numpy for `perfbalance demo`'s AVX-512 and cache workloads
[ "$MODE" = test ] && EXTRA="[test]"
STAMP="$VENV/.installed-$MODE"
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
    echo "setup: installing perfbalance$EXTRA into $VENV"
    "$VENV/bin/pip" install -q --upgrade pip >/dev/null
    "$VENV/bin/pip" install -q -e ".$EXTRA"
    touch "$STAMP"
fi

# NRI: the .proto files of Debian 13's NRI package (and, for the tests, the CRI api.proto and
# containerd 1.7 itself), fetched without installing them, then Python modules generated into
# the venv. Debian 12 has neither the NRI package nor a containerd with NRI.
TRIXIE_CACHE=${PERFBALANCE_TRIXIE_CACHE:-/var/cache/perfbalance/trixie}
if [ "$MODE" = test ]; then
    scripts/trixie-debs.sh "$TRIXIE_CACHE" golang-github-containerd-nri-dev \
        golang-github-kubernetes-cri-api-dev containerd
    scripts/gen-protos.sh "$VENV" "$TRIXIE_CACHE" cri
else
    scripts/trixie-debs.sh "$TRIXIE_CACHE" golang-github-containerd-nri-dev
    scripts/gen-protos.sh "$VENV" "$TRIXIE_CACHE"
fi
