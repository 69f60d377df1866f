//! Flows (issue 36, items 1 and 2; docs/src/flows.md): a job with parents
//! is held until every parent has ended done and runs once after them, in
//! both delivery modes; a parent that ends dead or cancelled applies each
//! child's policy down the graph, and `pgwake dead retry` of it undoes
//! that; bad parents and bad graphs are refused with nothing inserted; the
//! rescuer's sweep releases a child whose release was missed; a kill -9 of
//! a worker in the middle of a chain leaves nothing held.

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use pgwake::client::{enqueue, NewJob, ParentFailure};
use pgwake::{async_trait, BoxError, Handler, Job, JobContext, Outcome, Worker, WorkerConfig};

/// One run: (job id, task, started, ended).
type Run = (i64, String, Instant, Instant);

/// Every run, written by the handler.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<Vec<Run>>>);

/// Records each run; a task named `fail` fails while `failing` is set.
struct Timed {
    runs: Runs,
    failing: Arc<std::sync::atomic::AtomicBool>,
}

#[async_trait]
impl Handler for Timed {
    async fn handle(&self, job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let started = Instant::now();
        // Some work, so that a child released too early overlaps it.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let failed = job.task == "fail" && self.failing.load(std::sync::atomic::Ordering::SeqCst);
        self.runs
            .0
            .lock()
            .unwrap()
            .push((job.id, job.task.clone(), started, Instant::now()));
        if failed {
            Err("the parent fails".into())
        } else {
            Ok(Outcome::Done)
        }
    }
}

fn config(lease: bool) -> WorkerConfig {
    WorkerConfig {
        lease_queues: if lease {
            vec!["default".into()]
        } else {
            vec![]
        },
        concurrency: 8,
        ..test_config()
    }
}

fn start(
    db: &TestDb,
    lease: bool,
    runs: &Runs,
    failing: bool,
) -> (Running, Arc<std::sync::atomic::AtomicBool>) {
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(failing));
    let mut builder = Worker::builder(db.config()).config(config(lease));
    for task in ["work", "fail"] {
        builder = builder.handler(
            task,
            Timed {
                runs: runs.clone(),
                failing: failing.clone(),
            },
        );
    }
    (Running::start(builder.build().unwrap()), failing)
}

async fn held_and_waiting(db: &TestDb) -> (i64, i64) {
    let c = db.client().await;
    let r = c
        .query_one(
            "SELECT count(*) FILTER (WHERE held), count(*) FROM pgwake.jobs",
            &[],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1))
}

async fn until_no_job_left(db: &TestDb) {
    wait_for("every job to end", Duration::from_secs(60), async || {
        let left: i64 = db
            .scalar("SELECT (SELECT count(*) FROM pgwake.jobs) + (SELECT count(*) FROM pgwake.leased_jobs)")
            .await;
        if left == 0 {
            Ok(())
        } else {
            Err(format!("{left} jobs left"))
        }
    })
    .await;
}

/// Three parents fan in to `c`; `c` is the parent of `d` (a chain): every
/// child starts after each of its parents' handlers ended, every job runs
/// once, none is left held. (With add_parents' UPDATE no longer setting
/// `held`, no job is held at enqueue: the first check fails, (0, 25).)
async fn children_run_after_their_parents_and_once(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let mut parents = Vec::new();
    for _ in 0..3 {
        parents.push(
            enqueue(&client, &NewJob::new("work", serde_json::json!({})))
                .await
                .unwrap(),
        );
    }
    let c = enqueue(
        &client,
        &NewJob::new("work", serde_json::json!({})).after(parents.clone()),
    )
    .await
    .unwrap();
    let d = enqueue(
        &client,
        &NewJob::new("work", serde_json::json!({})).after([c]),
    )
    .await
    .unwrap();
    // Many unrelated jobs beside them, for the workers' slots.
    let others = insert_jobs(&db, "work", 20).await;
    assert_eq!(held_and_waiting(&db).await, (2, 25));

    let runs = Runs::default();
    let (w, _) = start(&db, lease, &runs, false);
    until_no_job_left(&db).await;
    w.shutdown().await;

    let runs = runs.0.lock().unwrap().clone();
    let mut by_id: HashMap<i64, (Instant, Instant)> = HashMap::new();
    for (id, _, s, e) in &runs {
        assert!(
            by_id.insert(*id, (*s, *e)).is_none(),
            "job {id} ran twice: {runs:?}"
        );
    }
    for id in parents.iter().chain([&c, &d]).chain(others.iter()) {
        assert!(by_id.contains_key(id), "job {id} never ran");
    }
    for p in &parents {
        assert!(
            by_id[&c].0 > by_id[p].1,
            "c started before its parent {p} ended"
        );
    }
    assert!(by_id[&d].0 > by_id[&c].1, "d started before c ended");
    let edges: i64 = db.scalar("SELECT count(*) FROM pgwake.job_parents").await;
    assert_eq!(
        edges, 4,
        "the edges stay until the sweep finds their children gone"
    );
}

