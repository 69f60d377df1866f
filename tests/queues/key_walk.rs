//! One call visits a bounded number of limit keys (issue 24): a claim of a
//! queue with per-key limits, or a per-key rate's reservation, passes over
//! at most `pgwake.key_walk_bound()` keys (at their limit or rate) and
//! reports the last key it visited; the worker's rotation resumes after it,
//! so a key behind the bound is still served, within ceil(keys / bound)
//! calls. Before, one call visited every key (10,000 keys at their rate:
//! 4.6 s a reservation). Counted, not timed: the pages a call touches, the
//! key it reports, and the calls a worker made (`pg_stat_user_functions`).

use crate::common;
use crate::key_backlog::{
    claim_and_count, claim_limited_and_count, counting_session, PAGES_PER_PASSED_KEY,
};
use crate::queues::until_all_ran;

use common::*;
use pgwake::internal::sql::{self, Sql};
use tokio_postgres::types::ToSql;

/// Keys at their limit or rate: ten times the bound (128), and fixed, not
/// derived from it, so that the test still means the same with the bound
/// removed.
const KEYS: i32 = 1280;

/// The bound of keys one call passes over.
async fn bound(db: &TestDb) -> i32 {
    db.scalar("SELECT pgwake.key_walk_bound()").await
}

/// The `i`-th key in byte order.
fn key(i: i32) -> String {
    format!("k{i:05}")
}

/// `n` keys of queue `queue` with 2 ready jobs each, every one at its limit
/// (`rate` false: its one slot held, as by a running lease of the key) or
/// its rate (its one admission an hour spent).
async fn full_keys(db: &TestDb, queue: &str, n: i32, rate: bool) {
    let setting = if rate {
        format!("SELECT pgwake.set_queue_rate_per_key('{queue}', 1, interval '1 hour')")
    } else {
        format!("SELECT pgwake.set_queue_max_running_per_key('{queue}', 1)")
    };
    let spent = if rate {
        format!(
            "INSERT INTO pgwake.key_rate_slots (queue, limit_key, slot, last_start)
             SELECT '{queue}', 'k' || lpad(g::text, 5, '0'), 1, now() FROM generate_series(0, {n} - 1) g"
        )
    } else {
        format!("UPDATE pgwake.key_slots SET lease_token = -1 WHERE queue = '{queue}'")
    };
    db.client()
        .await
        .batch_execute(&format!(
            "{setting};
             INSERT INTO pgwake.jobs (queue, task, payload, limit_key)
             SELECT '{queue}', 'work', '{{}}', 'k' || lpad((g % {n})::text, 5, '0')
             FROM generate_series(1, {n} * 2) g;
             {spent};
             ANALYZE pgwake.jobs;"
        ))
        .await
        .unwrap();
}

/// A claim of a per-key-limited queue whose keys are all at their limit
/// ([`KEYS`], ten times the bound) passes over the bound's keys, no more:
/// it reports the last key it visited, the bound-th in byte order, and
/// touches at most [`PAGES_PER_PASSED_KEY`] pages per key of the bound; the
/// next claim, after that key, visits the next bound's keys. In both modes'
/// claim statements.
///
/// Teeth: with `pgwake.key_walk_bound()` returning 1,000,000 (no bound),
/// this fails: no key is reported, and the claim touches the pages of all
/// 1,280 keys (it touches about 15 pages a key: 1,958 for the bound's).
#[tokio::test]
async fn a_claim_passes_over_at_most_the_bounds_keys_and_reports_where_it_stopped() {
    let db = migrated_db().await;
    let b = bound(&db).await;
    full_keys(&db, "tn", KEYS, false).await;
    let (claimer, mut notices) = counting_session(&db).await;
    let mut after: Option<String> = None;
    for round in 1..=2 {
        for lease in [false, true] {
            let (claim, rows, pages) =
                claim_limited_and_count(&claimer, &mut notices, lease, 10, "tn", after.clone())
                    .await;
            let stops = reported_stops(claim, &rows);
            assert_eq!(
                stops,
                vec![key(round * b - 1)],
                "{}: the key where a claim after {after:?} stopped",
                claim.name
            );
            assert!(
                pages <= PAGES_PER_PASSED_KEY * i64::from(b),
                "{}: {pages} pages for one claim, over {} full keys",
                claim.name,
                KEYS
            );
        }
        after = Some(key(round * b - 1));
    }
}

/// The keys a claim reported as where its walk stopped (the column before
/// the last, `release_s` (migration 0045), of its rows without a job),
/// after checking that it took no job.
fn reported_stops(claim: &Sql, rows: &[tokio_postgres::Row]) -> Vec<String> {
    assert!(
        rows.iter().all(|r| r.get::<_, Option<i64>>(0).is_none()),
        "{}: took a job of a full key",
        claim.name
    );
    rows.iter()
        .filter_map(|r| r.get::<_, Option<String>>(r.len() - 2))
        .collect()
}

