#!/usr/bin/env python3
"""Drain throughput of pgwake against graphile-worker and pg-boss, the peers
that run here (River, Oban and solid_queue need Go, Elixir and Ruby
packages from registries this project does not use).

Each round gives every system a fresh database holding JOBS no-op jobs
(enqueued with its own API, not timed), starts its worker with CONCURRENCY,
and times the drain from the outside: from the first poll that sees a job
gone to the poll that sees none left (polled every 20 ms). Systems take
turns within a round, so a busy machine slows them alike; read the ratios.

  scripts/bench-peers.py ADMIN_URL [--jobs 50000] [--rounds 3]
                         [--concurrency 8] [--pgwake target/release/pgwake]

ADMIN_URL: a server where databases can be created and dropped (e.g.
postgres://postgres@127.0.0.1:5432/postgres). The peers are installed with
npm into ~/.cache/pgwake-bench-peers (pinned versions below, with the Node
22 they need from npm's `node` package).

Systems:
  pgwake-sql    pgwake run, a `sql` no-op handler (tx mode, its fast path)
  pgwake-node   pgwake run, a persistent Node handler answering `done`
                (lease mode; scripts/peers/noop-worker.mjs, one process)
  graphile      graphile-worker's runner, its defaults, concurrency C
  pg-boss       pg-boss work(), localConcurrency C, batches of 100 fetched
                back to back (its defaults fetch one job per 2 s poll)

Needs psycopg2 (Debian's python3-psycopg2: run it with /usr/bin/python3).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.parse

import psycopg2

PEERS = {"graphile-worker": "0.18.0", "pg-boss": "12.38.0", "node": "22", "pg": "8"}
HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.path.expanduser("~/.cache/pgwake-bench-peers")


def install_peers():
    stamp = os.path.join(CACHE, "installed.json")
    if os.path.exists(stamp) and json.load(open(stamp)) == PEERS:
        return
    os.makedirs(CACHE, exist_ok=True)
    specs = [f"{name}@{version}" for name, version in PEERS.items()]
    print(f"installing {' '.join(specs)} into {CACHE} …", file=sys.stderr)
    subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", CACHE, *specs],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    json.dump(PEERS, open(stamp, "w"))


def node():
    return os.path.join(CACHE, "node_modules", ".bin", "node")


def admin_do(admin, *statements):
    c = psycopg2.connect(admin)
    c.autocommit = True
    for statement in statements:
        c.cursor().execute(statement)
    c.close()


def db_url(admin, name):
    p = urllib.parse.urlsplit(admin)
    return urllib.parse.urlunsplit(p._replace(path="/" + name))


class System:
    def __init__(self, name, remaining_sql):
        self.name, self.remaining_sql = name, remaining_sql


def peer(*argv):
    # NODE_PATH: peers.mjs lives in the tree, its packages in the cache.
    env = dict(os.environ, NODE_PATH=os.path.join(CACHE, "node_modules"))
    script = os.path.join(CACHE, "peers.mjs")  # beside node_modules, so imports resolve
    return [node(), script, *argv], env


def prepare(system, url, args):
    """Schema and JOBS waiting jobs; returns the worker's command and env."""
    if system.name.startswith("pgwake"):
        subprocess.run([args.pgwake, "migrate", "--database-url", url], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        c = psycopg2.connect(url)
        with c, c.cursor() as cur:
            cur.execute("CREATE FUNCTION public.noop(p jsonb) RETURNS void LANGUAGE sql AS ''")
            cur.execute("INSERT INTO pgwake.jobs (task) SELECT 'noop' FROM generate_series(1, %s)",
                        (args.jobs,))
        c.close()
        handler = ("noop=sql:public.noop" if system.name == "pgwake-sql" else
                   f"noop=persistent:{node()} {HERE}/peers/noop-worker.mjs {args.concurrency}")
        return [args.pgwake, "run", "--database-url", url, "--metrics-addr", "127.0.0.1:0",
                "--concurrency", str(args.concurrency), "--handler", handler], dict(os.environ)
    kind = "graphile" if system.name == "graphile" else "pgboss"
    cmd, env = peer(kind, "enqueue", url, str(args.jobs))
    subprocess.run(cmd, env=env, check=True)
    cmd, env = peer(kind, "work", url, str(args.concurrency))
    return cmd, env


def drain(system, admin, args):
    name = f"bench_peers_{os.getpid()}"
    admin_do(admin, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", f"CREATE DATABASE {name}")
    url = db_url(admin, name)
    try:
        cmd, env = prepare(system, url, args)
        admin_do(url, "VACUUM ANALYZE")
        poll = psycopg2.connect(url)
        poll.autocommit = True
        cur = poll.cursor()

        def remaining():
            cur.execute(system.remaining_sql)
            return cur.fetchone()[0]

        assert remaining() == args.jobs, f"{system.name}: {remaining()} waiting, not {args.jobs}"
        worker = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        t0 = n0 = None
        deadline = time.monotonic() + args.timeout
        while True:
            left = remaining()
            now = time.monotonic()
            if t0 is None and left < args.jobs:
                t0, n0 = now, left
            if left == 0:
                break
            if worker.poll() is not None:
                raise SystemExit(f"{system.name} exited: {worker.stderr.read().decode()[-2000:]}")
            if now > deadline:
                worker.kill()
                raise SystemExit(f"{system.name}: {left} jobs left after {args.timeout} s")
            time.sleep(0.02)
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
        poll.close()
        return n0 / (now - t0) if now > t0 else float("nan")
    finally:
        admin_do(admin, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("admin_url")
    ap.add_argument("--jobs", type=int, default=50000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--pgwake", default="target/release/pgwake")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--only", help="comma-separated systems")
    args = ap.parse_args()
    install_peers()
    # peers.mjs beside the packages, so that its imports resolve.
    with open(os.path.join(HERE, "peers", "peers.mjs")) as src, \
         open(os.path.join(CACHE, "peers.mjs"), "w") as dst:
        dst.write(src.read())
    systems = [
        System("pgwake-sql", "SELECT (SELECT count(*) FROM pgwake.jobs) + (SELECT count(*) FROM pgwake.leased_jobs)"),
        System("pgwake-node", "SELECT (SELECT count(*) FROM pgwake.jobs) + (SELECT count(*) FROM pgwake.leased_jobs)"),
        System("graphile", "SELECT count(*) FROM graphile_worker._private_jobs"),
        System("pg-boss", "SELECT count(*) FROM pgboss.job WHERE state IN ('created', 'retry', 'active')"),
    ]
    if args.only:
        systems = [s for s in systems if s.name in args.only.split(",")]
    rates = {s.name: [] for s in systems}
    print(f"# {args.jobs} no-op jobs, concurrency {args.concurrency}, {args.rounds} rounds, "
          f"{os.cpu_count()} cores; load {open('/proc/loadavg').read().split()[:3]}")
    for r in range(args.rounds):
        for s in systems:
            rate = drain(s, args.admin_url, args)
            rates[s.name].append(rate)
            print(json.dumps({"round": r + 1, "system": s.name, "jobs_per_s": round(rate)}), flush=True)
    base = statistics.median(rates[systems[0].name])
    print(f"\n{'system':<12} {'median jobs/s':>14} {'min–max':>16} {'÷ ' + systems[0].name:>14}")
    for s in systems:
        m = statistics.median(rates[s.name])
        print(f"{s.name:<12} {m:>14.0f} {min(rates[s.name]):>7.0f}–{max(rates[s.name]):<8.0f} {m / base:>14.2f}")
    print(f"# load after {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
