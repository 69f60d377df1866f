#!/usr/bin/env bash
# Claim-statement cost of queue settings (README → Performance → Queues):
# the claim statements of this tree against those of a base commit
# (default: the commit before queue settings), in the same run, with
# pgbench on a fresh database, from a backlog of 100,000 ready jobs
# reloaded before each measurement; variants interleaved, median of $REPS
# runs; 4 clients, 1,000 transactions each (100 at a rate of 100,000/s).
# Figures are jobs claimed per second (jobs gone from pgwake.jobs ×
# pgbench's tps / transactions), the mean latency of the claim statement
# and of the script's first statement (pgbench -r), and the jobs claimed
# (all asked for: no limit bound).
#
#   tx:    BEGIN; claim up to 10 jobs; COMMIT
#   lease: the lease claim of up to 10 jobs (autocommit: it moves them into
#          pgwake.leased_jobs), then DELETE of this client's leases (what
#          lease_done does; for a limited queue its trigger frees the slots),
#          so a client holds at most 10 slots and a max_running of 1000
#          never binds
#   rate:  rate_reserve.sql for 10 admissions (autocommit, its own
#          transaction; pgbench \gset keeps the slots it took), then the
#          tx or lease claim of a rate-limited queue with $5/$7 = the
#          number of admissions taken: one extra round trip per claim, as
#          in the worker. Rates of 2,000 per 100 ms and 100,000 per
#          second, neither binding: the reservation's cost grows with the
#          count (one slot row per admission of a window).
#
#   examples/queues_bench.sh [postgres://…/postgres] [base-commit]
set -euo pipefail
ADMIN=${1:-postgresql://postgres@127.0.0.1:5432/postgres}
BASE=${2:-9e67cba}
REPS=${REPS:-5}
PGWAKE=${PGWAKE:-target/release/pgwake}
DB=pgwake_queues_bench_$$
URL=${ADMIN%/*}/$DB
DIR=$(mktemp -d)
trap 'psql "$ADMIN" -qc "DROP DATABASE IF EXISTS $DB" >/dev/null 2>&1; rm -rf "$DIR"' EXIT
cd "$(dirname "$0")/.."
[ -x "$PGWAKE" ] || cargo build --release -q --bin pgwake
psql "$ADMIN" -qc "CREATE DATABASE $DB"
"$PGWAKE" migrate --database-url "$URL" >/dev/null 2>&1

# A statement file with its parameters filled in (perl: $N → value), its
# comment lines dropped (pgbench would take a :variable in a comment for a
# parameter of the prepared statement).
fill() { # file subst-perl-hash
    sed '/^ *--/d' "$1" |
        perl -pe "my %m = ($2); s/\\\$(\\d+)/exists \$m{\$1} ? \$m{\$1} : \"\\\$\$1\"/ge"
}
script() { # name file subst
    { echo 'BEGIN;'; fill "$2" "$3"; echo ';'; echo 'COMMIT;'; } >"$DIR/$1.sql"
}
ALL="1=>'10', 2=>\"'{}'\", 3=>'NULL', 4=>\"'{}'\""
ONE="1=>'10', 2=>\"'default'\", 3=>'NULL', 4=>\"'{}'\""
git show "$BASE:src/sql/claim_tx_all.sql" >"$DIR/base_all.in"
git show "$BASE:src/sql/claim_tx_queue.sql" >"$DIR/base_queue.in"
script base_all "$DIR/base_all.in" "$ALL"
script base_queue "$DIR/base_queue.in" "$ONE"
script all src/db/sql/claim_tx_all.sql "$ALL"
script queue src/db/sql/claim_tx_queue.sql "$ONE"
script limited src/db/sql/claim_tx_limited.sql "$ONE, 5=>'NULL'"
fill src/db/sql/ready_queues.sql "1=>\"'{}'\", 2=>'1000'" >"$DIR/ready.sql"; echo ';' >>"$DIR/ready.sql"

# Rate: the admission statement (its own autocommit transaction; \gset
# keeps its columns as r_*), then the claim capped at the admissions taken.
RESERVE="$(fill src/db/sql/rate_reserve.sql "1=>\"'default'\", 2=>'10', 3=>'NULL'") \\gset r_"
TAKEN="cardinality(:r_slots::int4[])"
{ echo "$RESERVE"; echo 'BEGIN;'; fill src/db/sql/claim_tx_limited.sql "$ONE, 5=>'$TAKEN'"; echo ';'; echo 'COMMIT;'; } \
    >"$DIR/rated.sql"
# Lease: autocommit claim, then this client's leases done (deleted).
LEASE="5=>\"'w' || :client_id::text\", 6=>'300'"
DONE="DELETE FROM pgwake.leased_jobs WHERE worker_id = 'w' || :client_id::text;"
{ fill src/db/sql/claim_lease_queue.sql "$ONE, $LEASE"; echo ';'; echo "$DONE"; } >"$DIR/lease_queue.sql"
{ fill src/db/sql/claim_lease_limited.sql "$ONE, $LEASE, 7=>'NULL'"; echo ';'; echo "$DONE"; } \
    >"$DIR/lease_limited.sql"
{ echo "$RESERVE"; fill src/db/sql/claim_lease_limited.sql "$ONE, $LEASE, 7=>'$TAKEN'"; echo ';'; echo "$DONE"; } \
    >"$DIR/lease_rated.sql"

load() { # queues
    psql "$URL" -qX >/dev/null <<SQL
SET pgwake.notify = off;
TRUNCATE pgwake.jobs, pgwake.leased_jobs;
INSERT INTO pgwake.jobs (queue, task, payload)
SELECT CASE WHEN g % $1 = 0 THEN 'default' ELSE 'q' || (g % $1) END, 'work', '{}'
FROM generate_series(1, 100000) g;
VACUUM ANALYZE pgwake.jobs;
SQL
}
settings() { # max_running rate window (rate NULL: none)
    psql "$URL" -qXc "SELECT pgwake.set_queue_max_running('default', $1),
                             pgwake.set_queue_rate('default', $2, '${3:-1 second}')" >/dev/null
}
count() { psql "$URL" -qAtXc "SELECT count(*) FROM pgwake.jobs"; }
# claims SCRIPT N [T] → "jobs/s:claim-ms:first-ms:jobs": jobs claimed per
# second, (pgbench -r) the mean latency of statement N (the claim) and of
# the first statement (BEGIN, the reservation or the lease claim), and the
# jobs claimed in all (4 × T transactions of up to 10: fewer means a limit
# bound or a claim came back empty). T: transactions per client (1000).
claims() {
    local before out tps lat t=${3:-1000}
    before=$(count)
    out=$(pgbench -n -r -c 4 -j 2 -t "$t" -M prepared -f "$DIR/$1.sql" "$URL" 2>/dev/null)
    tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out")
    lat=$(awk -v k="$2" '/statement latencies/ {on = 1; next}
                         on && $1 ~ /^[0-9.]+$/ {n++; if (n == k) c = $1; if (n == 1) f = $1}
                         END {printf "%.3f:%.3f", c, f}' <<<"$out")
    awk -v d=$((before - $(count))) -v t="$tps" -v n=$((4 * t)) -v l="$lat" \
        'BEGIN {printf "%.0f:%s:%d", d * t / n, l, d}'
}
declare -A R
for rep in $(seq "$REPS"); do
    settings NULL NULL
    for v in base_all all base_queue queue; do load 1; R[$v]+="$(claims $v 2) "; done
    load 1; R[lease_queue]+="$(claims lease_queue 1) "
    settings 1000 NULL
    load 1; R[limited]+="$(claims limited 2) "
    load 1; R[lease_limited]+="$(claims lease_limited 1) "
    # A rate that never binds: 2,000 per 100 ms (2,000 slot rows), then
    # 100,000 per second (100,000 slot rows; fewer transactions: each
    # reservation reads every slot row, see README).
    settings NULL 2000 '100 milliseconds'
    load 1; R[rated]+="$(claims rated 3) "
    load 1; R[lease_rated]+="$(claims lease_rated 2) "
    settings NULL 100000
    load 1; R[rated_100k]+="$(claims rated 3 100) "
    load 1; R[lease_rated_100k]+="$(claims lease_rated 2 100) "
    settings NULL NULL
    for n in 1 10 100; do
        load $n
        R[ready_$n]+="$(pgbench -n -c 1 -t 500 -M prepared -f "$DIR/ready.sql" "$URL" 2>/dev/null |
            sed -n 's/^tps = \([0-9.]*\).*/\1/p') "
    done
    echo "rep $rep/$REPS done, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
field() { tr ' ' '\n' | grep . | cut -d: -f"$1" | median; }
echo "median of $REPS; claims: jobs/s, mean latency of the claim statement and of the script's first"
echo "statement (ms; rated: the reservation); ready_N: reads/s. Every run: jobs/s:claim-ms:first-ms:jobs claimed"
for k in base_all all base_queue queue limited rated rated_100k lease_queue lease_limited lease_rated \
    lease_rated_100k ready_1 ready_10 ready_100; do
    v=${R[$k]}
    case $v in
        *:*) printf '%-14s %8s jobs/s  claim %6s ms  first %6s ms  (runs: %s)\n' \
                 "$k" "$(field 1 <<<"$v")" "$(field 2 <<<"$v")" "$(field 3 <<<"$v")" "$v" ;;
        *) printf '%-14s %8s reads/s  (runs: %s)\n' "$k" "$(field 1 <<<"$v")" "$v" ;;
    esac
done
