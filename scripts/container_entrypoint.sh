#!/bin/sh
# The image's entry point, under tini (PID 1). Runs `ragbot "$@"`; when it ends, and ragbot used the embedded
# database (DATABASE_URL unset), stops that database too: the embedded Postgres outlives a ragbot process by design
# (the next command reuses it), but in a container it would be killed with the container, mid-write. A fast
# shutdown here writes its checkpoint, so the volume holds a cleanly stopped database.
set -u
ragbot "$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM INT
status=0
wait "$child" || status=$?
# A trapped signal interrupts `wait`: wait again for ragbot's own exit status.
if kill -0 "$child" 2>/dev/null; then
    status=0
    wait "$child" || status=$?
fi
if [ -z "${DATABASE_URL:-}" ] && [ -f "${RAGBOT_HOME:-/data}/pgdata/postmaster.pid" ]; then
    ragbot db stop >/dev/null 2>&1 || echo "ragbot-entrypoint: could not stop the embedded database" >&2
fi
exit "$status"
