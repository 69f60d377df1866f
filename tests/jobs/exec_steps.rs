//! `exec` commands and durable steps and flows: a child reads its parents'
//! results from the file named by `PGWAKE_PARENT_RESULTS`, a job's
//! recorded steps reach its next run in the file named by `PGWAKE_STEPS`,
//! and a `pgwake-step:` stderr line records a step as `JobContext::step`
//! does; each in both delivery modes, with real `python3` commands.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};
use pgwake::{Worker, WorkerConfig};
use serde_json::json;

fn config(lease: bool) -> WorkerConfig {
    WorkerConfig {
        lease_queues: if lease {
            vec!["default".into()]
        } else {
            vec![]
        },
        ..test_config()
    }
}

/// A worker running `handlers` (`task=exec:…` flags), in tx mode unless
/// `lease`.
fn start(db: &TestDb, lease: bool, handlers: &[String]) -> Running {
    let mut builder = Worker::builder(db.config()).config(config(lease));
    for flag in handlers {
        let (task, h) = pgwake::handlers::parse_flag(flag).unwrap();
        let h = if lease {
            h
        } else {
            pgwake::handlers::with_delivery(h, pgwake::Delivery::Tx)
        };
        builder = builder.handler_arc(&task, h);
    }
    Running::start(builder.build().unwrap())
}

