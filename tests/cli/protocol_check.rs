//! `pgwake protocol check COMMAND`: the reference workers pass every
//! check, and a candidate broken in one way fails the check that defends
//! that rule, names it, and exits 1. Each broken candidate is the same
//! small Python worker with one fault switched on; with none switched on
//! it passes, so each failure is the fault's.

use crate::common;

use std::path::PathBuf;
use std::process::Output;
use std::time::{Duration, Instant};

use common::{pgwake_cmd, stderr_of};

/// A conformant worker in a screenful; `argv[1]` switches on one fault.
const CANDIDATE: &str = r#"
import json, os, sys, threading, time
FAULT = sys.argv[1] if len(sys.argv) > 1 else ""
if FAULT == "no-hello":
    time.sleep(600)
inp = os.fdopen(int(os.environ["PGWAKE_PROTOCOL_IN"]), "r", encoding="utf-8")
out = os.fdopen(int(os.environ["PGWAKE_PROTOCOL_OUT"]), "w", encoding="utf-8")
lock, jobs, draining = threading.Lock(), {}, False

def send(msg):
    with lock:
        out.write(json.dumps(msg, ensure_ascii=False) + "\n")
        out.flush()

def answer(msg, reply):
    token = "wrong-" + msg["token"] if FAULT == "wrong-token" else msg["token"]
    send({**reply, "id": msg["id"], "token": token})
    with lock:
        jobs.pop(msg["id"], None)
        if draining and not jobs:
            os._exit(0)

def progress(msg):  # not a fault: a worker may report progress while a job runs
    if FAULT == "reports-progress":
        send({"type": "progress", "id": msg["id"], "token": msg["token"], "value": {"done": 0}})

def sleep(msg, stop):
    progress(msg)
    stop.wait(msg["payload"]["secs"])
    answer(msg, {"type": "done"})

send({"type": "hello", "version": 2 if FAULT == "version-2" else 1,
      "tasks": ["echo", "sleep", "crash"], "inflight": 4})
for line in inp:
    msg = json.loads(line)
    kind = msg["type"]
    if kind == "ping":
        send({"type": "pong", "seq": msg["seq"]})
    elif kind == "job" and msg["task"] == "echo":
        progress(msg)
        answer(msg, {"type": "done", "result": msg["payload"]})
    elif kind == "job" and msg["task"] == "sleep":
        stop = threading.Event()
        with lock:
            jobs[msg["id"]] = (msg["token"], stop)
        threading.Thread(target=sleep, args=(msg, stop), daemon=True).start()
    elif kind == "job" and msg["task"] == "crash":
        os._exit(3)
    elif kind == "cancel" and FAULT != "ignore-cancel":
        with lock:
            job = jobs.get(msg["id"])
        if job and job[0] == msg["token"]:
            job[1].set()
    elif kind == "drain":
        with lock:
            draining = True
            if not jobs:
                os._exit(0)
"#;

/// `pgwake protocol check ARGS…`, and how long it took.
fn check(args: &[&str]) -> (Output, Duration) {
    let t0 = Instant::now();
    let out = pgwake_cmd()
        .args(["protocol", "check"])
        .args(args)
        .output()
        .expect("run pgwake protocol check");
    (out, t0.elapsed())
}

fn stdout_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The line of check `name` in the output.
fn line<'a>(stdout: &'a str, name: &str) -> &'a str {
    let prefix = format!("{name}: ");
    stdout
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no line for check {name:?} in:\n{stdout}"))
}

/// The candidate written to a temporary file, and the check run on it with
/// `fault` (and `flags` before the command).
fn check_candidate(flags: &[&str], fault: &str) -> (Output, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("candidate.py");
    std::fs::write(&script, CANDIDATE).unwrap();
    let mut args = flags.to_vec();
    args.extend(["python3", script.to_str().unwrap(), fault]);
    check(&args)
}

fn reference_worker(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples/persistent")
        .join(name);
    assert!(
        path.is_file(),
        "the reference worker {} is missing",
        path.display()
    );
    path.to_str().unwrap().to_owned()
}

fn assert_all_pass(o: &Output) {
    let out = stdout_of(o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{}", stderr_of(o));
    for name in [
        "handshake",
        "credits",
        "ping",
        "cancel",
        "stale token",
        "oversize line",
        "drain",
        "crash",
    ] {
        assert!(line(&out, name).contains(": ok"), "{out}");
    }
    assert!(out.contains("all 8 checks passed"), "{out}");
}

#[test]
fn the_python_reference_worker_passes_every_check() {
    let (o, _) = check(&["python3", &reference_worker("worker.py")]);
    assert_all_pass(&o);
}

#[test]
fn the_node_reference_worker_passes_every_check() {
    let (o, _) = check(&["node", &reference_worker("worker.mjs")]);
    assert_all_pass(&o);
    // Several jobs at once: the Node worker's hello asks for 8.
    assert!(line(&stdout_of(&o), "credits").contains("8 echo job(s) at once"));
}

#[test]
fn the_test_candidate_passes_with_no_fault_switched_on() {
    let (o, _) = check_candidate(&[], "");
    assert_all_pass(&o);
}

/// `progress` messages are not answers: a worker that sends them while its
/// jobs run passes every check (with them taken for answers, the credits
/// check fails: "sent an unexpected progress").
#[test]
fn a_worker_that_reports_progress_passes_every_check() {
    let (o, _) = check_candidate(&[], "reports-progress");
    assert_all_pass(&o);
}

#[test]
fn a_reply_with_a_wrong_token_fails_the_credits_check_naming_the_token() {
    let (o, _) = check_candidate(&[], "wrong-token");
    let out = stdout_of(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let credits = line(&out, "credits");
    assert!(
        credits.contains("FAILED") && credits.contains("token \"wrong-"),
        "{out}"
    );
    assert!(stderr_of(&o).contains("credits"), "{}", stderr_of(&o));
}

#[test]
fn a_worker_that_ignores_cancel_fails_the_cancel_check() {
    let (o, _) = check_candidate(&["--cancel-within", "1s"], "ignore-cancel");
    let out = stdout_of(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let cancel = line(&out, "cancel");
    assert!(
        cancel.contains("FAILED") && cancel.contains("no answer for job"),
        "{out}"
    );
    assert!(line(&out, "stale token").contains("FAILED"), "{out}");
    // Checks that need no cancel still pass.
    assert!(line(&out, "credits").contains(": ok"), "{out}");
    assert!(line(&out, "crash").contains(": ok"), "{out}");
}

#[test]
fn a_worker_that_never_says_hello_fails_the_handshake_within_the_start_timeout() {
    let (o, took) = check_candidate(&["--process-start-timeout", "2s"], "no-hello");
    let out = stdout_of(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        line(&out, "handshake").contains("FAILED: no hello within 2s"),
        "{out}"
    );
    assert!(line(&out, "crash").contains("skipped"), "{out}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
}

#[test]
fn a_worker_speaking_version_2_fails_the_handshake_naming_both_versions() {
    let (o, _) = check_candidate(&[], "version-2");
    let out = stdout_of(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        line(&out, "handshake").contains("protocol version 2; pgwake speaks 1"),
        "{out}"
    );
}

#[test]
fn a_command_not_found_is_a_usage_error() {
    let (o, _) = check(&["/nonexistent/worker"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr_of(&o));
    assert!(stderr_of(&o).contains("not found"), "{}", stderr_of(&o));
    assert!(stdout_of(&o).is_empty());
}