#[tokio::test]
async fn tx_mode_children_run_after_their_parents_and_once() {
    children_run_after_their_parents_and_once(false).await;
}

#[tokio::test]
async fn lease_mode_children_run_after_their_parents_and_once() {
    children_run_after_their_parents_and_once(true).await;
}

/// The commit that ends a parent releases its child, with no worker and no
/// rescuer running: tx mode, the claim transaction's commit (the child is
/// still held while that transaction is open); lease mode, the completion
/// statement (the lease claim's commit only moves the flag). (With the
/// *_release_children triggers dropped, the child is still held after the
/// commit in both modes.)
async fn the_parents_end_releases_the_child_in_its_commit(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let parent = enqueue(&client, &NewJob::new("t", serde_json::json!({})))
        .await
        .unwrap();
    let child = enqueue(
        &client,
        &NewJob::new("t", serde_json::json!({})).after([parent]),
    )
    .await
    .unwrap();
    let observer = db.client().await;
    let held = async || -> bool {
        observer
            .query_one("SELECT held FROM pgwake.jobs WHERE id = $1", &[&child])
            .await
            .unwrap()
            .get(0)
    };
    if lease {
        let rows = claim_lease_all(&client, "w").await;
        assert_eq!(rows.len(), 1, "only the parent is claimable");
        let token: i64 = rows[0].get(12);
        assert!(held().await, "the lease claim is not the parent's end");
        pgwake::internal::sql::Db::unnamed(&client)
            .query(&pgwake::internal::sql::LEASE_DONE, &[&vec![token]])
            .await
            .unwrap();
    } else {
        client.batch_execute("BEGIN").await.unwrap();
        let rows = claim_tx_all(&client).await;
        assert_eq!(rows.len(), 1, "only the parent is claimable");
        assert!(held().await, "the parent runs: the child waits");
        client.batch_execute("COMMIT").await.unwrap();
    }
    assert!(!held().await, "the parent's commit released its child");
}

#[tokio::test]
async fn tx_mode_the_parents_end_releases_the_child_in_its_commit() {
    the_parents_end_releases_the_child_in_its_commit(false).await;
}

#[tokio::test]
async fn lease_mode_the_parents_end_releases_the_child_in_its_commit() {
    the_parents_end_releases_the_child_in_its_commit(true).await;
}

