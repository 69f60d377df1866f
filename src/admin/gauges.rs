//! The gauges of the queues and of the database pressure they create, read
//! in one bounded sample: the worker's sampler publishes them as metrics
//! every `--sample-interval`, `pgwake stats` prints them uncapped.

use std::time::{Duration, Instant};

use crate::db::sql::{self, Db};
use crate::error::{Error, Result};

/// Per queue and state, rows are counted up to this many; a deeper queue
/// reports this number. It bounds the sampling query's cost on huge backlogs.
pub const DEPTH_CAP_DEFAULT: i64 = 100_000;

/// Time limit of one sample (the server's `statement_timeout` for its
/// queries). 5 s: the default sampling interval.
pub const TIME_LIMIT_DEFAULT: Duration = Duration::from_secs(5);

/// How many ready jobs of each queue, in claim order, are checked for a
/// running tx-mode claim (see [`QueueSample::ready`]). Bounds the heap reads
/// of the sample; claims take their rows from the head of the queue.
pub const RUNNING_CHECK_WINDOW: i64 = 10_000;

/// What a waiting job can wait for, as [`Sample::waiting`] counts it (the
/// `reason` label of `pgwake_jobs_waiting`): its handler snoozed it, put it
/// to sleep or made it wait for a signal, or it is held until its parents
/// end done.
pub const WAITING_REASONS: &[&str] = &["snoozed", "sleeping", "signal", "parents"];

/// Rows of its own table each reason of [`Sample::waiting`] reads at most
/// (or the depth cap, when lower): each is an index probe of the job, so a
/// sample's cost for the waits is this many probes per reason at most
/// (10,000: about 0.1 s for three reasons at the cap, 100,000: 1.3 s, on a
/// loaded 2-core machine; docs/src/metrics.md).
pub const WAITING_CAP: i64 = 10_000;

/// One queue's gauges.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq)]
pub struct QueueSample {
    /// The queue.
    pub queue: String,
    /// Ready jobs (`run_at <= now()`) that no tx-mode claim is running,
    /// counted up to the cap. Running claims are recognised among the first
    /// [`RUNNING_CHECK_WINDOW`] ready jobs in claim order; in a deeper queue
    /// the count may include jobs in flight further back (at most that many).
    pub ready: i64,
    /// Scheduled jobs (capped).
    pub scheduled: i64,
    /// Dead jobs (capped).
    pub dead: i64,
    /// Seconds the longest-waiting ready job has been ready (since the later
    /// of its `created_at` and `run_at`); 0 when none is ready.
    pub oldest_ready_age: f64,
}

/// What one sample read.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Per-queue gauges.
    pub queues: Vec<QueueSample>,
    /// Idle-in-transaction sessions by application_name.
    pub idle_in_transaction: Vec<(String, i64)>,
    /// Transaction age of the oldest idle-in-transaction session.
    pub idle_in_transaction_max_age: f64,
    /// Age of the oldest open transaction in the database.
    pub oldest_transaction_age: f64,
    /// `pg_notification_queue_usage()`.
    pub notification_queue_usage: f64,
    /// Dead tuples of `pgwake.jobs`.
    pub dead_tuples: i64,
    /// Malformed trace contexts producers gave and the database ignored,
    /// in all (`pgwake.trace_context_rejected`, functions/traces.sql).
    pub trace_context_rejected: i64,
    /// Paused queues (`pgwake queue pause`), by name.
    pub paused: Vec<String>,
    /// Queues with a max-running limit (`pgwake queue set --max-running`)
    /// and that limit, by name.
    pub max_running: Vec<(String, i32)>,
    /// Queues with a rate limit (`pgwake queue set --rate`) and that rate
    /// in admissions per second, by name.
    pub rate: Vec<(String, f64)>,
    /// Queues with a per-key running limit (`pgwake queue set
    /// --max-running-per-key`) and that limit, by name.
    pub max_running_per_key: Vec<(String, i32)>,
    /// Queues with a per-key rate (`pgwake queue set --rate-per-key`) and
    /// that rate in admissions per second per key, by name.
    pub rate_per_key: Vec<(String, f64)>,
    /// Queues whose claims rotate between limit keys (`pgwake queue set
    /// --fair-keys`), by name.
    pub fair_keys: Vec<String>,
    /// Queues the governor paused under critical pressure
    /// (`--shed-under-pressure`, `pgwake.pressure()`), by name.
    pub shed: Vec<String>,
    /// Waiting jobs by what they wait for, per queue: (queue, reason,
    /// count), reason one of [`WAITING_REASONS`]; each reason counted over
    /// at most [`WAITING_CAP`] rows of its table
    /// (`src/db/sql/sample_waiting.sql`).
    /// A queue and reason with none is left out.
    pub waiting: Vec<(String, String, i64)>,
    /// How long the sample took (connection checkout included).
    pub duration: Duration,
    /// Whether [`Sample::queues`] was read ([`sample_parts`]); when not,
    /// it is empty and says nothing about the queues.
    pub queues_read: bool,
}

