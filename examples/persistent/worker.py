#!/usr/bin/env python3
"""A reference persistent handler for pgwake (protocol 1, docs/src/protocol.md), standard library only.

pgwake writes one JSON object a line on fd $PGWAKE_PROTOCOL_IN; we answer on $PGWAKE_PROTOCOL_OUT.
--inflight + 1 threads take turns reading: the one that reads a job runs it and then reads on, so a
quick job costs no hand-off between threads. A job that blocks (it sleeps, calls a service, waits for
pgwake) leaves the reading to another thread, at once when it waits for pgwake, else within POLL
seconds: pings are answered and cancels seen while every job slot is busy (a silent process is
killed)."""
import argparse, json, os, queue, signal, sys, threading, traceback
POLL = 0.05  # how often the thread waiting to read checks whether the reading one runs a job

if os.environ.get("PGWAKE_PROTOCOL") != "1":  # exit 2 before the hello: a configuration error
    print(f"worker.py speaks protocol 1, PGWAKE_PROTOCOL is {os.environ.get('PGWAKE_PROTOCOL')!r}: "
          "run it with pgwake run --handler 'TASK=persistent:python3 worker.py'", file=sys.stderr)
    sys.exit(2)
parser = argparse.ArgumentParser()
parser.add_argument("--inflight", type=int, default=1, help="jobs at once (1-1024), said in the hello")
parser.add_argument("--steps", action="store_true",
                    help="ask (in the hello) for each job's recorded steps and parents' results")
ARGS = parser.parse_args()
INFLIGHT = ARGS.inflight
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

class StepRefused(Exception):
    """pgwake refused to record a step (its step_recorded error): the attempt fails whatever we answer."""

def answer(results):
    """Waits for pgwake's answer to a job's message, which the reading thread puts in `results`;
    this thread may have been the reading one: another takes over at once."""
    reader_wanted.set()
    return results.get()

class Flag:
    """Set once (a cancel), waited on with a timeout: a threading.Event, but ten times cheaper to make."""
    def __init__(self):
        self.q, self.flag = queue.SimpleQueue(), False
    def set(self):
        self.flag = True
        self.q.put(True)
    def is_set(self):
        return self.flag
    def wait(self, timeout=None):
        """True once set (at once if it is), False after `timeout` seconds if not."""
        try:
            self.flag or self.q.get(timeout=timeout)
        except queue.Empty:
            pass
        return self.flag

class Job:
    def __init__(self, msg):
        self.msg, self.cancelled, self.seq = msg, Flag(), 0
        self.sql_results, self.step_results = queue.SimpleQueue(), queue.SimpleQueue()

    def step(self, name, body):
        """A durable step: the output an earlier run recorded (the job message's "steps", sent to a
        process whose hello asked with "steps": true), else body()'s output, recorded by pgwake before
        this returns. Raises StepRefused when pgwake refuses it (a bad name, over 64 KiB of JSON...)."""
        recorded = self.msg.get("steps") or {}
        if name in recorded:
            return recorded[name]
        output = body()
        send({"type": "step", "id": self.msg["id"], "token": self.msg["token"], "name": name, "output": output})
        r = answer(self.step_results)  # the step_recorded
        if "error" in r:
            raise StepRefused(r["error"])
        return output

    def sql(self, sql, params):
        """Runs one statement in the job's claim transaction and returns its sql_result."""
        self.seq += 1
        send({"type": "sql", "id": self.msg["id"], "token": self.msg["token"], "seq": self.seq,
              "sql": sql, "params": params})
        return answer(self.sql_results)

    def progress(self, value, message=None):
        """Reports how far the job has got (shown by pgwake job show while it runs); not an answer.
        At most 4 KiB of JSON and a 200-character message, else pgwake warns and ignores it."""
        msg = {"type": "progress", "id": self.msg["id"], "token": self.msg["token"], "value": value}
        send(msg if message is None else {**msg, "message": message})

def echo(job, payload):
    print(f"echo {job.msg['id']}", flush=True)  # pgwake logs stdout and stderr, tagged with the job
    print(f"echo {job.msg['id']} on stderr", file=sys.stderr, flush=True)
    return done(payload)
def noop(job, payload):  # the benchmark's no-op
    return done()
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

def write_seen(path, seen):  # whole or not at all: the test waits for the file
    with open(path + ".tmp", "w") as f:
        f.write(json.dumps(seen) + "\n")
    os.rename(path + ".tmp", path)

