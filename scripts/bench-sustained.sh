#!/usr/bin/env bash
# A sustained drain (issue 35, item 4): does throughput hold while
# autovacuum works on the queue tables? A worker at its defaults runs a
# `sql` no-op handler on a backlog that a producer tops up to BACKLOG jobs
# (default 100,000) once a second, for SECONDS (default 600): the worker
# always has work, and the queue table sees a steady churn of inserts and
# deletes. Every 5 s the script prints the jobs run in those 5 s, the
# backlog, the dead tuples of pgwake.jobs and whether a vacuum is at work
# on a queue table; at the end, the 5th percentile and median of the
# 5-second throughput and their ratio (issue 35's target: >= 0.8), and how
# often autovacuum ran on each queue table.
# With TABLE_DEFAULTS=1 the queue tables' autovacuum settings of the
# migrations are reset to the server's, for comparison.
# Usage:
#   cargo build --release
#   scripts/bench-sustained.sh ADMIN_URL [SECONDS] [BACKLOG] [PGWAKE]
# ADMIN_URL names a server where a database can be created and dropped
# (e.g. postgres://postgres@127.0.0.1:5432/postgres); PGWAKE, the binary
# (default target/release/pgwake). Extra worker flags: PGWAKE_RUN_ARGS.
set -euo pipefail
export PGOPTIONS="-c client_min_messages=warning"
admin=$1; seconds=${2:-600}; target=${3:-100000}
here=$(cd "$(dirname "$0")/.." && pwd)
pgwake=${4:-$here/target/release/pgwake}
db="pgwake_sustained_$$"
url="${admin%/*}/$db"
work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    psql -q "$admin" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
psql -q "$admin" -c "CREATE DATABASE $db" >/dev/null
"$pgwake" migrate --database-url "$url" >/dev/null
psql -q "$url" -c "CREATE FUNCTION bench_noop(p jsonb) RETURNS void LANGUAGE sql AS 'SELECT'" >/dev/null
# Jobs inserted, counted in the producer's own transactions (a sequence
# would count rows not yet committed).
psql -q "$url" -c "CREATE TABLE bench_produced (n bigint NOT NULL); INSERT INTO bench_produced VALUES (0)" >/dev/null
if [ "${TABLE_DEFAULTS:-0}" = 1 ]; then
    for t in jobs leased_jobs tx_batches; do
        psql -q "$url" -c "ALTER TABLE pgwake.$t RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold,
            autovacuum_vacuum_insert_scale_factor, autovacuum_vacuum_insert_threshold, autovacuum_analyze_scale_factor,
            autovacuum_analyze_threshold, autovacuum_vacuum_cost_delay, autovacuum_vacuum_cost_limit, fillfactor)" >/dev/null
    done
fi
settings=$(psql -qAt "$url" -c "SELECT coalesce(array_to_string(reloptions, ','), 'server defaults') FROM pg_class WHERE oid = 'pgwake.jobs'::regclass")
echo "server: $(psql -qAt "$url" -c 'SHOW server_version') shared_buffers=$(psql -qAt "$url" -c 'SHOW shared_buffers') autovacuum_naptime=$(psql -qAt "$url" -c 'SHOW autovacuum_naptime') synchronous_commit=$(psql -qAt "$url" -c 'SHOW synchronous_commit')"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); pgwake $("$pgwake" --version | awk '{print $2}'); pgwake.jobs: $settings"

inserted() { psql -qAt "$url" -c "SELECT n FROM bench_produced"; }
backlog() { psql -qAt "$url" -c "SELECT count(*) FROM pgwake.jobs"; }
topup="WITH ins AS (INSERT INTO pgwake.jobs (task) SELECT 'noop' FROM generate_series(1, greatest(0, $target - (SELECT count(*) FROM pgwake.jobs))) RETURNING 1)
      UPDATE bench_produced SET n = n + (SELECT count(*) FROM ins);"
psql -q "$url" -c "$topup" >/dev/null

"$pgwake" run --database-url "$url" --handler 'noop=sql:bench_noop' --metrics-addr 127.0.0.1:0 ${PGWAKE_RUN_ARGS:-} >"$work/worker.log" 2>&1 &
pids+=($!)
until psql -qAt "$url" -c "SELECT count(*) FROM pgwake.workers" 2>/dev/null | grep -qv '^0$'; do sleep 0.2; done

# The producer: once a second, the backlog back up to $target (one session,
# one statement).
end=$(( $(date +%s) + seconds ))
( while [ "$(date +%s)" -lt "$end" ]; do
      echo "$topup"
      sleep 1
  done ) | psql -q "$url" >/dev/null &
pids+=($!)
bench=$!
t0=$(date +%s.%N)
av0=$(psql -qAt -F ' ' "$url" -c "SELECT string_agg(relname || '=' || autovacuum_count, ' ' ORDER BY relname) FROM pg_stat_user_tables WHERE schemaname = 'pgwake' AND relname IN ('jobs', 'leased_jobs', 'tx_batches')")
printf '%6s %9s %9s %10s %s\n' t "ran/s" backlog "dead jobs" "autovacuum at work on"
prev_i=$(inserted); prev_b=$(backlog)
: > "$work/rates"
next=5
while kill -0 "$bench" 2>/dev/null; do
    now=$(date +%s.%N)
    wait_s=$(echo "$t0 + $next - $now" | bc)
    if [ "$(echo "$wait_s > 0" | bc)" = 1 ]; then sleep "$wait_s"; fi
    kill -0 "$bench" 2>/dev/null || break
    read -r i b dead vac < <(psql -qAt -F ' ' "$url" -c "
      SELECT (SELECT n FROM bench_produced), (SELECT count(*) FROM pgwake.jobs),
             (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'pgwake.jobs'::regclass),
             coalesce((SELECT string_agg(DISTINCT c.relname, ',') FROM pg_stat_progress_vacuum v JOIN pg_class c ON c.oid = v.relid
                       WHERE v.datname = current_database()), '-')")
    ran=$(( (i - prev_i) - (b - prev_b) ))
    echo "$((ran / 5))" >> "$work/rates"
    printf '%6s %9s %9s %10s %s\n' "$next" "$((ran / 5))" "$b" "$dead" "$vac"
    prev_i=$i; prev_b=$b
    next=$((next + 5))
done
wait "$bench" || true
av1=$(psql -qAt -F ' ' "$url" -c "SELECT string_agg(relname || '=' || autovacuum_count, ' ' ORDER BY relname) FROM pg_stat_user_tables WHERE schemaname = 'pgwake' AND relname IN ('jobs', 'leased_jobs', 'tx_batches')")
echo "-- autovacuum runs: before $av0; after $av1"
python3 - "$work/rates" <<'PY'
import sys
# The first 5 s are left out: the worker's pools and plans warm up.
xs = sorted(int(l) for l in open(sys.argv[1]).read().split()[1:])
if not xs:
    sys.exit("no samples")
p5 = xs[int(0.05 * (len(xs) - 1))]
med = xs[len(xs) // 2]
print(f"-- 5-second throughput over {len(xs)} samples: p5 {p5}/s, median {med}/s, min {xs[0]}/s, max {xs[-1]}/s; p5/median {p5 / med:.2f} (target >= 0.80)")
PY
