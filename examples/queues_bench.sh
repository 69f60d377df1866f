#!/usr/bin/env bash
# Claim-statement cost of queue settings (README → Performance → Queues):
# the tx-mode claim statements of this tree against those of a base commit
# (default: the commit before queue settings), in the same run, with
# pgbench on a fresh database. Each figure: BEGIN; claim up to 10 jobs;
# COMMIT, 4 clients, 1,000 transactions each, from a backlog of 100,000
# ready jobs, reloaded before each measurement; variants interleaved, median
# of $REPS runs.
#
#   examples/queues_bench.sh [postgres://…/postgres] [base-commit]
set -euo pipefail
ADMIN=${1:-postgresql://postgres@127.0.0.1:5432/postgres}
BASE=${2:-9e67cba}
REPS=${REPS:-5}
DB=pgwake_queues_bench_$$
URL=${ADMIN%/*}/$DB
DIR=$(mktemp -d)
trap 'psql "$ADMIN" -qc "DROP DATABASE IF EXISTS $DB" >/dev/null 2>&1; rm -rf "$DIR"' EXIT
cd "$(dirname "$0")/.."
psql "$ADMIN" -qc "CREATE DATABASE $DB"
cargo run -q --bin pgwake -- migrate --database-url "$URL" >/dev/null

# A statement file with its parameters filled in (perl: $N → value).
fill() { # file subst-perl-hash
    perl -pe "my %m = ($2); s/\\\$(\\d+)/exists \$m{\$1} ? \$m{\$1} : \"\\\$\$1\"/ge" "$1"
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
script all src/sql/claim_tx_all.sql "$ALL"
script queue src/sql/claim_tx_queue.sql "$ONE"
script limited src/sql/claim_tx_limited.sql "$ONE"
fill src/sql/ready_queues.sql "1=>\"'{}'\", 2=>'1000'" >"$DIR/ready.sql"; echo ';' >>"$DIR/ready.sql"

load() { # queues
    psql "$URL" -qX >/dev/null <<SQL
SET pgwake.notify = off;
TRUNCATE pgwake.jobs;
INSERT INTO pgwake.jobs (queue, task, payload)
SELECT CASE WHEN g % $1 = 0 THEN 'default' ELSE 'q' || (g % $1) END, 'work', '{}'
FROM generate_series(1, 100000) g;
VACUUM ANALYZE pgwake.jobs;
SQL
}
tps() { # script
    pgbench -n -c 4 -j 2 -t 1000 -M prepared -f "$DIR/$1.sql" "$URL" 2>/dev/null |
        sed -n 's/^tps = \([0-9.]*\).*/\1/p'
}
declare -A R
for rep in $(seq "$REPS"); do
    for v in base_all all base_queue queue; do load 1; R[$v]+="$(tps $v) "; done
    psql "$URL" -qXc "SELECT pgwake.set_queue_max_running('default', 1000)" >/dev/null
    load 1; R[limited]+="$(tps limited) "
    psql "$URL" -qXc "SELECT pgwake.set_queue_max_running('default', NULL)" >/dev/null
    for n in 1 10 100; do
        load $n
        R[ready_$n]+="$(pgbench -n -c 1 -t 500 -M prepared -f "$DIR/ready.sql" "$URL" 2>/dev/null |
            sed -n 's/^tps = \([0-9.]*\).*/\1/p') "
    done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for k in base_all all base_queue queue limited ready_1 ready_10 ready_100; do
    printf '%-10s %10s  (runs: %s)\n' "$k" "$(echo "${R[$k]}" | median)" "${R[$k]}"
done