/// Write `text` as an executable script `name` in `dir`; its path.
fn script(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// What a child command saw, as it wrote it to `seen.json` beside it.
async fn until_seen(path: &Path) -> serde_json::Value {
    wait_for(
        "the child command to write",
        Duration::from_secs(60),
        async || match std::fs::read_to_string(path) {
            Ok(text) if text.ends_with('\n') => Ok(serde_json::from_str(&text).unwrap()),
            _ => Err("not yet".into()),
        },
    )
    .await
}

/// A child of two `exec` parents (whose stdout, JSON, is their result)
/// reads both results from the file named by `PGWAKE_PARENT_RESULTS`, in
/// a directory of mode 0700 that is gone once the run ended; a job without
/// parents or steps gets neither variable. (With the variable not set, the
/// child sees `null` and this fails.)
async fn an_exec_child_reads_its_parents_results(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("seen.json");
    let child = script(
        dir.path(),
        "child.py",
        &format!(
            r#"import json, os, stat, sys
seen = {{"vars": sorted(k for k in os.environ if k in ("PGWAKE_STEPS", "PGWAKE_PARENT_RESULTS"))}}
p = os.environ.get("PGWAKE_PARENT_RESULTS")
if p:
    seen["parents"] = json.load(open(p))
    seen["dir"] = os.path.dirname(p)
    seen["mode"] = oct(stat.S_IMODE(os.stat(os.path.dirname(p)).st_mode))
tmp = {seen:?} + ".%d.tmp" % os.getpid()  # the two children may run at once
with open(tmp, "w") as f:
    f.write(json.dumps(seen) + "\n")
os.rename(tmp, {seen:?} + (".lone" if "lone" in sys.stdin.read() else ""))
"#,
            seen = seen.display().to_string()
        ),
    );
    let p1 = enqueue(&client, &NewJob::new("parent", json!({"from": "one"})))
        .await
        .unwrap();
    let p2 = enqueue(&client, &NewJob::new("parent", json!({"from": ["two", 2]})))
        .await
        .unwrap();
    enqueue(&client, &NewJob::new("child", json!({})).after([p1, p2]))
        .await
        .unwrap();
    enqueue(&client, &NewJob::new("child", json!("lone")))
        .await
        .unwrap();
    let w = start(
        &db,
        lease,
        &[
            "parent=exec:cat".to_string(),
            format!("child=exec:python3 {child}"),
        ],
    );
    let got = until_seen(&seen).await;
    let lone = until_seen(&dir.path().join("seen.json.lone")).await;
    until_drained(&db).await;
    w.shutdown().await;
    assert_eq!(
        got["parents"],
        json!({
            p1.to_string(): {"result": {"from": "one"}},
            p2.to_string(): {"result": {"from": ["two", 2]}},
        }),
        "{got}"
    );
    assert_eq!(got["vars"], json!(["PGWAKE_PARENT_RESULTS"]), "{got}");
    assert_eq!(got["mode"], json!("0o700"), "{got}");
    let run_dir = got["dir"].as_str().unwrap();
    assert!(!Path::new(run_dir).exists(), "{run_dir} is left behind");
    assert_eq!(lone, json!({"vars": []}));
}

#[tokio::test]
async fn tx_mode_an_exec_child_reads_its_parents_results() {
    an_exec_child_reads_its_parents_results(false).await;
}

#[tokio::test]
async fn lease_mode_an_exec_child_reads_its_parents_results() {
    an_exec_child_reads_its_parents_results(true).await;
}

/// The `python3` command of the step tests: step "a" (appending a line to
/// `ledger` each time its body runs) unless `PGWAKE_STEPS` has it, recorded
/// with a `pgwake-step:` line; on the first run it then kills itself with
/// SIGKILL (mid-way: before step "b"); step "b" gets "a"'s output,
/// whether it ran or came from the file, and writes what it saw to `seen`.
fn steps_command(dir: &Path) -> String {
    script(
        dir,
        "steps.py",
        &format!(
            r#"import json, os, signal, sys
recorded = {{}}
if os.environ.get("PGWAKE_STEPS"):
    recorded = json.load(open(os.environ["PGWAKE_STEPS"]))
def step(name, body):
    if name in recorded:
        return recorded[name]
    out = body()
    sys.stderr.write("pgwake-step: %s %s\n" % (name, json.dumps(out)))
    sys.stderr.flush()
    return out
def a():
    with open({ledger:?}, "a") as f:
        f.write("a\n")
    return {{"charge": "ch_" + os.environ["PGWAKE_JOB_ID"], "text": "tab\t<b> \u00e9"}}
got = step("a", a)
if os.environ["PGWAKE_ATTEMPT"] == "1":
    os.kill(os.getpid(), signal.SIGKILL)
def b():
    with open({seen:?} + ".tmp", "w") as f:
        f.write(json.dumps({{"a": got, "recorded": sorted(recorded)}}) + "\n")
    os.rename({seen:?} + ".tmp", {seen:?})
    return 2
step("b", b)
"#,
            ledger = dir.join("ledger").display().to_string(),
            seen = dir.join("seen.json").display().to_string(),
        ),
    )
}

/// A command records step "a" with a `pgwake-step:` line and is killed
/// (SIGKILL, by itself) before step "b": the retry gets "a"'s output in
/// the file named by `PGWAKE_STEPS` and does not run it again (the ledger
/// has one "a"), then records "b"; both are in `pgwake.job_steps` with the
/// attempt that recorded them. (With the line not recorded, or the file
/// not given, the ledger has two "a" and this fails.)
async fn an_exec_commands_recorded_step_is_not_run_again(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let dir = tempfile::tempdir().unwrap();
    let command = steps_command(dir.path());
    let id = enqueue(&client, &NewJob::new("steps", json!({})))
        .await
        .unwrap();
    let w = start(&db, lease, &[format!("steps=exec:python3 {command}")]);
    let seen = until_seen(&dir.path().join("seen.json")).await;
    until_drained(&db).await;
    w.shutdown().await;
    assert_eq!(
        std::fs::read_to_string(dir.path().join("ledger")).unwrap(),
        "a\n",
        "step a ran again"
    );
    assert_eq!(
        seen,
        json!({"a": {"charge": format!("ch_{id}"), "text": "tab\t<b> é"}, "recorded": ["a"]})
    );
    let steps: Vec<(String, serde_json::Value, i32)> = client
        .query(
            "SELECT name, output, attempt FROM pgwake.job_steps WHERE job_id = $1 ORDER BY name",
            &[&id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        steps,
        vec![
            ("a".to_string(), seen["a"].clone(), 1),
            ("b".to_string(), json!(2), 2)
        ]
    );
}

#[tokio::test]
async fn tx_mode_an_exec_commands_recorded_step_is_not_run_again() {
    an_exec_commands_recorded_step_is_not_run_again(false).await;
}

#[tokio::test]
async fn lease_mode_an_exec_commands_recorded_step_is_not_run_again() {
    an_exec_commands_recorded_step_is_not_run_again(true).await;
}

/// Hostile `pgwake-step:` lines, each from a command that then exits 0
/// after recording a good step "ok": a bad name (a control character), an
/// output over `STEP_OUTPUT_MAX`, a line over `STEP_LINE_MAX`, an output
/// that is not JSON, bytes that are not UTF-8, no output, the same name
/// twice. Each makes the attempt fail with the documented refusal (one
/// attempt: the job is dead, its payload kept, the refusal its error);
/// the good step is recorded, nothing else is. (With the refusal not
/// turned into the outcome, the jobs end done and this fails.)
async fn hostile_step_lines_fail_the_attempt_and_lose_nothing(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let dir = tempfile::tempdir().unwrap();
    let command = script(
        dir.path(),
        "hostile.py",
        r#"import json, sys
case = json.load(sys.stdin)["case"]
out = sys.stderr.buffer
out.write(b"pgwake-step: ok 1\n")
line = {
    "bad name": b'pgwake-step: a\x1b[2Jb {"x": 1}',
    "too large": b'pgwake-step: big "' + b"x" * 65535 + b'"',
    "too long": b'pgwake-step: long "' + b"x" * 70000 + b'"',
    "not json": b"pgwake-step: nj {oops",
    "odd bytes": b'pgwake-step: odd "\xff\xfe"',
    "no output": b"pgwake-step: empty",
    "twice": b"pgwake-step: ok 2",
}[case]
out.write(line + b"\n")
out.flush()
"#,
    );
    let cases = [
        ("bad name", "STEP_NAME_MAX"),
        ("too large", "STEP_OUTPUT_MAX"),
        ("too long", "STEP_LINE_MAX"),
        ("not json", "not one JSON value"),
        ("odd bytes", "not UTF-8"),
        ("no output", "no output"),
        ("twice", "called twice in one run"),
    ];
    let mut ids = Vec::new();
    for (case, _) in cases {
        let job = NewJob::new("hostile", json!({ "case": case })).max_attempts(1);
        ids.push(enqueue(&client, &job).await.unwrap());
    }
    let w = start(&db, lease, &[format!("hostile=exec:python3 {command}")]);
    until_drained(&db).await;
    w.shutdown().await;
    for ((case, expected), id) in cases.iter().zip(&ids) {
        let row = client
            .query_one(
                "SELECT last_error, payload FROM pgwake.dead_jobs WHERE id = $1",
                &[id],
            )
            .await
            .unwrap_or_else(|e| panic!("{case}: not dead: {e}"));
        let error: String = row.get(0);
        assert!(
            error.contains("refused a pgwake-step: line") && error.contains(expected),
            "{case}: {error}"
        );
        assert!(!error.contains('\u{1b}'), "{case}: not escaped: {error}");
        assert_eq!(row.get::<_, serde_json::Value>(1), json!({ "case": case }));
        let names: Vec<String> = client
            .query("SELECT name FROM pgwake.job_steps WHERE job_id = $1", &[id])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(names, vec!["ok".to_string()], "{case}");
    }
}

#[tokio::test]
async fn tx_mode_hostile_step_lines_fail_the_attempt_and_lose_nothing() {
    hostile_step_lines_fail_the_attempt_and_lose_nothing(false).await;
}

#[tokio::test]
async fn lease_mode_hostile_step_lines_fail_the_attempt_and_lose_nothing() {
    hostile_step_lines_fail_the_attempt_and_lose_nothing(true).await;
}