/// A parent that ends dead: its `cancel` child and that child's own child
/// are cancelled at the same commit (with the reason among their errors);
/// its `run` child runs; its `wait` child stays held. `pgwake dead retry`
/// of the parent brings back the cancelled two, held for it; once it is
/// done all three run. (With cancel_children doing nothing, the cancel
/// child stays held and the first state check fails; with revive_parent
/// returning at once, the cancelled children stay dead and never run.)
async fn a_failed_parent_applies_each_policy_and_dead_retry_undoes_it(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let parent = enqueue(
        &client,
        &NewJob::new("fail", serde_json::json!({})).max_attempts(1),
    )
    .await
    .unwrap();
    let child = |policy| {
        NewJob::new("work", serde_json::json!({}))
            .after([parent])
            .on_parent_failure(policy)
    };
    let cancelled = enqueue(&client, &child(ParentFailure::Cancel))
        .await
        .unwrap();
    let grandchild = enqueue(
        &client,
        &NewJob::new("work", serde_json::json!({})).after([cancelled]),
    )
    .await
    .unwrap();
    let runs_anyway = enqueue(&client, &child(ParentFailure::Run)).await.unwrap();
    let waits = enqueue(&client, &child(ParentFailure::Wait)).await.unwrap();

    let runs = Runs::default();
    let (w, failing) = start(&db, lease, &runs, true);
    let ran = |id: i64| runs.0.lock().unwrap().iter().any(|r| r.0 == id);
    wait_for("the run child ran", Duration::from_secs(30), async || {
        if ran(runs_anyway) {
            Ok(())
        } else {
            Err("not yet".into())
        }
    })
    .await;
    let state = |id: i64| {
        let client = &client;
        async move {
            client
                .query_one(
                    "SELECT CASE WHEN EXISTS (SELECT 1 FROM pgwake.jobs WHERE id = $1 AND held) THEN 'held'
                                 WHEN EXISTS (SELECT 1 FROM pgwake.dead_jobs WHERE id = $1) THEN
                                      (SELECT last_error FROM pgwake.dead_jobs WHERE id = $1)
                                 ELSE 'other' END",
                    &[&id],
                )
                .await
                .unwrap()
                .get::<_, String>(0)
        }
    };
    assert!(state(parent).await.starts_with("the parent fails"));
    assert_eq!(state(cancelled).await, "cancelled");
    assert_eq!(state(grandchild).await, "cancelled");
    assert_eq!(state(waits).await, "held");
    let reason: String = client
        .query_one(
            "SELECT error FROM pgwake.job_errors WHERE job_id = $1",
            &[&cancelled],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(reason, format!("cancelled: parent {parent} ended dead"));
    assert!(!ran(cancelled) && !ran(grandchild) && !ran(waits));

    failing.store(false, std::sync::atomic::Ordering::SeqCst);
    let revived = pgwake::admin::dead::retry(
        &client,
        &pgwake::admin::dead::Selection {
            ids: Some(vec![parent]),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(revived, vec![parent]);
    until_no_job_left(&db).await;
    w.shutdown().await;
    let runs = runs.0.lock().unwrap().clone();
    let end_of = |id: i64| {
        runs.iter()
            .filter(|r| r.0 == id)
            .map(|r| r.3)
            .max()
            .unwrap()
    };
    let start_of = |id: i64| {
        runs.iter()
            .find(|r| r.0 == id)
            .map(|r| r.2)
            .unwrap_or_else(|| panic!("job {id} never ran: {runs:?}"))
    };
    for kid in [cancelled, waits] {
        assert!(
            start_of(kid) > end_of(parent),
            "{kid} ran before its parent's retry ended"
        );
    }
    assert!(start_of(grandchild) > end_of(cancelled));
    let dead: i64 = db.scalar("SELECT count(*) FROM pgwake.dead_jobs").await;
    assert_eq!(dead, 0);
}

#[tokio::test]
async fn tx_mode_a_failed_parent_applies_each_policy_and_dead_retry_undoes_it() {
    a_failed_parent_applies_each_policy_and_dead_retry_undoes_it(false).await;
}

#[tokio::test]
async fn lease_mode_a_failed_parent_applies_each_policy_and_dead_retry_undoes_it() {
    a_failed_parent_applies_each_policy_and_dead_retry_undoes_it(true).await;
}

/// The SQL error of `sql`, which must fail.
async fn refused(client: &tokio_postgres::Client, sql: &str) -> String {
    let e = client.batch_execute(sql).await.expect_err(sql);
    e.as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_else(|| e.to_string())
}

/// pgwake.flow enqueues a graph in one call, parents first, and returns
/// the ids by name; a cycle is refused naming it, a malformed node with
/// its index and name, and nothing is inserted. (With the cycle check
/// removed the loop inserts the acyclic part and returns: no error.)
#[tokio::test]
async fn flow_enqueues_a_graph_and_refuses_cycles_and_malformed_nodes_inserting_nothing() {
    let db = migrated_db().await;
    let client = db.client().await;
    let cases = [
        (
            r#"[{"name":"a","task":"t"},{"name":"b","task":"t","after":["a","c"]},{"name":"c","task":"t","after":["b"]}]"#,
            r#"pgwake.flow: the graph has a cycle: "b" waits for "c" waits for "b""#,
        ),
        (
            r#"[{"name":"a","task":"t"},{"name":"b"}]"#,
            r#"pgwake.flow: node 1 (name "b") needs a "task" string"#,
        ),
        (
            r#"[{"name":"a","task":"t","atfer":["x"]}]"#,
            r#"pgwake.flow: node 0 (name "a"): unknown field "atfer""#,
        ),
        (
            r#"[{"name":"a","task":"t"},{"name":"a","task":"t"}]"#,
            r#"pgwake.flow: node 1 (name "a"): the name is already used by node 0"#,
        ),
        (
            r#"[{"name":"a","task":"t","after":["zz"]}]"#,
            r#"pgwake.flow: node 0 (name "a"): "after" names "zz", which is no node of this flow"#,
        ),
        (
            r#"[{"task":"t"}]"#,
            r#"pgwake.flow: node 0 needs a "name": a string of 1 to 128 bytes"#,
        ),
    ];
    for (graph, message) in cases {
        let got = refused(&client, &format!("SELECT pgwake.flow('{graph}')")).await;
        assert_eq!(got, message, "{graph}");
    }
    let jobs: i64 = db.scalar("SELECT count(*) FROM pgwake.jobs").await;
    assert_eq!(jobs, 0, "a refused flow inserts nothing");

    let ids: serde_json::Value = client
        .query_one(
            r#"SELECT pgwake.flow('[{"name":"merge","task":"t","after":["a","b"]},
                                    {"name":"a","task":"t"},{"name":"b","task":"t","after":["a"]}]')"#,
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let id = |n: &str| ids[n].as_i64().unwrap();
    assert!(
        id("a") < id("b") && id("b") < id("merge"),
        "parents first: {ids}"
    );
    let rows = client
        .query(
            "SELECT id, held, parents_open FROM pgwake.jobs ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    let got: Vec<(i64, bool, i32)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        got,
        vec![
            (id("a"), false, 0),
            (id("b"), true, 1),
            (id("merge"), true, 2)
        ]
    );
}

/// Parents that would leave a child held forever are refused, in the
/// enqueue's transaction, naming the parent; more than 1,000 parents are
/// refused with the bound; a job enqueued before cannot be given parents.
/// (With the dead-parent check removed, the child
/// of a dead parent is inserted held and the first assertion fails.)
#[tokio::test]
async fn parents_that_would_hold_a_child_forever_are_refused() {
    let db = migrated_db().await;
    let client = db.client().await;
    let dead = enqueue(&client, &NewJob::new("t", serde_json::json!({})))
        .await
        .unwrap();
    client
        .execute("SELECT pgwake.cancel($1)", &[&dead])
        .await
        .unwrap();
    let gone = enqueue(&client, &NewJob::new("t", serde_json::json!({})))
        .await
        .unwrap();
    client
        .execute("DELETE FROM pgwake.jobs WHERE id = $1", &[&gone])
        .await
        .unwrap();
    let msg = refused(
        &client,
        &format!("SELECT pgwake.enqueue('c', after => ARRAY[{dead}]::bigint[])"),
    )
    .await;
    assert_eq!(
        msg,
        format!("pgwake: parent job {dead} ended dead or cancelled: a child would never run")
    );
    let msg = refused(
        &client,
        &format!("SELECT pgwake.enqueue('c', after => ARRAY[{gone}]::bigint[])"),
    )
    .await;
    assert_eq!(
        msg,
        format!("pgwake: parent job {gone} already ended, and the history does not show it done")
    );
    let msg = refused(
        &client,
        "SELECT pgwake.enqueue('c', after => ARRAY[987654321]::bigint[])",
    )
    .await;
    assert_eq!(msg, "pgwake: parent job 987654321 does not exist");
    let msg = refused(
        &client,
        "SELECT pgwake.enqueue('c', after => (SELECT array_agg(g) FROM generate_series(1, 1001) g)::bigint[])",
    )
    .await;
    assert_eq!(
        msg,
        "pgwake: a job with 1001 parents: at most 1000 are allowed"
    );
    // The Rust client's error is the database's.
    let e = enqueue(
        &client,
        &NewJob::new("c", serde_json::json!({})).after([dead]),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("ended dead or cancelled"), "{e}");
    let jobs: i64 = db.scalar("SELECT count(*) FROM pgwake.jobs").await;
    assert_eq!(jobs, 0, "nothing inserted");
    // A parent the history shows done counts as done.
    client
        .execute(
            "INSERT INTO pgwake.finished_jobs (id, queue, task, payload, outcome, attempts, enqueued_at)
             VALUES ($1, 'default', 't', '{}', 'done', 1, now())",
            &[&gone],
        )
        .await
        .unwrap();
    let c = enqueue(
        &client,
        &NewJob::new("c", serde_json::json!({})).after([gone]),
    )
    .await
    .unwrap();
    let held: bool = client
        .query_one("SELECT held FROM pgwake.jobs WHERE id = $1", &[&c])
        .await
        .unwrap()
        .get(0);
    assert!(!held, "a parent the history shows done counts as done");
    // A job enqueued earlier (by another transaction) cannot be given
    // parents afterwards: a producer cannot hold someone else's job.
    let msg = refused(
        &client,
        &format!("SELECT pgwake.add_parents({c}, ARRAY[{c}]::bigint[], NULL)"),
    )
    .await;
    assert_eq!(
        msg,
        format!("pgwake: job {c} was not enqueued by this transaction: parents are given when a job is enqueued")
    );
}

/// A child held with every parent ended (a release missed: made here by
/// hand, a parent removed without its has_children flag) is released by
/// the rescuer's sweep. (With the sweep's call removed from the rescuer,
/// flows_released is 0 and the child stays held.)
#[tokio::test]
async fn the_rescuers_sweep_releases_a_child_whose_parents_all_ended() {
    let db = migrated_db().await;
    let client = db.client().await;
    let parent = enqueue(&client, &NewJob::new("t", serde_json::json!({})))
        .await
        .unwrap();
    let child = enqueue(
        &client,
        &NewJob::new("t", serde_json::json!({})).after([parent]),
    )
    .await
    .unwrap();
    client
        .batch_execute(&format!(
            "UPDATE pgwake.jobs SET has_children = false WHERE id = {parent};
             DELETE FROM pgwake.jobs WHERE id = {parent};"
        ))
        .await
        .unwrap();
    assert_eq!(
        held_and_waiting(&db).await,
        (1, 1),
        "the release was missed"
    );
    let pool = pgwake::connect::pool(&db.config(), 2).unwrap();
    let rescuer = pgwake::internal::rescuer::Rescuer::new(pool, Default::default());
    let report = rescuer.run_once().await.unwrap();
    assert_eq!(report.flows_released, 1, "{report:?}");
    let held: bool = client
        .query_one("SELECT held FROM pgwake.jobs WHERE id = $1", &[&child])
        .await
        .unwrap()
        .get(0);
    assert!(!held);
}

/// A keyed child that waits for its parent heads its key: the key's own
/// release does not release it, and its parent's end does (through the
/// key, which then holds the rest of the key behind it). (With
/// release_ordering_key's `parents_open = 0` test removed, the key's
/// release frees the child before its parent ends.)
#[tokio::test]
async fn an_ordered_key_never_releases_a_child_its_parents_hold() {
    let db = migrated_db().await;
    let client = db.client().await;
    let parent = enqueue(&client, &NewJob::new("t", serde_json::json!({})))
        .await
        .unwrap();
    let child = enqueue(
        &client,
        &NewJob::new("t", serde_json::json!({}))
            .ordering_key("k")
            .after([parent]),
    )
    .await
    .unwrap();
    let behind = enqueue(
        &client,
        &NewJob::new("t", serde_json::json!({})).ordering_key("k"),
    )
    .await
    .unwrap();
    let held = |id: i64| {
        let client = &client;
        async move {
            client
                .query_one("SELECT held FROM pgwake.jobs WHERE id = $1", &[&id])
                .await
                .unwrap()
                .get::<_, bool>(0)
        }
    };
    client
        .execute("SELECT pgwake.release_ordering_key('k')", &[])
        .await
        .unwrap();
    assert!(
        held(child).await,
        "the key released a child its parent holds"
    );
    assert!(held(behind).await);
    client
        .execute("DELETE FROM pgwake.jobs WHERE id = $1", &[&parent])
        .await
        .unwrap();
    assert!(
        !held(child).await,
        "the parent's end released the key's head"
    );
    assert!(held(behind).await, "the rest of the key waits behind it");
}

/// A chain a → b → c whose first job's worker is killed (kill -9) while it
/// runs: another worker runs it again, then b and c each once, each after
/// its parent's last run ended; nothing is left held. (With the flows'
/// release removed from the rescuer's sweep (release_stalled_flows doing
/// nothing) and the triggers dropped, b is never released and the drain
/// times out; with the triggers dropped alone, the sweep releases b and c
/// and the test passes: the sweep bounds a missed release.)
async fn a_chain_survives_a_killed_worker(mode: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    let client = db.client().await;
    client
        .batch_execute("ALTER TABLE pgwake_runs ADD COLUMN ended_at timestamptz")
        .await
        .unwrap();
    let ids: serde_json::Value = client
        .query_one(
            r#"SELECT pgwake.flow('[{"name":"a","task":"block","max_attempts":5},
                                    {"name":"b","task":"work","after":["a"]},
                                    {"name":"c","task":"work","after":["b"]}]')"#,
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let (a, b, c) = (
        ids["a"].as_i64().unwrap(),
        ids["b"].as_i64().unwrap(),
        ids["c"].as_i64().unwrap(),
    );
    let mut args = mode.to_vec();
    args.push("--record-end");
    let mut first = ChaosWorker::spawn(&db, &args);
    until_runs(&db, "a running", Duration::from_secs(30), |r| {
        r.iter().any(|x| x.0 == a)
    })
    .await;
    let second = ChaosWorker::spawn(&db, &args);
    first.kill9();
    until_drained(&db).await;
    assert!(second.terminate().await.success());
    let rows = client
        .query(
            "SELECT job_id, count(*), min(at), max(ended_at) FROM pgwake_runs GROUP BY job_id",
            &[],
        )
        .await
        .unwrap();
    let by: HashMap<i64, (i64, std::time::SystemTime, Option<std::time::SystemTime>)> = rows
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3))))
        .collect();
    assert_eq!(by[&a].0, 2, "a ran again after the kill: {by:?}");
    assert_eq!((by[&b].0, by[&c].0), (1, 1), "b and c ran once: {by:?}");
    assert!(
        by[&b].1 > by[&a].2.unwrap(),
        "b started before a's last run ended"
    );
    assert!(by[&c].1 > by[&b].2.unwrap(), "c started before b ended");
    let dead: i64 = db.scalar("SELECT count(*) FROM pgwake.dead_jobs").await;
    assert_eq!(dead, 0);
}