/// Read one sample within [`TIME_LIMIT_DEFAULT`]; see [`sample_with`].
pub async fn sample(pool: &deadpool_postgres::Pool, depth_cap: i64) -> Result<Sample> {
    sample_with(pool, depth_cap, Some(TIME_LIMIT_DEFAULT)).await
}

/// Read one sample: four pipelined queries in one read-only transaction on a
/// pooled connection, under `statement_timeout` = `time_limit` (`None`: no
/// limit, as `pgwake stats` reads). Counts stop at `depth_cap` (`i64::MAX`:
/// no cap).
pub async fn sample_with(
    pool: &deadpool_postgres::Pool,
    depth_cap: i64,
    time_limit: Option<Duration>,
) -> Result<Sample> {
    sample_parts(pool, depth_cap, time_limit, true).await
}

/// As [`sample_with`], reading the per-queue gauges only when `read_queues`
/// (the worker's sampler skips them on most ticks while the vacuum horizon
/// is held: `services/sampler.rs`, `PRESSURE_QUEUE_GAUGES_EVERY`).
pub async fn sample_parts(
    pool: &deadpool_postgres::Pool,
    depth_cap: i64,
    time_limit: Option<Duration>,
    read_queues: bool,
) -> Result<Sample> {
    let started = Instant::now();
    let mut conn = pool.get().await.map_err(Error::pool("sampler"))?;
    let tx = conn
        .build_transaction()
        .read_only(true)
        .start()
        .await
        .map_err(Error::db("sampler: begin"))?;
    tx.batch_execute("SET LOCAL jit = off")
        .await
        .map_err(Error::db("sampler: set jit"))?;
    let limit_ms = time_limit.map_or(0, |d| d.as_millis().max(1) as u64);
    tx.batch_execute(&format!("SET LOCAL statement_timeout = {limit_ms}"))
        .await
        .map_err(Error::db("sampler: set statement_timeout"))?;
    let window = depth_cap.min(RUNNING_CHECK_WINDOW);
    let waiting_cap = depth_cap.min(WAITING_CAP);
    let waiting_params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&waiting_cap];
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&depth_cap, &window];
    let db = Db::unnamed(tx.client());
    let (queues, pressure, settings, waiting) = tokio::join!(
        async {
            if read_queues {
                db.query(&sql::SAMPLE_QUEUES, &params).await
            } else {
                Ok(Vec::new())
            }
        },
        db.query_one(&sql::SAMPLE_PRESSURE, &[]),
        db.query(&sql::SAMPLE_QUEUE_SETTINGS, &[]),
        db.query(&sql::SAMPLE_WAITING, &waiting_params),
    );
    // Pipelined: when the first fails (e.g. statement_timeout), the others
    // only say "transaction aborted"; report the first.
    let (queues, pressure, settings, waiting) = match (queues, pressure, settings, waiting) {
        (Ok(q), Ok(p), Ok(z), Ok(w)) => (q, p, z, w),
        (Err(e), _, _, _)
        | (Ok(_), Err(e), _, _)
        | (Ok(_), Ok(_), Err(e), _)
        | (Ok(_), Ok(_), Ok(_), Err(e)) => {
            return Err(Error::Db {
                context: "sampler",
                source: e,
            })
        }
    };
    tx.commit().await.map_err(Error::db("sampler: commit"))?;
    let idle: serde_json::Value = pressure.get(0);
    let idle_in_transaction = idle
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|pair| {
                    Some((pair.get(0)?.as_str()?.to_string(), pair.get(1)?.as_i64()?))
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(Sample {
        queues: queues
            .iter()
            .map(|r| QueueSample {
                queue: r.get(0),
                ready: r.get(1),
                oldest_ready_age: r.get(2),
                scheduled: r.get(3),
                dead: r.get(4),
            })
            .collect(),
        idle_in_transaction,
        idle_in_transaction_max_age: pressure.get(1),
        oldest_transaction_age: pressure.get(2),
        notification_queue_usage: pressure.get(3),
        dead_tuples: pressure.get(4),
        trace_context_rejected: pressure.get(5),
        paused: settings
            .iter()
            .filter(|r| r.get::<_, bool>(1))
            .map(|r| r.get(0))
            .collect(),
        max_running: settings
            .iter()
            .filter_map(|r| Some((r.get(0), r.get::<_, Option<i32>>(2)?)))
            .collect(),
        rate: settings
            .iter()
            .filter_map(|r| Some((r.get(0), r.get::<_, Option<f64>>(3)?)))
            .collect(),
        max_running_per_key: settings
            .iter()
            .filter_map(|r| Some((r.get(0), r.get::<_, Option<i32>>(4)?)))
            .collect(),
        rate_per_key: settings
            .iter()
            .filter_map(|r| Some((r.get(0), r.get::<_, Option<f64>>(5)?)))
            .collect(),
        fair_keys: settings
            .iter()
            .filter(|r| r.get::<_, bool>(6))
            .map(|r| r.get(0))
            .collect(),
        shed: settings
            .iter()
            .filter(|r| r.get::<_, bool>(7))
            .map(|r| r.get(0))
            .collect(),
        waiting: waiting
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect(),
        duration: started.elapsed(),
        queues_read: read_queues,
    })
}
