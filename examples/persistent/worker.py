#!/usr/bin/env python3
"""A reference persistent handler for pgwake (protocol 1, docs/src/protocol.md), standard library only.

pgwake writes one JSON object a line on fd $PGWAKE_PROTOCOL_IN; we answer on $PGWAKE_PROTOCOL_OUT.
The main thread only reads, so pings are answered while every job slot is busy (a silent process
is killed); jobs run on a pool of --inflight threads."""
import argparse, json, os, queue, sys, threading, traceback
from concurrent.futures import ThreadPoolExecutor

if os.environ.get("PGWAKE_PROTOCOL") != "1":  # exit 2 before the hello: a configuration error
    print(f"worker.py speaks protocol 1, PGWAKE_PROTOCOL is {os.environ.get('PGWAKE_PROTOCOL')!r}: "
          "run it with pgwake run --handler 'TASK=persistent:python3 worker.py'", file=sys.stderr)
    sys.exit(2)
parser = argparse.ArgumentParser()
parser.add_argument("--inflight", type=int, default=1, help="jobs at once (1-1024), said in the hello")
INFLIGHT = parser.parse_args().inflight
if not 1 <= INFLIGHT <= 1024:
    parser.error("--inflight must be 1-1024")

inp = os.fdopen(int(os.environ["PGWAKE_PROTOCOL_IN"]), "r", encoding="utf-8")
out = os.fdopen(int(os.environ["PGWAKE_PROTOCOL_OUT"]), "w", encoding="utf-8")
out_lock = threading.Lock()  # a line is written whole: threads never interleave their bytes

def send(msg):
    with out_lock:
        out.write(json.dumps(msg, ensure_ascii=False) + "\n")
        out.flush()

def quit(status):
    sys.stdout.flush(), sys.stderr.flush()
    with out_lock:  # never cut another thread's line in half
        os._exit(status)  # at once: other job threads may still be sleeping

def done(result=None):
    return {"type": "done"} if result is None else {"type": "done", "result": result}

def fail(error, for_good=False, retry_after=None):
    msg = {"type": "fail", "error": error, "for_good": for_good}
    return msg if retry_after is None else {**msg, "retry_after": retry_after}

def snooze(after):
    """Not yet: run the job again in `after` seconds, no attempt used (at most 30 days)."""
    return {"type": "snooze", "after": after}

class Job:
    def __init__(self, msg):
        self.msg, self.cancelled, self.sql_results, self.seq = msg, threading.Event(), queue.Queue(), 0

    def sql(self, sql, params):
        """Runs one statement in the job's claim transaction and returns its sql_result."""
        self.seq += 1
        send({"type": "sql", "id": self.msg["id"], "token": self.msg["token"], "seq": self.seq,
              "sql": sql, "params": params})
        return self.sql_results.get()  # handed over by the reader thread

    def progress(self, value, message=None):
        """Reports how far the job has got (shown by pgwake job show while it runs); not an answer.
        At most 4 KiB of JSON and a 200-character message, else pgwake warns and ignores it."""
        msg = {"type": "progress", "id": self.msg["id"], "token": self.msg["token"], "value": value}
        send(msg if message is None else {**msg, "message": message})

def echo(job, payload):
    print(f"echo {job.msg['id']}", flush=True)  # pgwake logs stdout and stderr, tagged with the job
    print(f"echo {job.msg['id']} on stderr", file=sys.stderr, flush=True)
    return done(payload)
def sleep(job, payload):
    return fail("cancelled") if job.cancelled.wait(float(payload["secs"])) else done()
def crash(job, payload):
    os._exit(1)  # a poison job: pgwake charges it to this job only if it was alone in flight
def fail_task(job, p):
    return fail(p.get("error", "failed"), p.get("for_good", False), p.get("retry_after"))

def snooze_task(job, p):
    return snooze(p.get("secs", 60))

def progress_task(job, p):  # reports its payload's value and message, then sleeps like `sleep`
    job.progress(p.get("value"), p.get("message"))
    return fail("cancelled") if job.cancelled.wait(float(p.get("secs", 0))) else done()

def sql(job, payload):
    if not job.msg.get("tx"):
        return fail("task sql needs tx mode (--tx-tasks sql)", for_good=True)
    results = []
    for st in payload["statements"]:
        r = job.sql(st["sql"], st.get("params", []))
        if "error" in r:  # the transaction is aborted for this job: stop, fail, it rolls back
            return fail(r["error"]["message"])
        results.append({"rows": r.get("rows", []), "rows_affected": r.get("rows_affected")})
    return fail("failed on purpose after its statements") if payload.get("fail") else done(results)

TASKS = {"echo": echo, "sleep": sleep, "crash": crash, "fail": fail_task, "snooze": snooze_task,
         "progress": progress_task, "sql": sql}
jobs, jobs_lock, draining = {}, threading.Lock(), False  # jobs in flight by id

def run(job):
    msg = job.msg
    try:
        handler = TASKS.get(msg["task"])
        reply = handler(job, msg["payload"]) if handler else fail(f"unknown task {msg['task']!r}", True)
    except Exception:
        reply = fail(traceback.format_exc().strip().splitlines()[-1])
    send({**reply, "id": msg["id"], "token": msg["token"]})
    with jobs_lock:
        del jobs[msg["id"]]
        if draining and not jobs:
            quit(0)

def main():
    global draining
    pool = ThreadPoolExecutor(max_workers=INFLIGHT)
    send({"type": "hello", "version": 1, "tasks": list(TASKS), "inflight": INFLIGHT})
    if json.loads(inp.readline() or "{}").get("type") != "welcome":  # no job comes before it
        raise RuntimeError("the first message is not a welcome")
    for line in inp:  # ends when pgwake closes fd 3 (it is gone): then stop at once
        msg = json.loads(line)
        with jobs_lock:
            job = jobs.get(msg.get("id"))
        ours = job is not None and job.msg["token"] == msg.get("token")  # else its answer crossed it
        if msg["type"] == "ping":
            send({"type": "pong", "seq": msg["seq"]})
        elif msg["type"] == "job":
            with jobs_lock:
                if draining:  # never sent after a drain; answer rather than leave it hanging
                    send({**fail("draining"), "id": msg["id"], "token": msg["token"]})
                    continue
                jobs[msg["id"]] = job = Job(msg)
            pool.submit(run, job)
        elif msg["type"] == "cancel" and ours:
            job.cancelled.set()
            job.sql_results.put({"error": {"message": "cancelled"}})  # if it waits for a statement
        elif msg["type"] == "sql_result" and ours:
            job.sql_results.put(msg)
        elif msg["type"] == "drain":
            with jobs_lock:
                draining = True
                if not jobs:
                    quit(0)
        elif msg["type"] not in ("cancel", "sql_result"):
            print(f"worker.py: ignoring a message of type {msg['type']!r}", file=sys.stderr, flush=True)
    quit(0)

try:
    main()
except Exception:
    traceback.print_exc()
    quit(1)
