//! Worker processes killed with `kill -9` in the middle of a job, in both
//! delivery modes: the job runs again, never while its first run is alive,
//! and a job that kills every worker that runs it ends dead.

use crate::common;

use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};

async fn killed_mid_job_runs_again_never_concurrently(mode: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("block", serde_json::json!({})).max_attempts(5),
    )
    .await
    .unwrap();
    let mut a = ChaosWorker::spawn(&db, mode);
    until_runs(&db, "attempt 1 running", Duration::from_secs(30), |r| {
        r.iter().any(|x| x.0 == id && x.1 == 1)
    })
    .await;
    // A second worker is already waiting when the first dies: it races for
    // the job as soon as the database gives it back.
    let b = ChaosWorker::spawn(&db, mode);
    a.kill9();
    until_runs(&db, "attempt 2", Duration::from_secs(60), |r| {
        r.iter().any(|x| x.0 == id && x.1 == 2)
    })
    .await;
    let runs = ledger_runs(&db).await;
    assert!(
        runs.iter().all(|r| !r.3),
        "a run overlapped a live earlier run: {runs:?}"
    );
    let attempts: Vec<i32> = runs.iter().map(|r| r.1).collect();
    assert_eq!(attempts, vec![1, 2], "ran again as attempt 2, once");
    assert_ne!(runs[1].2, a.pid(), "the second run is the other worker's");
    assert!(b.terminate().await.success());
    let left: i64 = db.scalar("SELECT count(*) FROM pgwake.jobs").await;
    let leased: i64 = db.scalar("SELECT count(*) FROM pgwake.leased_jobs").await;
    assert_eq!((left, leased), (0, 0), "the job completed");
}

#[tokio::test]
async fn tx_mode_job_of_a_killed_worker_runs_again_never_concurrently() {
    killed_mid_job_runs_again_never_concurrently(&[]).await;
}

#[tokio::test]
async fn lease_mode_job_of_a_killed_worker_runs_again_never_concurrently() {
    killed_mid_job_runs_again_never_concurrently(&["--lease", "--lease-ms", "1500"]).await;
}

async fn a_job_that_kills_every_worker_ends_dead(mode: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("poison", serde_json::json!({})).max_attempts(3),
    )
    .await
    .unwrap();
    for attempt in 1..=3 {
        let mut w = ChaosWorker::spawn(&db, mode);
        until_runs(
            &db,
            &format!("attempt {attempt}"),
            Duration::from_secs(60),
            |r| r.iter().any(|x| x.0 == id && x.1 == attempt),
        )
        .await;
        w.kill9();
    }
    let w = ChaosWorker::spawn(&db, mode);
    let reason: String = wait_for(
        "the poison job to reach dead_jobs",
        Duration::from_secs(60),
        async || {
            client
                .query_opt(
                    "SELECT last_error FROM pgwake.dead_jobs WHERE id = $1",
                    &[&id],
                )
                .await
                .unwrap()
                .map(|row| row.get(0))
                .ok_or_else(|| "not dead yet".to_string())
        },
    )
    .await;
    assert!(w.terminate().await.success());
    let attempts: Vec<i32> = ledger_runs(&db).await.iter().map(|r| r.1).collect();
    assert_eq!(attempts, vec![1, 2, 3], "no fourth run");
    assert!(reason.contains("3"), "{reason}");
}

#[tokio::test]
async fn tx_mode_a_job_that_kills_its_worker_every_time_ends_dead() {
    a_job_that_kills_every_worker_ends_dead(&[]).await;
}

#[tokio::test]
async fn lease_mode_a_job_that_kills_its_worker_every_time_ends_dead() {
    a_job_that_kills_every_worker_ends_dead(&["--lease", "--lease-ms", "1000"]).await;
}

