#!/usr/bin/env bash
# compose.scale.yaml's deployment brought up for real, one `podman run` per service (issue 43, item 5): a Postgres
# primary, a streaming hot standby (pg_basebackup -R), PgBouncer in transaction mode in front of the primary, a sync
# worker (`ragbot scheduler`) and two bot replicas (`ragbot run`). The worker syncs examples/handbook through the
# pooler, bot-1 answers a question (`ragbot ask --json` inside its container, with its settings: writes through the
# pooler, searches on the standby), both replicas' /healthz list the standby as serving; then everything is removed.
#
# Why plain runs, not podman-compose or `podman play kube`: no compose tool here, and the registry images
# compose.scale.yaml names (pgvector/pgvector, edoburu/pgbouncer) cannot be pulled on a machine without an image
# registry. The services use the local images instead (`make image-local`; PgBouncer's is built here from the same
# Debian base) and share one loopback-only network namespace (the primary's), as tests/image/smoke.sh does: ports
# 5432 primary, 5433 standby, 6432 PgBouncer, 3000 and 3001 the bots.
#
# Knobs: IMAGE (localhost/ragbot:local), PG_IMAGE (localhost/ragbot-postgres:local), BASE_IMAGE
# (localhost/ragbot-base:bookworm, for PgBouncer's image), CONTAINER_ENGINE, KEEP=1 (leave the containers).
# On a host whose hard limits are below podman's defaults (nofile 1048576), crun fails with "setrlimit ... Operation
# not permitted": point CONTAINERS_CONF at a file with `default_ulimits` under them and `runtime = "runc"` (the
# pytest wrapper, tests/test_compose_scale.py, does).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/container_engine.sh
. scripts/container_engine.sh

IMAGE=${IMAGE:-localhost/ragbot:local}
PG_IMAGE=${PG_IMAGE:-localhost/ragbot-postgres:local}
BASE_IMAGE=${BASE_IMAGE:-localhost/ragbot-base:bookworm}
BOUNCER_IMAGE=${BOUNCER_IMAGE:-localhost/ragbot-pgbouncer:local}
P=ragbot-scale-$$
QUESTION="How many PTO days do I get in my first year?"
PGPASS=scale-$RANDOM$RANDOM
REPLPASS=repl-$RANDOM$RANDOM
work=$(mktemp -d)

