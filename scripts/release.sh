#!/usr/bin/env bash
# `make release`: the artefacts of one version, checked.
#   dist/perfbalance-<version>.tar.gz and perfbalance-<version>-py3-none-any.whl
#   dist/perfbalance-image-<version>.oci.tar  (when the image builder is available, else skipped
#                                              with the reason)
#   dist/SHA256SUMS
# then installs the wheel into a fresh venv and runs `perfbalance --version` and `perfbalance
# doctor` from there. The version comes from git (setuptools-scm, docs/release.md).
# Environment: OUT (default dist), PY (default .venv/bin/python), SKIP_IMAGE=1 to leave the
# image out, IMAGE_REPO (default localhost/perfbalance).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-dist}
IMAGE_REPO=${IMAGE_REPO:-localhost/perfbalance}

VERSION=$("$PY" -m setuptools_scm)
# OCI tags allow [A-Za-z0-9_.-]: a development version's local part "+g<commit>" becomes "-g<commit>".
TAG=${VERSION//+/-}
echo "release: perfbalance $VERSION"
if [[ "$VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] && ! grep -q "^## \[$VERSION\]" CHANGELOG.md; then
    echo "release: CHANGELOG.md has no section '## [$VERSION]': write it before tagging" >&2
    exit 1
fi

rm -rf "$OUT"
mkdir -p "$OUT"
# --no-isolation: the build tools (setuptools, setuptools-scm, wheel, build) are in the venv, so
# a release builds offline and with exactly the pinned tools.
"$PY" -m build --no-isolation --sdist --wheel --outdir "$OUT" . >"$OUT/build.log" 2>&1 \
    || { tail -20 "$OUT/build.log" >&2; echo "release: build failed (log: $OUT/build.log)" >&2; exit 1; }
rm -f "$OUT/build.log"
echo "release: built $(cd "$OUT" && ls -- *.tar.gz *.whl | tr '\n' ' ')"

image="$OUT/perfbalance-image-$TAG.oci.tar"
if [ "${SKIP_IMAGE:-0}" = 1 ]; then
    echo "release: image skipped (SKIP_IMAGE=1)"
elif [ -x scripts/build-image.sh ] && command -v podman >/dev/null; then
    # The image builder (the real-node work) builds deploy/Containerfile with podman; it is
    # given VERSION and REVISION (build args of deploy/Containerfile: the installed version and
    # the OCI labels) and the IMAGE name to tag.
    VERSION="$VERSION" REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)" IMAGE="$IMAGE_REPO:$TAG" \
        scripts/build-image.sh
    podman save --format oci-archive -o "$image" "$IMAGE_REPO:$TAG"
    echo "release: image $IMAGE_REPO:$TAG saved as $image"
else
    why="scripts/build-image.sh is not in this tree"
    command -v podman >/dev/null || why="podman is not installed"
    echo "release: image SKIPPED: $why; sdist, wheel and checksums are complete (docs/release.md)"
fi

(cd "$OUT" && sha256sum -- * >SHA256SUMS)
echo "release: checksums in $OUT/SHA256SUMS"

# The wheel on its own: a fresh venv with nothing but the wheel and its declared dependencies.
# A PYTHONPATH from the caller (a work tree) would put the sources ahead of the installed wheel.
unset PYTHONPATH PYTHONHOME PYTHONSTARTUP PYTHONUSERBASE
check=$(mktemp -d /tmp/perfbalance-release-check.XXXXXX)
trap 'rm -rf "$check"' EXIT
/usr/bin/python3 -m venv "$check/venv"
"$check/venv/bin/pip" install -q --disable-pip-version-check "$OUT"/perfbalance-*.whl
got=$("$check/venv/bin/perfbalance" --version)
if [ "$got" != "perfbalance $VERSION" ]; then
    echo "release: the installed wheel says '$got', expected 'perfbalance $VERSION'" >&2
    exit 1
fi
(cd "$check" && "$check/venv/bin/perfbalance" doctor --json >"$check/doctor.json")
"$check/venv/bin/python" -c 'import json, sys; d = json.load(open(sys.argv[1])); assert isinstance(d, dict) and d, d' "$check/doctor.json"
echo "release: wheel installs in a clean venv; '$got'; perfbalance doctor ran"
echo "release: deploy it with: (cd deploy && kustomize edit set image $IMAGE_REPO=<registry>/perfbalance:$TAG)"
