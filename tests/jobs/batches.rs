//! Jobs of one claim never hurt each other: a long batch is not cut off by
//! the server's idle limit, one job's unwritable failure reason does not
//! roll back its siblings, a job that crashes its worker (or its database
//! session) is charged alone and ends dead, while the jobs claimed with it
//! run once and never end dead; after a partial batch tx claims are paced;
//! under database pressure a tx batch holds at most ten jobs.

use crate::common;

use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};
use pgwake::{async_trait, BoxError, Handler, Job, JobContext, Outcome, Worker, WorkerConfig};

/// Sleeps without touching the claim transaction.
struct Sleeps {
    ledger: Ledger,
    ms: u64,
}

#[async_trait]
impl Handler for Sleeps {
    async fn handle(&self, job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        self.ledger.record(job);
        tokio::time::sleep(Duration::from_millis(self.ms)).await;
        Ok(Outcome::Done)
    }
}

/// Issue repro: 10 jobs of 0.7 s with a 1 s job timeout in one tx batch take
/// 7 s, past the 6 s idle-in-transaction limit of the claim transaction.
#[tokio::test]
async fn a_tx_batch_longer_than_the_servers_idle_limit_is_not_cut_off() {
    let db = migrated_db().await;
    let ids = insert_jobs(&db, "sleep", 10).await;
    let ledger = Ledger::default();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            batch: 10,
            job_timeout: Duration::from_secs(1),
            ..test_config()
        })
        .handler(
            "sleep",
            Sleeps {
                ledger: ledger.clone(),
                ms: 700,
            },
        )
        .build()
        .unwrap();
    // One claim round: the whole batch in one transaction.
    assert_eq!(worker.claim_once().await.unwrap(), 10);
    assert!(ledger.check(&ids).is_empty(), "each job ran once");
    assert_eq!(remaining(&db).await, 0, "every job committed as done");
}

/// Fails the job whose payload says so, with bytes PostgreSQL text cannot
/// hold.
struct FailsWithNul(Ledger);

#[async_trait]
impl Handler for FailsWithNul {
    async fn handle(&self, job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        self.0.record(job);
        if job.payload["bad"].as_bool() == Some(true) {
            return Err("stderr said \0\u{1}\u{7f} and more".into());
        }
        Ok(Outcome::Done)
    }
}

async fn a_nul_byte_in_a_failure_reason_fails_only_its_own_job(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let payload = serde_json::json!({ "bad": i == 2 });
        ids.push(enqueue(&client, &NewJob::new("t", payload)).await.unwrap());
    }
    let ledger = Ledger::default();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            batch: 10,
            concurrency: 8,
            lease_queues: if lease {
                vec!["default".into()]
            } else {
                vec![]
            },
            ..test_config()
        })
        .handler("t", FailsWithNul(ledger.clone()))
        .build()
        .unwrap();
    assert_eq!(worker.claim_once().await.unwrap(), 5);
    assert!(ledger.check(&ids).is_empty(), "each job ran once");
    let rows = client
        .query(
            "SELECT id, attempts, last_error FROM pgwake.jobs ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "only the failed job is back in the queue");
    let (id, attempts, error): (i64, i32, String) =
        (rows[0].get(0), rows[0].get(1), rows[0].get(2));
    assert_eq!((id, attempts), (ids[2], 1));
    assert!(
        error.starts_with("stderr said \u{FFFD}\u{FFFD}\u{FFFD} and more"),
        "{error:?}"
    );
}

#[tokio::test]
async fn tx_mode_a_nul_byte_in_a_failure_reason_fails_only_its_own_job() {
    a_nul_byte_in_a_failure_reason_fails_only_its_own_job(false).await;
}

#[tokio::test]
async fn lease_mode_a_nul_byte_in_a_failure_reason_fails_only_its_own_job() {
    a_nul_byte_in_a_failure_reason_fails_only_its_own_job(true).await;
}

