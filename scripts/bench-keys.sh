#!/usr/bin/env bash
# Cost of ordered keys and unique keys (issue 10), measured with pgbench
# against a fresh database: the claim statements pgwake runs (tx claim,
# autocommit: each claim of up to 10 jobs deletes them at once) with and
# without the ordering-key predicate, on the same machine in the same run,
# and enqueue rates with and without a unique key.
#
#   scripts/bench-keys.sh postgres://postgres@127.0.0.1:5432/postgres [pgwake binary]
#
# Needs psql and pgbench. Creates and drops the database pgwake_bench_keys.
set -euo pipefail
ADMIN=${1:?admin URL}
PGWAKE=${2:-target/release/pgwake}
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-5}
CLIENTS=${CLIENTS:-4}
DB=pgwake_bench_keys
URL=${ADMIN%/*}/$DB
HERE=$(cd "$(dirname "$0")/.." && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

PGOPTIONS="-c client_min_messages=warning" psql -qX "$ADMIN" -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB" >/dev/null
"$PGWAKE" migrate --database-url "$URL" >/dev/null 2>&1

# The claim as shipped ($1 limit 10, every queue, any task), and the same
# statement without the two predicate lines (the claim before issue 10).
bind() { sed -e '/^--/d' -e 's/\$1/10/g; s/\$2::text\[\]/'"'{}'"'::text[]/g; s/\$3::text\[\]/NULL::text[]/g; s/\$4::text\[\]/'"'{}'"'::text[]/g' "$1"; }
bind "$HERE/src/db/sql/claim_tx_all.sql" | tr '\n' ' ' > "$TMP/with.sql"; echo >> "$TMP/with.sql"
bind "$HERE/src/db/sql/claim_tx_all.sql" | grep -v "ordering_key IS NULL" | grep -v "pgwake.ordering_free" \
    | tr '\n' ' ' > "$TMP/without.sql"; echo >> "$TMP/without.sql"

# load KIND: 100,000 ready jobs; KIND none | keys1000 (1,000 keys × 100) | keys100k (100,000 keys × 1)
load() {
    local key
    case $1 in
        none) key="NULL" ;;
        keys1000) key="'k' || (g % 1000)" ;;
        keys100k) key="'k' || (g % 100000)" ;;
    esac
    psql -qX "$URL" <<SQL >/dev/null
TRUNCATE pgwake.jobs, pgwake.leased_jobs, pgwake.dead_jobs;
SET pgwake.notify = off;
INSERT INTO pgwake.jobs (task, ordering_key, run_at)
SELECT 't', $key, now() - interval '1 hour' FROM generate_series(1, 100000) g;
VACUUM ANALYZE pgwake.jobs;
SQL
}

# drain SCRIPT: jobs claimed per second over SECS seconds
drain() {
    local before after
    before=$(psql -qAtX "$URL" -c "SELECT count(*) FROM pgwake.jobs")
    pgbench -n -f "$1" -c "$CLIENTS" -j 2 -T "$SECS" "$URL" > /dev/null 2>&1
    after=$(psql -qAtX "$URL" -c "SELECT count(*) FROM pgwake.jobs")
    [ "$after" -gt 0 ] || { echo "queue drained: raise the load" >&2; exit 1; }
    echo $(( (before - after) / SECS ))
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

declare -A R
for round in $(seq "$ROUNDS"); do
    for case in "none without" "none with" "keys1000 with" "keys100k with"; do
        set -- $case
        load "$1"
        R["$1 $2"]+="$(drain "$TMP/$2.sql") "
    done
done

# The same comparison interleaved: both statements in one pgbench run, each
# transaction picking one at random, on the same jobs (no key), so load on
# the machine hits both alike. Per-statement latency: throughput is its
# inverse.
load none
pgbench -n -f "$TMP/without.sql" -f "$TMP/with.sql" -c "$CLIENTS" -j 2 -T $((SECS * 2)) "$URL" 2>/dev/null \
    | awk '/^SQL script/ {name = ($4 ~ /with\.sql/ && $4 !~ /without/) ? "with" : "without"}
           /latency average/ && name {lat[name] = $5}
           END {printf "interleaved, no keys: claim latency without %s ms, with %s ms: with/without throughput = %.3f\n",
                lat["without"], lat["with"], lat["without"] / lat["with"]}'

echo "claims (tx claim of 10, autocommit, $CLIENTS clients, ${SECS}s, median of $ROUNDS):"
for case in "none without" "none with" "keys1000 with" "keys100k with"; do
    printf '  %-16s %8s jobs/s   runs: %s\n' "$case" "$(echo ${R[$case]} | tr ' ' '\n' | median)" "${R[$case]}"
done

# Enqueue rates: pgwake.enqueue without a key, with a fresh unique key each
# time, with a key that is always a duplicate; a plain INSERT with and
# without a unique key.
cat > "$TMP/e_plain.sql" <<'SQL'
SELECT pgwake.enqueue('t');
SQL
cat > "$TMP/e_unique.sql" <<'SQL'
SELECT pgwake.enqueue('t', unique_key => 'u' || :client_id || '-' || random());
SQL
cat > "$TMP/e_dup.sql" <<'SQL'
SELECT pgwake.enqueue_unique('t', unique_key => 'dup' || :client_id);
SQL
cat > "$TMP/i_plain.sql" <<'SQL'
INSERT INTO pgwake.jobs (task) VALUES ('t');
SQL
cat > "$TMP/i_unique.sql" <<'SQL'
INSERT INTO pgwake.jobs (task, unique_key) VALUES ('t', 'i' || :client_id || '-' || random());
SQL
declare -A E
for round in $(seq "$ROUNDS"); do
    for s in e_plain e_unique e_dup i_plain i_unique; do
        psql -qX "$URL" -c "TRUNCATE pgwake.jobs" >/dev/null
        tps=$(pgbench -n -f "$TMP/$s.sql" -c "$CLIENTS" -j 2 -T "$SECS" "$URL" 2>/dev/null \
              | awk '/^tps/ {print int($3)}')
        E[$s]+="$tps "
    done
done
echo "enqueues (one job per statement, autocommit, $CLIENTS clients, median of $ROUNDS):"
for s in e_plain e_unique e_dup i_plain i_unique; do
    printf '  %-10s %8s jobs/s   runs: %s\n' "$s" "$(echo ${E[$s]} | tr ' ' '\n' | median)" "${E[$s]}"
done
psql -qX "$ADMIN" -c "DROP DATABASE $DB" >/dev/null