note() { printf '%s\n' "$*" >&2; }
fail() { note "FAIL: $*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }

containers=("$P-bot2" "$P-bot1" "$P-sync" "$P-bouncer" "$P-standby" "$P-primary")
cleanup() {
    if [ "${KEEP:-0}" = 1 ]; then note "KEEP=1: containers $P-* left running"; return; fi
    for c in "${containers[@]}"; do "$engine" rm -f -t 0 "$c" >/dev/null 2>&1 || true; done
    for v in primary standby sync bot1 bot2; do "$engine" volume rm -f "$P-$v" >/dev/null 2>&1 || true; done
    rm -rf "$work"
}
trap 'status=$?; [ "$status" = 0 ] || note "FAIL (exit $status) at line $LINENO"; cleanup' EXIT

"$engine" image exists "$IMAGE" || fail "no image $IMAGE: run make image-local"
"$engine" image exists "$PG_IMAGE" || fail "no image $PG_IMAGE: run make image-local"
if ! "$engine" image exists "$BOUNCER_IMAGE"; then
    "$engine" image exists "$BASE_IMAGE" || fail "no image $BASE_IMAGE: run make image-base"
    note "building $BOUNCER_IMAGE (Debian's pgbouncer on $BASE_IMAGE)"
    printf 'FROM %s\nRUN apt-get update && apt-get install -y --no-install-recommends pgbouncer && rm -rf /var/lib/apt/lists/*\nUSER postgres\n' \
        "$BASE_IMAGE" > "$work/Containerfile.pgbouncer"
    "$engine" build -q -t "$BOUNCER_IMAGE" -f "$work/Containerfile.pgbouncer" "$work" >/dev/null
fi

pg() { "$engine" exec "$1" psql -h /var/run/postgresql -p "$2" -U ragbot -d ragbot -v ON_ERROR_STOP=1 -qtAc "$3"; }
http_get() {  # container port path
    "$engine" exec "$1" python3 -c "import sys, urllib.request
with urllib.request.urlopen('http://127.0.0.1:$2$3', timeout=5) as r: sys.stdout.write(r.read().decode())"
}
wait_for() {  # what seconds command...: poll until the command succeeds
    local what=$1 seconds=$2; shift 2
    local started; started=$(now)
    for _ in $(seq 1 "$((seconds * 2))"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
    fail "$what: not ready after $(since "$started") s"
}

t0=$(now)
# --- the primary, and the role the standby streams with (deploy/scale/primary-init.sh) -------------------------------
"$engine" run -d --name "$P-primary" --network none --no-healthcheck --shm-size 1g -e POSTGRES_USER=ragbot \
    -e POSTGRES_PASSWORD="$PGPASS" -e POSTGRES_DB=ragbot -v "$P-primary:/var/lib/postgresql/data" "$PG_IMAGE" \
    postgres -c port=5432 >/dev/null
wait_for "primary" 120 "$engine" exec "$P-primary" pg_isready -q -h 127.0.0.1 -p 5432 -U ragbot -d ragbot
pg "$P-primary" 5432 "CREATE ROLE replicator WITH REPLICATION LOGIN PASSWORD '$REPLPASS'"
"$engine" exec "$P-primary" sh -c 'echo "host replication replicator all scram-sha-256" >> "$PGDATA/pg_hba.conf"'
pg "$P-primary" 5432 "SELECT pg_reload_conf()" >/dev/null
note "primary ready ($(since "$t0") s)"

net=(--network "container:$P-primary")
# --- the standby: cloned by pg_basebackup -R, then streaming ---------------------------------------------------------
"$engine" run -d --name "$P-standby" "${net[@]}" --no-healthcheck --shm-size 1g -e PGPASSWORD="$REPLPASS" \
    -v "$P-standby:/var/lib/postgresql/data" --entrypoint sh "$PG_IMAGE" -c \
    'D=/var/lib/postgresql/data/standby
     pg_basebackup -h 127.0.0.1 -p 5432 -U replicator -D "$D" -R -X stream -c fast && chmod 700 "$D" &&
     exec postgres -D "$D" -c port=5433 -c hot_standby=on' >/dev/null
wait_for "standby" 180 "$engine" exec "$P-standby" pg_isready -q -h 127.0.0.1 -p 5433 -U ragbot -d ragbot
[ "$(pg "$P-standby" 5433 'SELECT pg_is_in_recovery()')" = t ] || fail "the standby is not in recovery"
note "standby streaming ($(since "$t0") s)"

# --- PgBouncer, transaction pooling (deploy/scale/pgbouncer.ini, on loopback) ----------------------------------------
sed -e 's/host=primary port=5432/host=127.0.0.1 port=5432/' -e 's/listen_addr = 0.0.0.0/listen_addr = 127.0.0.1/' \
    deploy/scale/pgbouncer.ini > "$work/pgbouncer.ini"
printf '"ragbot" "%s"\n' "$PGPASS" > "$work/userlist.txt"
chmod 644 "$work/pgbouncer.ini" "$work/userlist.txt"
"$engine" run -d --name "$P-bouncer" "${net[@]}" -v "$work/pgbouncer.ini:/etc/pgbouncer/pgbouncer.ini:ro" \
    -v "$work/userlist.txt:/etc/pgbouncer/userlist.txt:ro" "$BOUNCER_IMAGE" pgbouncer /etc/pgbouncer/pgbouncer.ini \
    >/dev/null

primary_url="postgresql://ragbot:$PGPASS@127.0.0.1:6432/ragbot"
standby_url="postgresql://ragbot:$PGPASS@127.0.0.1:5433/ragbot"
ragbot_env=(-e "DATABASE_URL=$primary_url" -e DATABASE_POOLER=transaction -e "DATABASE_REPLICA_URLS=$standby_url"
            -e LOG_LEVEL=INFO)
# --- the sync worker: migrates through the pooler, then syncs the handbook on its schedule ---------------------------
"$engine" run -d --name "$P-sync" "${net[@]}" --no-healthcheck --read-only "${ragbot_env[@]}" -v "$P-sync:/data" "$IMAGE" \
    scheduler --refresh 2 >/dev/null
wait_for "the worker's migrations" 300 "$engine" exec "$P-sync" ragbot sync-runs --json
"$engine" exec "$P-sync" ragbot source add folder handbook /app/examples/handbook --every 20s >/dev/null  # the first run 20 s on
synced() {
    "$engine" exec "$P-sync" ragbot sync-runs --json | python3 -c "import json, sys
runs = json.load(sys.stdin)['runs']
sys.exit(0 if any(r['status'] == 'ok' and r['added'] > 0 for r in runs) else 1)"
}
wait_for "the worker's first sync of the handbook" 900 synced
note "handbook synced by the worker ($(since "$t0") s)"

# --- two bot replicas: searches on the standby, writes through the pooler --------------------------------------------
for n in 1 2; do
    "$engine" run -d --name "$P-bot$n" "${net[@]}" --no-healthcheck --read-only "${ragbot_env[@]}" -e "PORT=$((2999 + n))" \
        -e RUN_SCHEDULER=false -v "$P-bot$n:/data" "$IMAGE" run >/dev/null
done
for n in 1 2; do
    wait_for "bot-$n /healthz" 300 http_get "$P-bot$n" "$((2999 + n))" /healthz
    health=$(http_get "$P-bot$n" "$((2999 + n))" /healthz)
    grep -q '"status": "ok"' <<<"$health" || fail "bot-$n unhealthy: $health"
    grep -q '"replica [^"]*": "ok' <<<"$health" || fail "bot-$n does not read from the standby: $health"
done
answer=$("$engine" exec "$P-bot1" ragbot ask --json "$QUESTION" | python3 -c "import json, sys
a = json.load(sys.stdin)
assert not a['abstained'] and a['citations'], a
print(json.dumps({'answer': a['answer'][:200], 'cited': [c['external_id'] for c in a['citations']]}))")
note "bot-1 answered: $answer"
http_get "$P-bot1" 3000 /metrics | grep -q '^ragbot_replica_serving' || fail "bot-1's /metrics lacks ragbot_replica_serving"
note "scale smoke: ok ($(since "$t0") s)"