/// Issue repro: one job whose command kills the worker (`kill -9` of the
/// exec shim's parent) among good jobs, `max_attempts 3`, the worker
/// restarted after each crash. The good jobs run once and end done; only
/// the poison job is charged, and it ends dead.
async fn a_poison_job_is_charged_alone_never_its_batch(mode: &[&str]) {
    let db = migrated_db().await;
    let client = db.client().await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    // Good jobs first (priority 0), the poison job (1), more good jobs (2):
    // the poison job is claimed with good jobs before and after it.
    let mut good = Vec::new();
    let mut poison = 0;
    for (task, priority) in [
        ("good", 0),
        ("good", 0),
        ("good", 0),
        ("poison", 1),
        ("good", 2),
        ("good", 2),
        ("good", 2),
    ] {
        let id = enqueue(
            &client,
            &NewJob::new(task, serde_json::json!({}))
                .priority(priority)
                .max_attempts(3),
        )
        .await
        .unwrap();
        if task == "good" {
            good.push(id);
        } else {
            poison = id;
        }
    }
    let good_cmd = format!(
        "good=exec:sh -c 'echo $PGWAKE_JOB_ID >> {}'",
        ledger.display()
    );
    // Usually lets the worker record its siblings' outcomes before it dies;
    // writes a line to the ledger first, so that the check below knows which
    // runs came before a crash. The worker is the parent of the exec shim,
    // the command's parent (or the command's own parent without the shim).
    let poison_cmd = format!(
        "poison=exec:sh -c 'sleep 0.3; echo crash >> {}; p=$PPID; \
         [ \"$(cat /proc/$p/comm)\" = pgwake ] || read -r _ _ _ p _ < /proc/$p/stat; kill -9 $p'",
        ledger.display()
    );
    let mut crashes = 0;
    let poison_dead = || async {
        db.scalar::<i64>(&format!(
            "SELECT count(*) FROM pgwake.dead_jobs WHERE id = {poison}"
        ))
        .await
            == 1
    };
    while !poison_dead().await {
        assert!(crashes < 8, "the poison job never ended dead");
        let mut args = vec![
            "--concurrency",
            "4",
            "--batch",
            "10",
            "--lease-duration",
            "1s",
            "--rescue-interval",
            "200ms",
            "--handler",
            &good_cmd,
            "--handler",
            &poison_cmd,
        ];
        args.extend_from_slice(mode);
        let mut child = spawn_pgwake_run(&db.url, &args);
        // Until the poison job kills this worker, or ends dead.
        let crashed = wait_for(
            "the poison job to crash the worker or end dead",
            Duration::from_secs(60),
            async || {
                if child.try_wait().unwrap().is_some() {
                    Ok(true)
                } else if poison_dead().await {
                    Ok(false)
                } else {
                    Err("worker running, poison job not dead".into())
                }
            },
        )
        .await;
        if crashed {
            crashes += 1;
        } else {
            send_signal(&child, libc::SIGTERM);
            let out = wait_exit(child, Duration::from_secs(30)).await;
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    // Every good job ran and is done. Once, unless its first run came
    // before a crash: a sibling that ran in the crashed batch before the
    // poison job (tx mode, where the batch's outcomes commit together), or
    // whose outcome was not yet written (lease mode), runs at most once
    // more, alone (ARCHITECTURE.md → "Crash charges"). Which jobs share the
    // poison job's batch depends on how the claims fell; the 0.3 s the
    // poison job waits makes a second run rare, not impossible.
    let runs = std::fs::read_to_string(&ledger).unwrap_or_default();
    let mut first_run_before_crash = std::collections::BTreeMap::new();
    let mut counts = std::collections::BTreeMap::<i64, usize>::new();
    let mut crashed_yet = 0;
    for line in runs.lines().map(str::trim) {
        if line == "crash" {
            crashed_yet += 1;
            continue;
        }
        let id: i64 = line.parse().unwrap();
        *counts.entry(id).or_default() += 1;
        first_run_before_crash.entry(id).or_insert(crashed_yet);
    }
    let ran: Vec<i64> = counts.keys().copied().collect();
    assert_eq!(ran, good, "every good job ran: {runs}");
    for (id, n) in &counts {
        let crashes_after_first_run = crashed_yet - first_run_before_crash[id];
        assert!(
            *n == 1 || (*n == 2 && crashes_after_first_run > 0),
            "good job {id} ran {n} times, {crashes_after_first_run} crashes after its first run: {runs}"
        );
    }
    let left: i64 = db.scalar("SELECT count(*) FROM pgwake.jobs").await;
    let dead: i64 = db.scalar("SELECT count(*) FROM pgwake.dead_jobs").await;
    assert_eq!((left, dead), (0, 1), "only the poison job is dead");
    let reason = dead_reason(&client, poison).await;
    assert!(
        reason.contains("never reported") || reason.contains("stopped heartbeating"),
        "{reason}"
    );
}

#[tokio::test]
async fn tx_mode_a_poison_job_is_charged_alone_never_its_batch() {
    a_poison_job_is_charged_alone_never_its_batch(&["--tx-queues", "default"]).await;
}

#[tokio::test]
async fn lease_mode_a_poison_job_is_charged_alone_never_its_batch() {
    a_poison_job_is_charged_alone_never_its_batch(&[]).await;
}

/// Waits until the job's SQL function runs (its server process id) or the
/// job is dead (`None`), on fresh connections: the server restarts after
/// every kill. Never returns a process in `killed`: until the postmaster
/// has reaped a killed server process (and reset shared memory), a new
/// connection can still see it active in `pg_stat_activity`, and counting
/// that stale row as another run made the test see 3 runs of a job that
/// ran twice.
async fn running_or_dead(db: &TestDb, id: i64, killed: &[i32]) -> Option<i32> {
    wait_for("the job to run or die", Duration::from_secs(60), async || {
        let c = pgwake::connect::connect(&db.config())
            .await
            .map_err(|e| format!("server restarting: {e}"))?;
        let dead = c
            .query_one(
                "SELECT count(*) FROM pgwake.dead_jobs WHERE id = $1",
                &[&id],
            )
            .await
            .map_err(|e| e.to_string())?;
        if dead.get::<_, i64>(0) == 1 {
            return Ok(None);
        }
        let rows = c
            .query(
                "SELECT pid FROM pg_stat_activity WHERE state = 'active' AND wait_event = 'PgSleep' AND query LIKE '%crash_me%' AND pid <> pg_backend_pid() AND pid <> ALL($1)",
                &[&killed],
            )
            .await
            .map_err(|e| e.to_string())?;
        match rows.first() {
            Some(row) => Ok(Some(row.get(0))),
            None => Err("not running yet".into()),
        }
    })
    .await
}

/// Crashes its database session through the claim transaction: `SELECT
/// crash_me(…)` sleeps until the test kills its server process.
struct CrashesItsSession;

/// Uses the claim transaction and succeeds.
struct UsesTheDatabase;

#[async_trait]
impl Handler for UsesTheDatabase {
    async fn handle(&self, _: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let tx = ctx.transaction().await?.expect("a tx-mode job");
        tx.execute("SELECT 1", &[]).await?;
        Ok(Outcome::Done)
    }
}

#[async_trait]
impl Handler for CrashesItsSession {
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let tx = ctx.transaction().await?.expect("a tx-mode job");
        tx.execute("SELECT crash_me($1)", &[&job.payload]).await?;
        Ok(Outcome::Done)
    }
}

/// Issue repro: the crash ledger was UNLOGGED, so a job that crashes the
/// server (crash recovery truncates unlogged tables) was retried at attempt
/// 1 forever. Each run of this job has its server process killed with
/// SIGKILL (the server restarts all sessions and recovers); it must use up
/// its attempts and end dead. The WAL writer is slowed to 10 s, so a batch
/// mark committed asynchronously survives the crash only if the worker made
/// it durable before the handler first used the database (a `sql` handler's
/// call; a Rust handler's `ctx.transaction()`). `warm`: a job that used the
/// database ran first, so the crashing job's mark is committed durably at
/// once (the worker learnt that its handlers use the database).
async fn a_job_that_crashes_its_database_session_uses_up_its_attempts(sql: bool, warm: bool) {
    let (cluster, db) = private_cluster_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE FUNCTION crash_me(p jsonb) RETURNS void LANGUAGE sql AS $$ SELECT pg_sleep(600) $$",
        )
        .await
        .unwrap();
    for setting in [
        "ALTER SYSTEM SET wal_writer_delay = '10s'",
        "ALTER SYSTEM SET wal_writer_flush_after = '1GB'",
        "SELECT pg_reload_conf()",
    ] {
        client.batch_execute(setting).await.unwrap();
    }
    let _ = &cluster;
    if warm {
        enqueue(&client, &NewJob::new("warm", serde_json::json!({})))
            .await
            .unwrap();
    }
    let id = enqueue(
        &client,
        &NewJob::new("crash", serde_json::json!({})).max_attempts(2),
    )
    .await
    .unwrap();
    drop(client);
    let builder = Worker::builder(db.config()).config(WorkerConfig {
        concurrency: 1,
        poll_interval: Duration::from_millis(200),
        ..test_config()
    });
    let builder = if sql {
        builder
            .handler_arc(
                "crash",
                pgwake::handlers::parse_flag("crash=sql:crash_me")
                    .unwrap()
                    .1,
            )
            .handler_arc(
                "warm",
                pgwake::handlers::parse_flag("warm=sql:pg_catalog.jsonb_typeof")
                    .unwrap()
                    .1,
            )
    } else {
        builder
            .handler("crash", CrashesItsSession)
            .handler("warm", UsesTheDatabase)
    };
    let running = Running::start(builder.build().unwrap());
    let mut killed = Vec::new();
    loop {
        // Wait for the job to run (or be dead), on a fresh connection: the
        // server restarts after every kill.
        let pid = running_or_dead(&db, id, &killed).await;
        let Some(pid) = pid else { break };
        let kills = killed.len();
        assert!(kills < 6, "the job kept running after {kills} crashes");
        // SAFETY: kill(2) on the test cluster's server process.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
        killed.push(pid);
    }
    let kills = killed.len();
    let client = db.client().await;
    let attempts: i32 = client
        .query_one(
            "SELECT attempts FROM pgwake.dead_jobs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    // Every run was charged: the first ran in a claim of one job, the
    // others alone as suspects.
    assert_eq!(
        kills, 2,
        "max_attempts runs, then dead (attempts charged: {attempts}; server processes killed: {killed:?})"
    );
    assert_eq!(attempts, 2);
    let reason = dead_reason(&client, id).await;
    assert!(reason.contains("never reported"), "{reason}");
    running.shutdown().await;
}

#[tokio::test]
async fn a_sql_job_that_crashes_its_database_session_uses_up_its_attempts() {
    a_job_that_crashes_its_database_session_uses_up_its_attempts(true, false).await;
}

#[tokio::test]
async fn a_rust_job_that_crashes_its_database_session_through_the_claim_transaction_uses_up_its_attempts(
) {
    a_job_that_crashes_its_database_session_uses_up_its_attempts(false, false).await;
}

#[tokio::test]
async fn a_sql_job_that_crashes_its_database_session_after_others_used_it_uses_up_its_attempts() {
    a_job_that_crashes_its_database_session_uses_up_its_attempts(true, true).await;
}

#[tokio::test]
async fn a_rust_job_that_crashes_its_database_session_after_others_used_it_uses_up_its_attempts() {
    a_job_that_crashes_its_database_session_uses_up_its_attempts(false, true).await;
}

/// Waits for the test's word (`release`) after saying it started.
struct Gated {
    started: std::sync::Arc<tokio::sync::Notify>,
    release: std::sync::Arc<tokio::sync::Notify>,
}

#[async_trait]
impl Handler for Gated {
    async fn handle(&self, _: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        self.started.notify_one();
        self.release.notified().await;
        Ok(Outcome::Done)
    }
}

/// Issue repro (the ordering test's `[1, 3]` attempts): a batch's mark was
/// cleared after its claim transaction committed, not in it. On a
/// connection's first batch the clear (a cached statement) waited for its
/// Prepare round trip while the pipelined COMMIT went out first, so the
/// clear ran alone afterwards. In between, any other claim saw a mark whose
/// transaction had ended: "batches that never reported", and jobs charged
/// for runs they never had. Here the test holds the mark's row while the
/// batch finishes: the claim transaction must still be in progress when it
/// waits for that row.
#[tokio::test]
async fn a_batch_commits_in_the_same_transaction_that_clears_its_mark() {
    let db = migrated_db().await;
    insert_jobs(&db, "gated", 1).await;
    let started = std::sync::Arc::new(tokio::sync::Notify::new());
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            concurrency: 1,
            poll_interval: Duration::from_millis(200),
            ..test_config()
        })
        .handler(
            "gated",
            Gated {
                started: started.clone(),
                release: release.clone(),
            },
        )
        .build()
        .unwrap();
    let running = Running::start(worker);
    started.notified().await;
    let holder = db.client().await;
    holder.batch_execute("BEGIN").await.unwrap();
    let xid: String = holder
        .query_one("SELECT xid::text FROM pgwake.tx_batches FOR SHARE", &[])
        .await
        .unwrap()
        .get(0);
    let holder_pid: i32 = holder
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    release.notify_one();
    let probe = db.client().await;
    // The worker's clear waits for the row the test holds.
    eventually(
        "the batch's clear to wait for the held mark",
        Duration::from_secs(30),
        || async {
            probe
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
                    &[&holder_pid],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
                == 1
        },
    )
    .await;
    let status: Option<String> = probe
        .query_one("SELECT pg_xact_status($1::text::xid8)", &[&xid])
        .await
        .unwrap()
        .get(0);
    holder.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        status.as_deref(),
        Some("in progress"),
        "the claim transaction ended before its mark was cleared"
    );
    until_drained(&db).await;
    let marks: i64 = db.scalar("SELECT count(*) FROM pgwake.tx_batches").await;
    assert_eq!(marks, 0);
    running.shutdown().await;
}

