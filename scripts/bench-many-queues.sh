#!/usr/bin/env bash
# Drain time of N no-op jobs spread over N queues against the same N jobs
# in one queue, for each pgwake binary given (tx mode: a `sql` handler),
# at the worker's defaults. Prints seconds and the ratio many/one per
# binary. Usage:
#   scripts/bench-many-queues.sh ADMIN_URL N BINARY...
# ADMIN_URL names a server where a database can be created and dropped
# (e.g. postgres://postgres@127.0.0.1:5432/postgres).
set -euo pipefail
export PGOPTIONS="-c client_min_messages=warning"
admin=$1; n=$2; shift 2
db="pgwake_manyq_$$"
base=${admin%/*}
url="$base/$db"
run() {
    local bin=$1 layout=$2
    psql -q "$admin" -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
    "$bin" migrate --database-url "$url" >/dev/null 2>&1
    psql -q "$url" -c "CREATE FUNCTION noop(p jsonb) RETURNS void LANGUAGE sql AS 'SELECT'" >/dev/null
    if [ "$layout" = many ]; then
        psql -q "$url" -c "INSERT INTO pgwake.jobs (task, queue) SELECT 't', 'q' || i FROM generate_series(1, $n) i" >/dev/null
    else
        psql -q "$url" -c "INSERT INTO pgwake.jobs (task, queue) SELECT 't', 'q' FROM generate_series(1, $n) i" >/dev/null
    fi
    psql -q "$url" -c "VACUUM ANALYZE pgwake.jobs" >/dev/null
    local t0 t1
    t0=$(date +%s.%N)
    "$bin" run --database-url "$url" --handler t=sql:noop --metrics-addr 127.0.0.1:0 >/dev/null 2>&1 &
    local pid=$!
    while [ "$(psql -qAt "$url" -c 'SELECT count(*) FROM pgwake.jobs')" != 0 ]; do sleep 0.05; done
    t1=$(date +%s.%N)
    kill -TERM $pid; wait $pid || true
    psql -q "$admin" -c "DROP DATABASE $db" >/dev/null
    echo "$t1 - $t0" | bc
}
for bin in "$@"; do
    one=$(run "$bin" one); many=$(run "$bin" many)
    printf '%s: %s jobs, one queue %.2f s, %s queues %.2f s, many/one %.2fx\n' \
        "$bin" "$n" "$one" "$n" "$many" "$(echo "$many / $one" | bc -l)"
done
