#!/usr/bin/env bash
# Build ragbot's image with docker or podman, whichever is installed.
#
#   scripts/build_image.sh                                   # FROM python:3.11-slim, pip's defaults
#   BASE_IMAGE=localhost/ragbot-base:bookworm HOST_PIP=1 scripts/build_image.sh
#
# HOST_PIP=1 hands the build this machine's own pip setup, as build secrets (never stored in a layer):
#   - its index settings (index-url, extra-index-url, find-links, trusted-host from `pip config list` and PIP_*),
#     written to a pip.conf passed as --secret id=pip_conf;
#   - its CA bundle (PIP_CERT, pip's `cert`, or SSL_CERT_FILE) as --secret id=ca_bundle: behind a TLS-intercepting
#     proxy pip trusts nothing else;
#   - with podman, every local folder those settings name (file:// indexes, find-links folders) as a read-only
#     --volume, so pip inside the build sees the same files. Docker's build has no --volume: serve such an index
#     over http(s) instead.
# Other knobs: TAG (default ragbot:local), TORCH_VERSION, TORCH_INDEX_URL (a CPU wheel index), CONTAINER_ENGINE,
# BUILD_FLAGS (extra flags for the engine's build).
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/container_engine.sh
. scripts/container_engine.sh
TAG=${TAG:-ragbot:local}
args=(build -t "$TAG" -f "${DOCKERFILE:-Dockerfile}")
[ -n "${BASE_IMAGE:-}" ] && args+=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
[ -n "${TORCH_VERSION:-}" ] && args+=(--build-arg "TORCH_VERSION=$TORCH_VERSION")
[ -n "${TORCH_INDEX_URL:-}" ] && args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")

secrets=$(mktemp -d)
trap 'rm -rf "$secrets"' EXIT
if [ "${HOST_PIP:-0}" = 1 ]; then
    python3 - "$secrets/pip.conf" "$secrets/volumes" "$secrets/cert" <<'PY'
import os, subprocess, sys
from urllib.parse import urlparse

conf_path, volumes_path, cert_path = sys.argv[1:4]
keys = ("index-url", "extra-index-url", "find-links", "trusted-host")
found: dict[str, str] = {}
cert = ""
listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
for line in listing.splitlines():  # e.g. global.extra-index-url='file:///opt/pypi/simple file:///x'
    name, _, value = line.partition("=")
    key, value = name.rsplit(".", 1)[-1], value.strip().strip("'\"")
    if key in keys:
        found[key] = value
    elif key == "cert":
        cert = value
for key in keys:  # the environment wins over config files, as in pip
    env = os.environ.get("PIP_" + key.upper().replace("-", "_"))
    if env:
        found[key] = env
cert = os.environ.get("PIP_CERT") or cert or os.environ.get("SSL_CERT_FILE", "")
folders = set()
for key in ("index-url", "extra-index-url", "find-links"):
    for item in found.get(key, "").split():
        path = urlparse(item).path if item.startswith("file://") else (item if item.startswith("/") else "")
        if path and os.path.isdir(path):
            folders.add(path.rstrip("/") if not path.endswith("/simple") else path[: -len("/simple")])
with open(conf_path, "w") as out:
    out.write("[global]\n" + "".join(f"{k} = {v}\n" for k, v in found.items()))
with open(volumes_path, "w") as out:
    out.write("".join(f"{f}\n" for f in sorted(folders)))
with open(cert_path, "w") as out:
    out.write(cert if cert and os.path.isfile(cert) else "")
PY
    args+=(--secret "id=pip_conf,src=$secrets/pip.conf")
    cert=$(cat "$secrets/cert")
    [ -n "$cert" ] && args+=(--secret "id=ca_bundle,src=$cert")
    while read -r folder; do
        [ -n "$folder" ] || continue
        if [[ $engine == *podman ]]; then
            args+=(--volume "$folder:$folder:ro")
        else
            echo "warning: docker builds cannot mount $folder; pip inside the build will not see it" >&2
        fi
    done < "$secrets/volumes"
    echo "pip inside the build: $(tr '\n' ' ' < "$secrets/pip.conf"); CA: ${cert:-none}" >&2
fi
# Podman: the build reaches the package index over the host's network; the docker image format keeps HEALTHCHECK.
[[ $engine == *podman ]] && args+=(--network host --format docker)   # docker format: keeps HEALTHCHECK
[[ $engine == *docker ]] && export DOCKER_BUILDKIT=1   # secrets need BuildKit

started=$(date +%s)
# shellcheck disable=SC2086
"$engine" "${args[@]}" ${BUILD_FLAGS:-} .
size=$("$engine" image inspect --format '{{.Size}}' "$TAG")
echo "built $TAG in $(( $(date +%s) - started )) s; image size $(awk -v s="$size" 'BEGIN{printf "%.0f MB", s/1e6}')"