/// The same for a per-key rate's reservation, every key's admission spent:
/// it stops at the bound-th key, returns it, and touches at most
/// [`PAGES_PER_PASSED_KEY`] pages per key of the bound.
///
/// Teeth: with `pgwake.key_walk_bound()` returning 1,000,000, this fails
/// (no key returned, and the pages of all 1,280 keys: it touches about 12
/// pages a key, 1,549 for the bound's).
#[tokio::test]
async fn a_reservation_passes_over_at_most_the_bounds_keys_and_returns_where_it_stopped() {
    let db = migrated_db().await;
    let b = bound(&db).await;
    full_keys(&db, "tr", KEYS, true).await;
    let (claimer, mut notices) = counting_session(&db).await;
    let (queue, wanted) = ("tr".to_string(), 10i64);
    let (any, none, no_job) = (None::<Vec<String>>, Vec::<String>::new(), None::<i64>);
    let mut after: Option<String> = None;
    for round in 1..=2 {
        let params: Vec<&(dyn ToSql + Sync)> = vec![&queue, &after, &wanted, &any, &none, &no_job];
        let (rows, pages) =
            claim_and_count(&claimer, &mut notices, &sql::KEY_RATE_RESERVE, &params).await;
        assert_eq!(rows.len(), 1);
        assert!(rows[0].get::<_, Vec<String>>(2).is_empty(), "an admission");
        let stop: Option<String> = rows[0].get(6);
        assert_eq!(
            stop,
            Some(key(round * b - 1)),
            "where a reservation after {after:?} stopped"
        );
        assert!(
            pages <= PAGES_PER_PASSED_KEY * i64::from(b),
            "{pages} pages for one reservation, over {KEYS} keys at their rate"
        );
        after = stop;
    }
}

/// Calls of `function` (schema pgwake) the worker made, counted by the
/// server (`track_functions`), once every worker connection has ended (a
/// backend's counts are written when it exits).
async fn calls_after_the_worker_ends(db: &TestDb, function: &str) -> i64 {
    wait_for(
        "the worker's connections to end",
        std::time::Duration::from_secs(60),
        async || {
            let n: i64 = db
                .scalar(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND application_name LIKE 'pgwake%'",
                )
                .await;
            if n == 0 {
                Ok(())
            } else {
                Err(format!("{n} connections"))
            }
        },
    )
    .await;
    db.scalar(&format!(
        "SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_user_functions
         WHERE schemaname = 'pgwake' AND funcname = '{function}'"
    ))
    .await
}

/// Three times the bound of keys at their limit (`rate` false) or rate, and
/// one more key after them all with a ready job: a worker (one place, no
/// polls, nothing enqueued after it starts) serves that key within
/// ceil(keys / bound) calls, each passing over the bound's keys and
/// resuming after the last it visited (`pgwake.fair_key_jobs`, or
/// `pgwake.reserve_key_admissions` under a rate, counted by the server).
///
/// Teeth: with `KeyCursors::served` (src/claim/choose/key_rotation.rs) ignoring
/// the reported stop (the cursor stays where it was, as before the bound),
/// the worker visits the first bound's keys again and again and the key
/// behind them never runs (the wait for its run times out, both tests);
/// likewise without the wake-up to claim again after a call stopped at the
/// bound with nothing taken (`Walk::served`, src/claim/choose/targets.rs): the
/// worker waits for a poll or a notification that never comes (lease test
/// run).
async fn a_key_behind_the_bound_is_served_within_the_stated_calls(rate: bool, extra: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    db.client()
        .await
        .batch_execute(
            "DO $$ BEGIN
                 EXECUTE format('ALTER DATABASE %I SET track_functions = ''pl''', current_database());
             END $$",
        )
        .await
        .unwrap();
    let b = bound(&db).await;
    // Three times the bound (fixed, as KEYS).
    let n = 384;
    full_keys(&db, "tn", n, rate).await;
    // The last key in byte order: a gated job, which stays running (so the
    // worker's one place stays busy, and it claims no more) once started.
    let behind: i64 = db
        .scalar(
            "INSERT INTO pgwake.jobs (queue, task, payload, limit_key)
             VALUES ('tn', 'gated', '{}', 'z') RETURNING id",
        )
        .await;
    let gate = Gate::closed(&db).await;
    let mut args = vec!["--concurrency", "1", "--poll-ms", "3600000"];
    args.extend_from_slice(extra);
    let mut worker = ChaosWorker::spawn(&db, &args);
    until_all_ran(&db, "the job of the key behind the bound to run", &[behind]).await;
    worker.kill9();
    let function = if rate {
        "reserve_key_admissions"
    } else {
        "fair_key_jobs"
    };
    let calls = calls_after_the_worker_ends(&db, function).await;
    let keys = n + 1;
    let stated = (keys + b - 1) / b;
    assert!(
        calls <= i64::from(stated),
        "{calls} calls of pgwake.{function} to serve the last of {keys} keys (bound {b}: at most {stated})"
    );
    gate.open().await;
}

#[tokio::test]
async fn tx_mode_a_key_behind_the_bound_of_keys_at_their_rate_is_served() {
    a_key_behind_the_bound_is_served_within_the_stated_calls(true, &[]).await;
}

#[tokio::test]
async fn lease_mode_a_key_behind_the_bound_of_keys_at_their_limit_is_served() {
    a_key_behind_the_bound_is_served_within_the_stated_calls(false, &["--lease"]).await;
}