/// `--concurrency` means what it says in tx mode at the defaults (issue 33,
/// item 16): a worker of 16 slots with a `sql` handler (tx mode, each
/// running batch holding its claim connection) runs 16 jobs at once. Each
/// job waits for an advisory lock the test holds, so every job the worker
/// runs stays running until released. Before, the claim pool's default
/// stopped at 10 connections, so 8 batches ran and 8 slots stayed idle
/// without a word. Above the pool's cap the worker says so at start.
#[tokio::test]
async fn a_tx_worker_runs_as_many_jobs_at_once_as_its_concurrency_says() {
    const HOLD: i64 = 0x6865_6c64; // "held"
    let db = migrated_db().await;
    let gate = db.client().await;
    gate.batch_execute(&format!(
        "CREATE FUNCTION public.held(payload jsonb) RETURNS void LANGUAGE sql
           AS $$ SELECT pg_advisory_lock_shared({HOLD}); SELECT pg_advisory_unlock_shared({HOLD}) $$;
         SELECT pg_advisory_lock({HOLD});"
    ))
    .await
    .unwrap();
    insert_jobs(&db, "held", 24).await;
    let mut worker = KillOnDrop::new(spawn_pgwake_run(
        &db.url,
        &["--concurrency", "16", "--handler", "held=sql:public.held"],
    ));
    let log = tail_stderr(worker.child());
    let waiting = async || -> i64 {
        gate.query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
               AND objid = $1::bigint::oid AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[&HOLD],
        )
        .await
        .unwrap()
        .get(0)
    };
    wait_for(
        "16 jobs running at once",
        Duration::from_secs(60),
        async || {
            if let Some(status) = worker.exited() {
                panic!("the worker exited ({status}): {}", log.lock().unwrap());
            }
            match waiting().await {
                16 => Ok(()),
                n => Err(format!("{n} running")),
            }
        },
    )
    .await;
    // Not more: the slots bound them.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(waiting().await, 16);
    assert!(
        !log.lock().unwrap().contains("batches run at once"),
        "{}",
        log.lock().unwrap()
    );
    gate.execute("SELECT pg_advisory_unlock($1)", &[&HOLD])
        .await
        .unwrap();
    eventually("every job ran", Duration::from_secs(60), || async {
        remaining(&db).await == 0
    })
    .await;
    send_signal(worker.child(), libc::SIGTERM);
    let out = wait_exit(worker.take(), Duration::from_secs(30)).await;
    assert!(out.status.success(), "{}", log.lock().unwrap());

    // Beyond the cap: said at start, with the flag that lifts it.
    let mut worker = KillOnDrop::new(spawn_pgwake_run(
        &db.url,
        &["--concurrency", "100", "--handler", "held=sql:public.held"],
    ));
    let log = tail_stderr(worker.child());
    wait_for(
        "the start-up line on the cap",
        Duration::from_secs(60),
        async || {
            let log = log.lock().unwrap().clone();
            let said = log.lines().any(|l| {
                l.contains("WARN")
                    && l.contains("at most 64 batches run at once, not --concurrency 100")
                    && l.contains("--max-connections 102")
                    && l.contains("Delivery::Lease, or --lease-queues")
            });
            if said {
                Ok(())
            } else {
                Err(log)
            }
        },
    )
    .await;
    send_signal(worker.child(), libc::SIGTERM);
    let out = wait_exit(worker.take(), Duration::from_secs(30)).await;
    assert!(out.status.success(), "{}", log.lock().unwrap());
}