#[tokio::test]
async fn tx_mode_a_chain_survives_a_killed_worker() {
    a_chain_survives_a_killed_worker(&[]).await;
}

#[tokio::test]
async fn lease_mode_a_chain_survives_a_killed_worker() {
    a_chain_survives_a_killed_worker(&["--lease", "--lease-ms", "1500"]).await;
}

/// `pgwake explain` of a held child names how many parents it waits for
/// and each open one with its state, first; a parent that ended done is
/// counted, not named; `pgwake stats` counts the held children. (Without
/// the reason's block in pgwake.explain, the first reason is `no_worker`.)
#[tokio::test]
async fn explain_and_stats_say_which_jobs_wait_for_parents() {
    let db = migrated_db().await;
    let client = db.client().await;
    let a = enqueue(&client, &NewJob::new("t", serde_json::json!({})))
        .await
        .unwrap();
    let b = enqueue(&client, &NewJob::new("t", serde_json::json!({})).after([a]))
        .await
        .unwrap();
    let done = enqueue(&client, &NewJob::new("t", serde_json::json!({})))
        .await
        .unwrap();
    let c = enqueue(
        &client,
        &NewJob::new("t", serde_json::json!({})).after([done, b, a]),
    )
    .await
    .unwrap();
    client
        .execute("DELETE FROM pgwake.jobs WHERE id = $1", &[&done])
        .await
        .unwrap();
    let reasons = pgwake::admin::jobs::explain(&client, c).await.unwrap();
    assert_eq!(reasons[0].reason, "waiting_for_parents", "{reasons:?}");
    assert_eq!(
        reasons[0].detail,
        format!(
            "waiting for 2 of 3 parents: {a} (waiting), {b} (waiting for its own parents); \
             it is released in the commit that ends the last"
        )
    );
    assert_eq!(reasons[0].blocking_job, Some(a));

    // `pgwake stats` counts the two held children (b and c), and its table
    // shows them. (Without the count's statement, 0.)
    let pool = pgwake::connect::pool(&db.config(), 2).unwrap();
    let stats = pgwake::admin::stats::read(&pool).await.unwrap();
    let default = stats.iter().find(|s| s.queue == "default").unwrap();
    assert_eq!(default.waiting_for_parents, 2, "{default:?}");
    let table = pgwake::admin::stats::render_table(&stats);
    assert!(table.lines().next().unwrap().contains("PARENTS"), "{table}");
}

