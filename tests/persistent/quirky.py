#!/usr/bin/env python3
"""A persistent handler that misbehaves on purpose, for pgwake's tests: each
--mode breaks one rule of the protocol (docs/src/protocol.md). Task `pid`
answers done with its process id and the job's keys (so does `grow`, after keeping `mib` MiB);
with no mode it behaves."""
import json, os, sys, threading, time

args = sys.argv[1:]
mode = args[args.index("--mode") + 1] if "--mode" in args else "good"
inflight = int(args[args.index("--inflight") + 1]) if "--inflight" in args else 1
out = os.fdopen(int(os.environ["PGWAKE_PROTOCOL_OUT"]), "w")
inp = os.fdopen(int(os.environ["PGWAKE_PROTOCOL_IN"]), "r")
lock = threading.Lock()

def send(msg):
    with lock:
        out.write(json.dumps(msg) + "\n")
        out.flush()

if mode == "exit-at-once":
    print("cannot import the app: no module named 'app'", file=sys.stderr, flush=True)
    sys.exit(3)
if mode == "no-hello":
    time.sleep(3600)
send({"type": "hello", "version": 2 if mode == "version2" else 1, "tasks": ["*"], "inflight": inflight})
inp.readline()  # welcome
flag = os.environ.get("MARKER")  # a file created once, so that a mode misbehaves only once
first = flag is not None and not os.path.exists(flag)
if first:
    open(flag, "w").close()
if mode == "crash-loop" and not first:
    sys.exit(1)  # every start after the first dies right after its hello

hoard = []  # what task `grow` keeps
threads = []

def answer(msg):
    payload = msg["payload"]
    if msg["task"] == "grow":
        hoard.append(bytearray(payload["mib"] * 1024 * 1024))
    if msg["task"] == "sleep" or (isinstance(payload, dict) and "secs" in payload):
        time.sleep(payload["secs"])
    send({"type": "done", "id": msg["id"], "token": msg["token"],
          "result": {"pid": os.getpid(), "keys": msg.get("keys"), "traceparent": msg.get("traceparent")}})

for line in inp:
    msg = json.loads(line)
    kind = msg["type"]
    if kind == "ping":
        if mode != "silent":
            send({"type": "pong", "seq": msg["seq"]})
        continue
    if kind == "drain":  # finish the jobs in flight, then exit
        for t in threads:
            t.join()
        out.flush()
        os._exit(0)
    if kind == "cancel":
        continue  # a stubborn process: it never answers a cancel
    if kind != "job":
        continue
    if first and mode == "garbage":
        with lock:
            out.write("this is not json\n"); out.flush()
        continue
    if first and mode == "flood":
        with lock:
            out.write("x" * (4 * 1024 * 1024)); out.flush()
        continue
    if first and mode == "unknown-type":
        send({"type": "launch", "id": msg["id"]})
        continue
    if first and mode == "never-given":
        send({"type": "done", "id": msg["id"] + 1000000, "token": msg["token"]})
        continue
    if first and mode == "duplicate":
        send({"type": "done", "id": msg["id"], "token": msg["token"], "result": {"pid": os.getpid()}})
        send({"type": "done", "id": msg["id"], "token": msg["token"], "result": {"pid": os.getpid()}})
        first = False
        continue
    if mode == "stale" and first:
        send({"type": "done", "id": msg["id"], "token": "not-" + msg["token"]})
        first = False
    if mode == "silent" and first:
        first = False
        continue  # never answers this job, nor pings: pgwake must kill it
    t = threading.Thread(target=answer, args=(msg,), daemon=True)
    t.start()
    threads.append(t)
