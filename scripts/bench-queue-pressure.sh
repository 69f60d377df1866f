#!/usr/bin/env bash
# What the autoscaling signal costs at a deep backlog (issue 35, item 5):
# pgwake.queue_pressure (functions/queue_pressure.sql) against `pgwake stats`
# (admin::stats, which counts every job of every queue) on N waiting jobs.
# Layout: queue `q` holds N jobs over 3 priorities, 90% ready and 10%
# scheduled an hour ahead, and 100 of them leased (running); 99 other queues
# hold 100 ready jobs each.
# Figures (ms a call, pgbench, one client, T seconds each; `stats`: wall
# time of the command, three runs):
#   fresh      right after the load, autovacuum off on pgwake.jobs: the
#              visibility map is empty, so every counted index entry is a
#              heap fetch (the worst case: a table autovacuum has not
#              reached yet)
#   vacuumed   after VACUUM ANALYZE: index-only counts
#   one        queue_pressure('q')            (cap 10,000, the default)
#   cap 100k   queue_pressure('q', 100000)
#   all        queue_pressure()               (100 queues)
#   keda       the query of deploy/kubernetes/keda/scaledobject.yaml
# Usage:
#   scripts/bench-queue-pressure.sh ADMIN_URL N T BINARY
# ADMIN_URL names a server where a database can be created and dropped
# (e.g. postgres://postgres@127.0.0.1:5432/postgres); psql and pgbench on PATH.
set -euo pipefail
export PGOPTIONS="-c client_min_messages=warning"
admin=$1; n=$2; t=$3; bin=$4
db="pgwake_pressure_$$"
url="${admin%/*}/$db"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; psql -q "$admin" -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true' EXIT

psql -q "$admin" -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
"$bin" migrate --database-url "$url" >/dev/null
keda=$(sed -n 's/^ *query: "\(.*\)"$/\1/p' "$(dirname "$0")/../deploy/kubernetes/keda/scaledobject.yaml")

t0=$(date +%s.%N)
psql -q "$url" <<SQL >/dev/null
ALTER TABLE pgwake.jobs SET (autovacuum_enabled = false);
INSERT INTO pgwake.jobs (queue, task, priority, run_at)
SELECT 'q', 't', i % 3,
       CASE WHEN i % 10 = 0 THEN now() + interval '1 hour' ELSE now() END
FROM generate_series(1, $n) i;
INSERT INTO pgwake.jobs (queue, task)
SELECT 'other' || (i % 99), 't' FROM generate_series(1, 9900) i;
SELECT count(*) FROM pgwake.claim_lease_queue(100, 'q', NULL, '{}', 'bench', 3600);
ANALYZE pgwake.jobs;
SQL
load_s=$(echo "$(date +%s.%N) - $t0" | bc)

# ms a call of $1, pgbench, one client, $t s.
ms() {
    printf '%s\n' "$1;" >"$tmp/q.sql"
    pgbench -n -c 1 -T "$t" -f "$tmp/q.sql" "$url" 2>/dev/null \
        | sed -n 's/^latency average = \([0-9.]*\) ms/\1/p'
}

# Wall ms of `pgwake stats`, three runs.
stats_ms() {
    local i t1 out=()
    for i in 1 2 3; do
        t1=$(date +%s%N)
        "$bin" stats --database-url "$url" >/dev/null
        out+=("$(( ($(date +%s%N) - t1) / 1000000 ))")
    done
    echo "${out[*]}"
}

row() {
    printf '  %-9s one %8.2f ms | cap 100k %8.2f ms | all %8.2f ms | keda %8.2f ms | pgwake stats %s ms\n' \
        "$1" "$(ms "SELECT * FROM pgwake.queue_pressure('q')")" \
        "$(ms "SELECT * FROM pgwake.queue_pressure('q', 100000)")" \
        "$(ms "SELECT * FROM pgwake.queue_pressure()")" \
        "$(ms "$keda")" "$(stats_ms)"
}

printf '%s: N = %s waiting jobs in q (+ 9,900 in 99 other queues), loaded in %.1f s\n' "$bin" "$n" "$load_s"
psql -qAt "$url" -c "SELECT format('  q: runnable %s, ready %s, running %s, capped %s', runnable, ready, running, capped) FROM pgwake.queue_pressure('q')"
row fresh
psql -q "$url" -c "VACUUM ANALYZE pgwake.jobs" >/dev/null
row vacuumed
psql -qAt "$url" -c "SELECT format('  q with cap 1,000,000: ready %s', ready) FROM pgwake.queue_pressure('q', 1000000)"
