#!/usr/bin/env bash
# Build a Debian base image from Debian's packages, for machines that reach Debian's mirror but no image registry.
#
#   scripts/build_base_image.sh                  # -> localhost/ragbot-base:bookworm
#   SUITE=trixie TAG=ragbot-base:trixie scripts/build_base_image.sh
#
# mmdebstrap writes a root file system as a tarball (Debian's packages, minbase variant, no docs or man pages) and
# `podman import` (or `docker import`) turns it into an image. It carries what both Dockerfiles need from Debian:
# Python 3.11+ with venv, tini (PID 1: forwards signals, reaps zombies), CA certificates. Then build the real
# images on it with BASE_IMAGE=localhost/ragbot-base:bookworm (the Makefile's `image-local` does all of this).
set -euo pipefail

SUITE=${SUITE:-bookworm}
TAG=${TAG:-localhost/ragbot-base:$SUITE}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${SECURITY_MIRROR:-http://deb.debian.org/debian-security}
PACKAGES=${PACKAGES:-python3,python3-venv,tini,ca-certificates,tzdata}

. "$(dirname "$0")/container_engine.sh"
command -v mmdebstrap >/dev/null || { echo "error: mmdebstrap is missing (apt-get install mmdebstrap)" >&2; exit 1; }

if [ "${REBUILD:-0}" != 1 ] && "$engine" image exists "$TAG" 2>/dev/null; then
    echo "$TAG exists (REBUILD=1 to build it again)"; exit 0
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
started=$(date +%s)
mmdebstrap --variant=minbase --include="$PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
    "$SUITE" "$out/rootfs.tar" \
    "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb $SECURITY_MIRROR $SUITE-security main"

"$engine" import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' \
    "$out/rootfs.tar" "$TAG" >/dev/null
python=$("$engine" run --rm "$TAG" python3 --version)
echo "$TAG built in $(( $(date +%s) - started )) s: $python, $("$engine" image inspect --format '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1/1e6}')"
