#!/usr/bin/env bash
# `make image` (and `make release`): build deploy/Containerfile with podman on a machine that has
# no container registry. The base image the FROM lines name is made from Debian packages
# (mmdebstrap --variant=minbase) and imported under that exact name, once; the build never pulls.
# The base trusts the same extra certificate authorities as this host
# (/usr/local/share/ca-certificates), so apt and pip inside the build work behind the same
# TLS-inspecting proxy as the host does.
# Environment: IMAGE (default localhost/perfbalance:<version>), VERSION (default from git),
# REVISION (default git HEAD), PY (default .venv/bin/python), PERFBALANCE_IMAGE_CACHE (default
# /var/cache/perfbalance/image: the base rootfs and the podman configuration).
# Prints the image name on the last line.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
VERSION=${VERSION:-$("$PY" -m setuptools_scm 2>/dev/null || echo 0.1.0)}
REVISION=${REVISION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
IMAGE=${IMAGE:-localhost/perfbalance:${VERSION//+/-}}
CACHE=${PERFBALANCE_IMAGE_CACHE:-/var/cache/perfbalance/image}
mkdir -p "$CACHE"

for tool in podman mmdebstrap runc; do
    command -v "$tool" >/dev/null || { echo "build-image: $tool is not installed (scripts/setup.sh test installs it)" >&2; exit 1; }
done

# podman with this host's limits, and nothing in /etc changed: runc (crun refuses a hybrid
# cgroup v1/v2 host), cgroupfs (no systemd as init), ulimits within this shell's hard limits.
# Without CAP_SYS_RESOURCE a container cannot get more than the runtime has: this shell's hard
# nofile, and for nproc at most 32768, where podman 4 lowers its own (runc inherits it).
# `podman run` takes the ulimits from the file, `podman build` from --ulimit.
nproc=$(ulimit -Hu); [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768
limits=("nofile=$(ulimit -Hn):$(ulimit -Hn)" "nproc=$nproc:$nproc")
conf="$CACHE/containers.conf"
cat >"$conf" <<CONF
[containers]
default_ulimits = ["${limits[0]}", "${limits[1]}"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
export CONTAINERS_CONF="$conf"

base=$(awk 'toupper($1) == "FROM" { print $2 }' deploy/Containerfile | sort -u)
[ "$(echo "$base" | wc -l)" = 1 ] || { echo "build-image: expected one base image in deploy/Containerfile, got: $base" >&2; exit 1; }
if ! podman image exists "$base"; then
    echo "build-image: making $base from Debian packages (mmdebstrap)"
    rootfs="$CACHE/bookworm-minbase.tar"
    certs=(/usr/local/share/ca-certificates/*.crt)
    hooks=()
    if [ -e "${certs[0]}" ]; then
        hooks+=(--customize-hook='mkdir -p "$1/usr/local/share/ca-certificates" "$1/etc/ssl/certs"')
        for c in "${certs[@]}"; do
            n=$(basename "$c" .crt)
            hooks+=(--customize-hook="copy-in $c /usr/local/share/ca-certificates"
                    --customize-hook="cp $c \"\$1/etc/ssl/certs/$n.pem\"")
        done
    fi
    # Like Debian's official -slim images: merged /usr without the usrmerge package (which pulls
    # perl in), no documentation, manual pages or translations (dpkg path-exclude, kept in the
    # base so later apt-get installs skip them too). This host's clock may be past the archive's
    # Valid-Until: the same apt options as the host.
    slim=()
    for p in /usr/share/doc/'*' /usr/share/man/'*' /usr/share/info/'*' /usr/share/locale/'*' \
             /usr/share/groff/'*' /usr/share/linda/'*' /usr/share/lintian/'*'; do
        slim+=(--dpkgopt="path-exclude=$p")
    done
    slim+=(--dpkgopt='path-include=/usr/share/doc/*/copyright')
    mmdebstrap --quiet --variant=minbase --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr "${slim[@]}" \
        --aptopt='Acquire::Check-Valid-Until "false"' --aptopt='Acquire::Check-Date "false"' \
        "${hooks[@]}" bookworm "$rootfs" \
        "deb http://deb.debian.org/debian bookworm main" \
        "deb http://deb.debian.org/debian bookworm-updates main" \
        "deb http://deb.debian.org/debian-security bookworm-security main"
    podman import --quiet "$rootfs" "$base" >/dev/null
    rm -f "$rootfs"
fi

echo "build-image: building $IMAGE (perfbalance $VERSION)"
start=$(date +%s)
podman build --pull=never --ulimit "${limits[0]}" --ulimit "${limits[1]}" -f deploy/Containerfile --build-arg "VERSION=$VERSION" \
    --build-arg "REVISION=$REVISION" -t "$IMAGE" . >"$CACHE/build.log" 2>&1 \
    || { tail -30 "$CACHE/build.log" >&2; echo "build-image: build failed (log: $CACHE/build.log)" >&2; exit 1; }
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
# Earlier builds' build stages stay behind untagged: keep only the newest (the layer cache).
podman images --filter dangling=true --filter label=io.perfbalance.stage=build --format '{{.CreatedAt}} {{.ID}}' \
    | sort -r | tail -n +2 | awk '{ print $NF }' | xargs -r podman rmi >/dev/null 2>&1 || true
echo "build-image: built $IMAGE in $(( $(date +%s) - start )) s, $(( size / 1000000 )) MB"
echo "$IMAGE"
