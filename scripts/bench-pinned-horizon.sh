#!/usr/bin/env bash
# A queue under a pinned vacuum horizon (issue 35, item 1): pgbench
# producers insert RATE jobs per second (default 1,500) on 2 connections, a
# worker at its defaults runs them with a `sql` no-op handler, for UNPINNED
# seconds (default 60); then a session opens a REPEATABLE READ transaction,
# takes its snapshot and sits idle in it for PINNED seconds (default 180),
# and the producers go on for 10 s after it ends. Every 5 s the script
# prints the worker's pickup latency (from the INSERT statement to the
# handler, mean and max), the backlog, and the dead tuples of the queue
# tables; at the end, per phase, the producers' insert rate and latency
# (mean, p99, max: the insert's own, INSERT and COMMIT, and pgbench's, from
# the insert's scheduled time), the same figures, the mean server time of the statements that
# cost the most time (pg_stat_statements, when the server preloads it), and
# what the producers' sessions waited on (pg_stat_activity sampled every
# 100 ms on one session: WAL flushes, the NOTIFY commit lock, a core).
# Usage:
#   cargo build --release
#   scripts/bench-pinned-horizon.sh ADMIN_URL [RATE] [UNPINNED] [PINNED] [PGWAKE]
# ADMIN_URL names a server where a database can be created and dropped
# (e.g. postgres://postgres@127.0.0.1:5432/postgres); PGWAKE, the binary
# (default target/release/pgwake). Extra worker flags: PGWAKE_RUN_ARGS;
# QUEUES=n inserts into n queues instead of one; NO_PIN=1 holds no
# transaction in the "pinned" phase (a control); CLIENTS=n, on n
# connections instead of 2 (at 1,500/s and about 1 ms an insert, two
# connections are busy most of the time, and an insert scheduled while its
# connection still runs the one before waits for it: pgbench counts that
# wait in its latency from the scheduled time).
# CSV=path also writes the 5-second figures (worker and producers) there,
# for scripts/plot-pinned-horizon.py.
set -euo pipefail
export PGOPTIONS="-c client_min_messages=warning"
# The server's own psql where there is one: Debian's /usr/bin/psql is a Perl
# wrapper that costs about 60 ms of CPU a call (the binary about 6 ms), and
# the script calls it every 5 s and several times at each phase boundary,
# on the machine it measures.
real_psql=$(ls /usr/lib/postgresql/*/bin/psql 2>/dev/null | sort -V | tail -1 || true)
if [ -n "$real_psql" ]; then psql() { "$real_psql" "$@"; }; fi
clients=${CLIENTS:-2}
admin=$1; rate=${2:-1500}; unpinned=${3:-60}; pinned=${4:-180}
here=$(cd "$(dirname "$0")/.." && pwd)
pgwake=${5:-$here/target/release/pgwake}
db="pgwake_pinned_$$"
url="${admin%/*}/$db"
work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    psql -q "$admin" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
    if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$work"/log* "$work"/worker.log "$KEEP"/ 2>/dev/null; fi
    rm -rf "$work"
}
trap cleanup EXIT
psql -q "$admin" -c "CREATE DATABASE $db" >/dev/null
"$pgwake" migrate --database-url "$url" >/dev/null
psql -q "$url" <<'SQL' >/dev/null
-- The pickup of every job: from its INSERT statement (the payload's t) to
-- the handler, in the claim transaction (rolled back with it, so only
-- runs that commit count). Unlogged: no WAL beside the queue's own.
-- BRIN on `at`: the script's 5-second reads take the last rows only (a
-- scan of the whole table every 5 s, 240,000 rows by the end, was CPU the
-- producers then waited for).
CREATE UNLOGGED TABLE bench_pickup (at timestamptz NOT NULL DEFAULT clock_timestamp(), seconds float8 NOT NULL, job_id bigint NOT NULL);
CREATE INDEX ON bench_pickup USING brin (at) WITH (pages_per_range = 8);
CREATE FUNCTION bench_noop(payload jsonb, job_id bigint, attempt int) RETURNS void LANGUAGE sql AS
  $$INSERT INTO bench_pickup (seconds, job_id) VALUES (extract(epoch FROM clock_timestamp()) - (payload->>'t')::float8, job_id)$$;
SQL
stats=$(psql -qAt "$url" -c "SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'" 2>/dev/null || echo 0)
if [ "$stats" = 0 ] && psql -qAt "$url" -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null 2>&1 \
   && psql -qAt "$url" -c "SELECT 1 FROM pg_stat_statements LIMIT 1" >/dev/null 2>&1; then stats=1; fi
echo "server: $(psql -qAt "$url" -c 'SHOW server_version') shared_buffers=$(psql -qAt "$url" -c 'SHOW shared_buffers') synchronous_commit=$(psql -qAt "$url" -c 'SHOW synchronous_commit') autovacuum_naptime=$(psql -qAt "$url" -c 'SHOW autovacuum_naptime') pg_stat_statements=$stats"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); pgwake $("$pgwake" --version | awk '{print $2}'); pgbench -c $clients -R $rate; $unpinned s unpinned, $pinned s pinned, 10 s after"

# Metrics on a port of its own (the default 9187 may be another worker's).
"$pgwake" run --database-url "$url" --handler 'noop=sql:bench_noop' --metrics-addr 127.0.0.1:0 ${PGWAKE_RUN_ARGS:-} >"$work/worker.log" 2>&1 &
pids+=($!)
worker=$!
until psql -qAt "$url" -c "SELECT count(*) FROM pgwake.workers" 2>/dev/null | grep -qv '^0$'; do sleep 0.2; done

# QUEUES=n spreads the inserts over n queues (q1 … qn, at random; default:
# the one queue "default"): a worker over every queue then claims them
# fairly, one queue per statement.
if [ "${QUEUES:-1}" -gt 1 ]; then
    echo "INSERT INTO pgwake.jobs (queue, task, payload) VALUES ('q' || (1 + floor(random() * ${QUEUES}))::int, 'noop', jsonb_build_object('t', extract(epoch FROM clock_timestamp())));" > "$work/insert.sql"
else
    echo "INSERT INTO pgwake.jobs (task, payload) VALUES ('noop', jsonb_build_object('t', extract(epoch FROM clock_timestamp())));" > "$work/insert.sql"
fi
total=$((unpinned + pinned + 10))
nice -n "${PRODUCERS_NICE:-0}" pgbench -n -c "$clients" -j 2 -R "$rate" -T "$total" -f "$work/insert.sql" -l --log-prefix="$work/log" "$url" >"$work/pgbench.out" 2>&1 &
pids+=($!)
bench=$!
t0=$(date +%s.%N)

# The machine's and the server's counters at each phase boundary: CPU
# (/proc/stat: busy and total jiffies), WAL (pg_stat_wal: records, full-page
# images, bytes, flushes) and commits, printed per phase at the end.
mark() {
    local cpu wal
    cpu=$(awk '/^cpu / {busy = $2 + $3 + $4 + $7 + $8; print busy, busy + $5 + $6}' /proc/stat)
    wal=$(psql -qAt -F ' ' "$url" -c "SELECT wal_records, wal_fpi, wal_bytes, wal_sync, (SELECT sum(xact_commit) FROM pg_stat_database) FROM pg_stat_wal")
    echo "$1 $(date +%s.%N) $cpu $wal $(awk '{print $14 + $15}' "/proc/$worker/stat")" >> "$work/marks"
}
reset_stats() { [ "$stats" = 1 ] && psql -qAt "$url" -c "SELECT pg_stat_statements_reset()" >/dev/null; true; }
top_statements() {
    [ "$stats" = 1 ] || return 0
    psql -qAt -F ' | ' "$url" -c "SELECT calls, round(mean_exec_time::numeric, 3) AS mean_ms, round(total_exec_time::numeric) AS total_ms, left(regexp_replace(query, '\s+', ' ', 'g'), 90)
                                   FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                                   ORDER BY total_exec_time DESC LIMIT 6" | sed 's/^/    /'
    # The longest single executions: a statement that holds a core for
    # tens of milliseconds delays the producers' inserts queued meanwhile.
    echo "    (longest single executions: calls | max ms | mean ms | statement)"
    psql -qAt -F ' | ' "$url" -c "SELECT calls, round(max_exec_time::numeric, 1), round(mean_exec_time::numeric, 3), left(regexp_replace(query, '\s+', ' ', 'g'), 90)
                                   FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                                   ORDER BY max_exec_time DESC LIMIT 5" | sed 's/^/    /'
}
# The backlog: the jobs after the last one that ran 5 s ago, counted by
# their ids (jobs run about in id order; one left behind for longer shows
# in the pickup maximum and in the count at the end). Counting the whole
# table walked every dead row a held horizon keeps, 190,000 at the end of
# a pinned phase, every 5 s: a burst of server time the producers waited
# for at each sample.
sample() {
    psql -qAt -F ' ' "$url" -c "
      SELECT (SELECT count(*) FROM pgwake.jobs WHERE id > coalesce((
                  SELECT max(job_id) FROM bench_pickup
                  WHERE at BETWEEN now() - interval '6 s' AND now() - interval '5 s'), 0)),
             (SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relid = 'pgwake.jobs'::regclass),
             (SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relid IN ('pgwake.leased_jobs'::regclass, 'pgwake.tx_batches'::regclass)),
             p.n, p.mean, p.max
      FROM (SELECT count(*) AS n, round(coalesce(avg(seconds), 0)::numeric * 1000, 1) AS mean,
                   round(coalesce(max(seconds), 0)::numeric * 1000, 1) AS max
            FROM bench_pickup WHERE at > now() - interval '5 s') p"
}
printf '%6s %7s %9s %8s %9s %11s %10s %9s\n' t phase "ran/s" "pickup" "pickupmax" backlog "dead jobs" "dead other"
phase=unpinned
echo "$phase" > "$work/phase"
# What the producers wait on, every 100 ms, through one psql session.
(while kill -0 "$bench" 2>/dev/null; do
    echo "SELECT '$(cat "$work/phase")', state, coalesce(wait_event_type, 'CPU'), coalesce(wait_event, '-') FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'pgbench';"
    sleep 0.1
done | psql -qAt -F ' ' "$url" > "$work/waits" 2>/dev/null) &
pids+=($!)
reset_stats
mark unpinned
next=5
while kill -0 "$bench" 2>/dev/null; do
    now=$(date +%s.%N)
    wait_s=$(echo "$t0 + $next - $now" | bc)
    if [ "$(echo "$wait_s > 0" | bc)" = 1 ]; then sleep "$wait_s"; fi
    kill -0 "$bench" 2>/dev/null || break
    if [ "$next" -eq "$unpinned" ]; then
        mark pinned
        echo "-- top statements, unpinned:"; top_statements; reset_stats
        # NO_PIN=1: the same phases without the pin (a control: what the
        # script's own work at the boundary costs the producers).
        pin="BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pgwake.workers;"
        [ -n "${NO_PIN:-}" ] && pin="SELECT 1;"
        ( echo "SET application_name = 'pinning-session'; $pin"; sleep "$pinned"; echo "COMMIT;" ) \
            | psql -q "$url" >/dev/null 2>&1 &
        pids+=($!)
        phase=pinned
        echo "$phase" > "$work/phase"
    fi
    if [ "$next" -eq $((unpinned + pinned)) ]; then
        mark after
        echo "-- top statements, pinned:"; top_statements; reset_stats
        phase=after
        echo "$phase" > "$work/phase"
    fi
    read -r backlog dead_jobs dead_other ran pickup pickup_max < <(sample)
    printf '%6s %7s %9s %8s %9s %11s %10s %9s\n' "$next" "$phase" "$((ran / 5))" "$pickup" "$pickup_max" "$backlog" "$dead_jobs" "$dead_other"
    echo "$next $phase $((ran / 5)) $pickup $dead_jobs" >> "$work/samples"
    next=$((next + 5))
done
wait "$bench" || true
mark end
echo "-- jobs waiting when the producers stopped (every one, counted once): $(psql -qAt "$url" -c "SELECT count(*) FROM pgwake.jobs")"
python3 - "$work/marks" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1])]
for a, b in zip(rows, rows[1:]):
    if a[0] == "after":
        break
    secs = float(b[1]) - float(a[1])
    d = [float(y) - float(x) for x, y in zip(a[2:], b[2:])]
    busy, total, records, fpi, wal_bytes, syncs, commits, worker = d
    print(f"-- {a[0]}: CPU {100 * busy / total:.0f}% busy (the worker process {worker / secs:.0f}% of a core), WAL {wal_bytes / secs / 1e6:.2f} MB/s "
          f"({records / secs:.0f} records/s, {fpi / secs:.0f} full-page images/s), "
          f"{syncs / secs:.0f} WAL flushes/s, {commits / secs:.0f} commits/s (every database)")
PY
echo "-- producers (pgbench): $(grep -E 'tps|latency average' "$work/pgbench.out" | tr '\n' ' ')"
for p in unpinned pinned; do
    echo "-- producers' sessions, $p (share of samples: state, wait event):"
    awk -v p="$p" '$1 == p {n++; c[$2 " " $3 " " $4]++} END {for (k in c) printf "    %5.1f%%  %s\n", 100 * c[k] / n, k}' "$work/waits" | sort -rn | head -6
done
python3 - "$t0" "$unpinned" "$pinned" "$rate" "$work" <<'PY'
import glob, os, sys
t0, unpinned, pinned, rate, work = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
# pgbench -R logs each insert's latency from its scheduled time and its
# schedule lag (how late it started): the insert itself, INSERT and COMMIT
# as a producer's own session sees them, is the difference. The lag is the
# load generator's: an insert waits for its connection's earlier ones and
# for the pgbench thread to get a core (on a small machine shared with the
# server and the worker, most of it).
inserts = []  # (done, own latency ms, latency from the schedule ms)
for f in glob.glob(work + "/log*"):
    for line in open(f):
        c = line.split()
        lat, lag = int(c[2]) / 1000.0, int(c[6]) / 1000.0
        inserts.append((int(c[4]) + int(c[5]) / 1e6 - t0, lat - lag, lat))
def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))] if xs else float("nan")
def figures(xs):
    return f"mean {sum(xs) / max(1, len(xs)):6.2f} ms, p99 {pct(xs, 99):7.2f} ms, max {max(xs or [0]):8.1f} ms"
for name, lo, hi in (("unpinned", 5, unpinned), ("pinned", unpinned, unpinned + pinned)):
    own = [o for d, o, _ in inserts if lo <= d < hi]
    sched = [l for d, _, l in inserts if lo <= d < hi]
    print(f"-- inserts, {name}: {len(own) / (hi - lo):7.0f}/s of {rate:.0f}; the insert (INSERT and COMMIT): {figures(own)}; "
          f"from its scheduled time (pgbench's latency): {figures(sched)}")
# With CSV=path: every 5 s, the worker's figures beside the producers'
# (inserts done in those 5 s and their latency p99, from the schedule and
# the insert's own), for a plot.
if os.environ.get("CSV"):
    buckets = {}
    for done, own, lat in inserts:
        buckets.setdefault(int(done // 5) * 5 + 5, []).append((own, lat))
    with open(os.environ["CSV"], "w") as out:
        out.write("t,phase,ran_per_s,pickup_ms,dead_jobs,inserts_per_s,insert_p99_ms,insert_own_p99_ms\n")
        for line in open(work + "/samples"):
            t, phase, ran, pickup, dead = line.split()
            xs = buckets.get(int(t), [])
            out.write(f"{t},{phase},{ran},{pickup},{dead},{len(xs) / 5:.0f},"
                      f"{pct([l for _, l in xs], 99):.2f},{pct([o for o, _ in xs], 99):.2f}\n")
PY
psql -qAt -F ' ' "$url" -c "
  SELECT '-- pickup, ' || phase || ': mean ' || round(avg(seconds)::numeric * 1000, 1) || ' ms, p99 ' ||
         round((percentile_cont(0.99) WITHIN GROUP (ORDER BY seconds))::numeric * 1000, 1) || ' ms, max ' ||
         round(max(seconds)::numeric * 1000, 1) || ' ms, ' || count(*) || ' jobs'
  FROM (SELECT CASE WHEN at < to_timestamp($t0 + $unpinned) THEN 'unpinned'
                    WHEN at < to_timestamp($t0 + $unpinned + $pinned) THEN 'pinned' ELSE 'after' END AS phase, seconds
        FROM bench_pickup WHERE at > to_timestamp($t0 + 5)) p
  GROUP BY phase ORDER BY min(seconds) IS NULL, phase DESC"
