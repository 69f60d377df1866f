#!/usr/bin/env bash
# What a backlog on ordering keys costs the claims (issue 21, item 9), for
# each pgwake binary given, against jobs without a key in the same run:
#   none  N jobs without a key (the baseline)
#   one   1 key × N jobs
#   many  N keys × 1 job
# Figures:
#   claim        ms per claim of up to 10 ready jobs, tx and lease mode
#                (pgbench, one client, T seconds, each claim rolled back so
#                the table stays as it is)
#   busy claim   the same while the key's first job runs (leased for an
#                hour): the other N - 1 jobs are blocked, the claim finds
#                nothing (layout one only)
#   idle CPU     server CPU (% of one core, all PostgreSQL processes) while
#                a tx-mode worker (defaults) waits, the key busy, over T s;
#                the baseline is the same worker on an empty table
#   drain        seconds for a tx-mode worker (defaults, `sql` no-op
#                handler) to run the N jobs (layouts none and many)
#   enqueue      seconds of the one INSERT … SELECT of the N jobs (the
#                producers' side: the insert trigger of keyed jobs)
# Usage:
#   scripts/bench-key-backlog.sh ADMIN_URL N T BINARY...
# ADMIN_URL names a server on this machine where a database can be created
# and dropped (e.g. postgres://postgres@127.0.0.1:5432/postgres); psql and
# pgbench on PATH; the CPU figures read /proc.
set -euo pipefail
export PGOPTIONS="-c client_min_messages=warning"
admin=$1; n=$2; t=$3; shift 3
db="pgwake_keys_$$"
base=${admin%/*}
url="$base/$db"
port=$(echo "$admin" | sed -n 's/.*:\([0-9][0-9]*\)\/.*/\1/p'); port=${port:-5432}
postmaster=$(ss -ltnpH "sport = :$port" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# CPU ticks of the server: the postmaster and its children.
server_ticks() {
    local total=0 p
    for p in $postmaster $(ps -o pid= --ppid "$postmaster"); do
        [ -r "/proc/$p/stat" ] || continue
        total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
    done
    echo $total
}

fresh() {
    local bin=$1
    psql -q "$admin" -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
    "$bin" migrate --database-url "$url" >/dev/null 2>&1
    psql -q "$url" -c "CREATE FUNCTION noop(p jsonb) RETURNS void LANGUAGE sql AS 'SELECT'" >/dev/null
}

# Seconds to insert the layout's N jobs (one INSERT … SELECT).
load() {
    local t0 t1
    t0=$(date +%s.%N)
    case $1 in
        none) psql -q "$url" -c "INSERT INTO pgwake.jobs (task) SELECT 't' FROM generate_series(1, $n)" ;;
        one)  psql -q "$url" -c "INSERT INTO pgwake.jobs (task, ordering_key) SELECT 't', 'k' FROM generate_series(1, $n)" ;;
        many) psql -q "$url" -c "INSERT INTO pgwake.jobs (task, ordering_key) SELECT 't', 'k' || i FROM generate_series(1, $n) i" ;;
    esac >/dev/null
    t1=$(date +%s.%N)
    psql -q "$url" -c "VACUUM ANALYZE pgwake.jobs" >/dev/null
    echo "$t1 - $t0" | bc
}

# ms per claim, pgbench for $t s.
claim_ms() {
    local mode=$1
    if [ "$mode" = tx ]; then
        printf 'BEGIN;\nSELECT count(*) FROM pgwake.claim_tx_all(10, %s, NULL, %s);\nROLLBACK;\n' "'{}'" "'{}'" >"$tmp/claim.sql"
    else
        printf 'BEGIN;\nSELECT count(*) FROM pgwake.claim_lease_all(10, %s, NULL, %s, %s, 30);\nROLLBACK;\n' "'{}'" "'{}'" "'bench'" >"$tmp/claim.sql"
    fi
    pgbench -n -c 1 -T "$t" -f "$tmp/claim.sql" "$url" 2>/dev/null | sed -n 's/^latency average = \([0-9.]*\) ms/\1/p'
}

