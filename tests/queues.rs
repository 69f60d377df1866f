//! Queue settings (`pgwake queue …`, `pgwake.pause_queue()`,
//! `pgwake.resume_queue()`): a paused queue starts nothing on any worker
//! process — across a kill -9 and restart of every worker — and everything
//! after resume; the state shows in `pgwake queue list`, `pgwake stats` and
//! the sampler (the `pgwake_queue_paused` gauge). Each test ends with a
//! ledger check.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;

const LONG: Duration = Duration::from_secs(120);

/// `n` jobs of task `work` in `queue`; their ids.
async fn insert_into(db: &TestDb, queue: &str, n: i32) -> Vec<i64> {
    db.client()
        .await
        .query(
            "INSERT INTO pgwake.jobs (queue, task, payload)
             SELECT $1, 'work', jsonb_build_object('n', g) FROM generate_series(1, $2) g
             RETURNING id",
            &[&queue, &n],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Wait until every id in `ids` has a run in the ledger.
async fn until_all_ran(db: &TestDb, what: &str, ids: &[i64]) {
    let want: HashSet<i64> = ids.iter().copied().collect();
    until_runs(db, what, LONG, |runs| {
        let ran: HashSet<i64> = runs.iter().map(|r| r.0).collect();
        want.is_subset(&ran)
    })
    .await;
}

/// Ledger: runs of `ids`, and whether any run overlapped another run of the
/// same job.
async fn runs_of(db: &TestDb, ids: &[i64]) -> (usize, bool) {
    let want: HashSet<i64> = ids.iter().copied().collect();
    let runs = ledger_runs(db).await;
    let mine: Vec<_> = runs.iter().filter(|r| want.contains(&r.0)).collect();
    (mine.len(), mine.iter().any(|r| r.3))
}

/// The paused queue's jobs are inserted before the open queue's, at the same
/// priority: a claim over every queue that took an open job would have taken
/// the paused queue's jobs first, had it not skipped them. So "every open
/// job ran and no paused job did" proves the claims skipped the paused queue
/// (no timing involved).
async fn paused_queue_runs_nothing_until_resumed(extra: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    let out = run_pgwake(&["queue", "pause", "held"], Some(&db.url));
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("held: paused"));
    // Idempotent: a second pause says so and changes nothing.
    let out = run_pgwake(&["queue", "pause", "held"], Some(&db.url));
    assert!(String::from_utf8_lossy(&out.stdout).contains("already paused"));

    let held = insert_into(&db, "held", 40).await;
    let open = insert_into(&db, "open", 40).await;
    let mut workers: Vec<ChaosWorker> = (0..3).map(|_| ChaosWorker::spawn(&db, extra)).collect();
    until_all_ran(&db, "the open queue's jobs to run", &open).await;
    assert_eq!(runs_of(&db, &held).await.0, 0, "a paused queue's job ran");

    // Every worker dies (kill -9) and new ones start: the pause is a row, it
    // holds for them too.
    for w in &mut workers {
        w.kill9();
    }
    let workers: Vec<ChaosWorker> = (0..3).map(|_| ChaosWorker::spawn(&db, extra)).collect();
    let open2 = insert_into(&db, "open", 40).await;
    until_all_ran(
        &db,
        "the open queue's new jobs to run after the restart",
        &open2,
    )
    .await;
    assert_eq!(
        runs_of(&db, &held).await.0,
        0,
        "a paused queue's job ran after a restart"
    );
    let waiting: i64 = db
        .scalar("SELECT count(*) FROM pgwake.jobs WHERE queue = 'held'")
        .await;
    assert_eq!(waiting, 40);

    // The state shows in `pgwake queue list` and `pgwake stats`.
    let list = run_pgwake(&["queue", "list", "--json"], Some(&db.url));
    assert!(list.status.success(), "{}", stderr_of(&list));
    let list: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    let state = |name: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|q| q["queue"] == name)
            .map(|q| q["paused"].as_bool().unwrap())
    };
    assert_eq!(state("held"), Some(true));
    // Drained and without settings: not listed.
    assert_eq!(state("open"), None);
    let stats = run_pgwake(&["stats", "--json"], Some(&db.url));
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    let held_stats = stats
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "held")
        .unwrap();
    assert_eq!(held_stats["paused"], true);
    assert_eq!(held_stats["ready"], 40);

    // Resume through SQL: everything runs.
    let resumed: bool = db.scalar("SELECT pgwake.resume_queue('held')").await;
    assert!(resumed);
    until_all_ran(&db, "the resumed queue's jobs to run", &held).await;
    for w in workers {
        w.terminate().await;
    }
    // Ledger: every job ran, none overlapped itself, nothing is left.
    let all: Vec<i64> = held.iter().chain(&open).chain(&open2).copied().collect();
    let (_, overlap) = runs_of(&db, &all).await;
    assert!(!overlap, "a job ran twice at once");
    assert_eq!(remaining(&db).await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn paused_queue_runs_nothing_until_resumed_tx_all_queues() {
    paused_queue_runs_nothing_until_resumed(&[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn paused_queue_runs_nothing_until_resumed_lease_named_queues() {
    paused_queue_runs_nothing_until_resumed(&["--lease", "--queues", "held,open"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn paused_queue_runs_nothing_until_resumed_tx_named_queues() {
    paused_queue_runs_nothing_until_resumed(&["--queues", "held,open"]).await;
}

/// The sampler reads the paused queues (the `pgwake_queue_paused` gauge);
/// resume and pause report whether they changed anything; a bad name or
/// limit is refused (exit 2); a limit shows in `queue list` and has its
/// slot rows.
#[tokio::test]
async fn settings_are_validated_and_reported() {
    let db = migrated_db().await;
    let pool = pgwake::connect::pool(&db.config(), 1).unwrap();
    let client = db.client().await;
    assert!(!pgwake::queues::resume(&client, "q").await.unwrap());
    assert!(pgwake::queues::pause(&client, "q").await.unwrap());
    assert!(!pgwake::queues::pause(&client, "q").await.unwrap());
    let sample = pgwake::sampler::sample(&pool, 100).await.unwrap();
    assert_eq!(sample.paused, vec!["q".to_string()]);
    assert!(pgwake::queues::resume(&client, "q").await.unwrap());
    let sample = pgwake::sampler::sample(&pool, 100).await.unwrap();
    assert!(sample.paused.is_empty());
    assert!(pgwake::queues::pause(&client, "").await.is_err());
    let err = client
        .query_one("SELECT pgwake.pause_queue('')", &[])
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("must not be empty")
            || format!("{err:?}").contains("must not be empty")
    );
    let out = run_pgwake(&["queue", "pause", ""], Some(&db.url));
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));

    // `set`: a limit is required, positive, and shows in `queue list`.
    for bad in [
        &["queue", "set", "q"][..],
        &["queue", "set", "q", "--max-running", "0"],
    ] {
        let out = run_pgwake(bad, Some(&db.url));
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", stderr_of(&out));
    }
    assert!(client
        .query_one("SELECT pgwake.set_queue_max_running('q', 0)", &[])
        .await
        .is_err());
    pgwake::queues::set_max_running(&client, "q", Some(2))
        .await
        .unwrap();
    let list = pgwake::queues::list(&client).await.unwrap();
    assert_eq!(list[0].max_running, Some(2));
    let slots: i64 = db.scalar("SELECT count(*) FROM pgwake.queue_slots").await;
    assert_eq!(slots, 2);
    let out = run_pgwake(&["queue", "set", "q", "--no-max-running"], Some(&db.url));
    assert!(out.status.success(), "{}", stderr_of(&out));
    let list = pgwake::queues::list(&client).await.unwrap();
    assert_eq!(list[0].max_running, None);
    let slots: i64 = db.scalar("SELECT count(*) FROM pgwake.queue_slots").await;
    assert_eq!(slots, 0);
}

/// 50,000 ready jobs in one queue, and 10 more in another once the workers
/// are busy with the first: the 10 run while the busy queue still holds most
/// of its backlog (the bound in fair.rs: within REFRESH_ROUNDS + 2 claim
/// rounds of each worker, i.e. a few hundred jobs, not 50,000). Counts, not
/// timing: the quiet jobs were inserted last, so a claim in (priority,
/// run_at, id) order over every queue would run them after all 50,000.
async fn quiet_queue_is_served_while_a_busy_one_drains(extra: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    db.client()
        .await
        .batch_execute(
            "INSERT INTO pgwake.jobs (queue, task, payload)
             SELECT 'busy', 'work', '{}' FROM generate_series(1, 50000)",
        )
        .await
        .unwrap();
    let workers: Vec<ChaosWorker> = (0..3)
        .map(|_| {
            let mut args = vec!["--sleep-ms", "0"];
            args.extend_from_slice(extra);
            ChaosWorker::spawn(&db, &args)
        })
        .collect();
    until_runs(
        &db,
        "the workers to be busy with the busy queue",
        LONG,
        |runs| runs.len() >= 100,
    )
    .await;
    let quiet = insert_into(&db, "quiet", 10).await;
    until_all_ran(&db, "the quiet queue's jobs to run", &quiet).await;
    let busy_left: i64 = db
        .scalar("SELECT count(*) FROM pgwake.jobs WHERE queue = 'busy'")
        .await;
    for w in workers {
        w.terminate().await;
    }
    assert!(
        busy_left > 40_000,
        "the quiet queue waited for the busy one: only {busy_left} busy jobs were left"
    );
    // Ledger: the quiet jobs ran, none twice at once, none is left.
    let (_, overlap) = runs_of(&db, &quiet).await;
    assert!(!overlap, "a job ran twice at once");
    let quiet_left: i64 = db
        .scalar("SELECT count(*) FROM pgwake.jobs WHERE queue = 'quiet'")
        .await;
    assert_eq!(quiet_left, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn quiet_queue_is_served_while_a_busy_one_drains_tx() {
    quiet_queue_is_served_while_a_busy_one_drains(&[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn quiet_queue_is_served_while_a_busy_one_drains_lease() {
    quiet_queue_is_served_while_a_busy_one_drains(&["--lease-handler"]).await;
}

/// Peak number of runs of `ids` alive at once, from the ledger's DB
/// timestamps: a run lasts from its start to its `ended_at`, or to the
/// moment its process was killed (`killed`: pid → DB time just after the
/// kill returned). At equal timestamps ends count first.
async fn peak_running(db: &TestDb, ids: &[i64], killed: &[(i32, String)]) -> i64 {
    let pids: Vec<i32> = killed.iter().map(|k| k.0).collect();
    let times: Vec<String> = killed.iter().map(|k| k.1.clone()).collect();
    db.client()
        .await
        .query_one(
            "WITH k AS (SELECT * FROM unnest($2::int[], $3::text[]) AS k(pid, at)),
                  runs AS (
                      SELECT r.at AS started,
                             coalesce(r.ended_at, (SELECT k.at::timestamptz FROM k WHERE k.pid = r.pid))
                                 AS ended
                      FROM pgwake_runs r WHERE r.job_id = ANY($1)
                  ),
                  ev AS (
                      SELECT started AS t, 1 AS d FROM runs
                      UNION ALL
                      SELECT ended, -1 FROM runs
                  )
             SELECT coalesce(max(running), 0)::bigint FROM (
                 SELECT sum(d) OVER (ORDER BY t, d ROWS UNBOUNDED PRECEDING) AS running FROM ev
             ) x",
            &[&ids, &pids, &times],
        )
        .await
        .unwrap()
        .get(0)
}

/// `--max-running 3` on one queue, 3 worker processes of 8 slots each, two
/// of them killed (-9) mid-run and replaced; lease mode rescues the killed
/// runs' leases, tx mode rolls them back. From the ledger of start/end
/// times: never more than 3 runs of the queue at once; every job ran; an
/// unlimited queue next to it ran too; every slot is free at the end.
async fn max_running_holds_across_workers_kills_and_rescues(extra: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    db.client()
        .await
        .batch_execute("ALTER TABLE pgwake_runs ADD COLUMN ended_at timestamptz")
        .await
        .unwrap();
    let out = run_pgwake(
        &["queue", "set", "lim", "--max-running", "3"],
        Some(&db.url),
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    let lim = insert_into(&db, "lim", 150).await;
    let free = insert_into(&db, "free", 100).await;
    let mut args = vec![
        "--sleep-ms",
        "20",
        "--concurrency",
        "8",
        "--record-end",
        "--lease-ms",
        "1000",
        "--rescue-ms",
        "200",
    ];
    args.extend_from_slice(extra);
    let mut workers: Vec<ChaosWorker> = (0..3).map(|_| ChaosWorker::spawn(&db, &args)).collect();
    let mut killed = Vec::new();
    for (i, after) in [30usize, 70].into_iter().enumerate() {
        let want: HashSet<i64> = lim.iter().copied().collect();
        until_runs(&db, "runs of the limited queue", LONG, |runs| {
            runs.iter().filter(|r| want.contains(&r.0)).count() >= after
        })
        .await;
        let pid = workers[i].pid();
        // Taken just before the kill: the process's runs end between this
        // and the kill, and a slot it held is free only after the server
        // rolled back its transaction (tx) or rescued its lease (lease),
        // both after the kill.
        let at: String = db.scalar("SELECT clock_timestamp()::text").await;
        workers[i].kill9();
        killed.push((pid, at));
        workers.push(ChaosWorker::spawn(&db, &args));
    }
    until_all_ran(
        &db,
        "every job to run",
        &lim.iter().chain(&free).copied().collect::<Vec<_>>(),
    )
    .await;
    wait_for("the queue to drain", LONG, async || {
        let left: i64 = db
            .scalar("SELECT (SELECT count(*) FROM pgwake.jobs) + (SELECT count(*) FROM pgwake.leased_jobs)")
            .await;
        if left == 0 { Ok(()) } else { Err(format!("{left} jobs left")) }
    })
    .await;
    for w in workers.drain(..) {
        if w.child.id() as i32 != killed[0].0 && w.child.id() as i32 != killed[1].0 {
            w.terminate().await;
        }
    }
    let peak = peak_running(&db, &lim, &killed).await;
    assert!(peak <= 3, "{peak} jobs of a queue limited to 3 ran at once");
    assert!(peak >= 1);
    let held: i64 = db
        .scalar("SELECT count(*) FROM pgwake.queue_slots WHERE lease_token IS NOT NULL")
        .await;
    assert_eq!(held, 0, "a slot is still held after every job ended");
    let slots: i64 = db.scalar("SELECT count(*) FROM pgwake.queue_slots").await;
    assert_eq!(slots, 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn max_running_holds_across_workers_kills_and_rescues_tx() {
    max_running_holds_across_workers_kills_and_rescues(&[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn max_running_holds_across_workers_kills_and_rescues_lease() {
    max_running_holds_across_workers_kills_and_rescues(&["--lease-handler"]).await;
}
