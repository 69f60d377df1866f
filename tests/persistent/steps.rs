//! Durable steps and parents' results over the protocol, with the
//! reference workers in Python and Node: a `step` message records a step
//! as `JobContext::step` does (answered with `step_recorded`), a process
//! whose hello asked for them gets the job's recorded steps and parents'
//! results in its job messages, and one that did not ask gets neither;
//! refused steps fail the attempt and lose nothing.

use crate::common::*;
use crate::support::*;

use std::path::Path;
use std::time::Duration;

use pgwake::client::{enqueue, NewJob};
use serde_json::json;

/// What a task of the reference worker wrote to `path` (whole, by rename).
async fn until_seen(path: &Path) -> serde_json::Value {
    wait_for(
        "the process to write",
        Duration::from_secs(60),
        async || match std::fs::read_to_string(path) {
            Ok(text) if text.ends_with('\n') => Ok(serde_json::from_str(&text).unwrap()),
            _ => Err("not yet".into()),
        },
    )
    .await
}

/// The reference worker's `steps` task records step "a" with a `step`
/// message and then its process kills itself (SIGKILL, the job alone in
/// flight: a failed attempt); the retry's job message carries "a" in
/// `steps`, so "a" does not run again (the ledger has one line), and "b"
/// gets its output. Both are in `pgwake.job_steps` with the attempt that
/// recorded them. (With the `step` message not recorded, or `steps` not
/// sent, the ledger has two lines and this fails.)
async fn a_recorded_step_is_not_run_again(command: String, tx: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("seen.json");
    let ledger = dir.path().join("ledger");
    let id = enqueue(
        &client,
        &NewJob::new("steps", json!({"seen": seen, "ledger": ledger})),
    )
    .await
    .unwrap();
    let w = Running::start(worker(
        &db,
        &command,
        &["steps"],
        if tx { &["steps"] } else { &[] },
        options(1),
        test_config(),
    ));
    let got = until_seen(&seen).await;
    until_drained(&db).await;
    w.shutdown().await;
    assert_eq!(
        std::fs::read_to_string(&ledger).unwrap(),
        "a\n",
        "step a ran again"
    );
    assert_eq!(
        got,
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
            ("a".to_string(), got["a"].clone(), 1),
            ("b".to_string(), json!(2), 2)
        ]
    );
}

#[tokio::test]
async fn python_lease_mode_a_recorded_step_is_not_run_again() {
    a_recorded_step_is_not_run_again(python_worker("--steps"), false).await;
}

#[tokio::test]
async fn python_tx_mode_a_recorded_step_is_not_run_again() {
    a_recorded_step_is_not_run_again(python_worker("--steps"), true).await;
}

#[tokio::test]
async fn node_lease_mode_a_recorded_step_is_not_run_again() {
    a_recorded_step_is_not_run_again(node_worker("--steps --inflight 1"), false).await;
}

#[tokio::test]
async fn node_tx_mode_a_recorded_step_is_not_run_again() {
    a_recorded_step_is_not_run_again(node_worker("--steps --inflight 1"), true).await;
}

/// A child of two `echo` parents: a process whose hello asked for them
/// (`--steps`) gets both parents' results in the job message's
/// `parent_results` (and no `steps`: it has none); one that did not ask
/// gets neither field. (With the field not sent, the first sees `null` and
/// this fails.)
async fn a_child_gets_its_parents_results_when_asked(command: String, asked: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("seen.json");
    let p1 = enqueue(&client, &NewJob::new("echo", json!({"from": "one"})))
        .await
        .unwrap();
    let p2 = enqueue(&client, &NewJob::new("echo", json!([2, "two"])))
        .await
        .unwrap();
    enqueue(
        &client,
        &NewJob::new("inputs", json!({ "seen": seen })).after([p1, p2]),
    )
    .await
    .unwrap();
    let w = Running::start(worker(
        &db,
        &command,
        &["echo", "inputs"],
        &[],
        options(1),
        test_config(),
    ));
    let got = until_seen(&seen).await;
    until_drained(&db).await;
    w.shutdown().await;
    let expected = if asked {
        json!({
            "steps": null,
            "parent_results": {
                p1.to_string(): {"result": {"from": "one"}},
                p2.to_string(): {"result": [2, "two"]},
            },
        })
    } else {
        json!({"steps": null, "parent_results": null})
    };
    assert_eq!(got, expected);
}

#[tokio::test]
async fn python_a_child_gets_its_parents_results_when_asked() {
    a_child_gets_its_parents_results_when_asked(python_worker("--steps"), true).await;
}

#[tokio::test]
async fn node_a_child_gets_its_parents_results_when_asked() {
    a_child_gets_its_parents_results_when_asked(node_worker("--steps"), true).await;
}

#[tokio::test]
async fn a_process_that_did_not_ask_gets_no_parents_results() {
    a_child_gets_its_parents_results_when_asked(python_worker(""), false).await;
}

/// Hostile `step` messages after a good step "ok", each from a job whose
/// process then answers `done` whatever `step_recorded` said: a bad name
/// (control characters), no name, an output over `STEP_OUTPUT_MAX`, the
/// name "ok" again. Each is answered with an error (no protocol error: the
/// process lives), the attempt fails (one attempt: dead, payload kept,
/// the refusal its error), and only "ok" is recorded. (With the refusal
/// not turned into the outcome, the jobs end done and this fails.)
async fn refused_steps_fail_the_attempt_and_lose_nothing(tx: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let big = "x".repeat(pgwake::STEP_OUTPUT_MAX);
    let cases = [
        (json!({"name": "a\u{1b}[2Jb", "output": 1}), "STEP_NAME_MAX"),
        (json!({"name": "", "output": 1}), "STEP_NAME_MAX"),
        (json!({"name": "big", "output": big}), "STEP_OUTPUT_MAX"),
        (
            json!({"name": "ok", "output": 2}),
            "called twice in one run",
        ),
    ];
    let mut ids = Vec::new();
    for (step, _) in &cases {
        let job = NewJob::new("bad_step", json!({ "steps": [step] })).max_attempts(1);
        ids.push(enqueue(&client, &job).await.unwrap());
    }
    let w = Running::start(worker(
        &db,
        &python_worker("--steps"),
        &["bad_step"],
        if tx { &["bad_step"] } else { &[] },
        options(1),
        test_config(),
    ));
    until_drained(&db).await;
    w.shutdown().await;
    for ((step, expected), id) in cases.iter().zip(&ids) {
        let row = client
            .query_one(
                "SELECT last_error, payload FROM pgwake.dead_jobs WHERE id = $1",
                &[id],
            )
            .await
            .unwrap_or_else(|e| panic!("{step}: not dead: {e}"));
        let error: String = row.get(0);
        assert!(
            error.contains("a step it sent was refused") && error.contains(expected),
            "{step}: {error}"
        );
        assert!(!error.contains('\u{1b}'), "{step}: not escaped: {error}");
        assert_eq!(
            row.get::<_, serde_json::Value>(1),
            json!({ "steps": [step] })
        );
        let names: Vec<String> = client
            .query("SELECT name FROM pgwake.job_steps WHERE job_id = $1", &[id])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(names, vec!["ok".to_string()], "{step}");
    }
}

#[tokio::test]
async fn lease_mode_refused_steps_fail_the_attempt_and_lose_nothing() {
    refused_steps_fail_the_attempt_and_lose_nothing(false).await;
}

#[tokio::test]
async fn tx_mode_refused_steps_fail_the_attempt_and_lose_nothing() {
    refused_steps_fail_the_attempt_and_lose_nothing(true).await;
}
