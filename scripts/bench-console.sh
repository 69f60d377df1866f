#!/usr/bin/env bash
# Page times of the console (`pgwake ui`) on a big database: a throwaway
# PostgreSQL cluster (Unix socket only, removed at exit) with 1,000,000
# waiting jobs over 10 queues, 10,000 dead jobs, and 10,000,000 history rows
# in pgwake.finished_jobs over 10 daily partitions (pgwake.history_partition),
# all made with generate_series. Then every page is fetched 7 times and the
# median time printed, in milliseconds. Usage:
#   scripts/bench-console.sh [PGWAKE_BINARY] [WAITING] [HISTORY]
# (defaults: target/release/pgwake, 1000000, 10000000); BENCH_KEEP=1 keeps
# the cluster running for a look with psql. Published in
# docs/src/performance.md ("The console").
set -euo pipefail
bin=$(realpath "${1:-target/release/pgwake}")
waiting=${2:-1000000}
history=${3:-10000000}
export PGOPTIONS="-c client_min_messages=warning"

pgbin=$(pg_config --bindir 2>/dev/null || true)
if [ ! -x "$pgbin/initdb" ]; then
    pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
fi
dir=$(mktemp -d /tmp/pgwake-console-bench.XXXXXX)
url="postgres://postgres@/postgres?host=$dir"
chmod 755 "$dir"
as_pg=()
if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --home /var/lib/postgresql --shell /bin/sh postgres
    chown postgres "$dir"
    as_pg=(runuser -u postgres --)
fi
ui_pid=
cleanup() {
    [ -n "$ui_pid" ] && kill "$ui_pid" 2>/dev/null || true
    if [ -n "${BENCH_KEEP-}" ]; then
        echo "kept: $url (stop: pg_ctl -D $dir/data stop)" >&2
        return
    fi
    "${as_pg[@]}" "$pgbin/pg_ctl" -D "$dir/data" stop -m immediate >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT

"${as_pg[@]}" "$pgbin/initdb" -D "$dir/data" -U postgres --auth=trust >/dev/null
"${as_pg[@]}" "$pgbin/pg_ctl" -D "$dir/data" -w -l "$dir/log" start \
    -o "-c listen_addresses='' -k $dir -c shared_buffers=512MB -c max_wal_size=8GB -c fsync=off" >/dev/null
sql() { "$pgbin/psql" -qAtX "$url" -v ON_ERROR_STOP=1 "$@"; }

"$bin" migrate --database-url "$url" >/dev/null
echo "loading $waiting waiting jobs, 10000 dead, $history history rows …" >&2
t0=$(date +%s)
sql -c "INSERT INTO pgwake.jobs (task, queue, payload, created_at, run_at)
        SELECT 'task' || (i % 7), 'q' || (i % 10),
               jsonb_build_object('customer', i % 50000, 'order', i, 'note', 'x'),
               now() - interval '1 hour', now() - interval '1 hour'
        FROM generate_series(1, $waiting) i"
sql -c "INSERT INTO pgwake.dead_jobs (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error, created_at)
        SELECT nextval(pg_get_serial_sequence('pgwake.jobs', 'id')), 'q' || (i % 10), 'task1',
               jsonb_build_object('customer', i), 0, now(), 3, 3, 'boom', now()
        FROM generate_series(1, 10000) i"
sql -c "INSERT INTO pgwake.history_settings (keep) VALUES (interval '30 days')
        ON CONFLICT (singleton) DO UPDATE SET keep = excluded.keep"
sql -c "SELECT pgwake.history_partition((now() - make_interval(days => d))::date) FROM generate_series(0, 10) d" >/dev/null
# 10 days of history, the newest rows in the last minutes (for jobs/s).
sql -c "INSERT INTO pgwake.finished_jobs (id, queue, task, payload, outcome, result, attempts, enqueued_at, started_at, finished_at, worker)
        SELECT 2000000000 + i, 'q' || (i % 10), 'task' || (i % 7), jsonb_build_object('customer', i % 50000),
               'done', '{\"ok\": true}', 1, f - interval '1 second', f - interval '10 ms', f, 'bench'
        FROM generate_series(1, $history) i,
             LATERAL (SELECT now() - make_interval(secs => (i::float8 / $history) * 864000) AS f) t"
sql -c "VACUUM ANALYZE" >/dev/null
echo "loaded in $(( $(date +%s) - t0 )) s" >&2

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin" ui --database-url "$url" --ui-addr "127.0.0.1:$port" >/dev/null 2>&1 &
ui_pid=$!
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/" >/dev/null 2>&1 && break; sleep 0.2; done

waiting_id=$(sql -c "SELECT max(id) FROM pgwake.jobs")
head_id=$(sql -c "SELECT min(id) FROM pgwake.jobs")
finished_id=$(sql -c "SELECT 2000000000 + $history / 2")
median() {
    local path=$1 times=()
    for _ in 1 2 3 4 5 6 7; do
        times+=("$(curl -s -o /dev/null -w '%{http_code} %{time_total}' "http://127.0.0.1:$port$path")")
    done
    printf '%s\n' "${times[@]}" | awk '$1 != 200 { bad = $1 } { print $2 } END { if (bad) print "status " bad > "/dev/stderr" }' \
        | sort -n | awk '{ a[NR] = $1 } END { printf "%.0f", a[int((NR + 1) / 2)] * 1000 }'
}
printf '%-55s %10s\n' "page ($waiting waiting, $history history rows)" "median ms"
for path in \
    / \
    /workers \
    /queues \
    /schedules \
    /jobs \
    "/jobs?state=waiting&queue=q3" \
    "/jobs?state=waiting&queue=q3&after=$((waiting / 2))" \
    "/jobs?state=dead" \
    "/jobs?state=finished" \
    "/jobs?queue=q3&payload=customer%3D4242" \
    "/jobs?state=finished&payload=customer%3D4242" \
    "/jobs/$head_id" \
    "/jobs/$waiting_id" \
    "/jobs/$finished_id"; do
    printf '%-55s %10s\n' "$path" "$(median "$path")"
done
