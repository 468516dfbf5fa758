#!/usr/bin/env bash
# Fetch Debian 13 (trixie) packages WITHOUT installing them into the host's package database:
# a private sources list and lists directory, `apt-get download`, then `dpkg -x` into a cache.
# Used for NRI's .proto files (golang-github-containerd-nri-dev), the CRI api.proto
# (golang-github-kubernetes-cri-api-dev) and, for the tests, containerd 1.7 (Debian 12 ships 1.6,
# which has no NRI). Idempotent: a package already extracted is not fetched again.
#   scripts/trixie-debs.sh CACHE_DIR PACKAGE...      -> files under CACHE_DIR/root/
set -euo pipefail
CACHE=$1; shift
APT="$CACHE/apt"
mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$CACHE/debs" "$CACHE/root"
cat > "$APT/trixie.sources" <<SRC
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
opts=(-o "Dir::Etc::SourceList=$APT/trixie.sources" -o Dir::Etc::SourceParts=/dev/null
      -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache=$APT/cache" -o DPkg::Lock::Timeout=600
      -o APT::Sandbox::User=root -qq)
todo=()
for p in "$@"; do [ -e "$CACHE/root/.extracted-$p" ] || todo+=("$p"); done
[ ${#todo[@]} -eq 0 ] && exit 0
echo "trixie-debs: fetching ${todo[*]} into $CACHE"
apt-get "${opts[@]}" update
(cd "$CACHE/debs" && apt-get "${opts[@]}" download "${todo[@]}")
for p in "${todo[@]}"; do
    deb=$(ls -t "$CACHE/debs/${p}_"*.deb | head -1)
    dpkg -x "$deb" "$CACHE/root"
    dpkg-deb -f "$deb" Version > "$CACHE/root/.extracted-$p"
done