def steps_task(job, p):
    """Step "a" (a line in the ledger each time its body runs), then, on attempt 1, a crash (SIGKILL)
    before step "b", which writes what the run saw to p["seen"]."""
    def a():
        with open(p["ledger"], "a") as f:
            f.write("a\n")
        return {"charge": "ch_%d" % job.msg["id"], "text": "tab\t<b> \u00e9"}
    got = job.step("a", a)
    if job.msg["attempt"] == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    job.step("b", lambda: write_seen(p["seen"], {"a": got, "recorded": sorted(job.msg.get("steps") or {})}) or 2)
    return done()

def inputs_task(job, p):  # writes the job message's steps and parent_results (absent: null) to p["seen"]
    write_seen(p["seen"], {"steps": job.msg.get("steps"), "parent_results": job.msg.get("parent_results")})
    return done()

def bad_step(job, p):
    """Records step "ok", sends the step messages of p["steps"] as they are, then answers done
    whatever pgwake said: a refused step makes the attempt fail anyway."""
    job.step("ok", lambda: 1)
    errors = []
    for m in p["steps"]:
        send({**m, "type": "step", "id": job.msg["id"], "token": job.msg["token"]})
        errors.append(answer(job.step_results).get("error"))
    return done(errors)

TASKS = {"noop": noop, "echo": echo, "sleep": sleep, "crash": crash, "fail": fail_task,
         "snooze": snooze_task, "progress": progress_task, "sql": sql, "steps": steps_task,
         "inputs": inputs_task, "bad_step": bad_step}
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

read_lock = threading.Lock()  # held by the thread reading fd 3
standby_lock = threading.Lock()  # held by the thread waiting to read next
reader_wanted = threading.Event()  # set by a job about to wait for pgwake: read its answer now

def next_job():
    """Reads until a job comes (the reading thread answers everything else at once)."""
    global draining
    for line in inp:
        msg = json.loads(line)
        if msg["type"] == "job":
            with jobs_lock:
                if not draining:
                    jobs[msg["id"]] = job = Job(msg)
                    return job
            send({**fail("draining"), "id": msg["id"], "token": msg["token"]})  # never sent after a drain
            continue
        with jobs_lock:
            job = jobs.get(msg.get("id"))
        ours = job is not None and job.msg["token"] == msg.get("token")  # else its answer crossed it
        if msg["type"] == "ping":
            send({"type": "pong", "seq": msg["seq"]})
        elif msg["type"] == "cancel" and ours:
            job.cancelled.set()
            job.sql_results.put({"error": {"message": "cancelled"}})  # if it waits for a statement
            job.step_results.put({"error": "cancelled"})  # or for a step's record
        elif msg["type"] == "sql_result" and ours:
            job.sql_results.put(msg)
        elif msg["type"] == "step_recorded" and ours:
            job.step_results.put(msg)
        elif msg["type"] == "drain":
            with jobs_lock:
                draining = True
                if not jobs:
                    quit(0)
        elif msg["type"] not in ("cancel", "sql_result", "step_recorded"):
            print(f"worker.py: ignoring a message of type {msg['type']!r}", file=sys.stderr, flush=True)
    quit(0)  # end of fd 3: pgwake is gone, stop at once

def serve():
    """Read when no other thread does, run the job read, and read on. Of the INFLIGHT + 1 threads
    (pgwake sends at most INFLIGHT jobs) one is always free to read or to watch the one reading."""
    try:
        while True:
            if not read_lock.acquire(blocking=False):  # another thread reads
                with standby_lock:  # one waiting thread watches it; the others sleep here
                    while not read_lock.acquire(blocking=False):
                        reader_wanted.wait(POLL)  # take over when the reading thread runs a job
                        reader_wanted.clear()
            try:
                job = next_job()
            finally:
                read_lock.release()
            run(job)
    except BaseException:  # a line that is not JSON, fd 4 closed...: say why and exit
        traceback.print_exc()
        quit(1)

def main():
    hello = {"type": "hello", "version": 1, "tasks": list(TASKS), "inflight": INFLIGHT}
    if ARGS.steps:  # optional fields: without them, job messages carry neither (and cost nothing)
        hello.update(steps=True, parent_results=True)
    send(hello)
    if json.loads(inp.readline() or "{}").get("type") != "welcome":  # no job comes before it
        raise RuntimeError("the first message is not a welcome")
    for _ in range(INFLIGHT):
        threading.Thread(target=serve, daemon=True).start()
    serve()

try:
    main()
except Exception:
    traceback.print_exc()
    quit(1)
