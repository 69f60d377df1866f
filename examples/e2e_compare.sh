#!/usr/bin/env bash
# End-to-end throughput of this tree against a base commit (README →
# Performance → "End to end: this tree against the tree before issue 10"):
# `pgwake bench --json` of both builds on the same machine in the same
# session, runs alternated (base, new, base, new, …), each on its own fresh
# throwaway cluster, then a table of medians (min–max) and new/base ratios.
# Jobs in the bench use no queue setting, key or rate: the figures are what
# issue 10 costs jobs that use none of it.
#
#   examples/e2e_compare.sh [base-commit]          # default 9e67cba (before issue 10)
#
#   REPS=3                 runs of each tree
#   BENCH_ARGS='…'         flags for both (default below: about 2 min per run)
#   BASE_WT=/work/wt-base  worktree for the base (created, kept; remove it with
#                          git worktree remove --force "$BASE_WT")
#   BASE_TARGET=$BASE_WT/target   its CARGO_TARGET_DIR
#   OUT=dir                keep each run's JSON there (default: a temp dir)
#   SKIP_BUILD=1           use the binaries already built
#   REPORT_ONLY=1          no build, no runs: the table of the runs in $OUT
#   BASE_BENCH_FIX=699a35e  a commit whose src/bench/ change is applied to the
#                          base worktree when the base lacks it ('' for none):
#                          the harness before it emptied pgwake.history_settings
#                          between runs, and every worker after that refused to
#                          start ("history: cannot read the setting"). Only the
#                          harness changes; the worker under test is the base's.
#
# Builds run one after the other (never two release builds at once). The
# load average is printed before and after each run: on a shared machine,
# read ratios within its noise.
set -euo pipefail
BASE=${1:-9e67cba}
REPS=${REPS:-3}
BENCH_ARGS=${BENCH_ARGS:---runs 1 --jobs 50000 --backlog-small 5000 --backlog-large 100000 --duration 5s --mode tx}
HERE=$(cd "$(dirname "$0")/.." && pwd)
BASE_WT=${BASE_WT:-$HERE/../wt-base-$BASE}
BASE_TARGET=${BASE_TARGET:-$BASE_WT/target}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
cd "$HERE"

if [ -z "${SKIP_BUILD:-}${REPORT_ONLY:-}" ]; then
    [ -d "$BASE_WT" ] || git worktree add --detach "$BASE_WT" "$BASE" >/dev/null
    fix=${BASE_BENCH_FIX-699a35e}
    if [ -n "$fix" ] && ! git merge-base --is-ancestor "$fix" "$BASE"; then
        if git diff "$fix^" "$fix" -- src/bench/ | (cd "$BASE_WT" && git apply --check - 2>/dev/null); then
            git diff "$fix^" "$fix" -- src/bench/ | (cd "$BASE_WT" && git apply -)
            echo "applied the bench harness fix of $fix to the base" >&2
        fi
    fi
    echo "building base $BASE in $BASE_WT …" >&2
    (cd "$BASE_WT" && CARGO_TARGET_DIR=$BASE_TARGET cargo build --release -q --bin pgwake)
    echo "building this tree ($(git rev-parse --short HEAD)) …" >&2
    cargo build --release -q --bin pgwake
fi
BIN_base=$BASE_TARGET/release/pgwake
BIN_new=${CARGO_TARGET_DIR:-$HERE/target}/release/pgwake
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
for rep in $(seq "$REPS"); do
    [ -z "${REPORT_ONLY:-}" ] || break
    for b in "$BIN_base" "$BIN_new"; do [ -x "$b" ] || { echo "missing $b" >&2; exit 1; }; done
    for tree in base new; do
        bin=BIN_$tree
        before=$(loadavg)
        t0=$(date +%s)
        # shellcheck disable=SC2086
        "${!bin}" bench --json $BENCH_ARGS >"$OUT/$tree-$rep.json" 2>"$OUT/$tree-$rep.log"
        echo "$tree run $rep: $(( $(date +%s) - t0 )) s, load average before $before, after $(loadavg)" >&2
        echo "$tree $rep $before / $(loadavg)" >>"$OUT/load.txt"
    done
done

python3 - "$OUT" "$REPS" "$BASE" "$(git rev-parse --short HEAD)" <<'PY'
import json, statistics, sys
out, reps, base, new = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
runs = {t: [json.load(open(f"{out}/{t}-{i}.json")) for i in range(1, reps + 1)] for t in ("base", "new")}

def figures(r):
    """(name, value, higher_is_better) of one run."""
    f = []
    for k in r["handler_kinds"]:
        f.append((f"handler kind {k['kind']}: jobs/s", k["jobs_per_s"]["median"], True))
    for m in r["modes"]:
        mode = m["mode"]
        for b in m["burn_down"]:
            f.append((f"{mode} burn-down batch {b['batch']}: worker jobs/s", b["worker_jobs_per_s"]["median"], True))
            f.append((f"{mode} burn-down batch {b['batch']}: raw claim loop jobs/s (control)", b["raw_jobs_per_s"]["median"], True))
            f.append((f"{mode} burn-down batch {b['batch']}: worker/raw", b["ratio"]["median"], True))
        p = m["idle_pickup"]["from_commit_ms"]
        f.append((f"{mode} idle pickup from commit p50 ms", p["p50"]["median"], False))
        f.append((f"{mode} idle pickup from commit p99 ms", p["p99"]["median"], False))
        # Offered at a fraction of each tree's own burn-down rate: the two
        # trees are offered different rates when their burn-downs differ.
        for s in m["steady_state"]:
            pct = round(s["fraction"] * 100)
            f.append((f"{mode} steady {pct}% of own rate: offered jobs/s", s["offered_jobs_per_s"], True))
            f.append((f"{mode} steady {pct}% of own rate: latency p50 ms", s["latency_ms"]["p50"]["median"], False))
            f.append((f"{mode} steady {pct}% of own rate: latency p99 ms", s["latency_ms"]["p99"]["median"], False))
        for v in m["backlog"]["variants"]:
            half = ", half scheduled" if v["half_future"] else ""
            f.append((f"{mode} backlog {v['waiting']:,} waiting{half}: jobs/s", v["jobs_per_s"]["median"], True))
    return f

names = [n for n, _, _ in figures(runs["base"][0])]
better = {n: h for n, _, h in figures(runs["base"][0])}
vals = {t: {n: [] for n in names} for t in runs}
for t, rs in runs.items():
    for r in rs:
        for n, v, _ in figures(r):
            if n in vals[t]:
                vals[t][n].append(v)

def fmt(x):
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.2f}"

print(f"base {base} vs new {new}: {reps} runs each, alternated; median (min–max); "
      "ratio new/base (for latencies base/new, so > 1 is better for both)")
print(f"{'figure':<62} {'base':>24} {'new':>24} {'ratio':>6}")
for n in names:
    b, w = vals["base"][n], vals["new"][n]
    if not b or not w:
        continue
    mb, mw = statistics.median(b), statistics.median(w)
    ratio = (mw / mb if better[n] else mb / mw) if mb and mw else float("nan")
    cell = lambda v, m: f"{fmt(m)} ({fmt(min(v))}–{fmt(max(v))})"
    print(f"{n:<62} {cell(b, mb):>24} {cell(w, mw):>24} {ratio:>6.3f}")
PY
echo "runs' JSON and load averages: $OUT" >&2
