# Sourced by the image scripts: sets $engine to docker (when its daemon answers) or podman, else exits with the fix.
# CONTAINER_ENGINE=podman (or a path) chooses one.
if [ -n "${CONTAINER_ENGINE:-}" ]; then
    engine=$CONTAINER_ENGINE
elif command -v docker >/dev/null 2>&1 && timeout 10 docker info >/dev/null 2>&1; then
    engine=docker
elif command -v podman >/dev/null 2>&1; then
    engine=podman
else
    echo "error: no container engine: install podman (Debian: apt-get install podman runc) or start Docker's daemon" >&2
    exit 1
fi