/// Each job's claim transaction (its xid) and id, in the order they ran.
type Batches = std::sync::Arc<std::sync::Mutex<Vec<(i64, i64)>>>;

/// Records each job's claim transaction (its xid), so that a test can see
/// how many jobs each tx batch held.
struct RecordsItsBatch {
    batches: Batches,
}

/// A worker with `config` whose task `t` records its batches, started and
/// listening.
async fn recording_worker(db: &TestDb, config: WorkerConfig) -> (Running, Batches) {
    let batches = Batches::default();
    let worker = Worker::builder(db.config())
        .config(config)
        .handler(
            "t",
            RecordsItsBatch {
                batches: batches.clone(),
            },
        )
        .build()
        .unwrap();
    let w = Running::start(worker);
    w.until_listening().await;
    (w, batches)
}

#[async_trait]
impl Handler for RecordsItsBatch {
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let tx = ctx.transaction().await?.expect("a tx-mode job");
        let xid: i64 = tx.query_one("SELECT txid_current()", &[]).await?.get(0);
        self.batches.lock().unwrap().push((xid, job.id));
        Ok(Outcome::Done)
    }
}

/// The largest batch among the jobs in `ids`.
fn largest_batch(batches: &[(i64, i64)], ids: &[i64]) -> usize {
    let mut per: std::collections::HashMap<i64, usize> = Default::default();
    for (xid, id) in batches {
        if ids.contains(id) {
            *per.entry(*xid).or_default() += 1;
        }
    }
    per.into_values().max().unwrap_or(0)
}