/// A lease worker killed with a full prefetch buffer, again and again: the
/// buffered jobs come back through the rescuer with their attempts refunded
/// (they may not have started), nothing is lost, each runs once, and a
/// poison job that keeps getting its workers killed still ends dead after
/// its attempts (its runs started from a buffer refunded too).
#[tokio::test]
async fn lease_mode_a_worker_killed_with_a_full_prefetch_buffer_loses_nothing() {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    let client = db.client().await;
    let poison = enqueue(
        &client,
        &NewJob::new("poison", serde_json::json!({})).max_attempts(3),
    )
    .await
    .unwrap();
    let mut work = Vec::new();
    for _ in 0..4 {
        work.push(
            enqueue(
                &client,
                &NewJob::new("work", serde_json::json!({})).max_attempts(3),
            )
            .await
            .unwrap(),
        );
    }
    let mode = [
        "--lease",
        "--lease-ms",
        "1000",
        "--concurrency",
        "1",
        "--prefetch",
        "4",
        // The poison run holds the one slot: with nothing started for
        // --prefetch-wait (1 s by default) the buffer would be handed back
        // before the check below on a loaded machine.
        "--prefetch-wait-ms",
        "3600000",
    ];
    let poison_dead = async || -> bool {
        let dead: i64 = db
            .scalar(&format!(
                "SELECT count(*) FROM pgwake.dead_jobs WHERE id = {poison}"
            ))
            .await;
        dead == 1
    };
    let mut killed = 0;
    let w = loop {
        assert!(
            killed < 6,
            "the poison job still not dead after {killed} kills"
        );
        let seen = ledger_runs(&db)
            .await
            .iter()
            .filter(|r| r.0 == poison)
            .count();
        let mut w = ChaosWorker::spawn(&db, &mode);
        wait_for(
            "the poison job's next run, or its end",
            Duration::from_secs(60),
            async || {
                let runs = ledger_runs(&db)
                    .await
                    .iter()
                    .filter(|r| r.0 == poison)
                    .count();
                (runs > seen || poison_dead().await)
                    .then_some(())
                    .ok_or_else(|| format!("{runs} poison runs"))
            },
        )
        .await;
        if poison_dead().await {
            // This worker (its rescuer buried the poison job) runs the rest.
            break w;
        }
        if killed == 0 {
            // The poison job holds the one slot; the other four wait in the
            // buffer, leased.
            let leased: i64 = db.scalar("SELECT count(*) FROM pgwake.leased_jobs").await;
            assert_eq!(leased, 5, "one running, four prefetched");
        }
        w.kill9();
        killed += 1;
    };
    wait_for(
        "every other job done",
        Duration::from_secs(60),
        async || {
            let left: i64 = db
                .scalar("SELECT (SELECT count(*) FROM pgwake.jobs) + (SELECT count(*) FROM pgwake.leased_jobs)")
                .await;
            (left == 0).then_some(()).ok_or_else(|| format!("{left} left"))
        },
    )
    .await;
    assert!(w.terminate().await.success());
    let runs = ledger_runs(&db).await;
    let poison_runs: Vec<i32> = runs.iter().filter(|r| r.0 == poison).map(|r| r.1).collect();
    assert!(
        poison_runs.last() == Some(&3) && poison_runs.windows(2).all(|w| w[0] <= w[1]),
        "the poison job ran as attempts {poison_runs:?}: its three, and runs from a buffer refunded"
    );
    for id in &work {
        // Charged only for runs that started: the n-th run of a job is at
        // most its n-th attempt.
        let attempts: Vec<i32> = runs.iter().filter(|r| r.0 == *id).map(|r| r.1).collect();
        assert!(
            !attempts.is_empty() && attempts.iter().zip(1..).all(|(a, n)| *a <= n),
            "job {id} ran as attempts {attempts:?}: {runs:?}"
        );
    }
    let dead: i64 = db.scalar("SELECT count(*) FROM pgwake.dead_jobs").await;
    assert_eq!(dead, 1, "only the poison job is dead");
}