/// `pgwake enqueue --after` (repeated, or a list) and NDJSON's `"after"`
/// give a job its parents; a dead parent is refused with the database's
/// message, exit non-zero, nothing inserted. (With `--after` not passed to
/// the job, the edges are only NDJSON's: [(c, d, run)].)
#[tokio::test]
async fn the_cli_and_ndjson_take_parents() {
    let db = migrated_db().await;
    let url = db.url.clone();
    let client = db.client().await;
    let id_of = |o: &std::process::Output| -> i64 {
        assert!(o.status.success(), "{}", stderr_of(o));
        String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
    };
    let a = id_of(&run_pgwake(&["enqueue", "--task", "a"], Some(&url)));
    let b = id_of(&run_pgwake(&["enqueue", "--task", "b"], Some(&url)));
    let c = id_of(&run_pgwake(
        &[
            "enqueue",
            "--task",
            "c",
            "--after",
            &a.to_string(),
            "--after",
            &b.to_string(),
            "--on-parent-failure",
            "wait",
        ],
        Some(&url),
    ));
    let out = run_pgwake_stdin(
        &["enqueue", "--ndjson"],
        Some(&url),
        &format!("{{\"task\": \"d\", \"after\": [{c}], \"on_parent_failure\": \"run\"}}\n"),
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    let edges: Vec<(i64, i64, String)> = client
        .query(
            "SELECT parent, child, on_failure FROM pgwake.job_parents ORDER BY child, parent",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let d: i64 = db.scalar("SELECT max(id) FROM pgwake.jobs").await;
    assert_eq!(
        edges,
        vec![
            (a, c, "wait".into()),
            (b, c, "wait".into()),
            (c, d, "run".into())
        ]
    );
    let held: i64 = db
        .scalar("SELECT count(*) FROM pgwake.jobs WHERE held AND parents_open > 0")
        .await;
    assert_eq!(held, 2);

    client
        .execute("SELECT pgwake.cancel($1)", &[&a])
        .await
        .unwrap();
    let out = run_pgwake(
        &["enqueue", "--task", "e", "--after", &format!("{b},{a}")],
        Some(&url),
    );
    assert!(!out.status.success());
    assert!(
        stderr_of(&out).contains(&format!("parent job {a} ended dead or cancelled")),
        "{}",
        stderr_of(&out)
    );
    let e: i64 = db
        .scalar("SELECT count(*) FROM pgwake.jobs WHERE task = 'e'")
        .await;
    assert_eq!(e, 0);
}