/// Once a tx claim finds fewer jobs than it asked for, the worker's tx
/// claims start one per `claim_pace` (claim/choose/idle.rs), pressure or
/// not: jobs inserted one by one after a partial batch gather into the next
/// batch instead of each being claimed as it comes. One claim task; twenty
/// jobs in one statement grow its batches (1, 2, 4, 8, then 5: partial);
/// with a pace of 1 s, three jobs inserted one by one right after them,
/// 50 ms apart, share one claim transaction. Fails with `claim_pace` zero
/// (no pacing): the worker claims again as soon as a batch commits and
/// takes the three as they come (more than one transaction in 8 of 8
/// runs).
#[tokio::test]
async fn tx_claims_after_a_partial_batch_are_paced() {
    let db = migrated_db().await;
    let c = db.client().await;
    let config = WorkerConfig {
        claim_pace: Duration::from_secs(1),
        concurrency: 1,
        ..test_config()
    };
    let (w, batches) = recording_worker(&db, config).await;
    let ran = async |ids: &[i64]| {
        let b = batches.lock().unwrap();
        ids.iter()
            .all(|id| b.iter().any(|(_, j)| j == id))
            .then_some(())
            .ok_or(format!("{} of {} ran", b.len(), ids.len()))
    };
    let first = insert_jobs(&db, "t", 20).await;
    wait_for(
        "the first twenty jobs",
        Duration::from_secs(30),
        async || ran(&first).await,
    )
    .await;
    let mut later = Vec::new();
    for i in 0..3 {
        // A producer's pace, not a synchronisation: 50 ms between inserts,
        // all three well inside the 1 s pace, each far more than a claim.
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let id: i64 = c
            .query_one(
                "INSERT INTO pgwake.jobs (task) VALUES ('t') RETURNING id",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        later.push(id);
    }
    wait_for(
        "the three later jobs",
        Duration::from_secs(30),
        async || ran(&later).await,
    )
    .await;
    w.shutdown().await;
    let b = batches.lock().unwrap();
    assert_eq!(
        largest_batch(&b, &later),
        3,
        "the jobs inserted one by one after a partial batch were claimed as they came: {b:?}"
    );
}

/// Issue 35, item 2: while the governor's level is above ok (as the
/// worker's own sampler read it), tx-mode batches take at most
/// `TX_BATCH_UNDER_PRESSURE` jobs, so the worker's claim transactions are
/// not what holds the horizon; without pressure they grow to `--batch`.
#[tokio::test]
async fn under_pressure_tx_batches_are_capped() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(
        "SELECT pgwake.set_pressure_thresholds(horizon_elevated_seconds => 1, horizon_critical_seconds => 600)",
    )
    .await
    .unwrap();
    let config = WorkerConfig {
        batch: 100,
        concurrency: 1,
        sample_interval: Some(Duration::from_millis(100)),
        ..test_config()
    };
    let (w, batches) = recording_worker(&db, config).await;
    let run = async |n: i64| -> Vec<i64> {
        let ids: Vec<i64> = c
            .query(
                "INSERT INTO pgwake.jobs (task) SELECT 't' FROM generate_series(1, $1::int8) RETURNING id",
                &[&n],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        wait_for("the jobs to run", Duration::from_secs(60), async || {
            let left: i64 = c
                .query_one("SELECT count(*) FROM pgwake.jobs", &[])
                .await
                .unwrap()
                .get(0);
            if left == 0 {
                Ok(())
            } else {
                Err(format!("{left} left"))
            }
        })
        .await;
        ids
    };
    let calm = run(1000).await;
    let calm_max = largest_batch(&batches.lock().unwrap(), &calm);
    assert!(calm_max > pgwake::TX_BATCH_UNDER_PRESSURE, "{calm_max}");

    let pin = connect_as(&db, "report").await;
    pin.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;")
        .await
        .unwrap();
    let health = w.health.clone();
    eventually(
        "the sampler to see the pressure",
        Duration::from_secs(30),
        || {
            let h = health.clone();
            async move { h.under_pressure() }
        },
    )
    .await;
    let pressed = run(1000).await;
    let pressed_max = largest_batch(&batches.lock().unwrap(), &pressed);
    assert!(
        (1..=pgwake::TX_BATCH_UNDER_PRESSURE).contains(&pressed_max),
        "{pressed_max} (without pressure: {calm_max})"
    );
    pin.batch_execute("COMMIT").await.unwrap();
    w.stop.cancel();
    w.join.await.unwrap().unwrap();
}
