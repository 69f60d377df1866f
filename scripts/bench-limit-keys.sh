#!/usr/bin/env bash
# What limit keys cost (issue 24), in one run of one pgwake binary, in both
# delivery modes:
#   plain claim   ms per claim of up to 10 jobs of a queue without keys (N
#                 waiting): tx (pgwake.claim_tx_queue) and lease
#                 (pgwake.claim_lease_queue), alone ("base") and beside a
#                 queue holding K keyed jobs of K distinct keys with
#                 --fair-keys and --max-running-per-key 3 ("keys")
#   keyed claim   ms per claim of that keyed queue by the worker's whole
#                 statement (src/db/sql/claim_{tx,lease}_limited.sql: the
#                 rotation, a key slot per job, the delete; in lease mode
#                 the leases and their slots' tokens too), asking for 10
#                 jobs (tx mode takes one job per claim transaction under
#                 per-key limits, lease mode 10)
#   enqueue       seconds of one INSERT … SELECT of N jobs without keys,
#                 without the limit-key-path insert trigger (no queue has
#                 a path: the default) and with it (a queue has one), twice
# The claim figures are measured in R rounds (default 3), base and keys
# alternating (the keyed jobs deleted and put back between), and printed
# round by round with their median. Each claim is rolled back (pgbench, one
# client, T seconds), so the tables stay as they are. Run it from the
# repository's root: the keyed claims are read from src/db/sql/.
# Usage:
#   scripts/bench-limit-keys.sh ADMIN_URL N K T BINARY [R]
# ADMIN_URL names a server where a database can be created and dropped;
# psql and pgbench on PATH.
set -euo pipefail
export PGOPTIONS="-c client_min_messages=warning"
admin=$1; n=$2; k=$3; t=$4; bin=$5; rounds=${6:-3}
db="pgwake_limit_keys_$$"
base=${admin%/*}
url="$base/$db"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"; psql -q "$admin" -c "DROP DATABASE IF EXISTS $db" >/dev/null' EXIT

psql -q "$admin" -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
"$bin" migrate --database-url "$url" >/dev/null 2>&1
"$bin" queue set tenants --fair-keys --max-running-per-key 3 --database-url "$url" >/dev/null

printf 'BEGIN;\nSELECT count(*) FROM pgwake.claim_tx_queue(10, %s, NULL, %s);\nROLLBACK;\n' \
    "'plain'" "'{}'" > "$tmp/plain_tx.sql"
printf 'BEGIN;\nSELECT count(*) FROM pgwake.claim_lease_queue(10, %s, NULL, %s, %s, 30);\nROLLBACK;\n' \
    "'plain'" "'{}'" "'bench'" > "$tmp/plain_lease.sql"
# The worker's keyed claims with their parameters written in, comments
# dropped. tx: $1 limit, $2 queue, $3 $4 tasks, $5 admissions, $6 after
# key; lease: $5 worker, $6 lease seconds, $7 admissions, $8 after key.
keyed() {  # keyed FILE SED-ARGS…
    local file=$1; shift
    { echo "BEGIN;"; sed -e 's/--.*$//' "$@" "src/db/sql/$file"; echo ";"; echo "ROLLBACK;"; }
}
q="'"
keyed claim_tx_limited.sql -e 's/\$7/NULL/g' -e 's/\$6/NULL/g' -e 's/\$5/NULL/g' -e "s/\\\$4/${q}{}${q}/g" \
    -e 's/\$3/NULL/g' -e "s/\\\$2/${q}tenants${q}/g" -e 's/\$1/10/g' > "$tmp/keyed_tx.sql"
keyed claim_lease_limited.sql -e 's/\$9/NULL/g' -e 's/\$8/NULL/g' -e 's/\$7/NULL/g' -e 's/\$6/30/g' \
    -e "s/\\\$5/${q}bench${q}/g" -e "s/\\\$4/${q}{}${q}/g" -e 's/\$3/NULL/g' \
    -e "s/\\\$2/${q}tenants${q}/g" -e 's/\$1/10/g' > "$tmp/keyed_lease.sql"

ms() {  # ms per transaction of script $1
    pgbench -n -c 1 -T "$t" -f "$1" "$url" 2>/dev/null \
        | awk '/^tps/ {printf "%.3f", 1000 / $3}'
}
keys_in() {
    psql -q "$url" -c "INSERT INTO pgwake.jobs (queue, task, limit_key) SELECT 'tenants', 't', 'k' || i FROM generate_series(1, $k) i" >/dev/null
    psql -q "$url" -c "VACUUM ANALYZE pgwake.jobs" >/dev/null
}
keys_out() {
    psql -q "$url" -c "DELETE FROM pgwake.jobs WHERE queue = 'tenants'" >/dev/null
    psql -q "$url" -c "VACUUM ANALYZE pgwake.jobs" >/dev/null
}
insert_s() {
    local t0 t1
    t0=$(date +%s.%N)
    psql -q "$url" -c "INSERT INTO pgwake.jobs (queue, task) SELECT 'load', 't' FROM generate_series(1, $n)" >/dev/null
    t1=$(date +%s.%N)
    psql -q "$url" -c "DELETE FROM pgwake.jobs WHERE queue = 'load'" -c "VACUUM pgwake.jobs" >/dev/null
    echo "$t1 - $t0" | bc
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }

psql -q "$url" -c "INSERT INTO pgwake.jobs (queue, task) SELECT 'plain', 't' FROM generate_series(1, $n)" >/dev/null
psql -q "$url" -c "VACUUM ANALYZE pgwake.jobs" >/dev/null
declare -A fig
for _ in $(seq 1 "$rounds"); do
    for m in tx lease; do fig[base_$m]+=" $(ms "$tmp/plain_$m.sql")"; done
    keys_in
    for m in tx lease; do
        fig[keys_$m]+=" $(ms "$tmp/plain_$m.sql")"
        fig[keyed_$m]+=" $(ms "$tmp/keyed_$m.sql")"
    done
    keys_out
done
# No queue has a limit key path: no trigger. The first path creates it.
off1=$(insert_s)
"$bin" queue set other --limit-key-path customer_id --database-url "$url" >/dev/null
on1=$(insert_s)
psql -q "$url" -c "ALTER TABLE pgwake.jobs DISABLE TRIGGER jobs_fill_limit_key" >/dev/null
off2=$(insert_s)
psql -q "$url" -c "ALTER TABLE pgwake.jobs ENABLE TRIGGER jobs_fill_limit_key" >/dev/null
on2=$(insert_s)

echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "claims, ms per claim, round by round, then the median (N=$n waiting; K=$k keys)"
for f in base_tx keys_tx keyed_tx base_lease keys_lease keyed_lease; do
    printf '  %-11s %s   median %s\n' "$f" "${fig[$f]}" "$(echo "${fig[$f]}" | median)"
done
echo "enqueue of N=$n jobs without keys, s"
echo "  no path (no trigger)   $off1  $off2"
echo "  a queue has a path     $on1  $on2"
