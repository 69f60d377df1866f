//! Queue settings (`pgwake queue …`, `pgwake.pause_queue()`,
//! `pgwake.resume_queue()`): a paused queue starts nothing on any worker
//! process — across a kill -9 and restart of every worker — and everything
//! after resume; the state shows in `pgwake queue list`, `pgwake stats` and
//! the sampler (the `pgwake_queue_paused` gauge). `--max-running` holds
//! across worker processes, kills and rescues, and when lowered while jobs
//! run. Each test ends with a ledger check.

use crate::common;

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
pub(crate) async fn until_all_ran(db: &TestDb, what: &str, ids: &[i64]) {
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

/// The sampler reads the paused queues (the `pgwake_queue_paused` gauge)
/// and the limited ones (`pgwake_queue_max_running`);
/// resume and pause report whether they changed anything; a bad name or
/// limit is refused (exit 2); a limit shows in `queue list` and has its
/// slot rows.
#[tokio::test]
async fn settings_are_validated_and_reported() {
    let db = migrated_db().await;
    let pool = pgwake::connect::pool(&db.config(), 1).unwrap();
    let client = db.client().await;
    assert!(!pgwake::admin::queues::resume(&client, "q").await.unwrap());
    assert!(pgwake::admin::queues::pause(&client, "q").await.unwrap());
    assert!(!pgwake::admin::queues::pause(&client, "q").await.unwrap());
    let sample = pgwake::internal::sampler::sample(&pool, 100).await.unwrap();
    assert_eq!(sample.paused, vec!["q".to_string()]);
    assert!(pgwake::admin::queues::resume(&client, "q").await.unwrap());
    let sample = pgwake::internal::sampler::sample(&pool, 100).await.unwrap();
    assert!(sample.paused.is_empty());
    assert!(pgwake::admin::queues::pause(&client, "").await.is_err());
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
    pgwake::admin::queues::set_max_running(&client, "q", Some(2))
        .await
        .unwrap();
    let list = pgwake::admin::queues::list(&client).await.unwrap();
    assert_eq!(list[0].max_running, Some(2));
    let slots: i64 = db.scalar("SELECT count(*) FROM pgwake.queue_slots").await;
    assert_eq!(slots, 2);
    let sample = pgwake::internal::sampler::sample(&pool, 100).await.unwrap();
    assert_eq!(sample.max_running, vec![("q".to_string(), 2)]);
    assert!(sample.paused.is_empty());
    let out = run_pgwake(&["queue", "set", "q", "--no-max-running"], Some(&db.url));
    assert!(out.status.success(), "{}", stderr_of(&out));
    let list = pgwake::admin::queues::list(&client).await.unwrap();
    assert_eq!(list[0].max_running, None);
    let slots: i64 = db.scalar("SELECT count(*) FROM pgwake.queue_slots").await;
    assert_eq!(slots, 0);
    let sample = pgwake::internal::sampler::sample(&pool, 100).await.unwrap();
    assert!(sample.max_running.is_empty());
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
pub(crate) async fn peak_running(db: &TestDb, ids: &[i64], killed: &[(i32, String)]) -> i64 {
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
    limit_queue(&db, "lim", 3);
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

/// Every run in the ledger as (job, attempt, pid, start, end), in start
/// order: what a failed over-limit check prints.
pub(crate) async fn ledger_spans(db: &TestDb) -> Vec<(i64, i32, i32, String, Option<String>)> {
    db.client()
        .await
        .query(
            "SELECT job_id, attempt, pid, at::text, ended_at::text FROM pgwake_runs ORDER BY at",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}

/// Runs of `ids` that started after `change` (a DB time just after the
/// limit was lowered) while `allowed` or more other runs of `ids` were alive:
/// (job id, start, how many were alive). A run is alive from its `at` to its
/// `ended_at`; runs starting at the same instant are ordered by job id (the
/// later one sees the earlier alive), and a run that ended at the instant
/// another started counts as ended. The chaos worker records `ended_at`
/// before the job completes, i.e. before its slot is free: a run that took
/// that slot started later, so the ledger never shows a breach that did not
/// happen.
pub(crate) async fn started_over_limit(
    db: &TestDb,
    ids: &[i64],
    change: &str,
    allowed: i64,
) -> Vec<(i64, String, i64)> {
    db.client()
        .await
        .query(
            "WITH r AS (SELECT job_id, attempt, at, ended_at FROM pgwake_runs WHERE job_id = ANY($1))
             SELECT a.job_id, a.at::text, count(*) FILTER (WHERE b.job_id IS NOT NULL)
             FROM r a
             LEFT JOIN r b ON (b.at, b.job_id, b.attempt) < (a.at, a.job_id, a.attempt)
                          AND b.ended_at > a.at
             WHERE a.at > $2::text::timestamptz
             GROUP BY a.job_id, a.attempt, a.at
             HAVING count(*) FILTER (WHERE b.job_id IS NOT NULL) >= $3
             ORDER BY a.at",
            &[&ids, &change, &allowed],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// `--max-running 6`, six jobs of the queue running on three worker
/// processes, more waiting; the limit is lowered to 2. The documented rule
/// (functions/queues.sql): no job of the queue starts until the jobs above
/// the new limit have ended, and no job started after the change ever runs
/// with more than 2 of the queue's jobs alive (itself included). From the
/// ledger's DB times: every run that started after the change found at most
/// one other run alive; the six alive at the change were allowed; every
/// waiting job ran after the change (so the check had runs to judge); the
/// old limit held throughout; 2 free slot rows are left.
///
/// The six first jobs are `gated`: they stay alive until the test opens the
/// gate, after the change has committed and every claim statement begun
/// before it has finished. So no claim can start a job on the old limit
/// "at the same instant" as the change: every run after the change is held
/// to the new limit, and the check needs no allowance for a race. Once the
/// gate opens, the six end one at a time, 200 ms apart (their payloads;
/// twice the workers' poll interval, so claims are tried between any two
/// ends): the claims see free slots at or below 2 while slots above 2 are
/// still held. Which slot each of the six holds is up to the claims.
///
/// Teeth: with the `NOT EXISTS (… slot > max_running)` guard removed from
/// claim_tx_limited.sql and claim_lease_limited.sql (so the free slots 1
/// and 2 are taken while jobs above the new limit still run), both variants
/// fail here (3 runs of 3 each) with runs that started while up to 5 others
/// were alive.
async fn lowered_max_running_holds_for_jobs_started_after_the_change(extra: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    db.client()
        .await
        .batch_execute("ALTER TABLE pgwake_runs ADD COLUMN ended_at timestamptz")
        .await
        .unwrap();
    let gate = Gate::closed(&db).await;
    limit_queue(&db, "lim", 6);
    let gated: Vec<i64> = db
        .client()
        .await
        .query(
            "INSERT INTO pgwake.jobs (queue, task, payload)
             SELECT 'lim', 'gated', jsonb_build_object('ms', 200 * g)
             FROM generate_series(1, 6) g RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    // 3 × 4 = 12 places: the limit, not the workers, is what stops a 7th.
    let mut args = vec![
        "--sleep-ms",
        "300",
        "--poll-ms",
        "100",
        "--concurrency",
        "4",
        "--record-end",
    ];
    args.extend_from_slice(extra);
    let workers: Vec<ChaosWorker> = (0..3).map(|_| ChaosWorker::spawn(&db, &args)).collect();
    until_all_ran(&db, "the six gated jobs to run", &gated).await;
    // Waiting behind them while the limit is still 6, with no free slot.
    let waiting = insert_into(&db, "lim", 40).await;

    limit_queue(&db, "lim", 2);
    // After the change committed: every claim snapshot taken from here on
    // sees the new limit.
    let change: String = db.scalar("SELECT clock_timestamp()::text").await;
    // A claim statement begun before the change (snapshot of the old limit)
    // has found no free slot, as all six are held; wait until every such
    // statement has finished, so none is still running when slots free up.
    // (The gated runs' ledger connections wait on the gate: not claims.)
    wait_for(
        "claims begun before the change to finish",
        LONG,
        async || {
            let n: i64 = db
                .client()
                .await
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND state = 'active'
                   AND pid <> pg_backend_pid() AND application_name <> 'chaos-ledger'
                   AND query_start < $1::text::timestamptz",
                    &[&change],
                )
                .await
                .unwrap()
                .get(0);
            if n == 0 {
                Ok(())
            } else {
                Err(format!("{n} statements"))
            }
        },
    )
    .await;
    gate.open().await;

    let all: Vec<i64> = gated.iter().chain(&waiting).copied().collect();
    until_all_ran(&db, "every job to run", &all).await;
    until_drained(&db).await;
    for w in workers {
        w.terminate().await;
    }

    // Ledger.
    let unended: i64 = db
        .scalar("SELECT count(*) FROM pgwake_runs WHERE ended_at IS NULL")
        .await;
    assert_eq!(unended, 0, "a run has no end recorded");
    let over = started_over_limit(&db, &all, &change, 2).await;
    assert!(
        over.is_empty(),
        "runs started after the limit was lowered to 2 while 2 or more others ran \
         (job, start, alive): {over:?}"
    );
    let (after, alive_at_change): (i64, i64) = {
        let row = db
            .client()
            .await
            .query_one(
                "SELECT count(*) FILTER (WHERE at > $2::text::timestamptz),
                        count(*) FILTER (WHERE at <= $2::text::timestamptz AND ended_at > $2::text::timestamptz)
                 FROM pgwake_runs WHERE job_id = ANY($1)",
                &[&all, &change],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(
        after,
        waiting.len() as i64,
        "every waiting job, and only those, ran after the change"
    );
    assert_eq!(
        alive_at_change, 6,
        "six jobs ran when the limit was lowered"
    );
    let peak = peak_running(&db, &all, &[]).await;
    assert!(peak <= 6, "{peak} jobs of a queue limited to 6 ran at once");
    let (runs, overlap) = runs_of(&db, &all).await;
    assert_eq!(runs, all.len(), "a job ran more than once");
    assert!(!overlap, "a job ran twice at once");
    // The rows above the new limit were deleted once free; the two left are free.
    let slots: Vec<(i32, Option<i64>)> = db
        .client()
        .await
        .query(
            "SELECT slot, lease_token FROM pgwake.queue_slots ORDER BY slot",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(slots, vec![(1, None), (2, None)]);
}

#[tokio::test(flavor = "multi_thread")]
async fn lowered_max_running_holds_for_jobs_started_after_the_change_tx() {
    lowered_max_running_holds_for_jobs_started_after_the_change(&[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lowered_max_running_holds_for_jobs_started_after_the_change_lease() {
    lowered_max_running_holds_for_jobs_started_after_the_change(&["--lease-handler"]).await;
}

/// A limited queue uses all of its limit when its jobs arrive one at a
/// time: with `--max-running 3` and batches of up to 10, a claim that finds
/// one ready job must not keep the other slots from other claims. Three
/// jobs, inserted one after another, all run at once (they wait at the
/// closed gate, so each is alive until the test opens it). No poll: the
/// inserts' notifications and the claims' own wake-ups do it.
async fn a_limited_queue_runs_up_to_its_limit_when_jobs_arrive_one_by_one(extra: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    limit_queue(&db, "lim", 3);
    let gate = Gate::closed(&db).await;
    let mut args = vec![
        "--batch",
        "10",
        "--concurrency",
        "4",
        "--poll-ms",
        "600000",
        "--sleep-ms",
        "0",
    ];
    args.extend_from_slice(extra);
    let workers: Vec<ChaosWorker> = (0..2).map(|_| ChaosWorker::spawn(&db, &args)).collect();
    let c = db.client().await;
    for n in 1..=3usize {
        c.execute(
            "INSERT INTO pgwake.jobs (queue, task, payload) VALUES ('lim', 'gated', '{\"ms\": 0}')",
            &[],
        )
        .await
        .unwrap();
        until_runs(&db, &format!("{n} jobs running at once"), LONG, |runs| {
            runs.len() >= n
        })
        .await;
    }
    let runs = ledger_runs(&db).await;
    assert_eq!(runs.len(), 3, "{runs:?}");
    gate.open().await;
    until_drained(&db).await;
    for w in workers {
        w.terminate().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_limited_queue_runs_up_to_its_limit_when_jobs_arrive_one_by_one_tx() {
    a_limited_queue_runs_up_to_its_limit_when_jobs_arrive_one_by_one(&[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_limited_queue_runs_up_to_its_limit_when_jobs_arrive_one_by_one_lease() {
    a_limited_queue_runs_up_to_its_limit_when_jobs_arrive_one_by_one(&["--lease-handler"]).await;
}

/// A notified claim of a limited queue does not trust an old list of ready
/// queues. A worker claims a limited queue only when its list shows it
/// ready (fair.rs); the list is re-read every `REFRESH_ROUNDS` rounds.
/// Here it is re-read while the limited queue's one job runs (leased: not
/// ready) — 20 jobs of another queue, one at a time, make the rounds —
/// and then a second job of the limited queue comes, with the poll 10
/// minutes away: its notification's round finds nothing with that list,
/// and must read the list again and claim, not wait for the next event.
/// Before, the round ended there (`found_nothing` with limited queues only
/// marked the list for the next round, and none came): the wait for the
/// second job timed out in 15 of 16 runs (when the notified round is the
/// one that re-reads anyway, it passes).
#[tokio::test(flavor = "multi_thread")]
async fn a_notified_round_rereads_an_old_list_that_hides_a_limited_queue() {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    limit_queue(&db, "lim", 3);
    let gate = Gate::closed(&db).await;
    let worker = ChaosWorker::spawn(
        &db,
        &[
            "--poll-ms",
            "600000",
            "--concurrency",
            "4",
            "--sleep-ms",
            "0",
            "--lease-handler",
        ],
    );
    let c = db.client().await;
    let gated = async || -> i64 {
        c.query_one(
            // Its own timeout: the chaos worker's 30 s would end the first
            // run, and the slot it frees would wake a claim.
            "INSERT INTO pgwake.jobs (queue, task, payload, timeout)
             VALUES ('lim', 'gated', '{\"ms\": 0}', '1 hour') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0)
    };
    let first = gated().await;
    until_all_ran(&db, "the first limited job to run", &[first]).await;
    for n in 1..=20 {
        let other = insert_into(&db, "other", 1).await;
        until_all_ran(&db, &format!("job {n} of the other queue to run"), &other).await;
    }
    let second = gated().await;
    until_all_ran(
        &db,
        "the second limited job to run on its notification",
        &[second],
    )
    .await;
    gate.open().await;
    until_drained(&db).await;
    worker.terminate().await;
}

/// A limited queue's backlog drains on its own: with the poll 10 minutes
/// away, a claim that found every slot held must be started again when a
/// slot frees. In lease mode a slot frees when the completer deletes the
/// lease, after the claim task went idle: 348 of 400 jobs were still waiting
/// after 3 minutes before the completer woke a claim for limited queues.
async fn a_limited_queue_drains_its_backlog_without_polls(extra: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    limit_queue(&db, "lim", 3);
    let ids = insert_into(&db, "lim", 200).await;
    let mut args = vec!["--poll-ms", "600000", "--sleep-ms", "2"];
    args.extend_from_slice(extra);
    let workers: Vec<ChaosWorker> = (0..2).map(|_| ChaosWorker::spawn(&db, &args)).collect();
    until_drained(&db).await;
    for w in workers {
        w.terminate().await;
    }
    let (runs, overlap) = runs_of(&db, &ids).await;
    assert_eq!(runs, 200);
    assert!(!overlap);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_limited_queue_drains_its_backlog_without_polls_tx() {
    a_limited_queue_drains_its_backlog_without_polls(&[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_limited_queue_drains_its_backlog_without_polls_lease() {
    a_limited_queue_drains_its_backlog_without_polls(&["--lease-handler"]).await;
}

/// A tx-mode claim of a limited queue holds one slot, for the one job it
/// claims: with 3 slots and 2 ready jobs, a claim of up to 10 leaves 2
/// slots free for other claims while its transaction is open. (It locked
/// all 3, one per batch place, for a batch that runs its jobs one after
/// another.)
#[tokio::test]
async fn a_tx_claim_of_a_limited_queue_holds_one_slot() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute("SELECT pgwake.set_queue_max_running('lim', 3)")
        .await
        .unwrap();
    insert_into(&db, "lim", 2).await;
    let claimer = db.client().await;
    claimer.batch_execute("BEGIN").await.unwrap();
    let none: Option<Vec<String>> = None;
    let empty: Vec<String> = vec![];
    let claimed = pgwake::internal::sql::Db::unnamed(&claimer)
        .query(
            &pgwake::internal::sql::CLAIM_TX_LIMITED,
            &[
                &10i64,
                &"lim",
                &none,
                &empty,
                &None::<i64>,
                &None::<String>,
                &None::<Vec<String>>,
            ],
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let free: i64 = db
        .scalar(
            "SELECT count(*) FROM (SELECT slot FROM pgwake.queue_slots WHERE queue = 'lim'
                                   FOR UPDATE SKIP LOCKED) s",
        )
        .await;
    assert_eq!(free, 2, "the claim of one job holds more than one slot");
    claimer.batch_execute("ROLLBACK").await.unwrap();
}

/// Slots of held leases, by queue: `(queue, slot, lease_token)` of every
/// slot that is not free.
async fn held_slots(db: &TestDb) -> Vec<(String, i32, i64)> {
    db.client()
        .await
        .query(
            "SELECT queue, slot, lease_token FROM pgwake.queue_slots
             WHERE lease_token IS NOT NULL ORDER BY queue, slot",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// A lease row written the way a writer that predates `holds_slot` writes
/// one (pgwake before migration 0011, or by hand); its token, now holding
/// slot 1 of `queue`.
async fn old_style_lease_holding_slot_1(c: &tokio_postgres::Client, id: i64, queue: &str) -> i64 {
    let token: i64 = c
        .query_one(
            "INSERT INTO pgwake.leased_jobs (id, queue, task, payload, priority, run_at, attempts,
                                             max_attempts, created_at, worker_id, lease_until)
             VALUES ($1, $2, 'work', '{}', 0, now(), 1, 5, now(), 'old', now() + interval '1 hour')
             RETURNING token",
            &[&id, &queue],
        )
        .await
        .unwrap()
        .get(0);
    c.execute(
        "UPDATE pgwake.queue_slots SET lease_token = $2 WHERE queue = $1 AND slot = 1",
        &[&queue, &token],
    )
    .await
    .unwrap();
    token
}

/// The slot of a lease is freed by a row trigger that fires only for leases
/// marked `holds_slot` (migration 0011): the claims of limited queues mark
/// theirs, the plain claims do not (their completions skip the trigger),
/// and every writer that does not know the column — a lease held across the
/// upgrade, an older pgwake binary, a hand-written INSERT — gets the
/// release by default. A slot must never stay held after its lease is gone.
#[tokio::test]
async fn every_lease_that_holds_a_slot_frees_it_across_the_upgrade_that_marks_them() {
    let db = empty_db().await;
    let mut c = db.client().await;
    // The schema at version 10, with a lease of a limited queue holding its
    // one slot, as a worker of that version left it.
    c.batch_execute(
        "CREATE SCHEMA pgwake;
         CREATE TABLE pgwake.schema_migrations (version integer PRIMARY KEY, name text NOT NULL,
                                                applied_at timestamptz NOT NULL DEFAULT now());
         CREATE TABLE pgwake.schema_definitions (name text PRIMARY KEY, sql text NOT NULL,
                                                 applied_at timestamptz NOT NULL DEFAULT now());",
    )
    .await
    .unwrap();
    for m in pgwake::admin::schema::MIGRATIONS
        .iter()
        .filter(|m| m.version <= 10)
    {
        c.batch_execute(m.sql).await.unwrap();
        c.execute(
            "INSERT INTO pgwake.schema_migrations (version, name) VALUES ($1, $2)",
            &[&m.version, &m.name],
        )
        .await
        .unwrap();
    }
    c.batch_execute(
        "INSERT INTO pgwake.queues (name, max_running) VALUES ('lim', 1), ('lim2', 1);
         INSERT INTO pgwake.queue_slots (queue, slot) VALUES ('lim', 1), ('lim2', 1);",
    )
    .await
    .unwrap();
    let across = old_style_lease_holding_slot_1(&c, 1, "lim").await;
    pgwake::admin::schema::migrate(&mut c).await.unwrap();
    assert_eq!(held_slots(&db).await, vec![("lim".into(), 1, across)]);

    // An older binary's lease after the upgrade.
    let old = old_style_lease_holding_slot_1(&c, 2, "lim2").await;
    // A lease claim of a limited queue, and one of a queue without a limit.
    c.batch_execute(
        "SELECT pgwake.set_queue_max_running('lim3', 2);
         INSERT INTO pgwake.jobs (id, queue, task) VALUES (3, 'lim3', 'work'), (4, 'free', 'work');",
    )
    .await
    .unwrap();
    let (none, empty) = (None::<Vec<String>>, Vec::<String>::new());
    let db_ = pgwake::internal::sql::Db::unnamed(&c);
    let limited = db_
        .query(
            &pgwake::internal::sql::CLAIM_LEASE_LIMITED,
            &[
                &10i64,
                &"lim3",
                &none,
                &empty,
                &"w",
                &60.0f64,
                &None::<i64>,
                &None::<String>,
                &None::<Vec<String>>,
            ],
        )
        .await
        .unwrap();
    let plain = db_
        .query(
            &pgwake::internal::sql::CLAIM_LEASE_QUEUE,
            &[&10i64, &"free", &none, &empty, &"w", &60.0f64, &10i64],
        )
        .await
        .unwrap();
    assert_eq!((limited.len(), plain.len()), (1, 1));
    let claimed: i64 = limited[0].get(12);
    let marks: Vec<(i64, bool)> = c
        .query(
            "SELECT id, holds_slot FROM pgwake.leased_jobs ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        marks,
        vec![(1, true), (2, true), (3, true), (4, false)],
        "leases across the upgrade, of older writers and of limited claims hold slots; plain claims do not"
    );
    assert_eq!(
        held_slots(&db).await,
        vec![
            ("lim".into(), 1, across),
            ("lim2".into(), 1, old),
            ("lim3".into(), 1, claimed)
        ]
    );
    // Every way a lease ends deletes its row: each frees its slot.
    c.batch_execute("DELETE FROM pgwake.leased_jobs")
        .await
        .unwrap();
    assert_eq!(held_slots(&db).await, vec![], "a slot outlived its lease");
}

/// `n` jobs of `task` in `queue` with limit key `key` (`None`: no key).
pub(crate) async fn insert_keyed(
    db: &TestDb,
    queue: &str,
    task: &str,
    key: Option<&str>,
    n: i32,
) -> Vec<i64> {
    db.client()
        .await
        .query(
            "INSERT INTO pgwake.jobs (queue, task, payload, limit_key)
             SELECT $1, $2, jsonb_build_object('n', g), $3 FROM generate_series(1, $4) g
             RETURNING id",
            &[&queue, &task, &key, &n],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// `pgwake queue set ARGS…` on `db`, which must succeed.
pub(crate) fn queue_set(db: &TestDb, args: &[&str]) {
    let mut all = vec!["queue", "set"];
    all.extend_from_slice(args);
    let out = run_pgwake(&all, Some(&db.url));
    assert!(out.status.success(), "{all:?}: {}", stderr_of(&out));
}
