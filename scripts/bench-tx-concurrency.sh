#!/usr/bin/env bash
# Jobs/s of 1 ms jobs in tx mode with 4,000 jobs kept waiting, at
# --concurrency C (issue 33, item 16: a third-party benchmark's main
# scenario is 64 workers, 1 ms jobs, 4,000 waiting). Each job is a `sql`
# handler, `pg_sleep(0.001)`, so each runs in its claim transaction; the
# worker's defaults otherwise (PGWAKE_BENCH_FLAGS adds flags to every run).
# A producer session tops the queue up to 4,000 every 50 ms. After a 3 s
# warm-up, counts the jobs done in SECONDS and the worker's CPU time. The
# binaries take turns, ROUNDS times, each on a fresh database. Usage:
#   scripts/bench-tx-concurrency.sh ADMIN_URL CONCURRENCY SECONDS ROUNDS BINARY...
# ADMIN_URL names a server where a database can be created and dropped and
# that allows CONCURRENCY + 10 more connections (e.g.
# postgres://postgres@/postgres?host=/tmp/sock).
set -euo pipefail
export PGOPTIONS="-c client_min_messages=warning"
admin=$1; concurrency=$2; seconds=$3; rounds=$4; shift 4
db="pgwake_txconc_$$"
url=$(python3 -c 'import sys, urllib.parse as u; p = u.urlsplit(sys.argv[1]); print(u.urlunsplit(p._replace(path="/" + sys.argv[2])))' "$admin" "$db")
ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
done_jobs() {
    psql -qAt "$url" -c "SELECT (SELECT last_value FROM pgwake.jobs_id_seq) - (SELECT count(*) FROM pgwake.jobs)"
}
run() {
    local bin=$1
    psql -q "$admin" -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
    "$bin" migrate --database-url "$url" >/dev/null 2>&1
    psql -q "$url" -c "CREATE FUNCTION sleep1(p jsonb) RETURNS void LANGUAGE sql AS 'SELECT pg_sleep(0.001)'" \
        -c "INSERT INTO pgwake.jobs (task) SELECT 't' FROM generate_series(1, 4000)" \
        -c "VACUUM ANALYZE pgwake.jobs" >/dev/null
    # The producer: one session, topping up to 4,000 waiting every 50 ms,
    # until its flag file goes.
    local flag="/tmp/$db.producing"
    touch "$flag"
    (while [ -e "$flag" ]; do
        echo "INSERT INTO pgwake.jobs (task) SELECT 't' FROM generate_series(1, 4000 - (SELECT count(*) FROM pgwake.jobs));"
        sleep 0.05
    done | psql -q "$url" >/dev/null 2>&1) &
    local producer=$!
    # shellcheck disable=SC2086
    "$bin" run --database-url "$url" --handler t=sql:sleep1 --concurrency "$concurrency" \
        --metrics-addr 127.0.0.1:0 ${PGWAKE_BENCH_FLAGS:-} >/dev/null 2>"/tmp/$db.log" &
    local pid=$!
    sleep 3
    local d0 c0 t0 d1 c1 t1
    d0=$(done_jobs); c0=$(cpu $pid); t0=$(date +%s.%N)
    sleep "$seconds"
    d1=$(done_jobs); c1=$(cpu $pid); t1=$(date +%s.%N)
    kill -TERM $pid; wait $pid || true
    rm -f "$flag"; wait $producer || true
    psql -q "$admin" -c "DROP DATABASE $db WITH (FORCE)" >/dev/null
    python3 -c "import sys; d, t, c = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]) / float(sys.argv[4])
print(f'{d / t:8.0f} jobs/s  worker CPU {100 * c / t:4.0f}%')" \
        "$((d1 - d0))" "$(echo "$t1 - $t0" | bc)" "$((c1 - c0))" "$ticks"
}
for round in $(seq 1 "$rounds"); do
    for bin in "$@"; do
        printf 'round %s %s --concurrency %s %s: %s\n' "$round" "$bin" "$concurrency" \
            "${PGWAKE_BENCH_FLAGS:-}" "$(run "$bin")"
    done
done
