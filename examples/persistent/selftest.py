#!/usr/bin/env python3
"""Checks a persistent-handler worker against protocol v1 without pgwake (a developer tool).

    python3 examples/persistent/selftest.py python3 examples/persistent/worker.py --inflight 4
    python3 examples/persistent/selftest.py node examples/persistent/worker.mjs

Plays pgwake's side: starts the command with fd 3 (pgwake -> process) and fd 4 (process ->
pgwake) as pipes, does the handshake and sends the reference workers' tasks (echo, sleep,
fail, crash, sql), cancels, pings and a drain, checking each reply. Every line the worker
writes must be one JSON object with a known type, and a reply must carry its job's id and
token and come once. Exits 1 if a check failed. See docs/src/protocol.md.
"""
import fcntl, json, os, queue, subprocess, sys, threading, time

COMMAND = sys.argv[1:]
if not COMMAND:
    sys.exit(__doc__)
TYPES = {"hello", "done", "fail", "pong", "sql"}
failures = []


def check(ok, what, detail="", quiet=False):
    """Prints the check (a quiet one only when it fails)."""
    if not (ok and quiet):
        print(f"{'ok  ' if ok else 'FAIL'}  {what}" + ("" if ok else f": {detail}"))
    if not ok:
        failures.append(what)
    return ok


class Worker:
    """One process of COMMAND, with pgwake's view of it."""

    def __init__(self, protocol="1"):
        to_r, self.to_w = os.pipe()
        from_r, from_w = os.pipe()
        # The child's ends above fd 10, so moving them to 3 and 4 overwrites neither.
        child_in = fcntl.fcntl(to_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_out = fcntl.fcntl(from_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_r), os.close(from_w)
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
        if protocol is not None:
            env["PGWAKE_PROTOCOL"] = protocol
        env.update(PGWAKE_PROTOCOL_IN="3", PGWAKE_PROTOCOL_OUT="4", PGWAKE_PROCESS="0")
        # A small Python wrapper puts them at 3 and 4, then execs COMMAND (same pid).
        at_3_and_4 = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
                      "os.execvp(sys.argv[3], sys.argv[3:])")
        self.proc = subprocess.Popen([sys.executable, "-c", at_3_and_4, str(child_in), str(child_out), *COMMAND],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env, pass_fds=(child_in, child_out), start_new_session=True)
        os.close(child_in), os.close(child_out)
        self.out = os.fdopen(self.to_w, "w", encoding="utf-8")
        self.messages, self.backlog = queue.Queue(), []
        self.stdout, self.stderr = [], []
        self.replied = set()  # (id, token) of the jobs answered
        threading.Thread(target=self._read, args=(os.fdopen(from_r, "rb"),), daemon=True).start()
        for stream, lines in ((self.proc.stdout, self.stdout), (self.proc.stderr, self.stderr)):
            threading.Thread(target=lambda s=stream, l=lines: l.extend(s), daemon=True).start()

    def _read(self, f):
        for line in f:
            try:
                msg = json.loads(line)
                assert isinstance(msg, dict) and msg.get("type") in TYPES, "not a known message"
                assert line.endswith(b"\n")
            except Exception as e:
                check(False, "every line is a JSON object with a known type", f"{line!r}: {e}")
                continue
            if msg["type"] in ("done", "fail"):
                key = (msg.get("id"), msg.get("token"))
                check(key not in self.replied, "one reply per job", f"second reply {msg}", quiet=True)
                self.replied.add(key)
            self.messages.put(msg)

    def send(self, **msg):
        self.out.write(json.dumps(msg) + "\n")
        self.out.flush()

    def expect(self, pred, what, timeout=5.0):
        """The first message `pred` accepts, within `timeout` seconds; others wait their turn."""
        for i, msg in enumerate(self.backlog):
            if pred(msg):
                return self.backlog.pop(i)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = self.messages.get(timeout=left)
            except queue.Empty:
                break
            if pred(msg):
                return msg
            self.backlog.append(msg)
        check(False, what, f"nothing within {timeout}s (other messages: {self.backlog})")
        return None

    def handshake(self):
        hello = self.expect(lambda m: m["type"] == "hello", "hello", timeout=10)
        if hello:
            check(hello.get("version") == 1, "hello: version 1", hello)
            check({"echo", "sleep", "crash", "fail", "sql"} <= set(hello.get("tasks", [])),
                  "hello: serves echo, sleep, crash, fail, sql", hello)
            check(isinstance(hello.get("inflight", 1), int) and 1 <= hello.get("inflight", 1) <= 1024,
                  "hello: inflight 1..1024", hello)
        self.inflight = (hello or {}).get("inflight", 1)
        self.send(type="welcome", version=1, process=0, ping_interval_ms=5000, future_field=True)

    def job(self, id, task, payload, tx=False):
        token = f"tok-{id}-{time.monotonic_ns()}"
        self.send(type="job", id=id, token=token, task=task, queue="default", payload=payload,
                  attempt=1, max_attempts=25, deadline="2099-01-01T00:00:00.000Z", tx=tx, unknown=1)
        return token

    def reply(self, id, token, what, timeout=5.0):
        msg = self.expect(lambda m: m["type"] in ("done", "fail") and m.get("id") == id, what, timeout)
        if msg:
            check(msg.get("token") == token, f"{what}: carries the job's token", msg, quiet=True)
        return msg or {}

    def exited(self, timeout):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self):
        if self.exited(0) is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        check(not self.backlog and self.messages.empty(), "no stray message",
              self.backlog + list(self.messages.queue))


