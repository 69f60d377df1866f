#!/usr/bin/env bash
# Producers' insert latency while a migration builds an index on
# pgwake.jobs holding JOBS waiting jobs (default 1,000,000): once with a
# no-transaction step (CREATE INDEX CONCURRENTLY, the online path), once
# with a plain CREATE INDEX in the migration's transaction, for contrast.
# pgbench producers insert at RATE per second (default 500) on CLIENTS
# connections (default 4) throughout; the script prints, for each way, how
# long the migration took and the p50/p99/max latency of the inserts that
# completed while it ran (and until 1 s after). Usage:
#   cargo build --example online_migration
#   scripts/bench-online-migration.sh ADMIN_URL [JOBS] [RATE] [CLIENTS]
# ADMIN_URL names a server where a database can be created and dropped
# (e.g. postgres://postgres@127.0.0.1:5432/postgres).
set -euo pipefail
export PGOPTIONS="-c client_min_messages=warning"
admin=$1; jobs=${2:-1000000}; rate=${3:-500}; clients=${4:-4}
here=$(cd "$(dirname "$0")/.." && pwd)
example="$here/target/debug/examples/online_migration"
db="pgwake_onlinemig_$$"
base=${admin%/*}
url="$base/$db"
work=$(mktemp -d)
trap 'rm -rf "$work"; psql -q "$admin" -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true' EXIT
psql -q "$admin" -c "CREATE DATABASE $db" >/dev/null
"$here/target/debug/pgwake" migrate --database-url "$url" >/dev/null
psql -q "$url" -c "INSERT INTO pgwake.jobs (task, payload, priority, run_at) SELECT 'waiting', jsonb_build_object('n', g), (hashint4(g) & 7), now() - (hashint4(g) & 4095) * interval '1 second' FROM generate_series(1, $jobs) g" \
    -c "VACUUM ANALYZE pgwake.jobs" >/dev/null
echo "server: $(psql -qAt "$url" -c 'SHOW server_version') shared_buffers=$(psql -qAt "$url" -c 'SHOW shared_buffers') maintenance_work_mem=$(psql -qAt "$url" -c 'SHOW maintenance_work_mem') synchronous_commit=$(psql -qAt "$url" -c 'SHOW synchronous_commit')"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); $jobs waiting jobs; pgbench -c $clients -R $rate"
echo "INSERT INTO pgwake.jobs (task, payload) VALUES ('produced', '{\"n\": 1}');" > "$work/insert.sql"
for way in locking online; do
    "$example" "$url" undo
    rm -f "$work"/log*
    pgbench -n -c "$clients" -j 2 -R "$rate" -T 30 -f "$work/insert.sql" -l --log-prefix="$work/log" "$url" >"$work/pgbench.out" 2>&1 &
    bench=$!
    sleep 5
    read -r _ start end took < <("$example" "$url" "$way")
    wait $bench
    python3 - "$way" "$start" "$end" "$took" "$work" <<'PY'
import glob, sys
way, start, end, took, work = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
during, all_ = [], []
for f in glob.glob(work + "/log*"):
    for line in open(f):
        c = line.split()
        lat_ms = int(c[2]) / 1000.0
        done = int(c[4]) + int(c[5]) / 1e6
        all_.append(lat_ms)
        if start <= done <= end + 1.0:
            during.append(lat_ms)
def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))] if xs else float("nan")
print(f"{way:8} migration {float(took):6.2f} s; inserts during it: {len(during):6d}, "
      f"p50 {pct(during, 50):8.1f} ms, p99 {pct(during, 99):8.1f} ms, max {max(during or [0]):8.1f} ms; "
      f"whole 30 s run p99 {pct(all_, 99):.1f} ms")
PY
done