/// A job that kills its own worker process (as an OOM kill or a segfault in
/// a native library does) while good jobs wait in that worker's prefetch
/// buffer, in a crash loop with immediate restarts (systemd's
/// `Restart=always`): the good jobs are never charged for a run that did
/// not start, and end done; only the crashing job ends dead, after its own
/// attempts. Before the buffered leases were refunded, every
/// crash charged the buffered jobs too, and the good ones ended dead ("lease
/// expired on the last attempt") without ever having run.
#[tokio::test]
async fn lease_mode_a_job_that_kills_its_worker_never_charges_the_jobs_buffered_beside_it() {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    let client = db.client().await;
    let job = |task: &str| NewJob::new(task, serde_json::json!({})).max_attempts(3);
    // In claim order: a good job takes the one slot, the crashing job and
    // two good ones wait in the buffer behind it.
    let first = enqueue(&client, &job("work")).await.unwrap();
    let crash = enqueue(&client, &job("crash")).await.unwrap();
    let mut good = vec![first];
    for _ in 0..2 {
        good.push(enqueue(&client, &job("work")).await.unwrap());
    }
    let mode = [
        "--lease",
        "--lease-ms",
        "1000",
        "--concurrency",
        "1",
        "--prefetch",
        "4",
        "--prefetch-wait-ms",
        "3600000",
    ];
    let settled = async || -> bool {
        let row = client
            .query_one(
                "SELECT (SELECT count(*) FROM pgwake.jobs) + (SELECT count(*) FROM pgwake.leased_jobs),
                        (SELECT count(*) FROM pgwake.dead_jobs)",
                &[],
            )
            .await
            .unwrap();
        let (left, dead): (i64, i64) = (row.get(0), row.get(1));
        left == 0 && dead >= 1
    };
    let mut crashes = 0;
    loop {
        let mut w = ChaosWorker::spawn(&db, &mode);
        // Until this worker dies (restarted at once) or every job has ended.
        let died = wait_for(
            "the worker to die or every job to end",
            Duration::from_secs(60),
            async || {
                if w.child.try_wait().unwrap().is_some() {
                    return Ok(true);
                }
                if settled().await {
                    return Ok(false);
                }
                Err("running".to_string())
            },
        )
        .await;
        if !died {
            assert!(w.terminate().await.success());
            break;
        }
        crashes += 1;
        assert!(
            crashes <= 8,
            "still crashing after {crashes} restarts: {:?}",
            ledger_runs(&db).await
        );
    }
    let runs = ledger_runs(&db).await;
    for id in &good {
        // Charged only for runs that started: the n-th run of a job is at
        // most its n-th attempt. (A good job may run twice: a crash right
        // after it finished, before its outcome was written, is a crash
        // during its run.)
        let attempts: Vec<i32> = runs.iter().filter(|r| r.0 == *id).map(|r| r.1).collect();
        assert!(
            !attempts.is_empty() && attempts.iter().zip(1..).all(|(a, n)| *a <= n),
            "good job {id} ran as attempts {attempts:?}: charged for runs that never started: {runs:?}"
        );
    }
    let dead: Vec<(i64, i32, String)> = client
        .query("SELECT id, attempts, last_error FROM pgwake.dead_jobs", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(dead.len(), 1, "only the crashing job is dead: {dead:?}");
    assert_eq!((dead[0].0, dead[0].1), (crash, 3), "{dead:?}");
    assert!(dead[0].2.contains("3 of 3"), "{dead:?}");
    // Its runs from a buffer were refunded (it may not have started), the
    // others charged: it ended dead on its third charged run.
    let crash_runs: Vec<i32> = runs.iter().filter(|r| r.0 == crash).map(|r| r.1).collect();
    assert!(
        crash_runs.last() == Some(&3) && crash_runs.windows(2).all(|w| w[0] <= w[1]),
        "the crashing job ran as attempts {crash_runs:?}: {runs:?}"
    );
}

/// A job rescued from a dead worker keeps its place: its run_at is what it
/// was when claimed, so it (and its ordering key's later jobs) is not sent
/// behind everything enqueued meanwhile. Before, the rescue set run_at to
/// the rescue's time, and an ordered key's jobs ran after every other key's.
#[tokio::test]
async fn a_rescued_job_keeps_its_place_in_the_queue() {
    let db = migrated_db().await;
    let c = db.client().await;
    let first: i64 = c
        .query_one(
            "INSERT INTO pgwake.jobs (task, payload, run_at, ordering_key)
             VALUES ('t', '{}', now() - interval '1 hour', 'k') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let run_at: std::time::SystemTime = c
        .query_one("SELECT run_at FROM pgwake.jobs WHERE id = $1", &[&first])
        .await
        .unwrap()
        .get(0);
    // Claimed on a free slot by a worker that then dies; a later job is
    // enqueued meanwhile.
    let claim = "SELECT id FROM pgwake.claim_lease_all(1, '{}', NULL, '{}', 'dead-worker', 60, 1)";
    let claimed: i64 = c.query_one(claim, &[]).await.unwrap().get(0);
    assert_eq!(claimed, first);
    let later: i64 = c
        .query_one(
            "INSERT INTO pgwake.jobs (task, payload, run_at) VALUES ('t', '{}', now() - interval '1 minute') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    c.batch_execute("UPDATE pgwake.leased_jobs SET lease_until = now() - interval '1 second'")
        .await
        .unwrap();
    let what: String = c
        .query_one("SELECT what FROM pgwake.rescue(10)", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(what, "requeued", "charged: it ran on a free slot");
    let row = c
        .query_one(
            "SELECT run_at, attempts FROM pgwake.jobs WHERE id = $1",
            &[&first],
        )
        .await
        .unwrap();
    let (back_at, attempts): (std::time::SystemTime, i32) = (row.get(0), row.get(1));
    assert_eq!(
        (back_at, attempts),
        (run_at, 1),
        "its run_at kept, its attempt charged"
    );
    let next: i64 = c.query_one(claim, &[]).await.unwrap().get(0);
    assert_eq!(
        next, first,
        "claimed before the job {later} enqueued after it"
    );
}
