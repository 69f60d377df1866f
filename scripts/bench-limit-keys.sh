#!/usr/bin/env bash
# What limit keys cost (issue 24), in one run of one pgwake binary:
#   plain claim   ms per tx-mode claim of up to 10 jobs of a queue without
#                 keys (N waiting), alone ("base") and beside a queue
#                 holding K keyed jobs of K distinct keys with --fair-keys
#                 and --max-running-per-key 3 ("keys"); measured base,
#                 keys, base, keys (the keyed jobs deleted and put back)
#   keyed claim   ms per choice-and-delete of up to 10 jobs of that keyed
#                 queue (pgwake.fair_key_jobs from the first key, key slots
#                 taken), against the plain claim's figure
#   enqueue       seconds of one INSERT … SELECT of N jobs without keys,
#                 without the limit-key-path insert trigger (no queue has
#                 a path: the default) and with it (a queue has one), twice
# Each claim is rolled back (pgbench, one client, T seconds), so the tables
# stay as they are.
# Usage:
#   scripts/bench-limit-keys.sh ADMIN_URL N K T BINARY
# ADMIN_URL names a server where a database can be created and dropped;
# psql and pgbench on PATH.
set -euo pipefail
export PGOPTIONS="-c client_min_messages=warning"
admin=$1; n=$2; k=$3; t=$4; bin=$5
db="pgwake_limit_keys_$$"
base=${admin%/*}
url="$base/$db"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"; psql -q "$admin" -c "DROP DATABASE IF EXISTS $db" >/dev/null' EXIT

psql -q "$admin" -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
"$bin" migrate --database-url "$url" >/dev/null 2>&1
"$bin" queue set tenants --fair-keys --max-running-per-key 3 --database-url "$url" >/dev/null

cat > "$tmp/plain.sql" <<'EOF'
BEGIN;
SELECT count(*) FROM pgwake.claim_tx_queue(10, 'plain', NULL, '{}');
ROLLBACK;
EOF
cat > "$tmp/keyed.sql" <<'EOF'
BEGIN;
DELETE FROM pgwake.jobs WHERE id IN (SELECT f.id FROM pgwake.fair_key_jobs('tenants', NULL, 10, NULL, '{}') f);
ROLLBACK;
EOF

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

psql -q "$url" -c "INSERT INTO pgwake.jobs (queue, task) SELECT 'plain', 't' FROM generate_series(1, $n)" >/dev/null
psql -q "$url" -c "VACUUM ANALYZE pgwake.jobs" >/dev/null
b1=$(ms "$tmp/plain.sql")
keys_in
k1=$(ms "$tmp/plain.sql")
c1=$(ms "$tmp/keyed.sql")
keys_out
b2=$(ms "$tmp/plain.sql")
keys_in
k2=$(ms "$tmp/plain.sql")
c2=$(ms "$tmp/keyed.sql")
keys_out
# No queue has a limit key path: no trigger. The first path creates it.
off1=$(insert_s)
"$bin" queue set other --limit-key-path customer_id --database-url "$url" >/dev/null
on1=$(insert_s)
psql -q "$url" -c "ALTER TABLE pgwake.jobs DISABLE TRIGGER jobs_fill_limit_key" >/dev/null
off2=$(insert_s)
psql -q "$url" -c "ALTER TABLE pgwake.jobs ENABLE TRIGGER jobs_fill_limit_key" >/dev/null
on2=$(insert_s)

echo "plain claim, ms (N=$n waiting; beside K=$k keys or not)"
echo "  base   $b1  $b2"
echo "  keys   $k1  $k2"
echo "keyed claim of the fair, per-key-limited queue, ms: $c1  $c2"
echo "enqueue of N=$n jobs without keys, s"
echo "  no path (no trigger)   $off1  $off2"
echo "  a queue has a path     $on1  $on2"