# % of one core the server used while a worker idles for $t s.
idle_cpu() {
    local bin=$1
    "$bin" run --database-url "$url" --handler t=sql:noop --metrics-addr 127.0.0.1:0 >/dev/null 2>&1 &
    local pid=$!
    sleep 3
    local t0 c0 t1 c1
    t0=$(date +%s.%N); c0=$(server_ticks)
    sleep "$t"
    t1=$(date +%s.%N); c1=$(server_ticks)
    kill -TERM $pid; wait $pid || true
    echo "($c1 - $c0) / $(getconf CLK_TCK) / ($t1 - $t0) * 100" | bc -l
}

drain_s() {
    local bin=$1 t0 t1
    t0=$(date +%s.%N)
    "$bin" run --database-url "$url" --handler t=sql:noop --metrics-addr 127.0.0.1:0 >/dev/null 2>&1 &
    local pid=$!
    while [ "$(psql -qAt "$url" -c 'SELECT count(*) FROM pgwake.jobs')" != 0 ]; do sleep 0.05; done
    t1=$(date +%s.%N)
    kill -TERM $pid; wait $pid || true
    echo "$t1 - $t0" | bc
}

for bin in "$@"; do
    fresh "$bin"
    cpu_empty=$(idle_cpu "$bin")
    declare -A tx lease drain enqueue
    for layout in none one many; do
        fresh "$bin"; enqueue[$layout]=$(load $layout)
        tx[$layout]=$(claim_ms tx); lease[$layout]=$(claim_ms lease)
        if [ $layout = one ]; then
            # The key's first job runs (leased for an hour): the rest wait.
            psql -qAt "$url" -c "SELECT count(*) FROM pgwake.claim_lease_all(1, '{}', NULL, '{}', 'holder', 3600)" >/dev/null
            tx_busy=$(claim_ms tx); lease_busy=$(claim_ms lease)
            cpu_busy=$(idle_cpu "$bin")
        else
            drain[$layout]=$(drain_s "$bin")
        fi
    done
    psql -q "$admin" -c "DROP DATABASE $db" >/dev/null
    r() { echo "$1 / $2" | bc -l; }
    printf '%s, N = %s:\n' "$bin" "$n"
    printf '  claim tx    ms: none %.3f | 1 key x N %.3f (%.1fx) | N keys x 1 %.3f (%.1fx) | 1 key busy %.3f (%.1fx)\n' \
        "${tx[none]}" "${tx[one]}" "$(r "${tx[one]}" "${tx[none]}")" "${tx[many]}" "$(r "${tx[many]}" "${tx[none]}")" \
        "$tx_busy" "$(r "$tx_busy" "${tx[none]}")"
    printf '  claim lease ms: none %.3f | 1 key x N %.3f (%.1fx) | N keys x 1 %.3f (%.1fx) | 1 key busy %.3f (%.1fx)\n' \
        "${lease[none]}" "${lease[one]}" "$(r "${lease[one]}" "${lease[none]}")" "${lease[many]}" "$(r "${lease[many]}" "${lease[none]}")" \
        "$lease_busy" "$(r "$lease_busy" "${lease[none]}")"
    printf '  idle server CPU: empty table %.1f%% | 1 key x N busy %.1f%% of a core\n' "$cpu_empty" "$cpu_busy"
    printf '  drain s: none %.2f | N keys x 1 %.2f (%.2fx)\n' "${drain[none]}" "${drain[many]}" "$(r "${drain[many]}" "${drain[none]}")"
    printf '  enqueue s: none %.2f | 1 key x N %.2f (%.2fx) | N keys x 1 %.2f (%.2fx)\n' \
        "${enqueue[none]}" "${enqueue[one]}" "$(r "${enqueue[one]}" "${enqueue[none]}")" \
        "${enqueue[many]}" "$(r "${enqueue[many]}" "${enqueue[none]}")"
done