def main():
    print(f"== {' '.join(COMMAND)}")
    for protocol in ("2", None):
        w = Worker(protocol)
        status = w.exited(10)
        time.sleep(0.1)  # the stderr thread's last lines
        check(status == 2 and w.stderr, f"PGWAKE_PROTOCOL={protocol}: exit 2 with a message on stderr",
              f"status {status}, stderr {w.stderr}")

    w = Worker()
    w.handshake()

    payload = {"text": "héllo ☃", "n": [1, 2.5, None, True, -7], "nested": {"a": {"b": []}}, "big": 2**52}
    token = w.job(1, "echo", payload)
    r = w.reply(1, token, "echo: answers")
    check(r.get("type") == "done" and r.get("result") == payload, "echo: done with the payload", r)
    time.sleep(0.2)
    check(b"echo 1\n" in w.stdout, "echo: 'echo 1' on stdout", w.stdout)
    check(any(b"1" in line for line in w.stderr), "echo: a line on stderr", w.stderr)

    token = w.job(2, "fail", {"error": "boom", "for_good": True, "retry_after": 30})
    r = w.reply(2, token, "fail: answers")
    check(r.get("type") == "fail" and r.get("error") == "boom" and r.get("for_good") is True
          and r.get("retry_after") == 30, "fail: error, for_good and retry_after as asked", r)
    token = w.job(3, "fail", {"error": "try again"})
    r = w.reply(3, token, "fail: answers")
    check(r.get("type") == "fail" and not r.get("for_good") and "retry_after" not in r,
          "fail: not for good, no retry_after by default", r)
    token = w.job(4, "no-such-task", {})
    r = w.reply(4, token, "unknown task: answers")
    check(r.get("type") == "fail" and r.get("for_good") is True, "unknown task: fail for good", r)
    token = w.job(5, "fail", None)  # payload.get on null: the handler throws
    r = w.reply(5, token, "handler exception: answers")
    check(r.get("type") == "fail" and isinstance(r.get("error"), str) and r["error"],
          "handler exception: fail with the error's text", r)

    # Pings are answered while every slot is busy.
    tokens = {10 + i: w.job(10 + i, "sleep", {"secs": 1.0}) for i in range(w.inflight)}
    time.sleep(0.2)
    started = time.monotonic()
    w.send(type="ping", seq=7)
    check(w.expect(lambda m: m == {"type": "pong", "seq": 7}, "pong") is not None
          and time.monotonic() - started < 0.5, "ping: pong within 0.5 s while every slot sleeps")
    for id, token in tokens.items():
        r = w.reply(id, token, f"sleep {id}: answers")
        check(r.get("type") == "done", f"sleep {id}: done", r)
    check(time.monotonic() - started < 1.7, f"{w.inflight} sleeps of 1 s ran at once (inflight)")

    token = w.job(20, "sleep", {"secs": 30})
    time.sleep(0.2)
    w.send(type="cancel", id=20, token=token, reason="cancelled")
    r = w.reply(20, token, "cancel: sleep answers within 2 s", timeout=2)
    check(r.get("type") == "fail" and r.get("error") == "cancelled", "cancel: fail 'cancelled'", r)

    statements = [{"sql": "INSERT INTO t(x) VALUES ($1) RETURNING id", "params": [42]},
                  {"sql": "SELECT $1::jsonb AS j", "params": [{"k": [1]}]}]
    for id, extra, want in ((30, {}, "done"), (31, {"fail": True}, "fail")):
        token = w.job(id, "sql", {"statements": statements, **extra}, tx=True)
        results = []
        for seq, st in enumerate(statements, 1):
            m = w.expect(lambda m: m["type"] == "sql" and m.get("id") == id, f"sql {id}: statement {seq}")
            if not m:
                break
            check(m.get("token") == token and m.get("seq") == seq and m.get("sql") == st["sql"]
                  and m.get("params") == st["params"], f"sql {id}: statement {seq} as given", m)
            result = {"rows": [{"id": seq, "x": "42"}], "rows_affected": 1}
            results.append(result)
            w.send(type="sql_result", id=id, token=token, seq=m.get("seq"), **result)
        r = w.reply(id, token, f"sql {id}: answers")
        check(r.get("type") == want and (want == "fail" or r.get("result") == results),
              f"sql {id}: {want}" + (" with every statement's result" if want == "done" else ""), r)

    token = w.job(32, "sql", {"statements": statements}, tx=True)
    m = w.expect(lambda m: m["type"] == "sql" and m.get("id") == 32, "sql error: statement 1")
    w.send(type="sql_result", id=32, token=token, seq=(m or {}).get("seq"),
           error={"message": "duplicate key value", "code": "23505"})
    r = w.reply(32, token, "sql error: answers")
    check(r.get("type") == "fail" and "duplicate key" in r.get("error", ""), "sql error: fail with its message", r)

    token = w.job(33, "sql", {"statements": statements}, tx=True)
    w.expect(lambda m: m["type"] == "sql" and m.get("id") == 33, "sql cancel: statement 1")
    w.send(type="cancel", id=33, token=token, reason="timeout")
    r = w.reply(33, token, "sql cancel: answers within 2 s", timeout=2)
    check(r.get("type") in ("done", "fail"), "sql cancel: answered while waiting for its sql_result", r)
    token = w.job(34, "sql", {"statements": statements}, tx=False)
    r = w.reply(34, token, "sql without tx: answers")
    check(r.get("type") == "fail" and r.get("for_good") is True, "sql without tx: fail for good, no sql sent", r)

    # Drain: the job in flight is answered, pings still are, then exit 0.
    token = w.job(40, "sleep", {"secs": 0.5})
    time.sleep(0.1)
    w.send(type="drain")
    w.send(type="ping", seq=8)
    w.expect(lambda m: m == {"type": "pong", "seq": 8}, "drain: pings still answered")
    r = w.reply(40, token, "drain: the job in flight is answered")
    check(r.get("type") == "done", "drain: the job in flight is done", r)
    check(w.exited(5) == 0, "drain: exit status 0 once no job is in flight", w.proc.returncode)
    w.stop()

    w = Worker()
    w.handshake()
    w.send(type="drain")
    check(w.exited(5) == 0, "drain while idle: exit status 0 at once", w.proc.returncode)
    w.stop()

    w = Worker()
    w.handshake()
    w.job(50, "crash", {})
    check(w.exited(5) == 1, "crash: exit status 1", w.proc.returncode)
    w.stop()

    w = Worker()
    w.handshake()
    w.job(60, "sleep", {"secs": 30})
    w.out.close()  # pgwake is gone
    check(w.exited(5) is not None, "fd 3 closed (pgwake gone): the worker exits, even with a job in flight",
          "still running after 5 s")
    w.stop()

    print(f"== {len(failures)} failed" if failures else "== all checks passed")
    sys.exit(1 if failures else 0)


main()
