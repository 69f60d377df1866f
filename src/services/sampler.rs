//! The database sampler: every `--sample-interval` it reads the queue
//! gauges and the database-pressure gauges with two pipelined queries of
//! bounded cost (never a `count(*)` per scrape), the queue settings (paused,
//! max running) with a third, and the pool's state.
//! A failed sample counts in `pgwake_sampler_errors_total` and, when the
//! database is unreachable, marks it not ready; the gauges keep their last
//! values.
//!
//! Cost: each count stops at [`DEPTH_CAP_DEFAULT`] and reads only index
//! ranges (see `sql/sample_queues.sql`), so a table of millions of rows costs
//! what the cap costs, and the work is linear in the number of queues. Every
//! sample runs under `statement_timeout` = [`TIME_LIMIT_DEFAULT`]: a sample
//! that would take longer is cancelled by the server (its snapshot, which
//! holds back the vacuum horizon the gauges report on, goes with it), counts
//! in `pgwake_sampler_errors_total`, and the gauges keep their last values.
//! Queue labels are capped ([`crate::metrics::LABEL_VALUES_MAX`]); queues
//! beyond the cap are summed into `queue="other"`. The queries run in a read-only transaction with JIT
//! off: their cost *estimates* are high (the planner cannot know the counts
//! stop early), and on a server with `jit = on` (the default where LLVM is
//! available) compiling them took 5 to 10 times longer than running them.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::db::sql::{self, Db};
use crate::error::{Error, Result};
use crate::health::Health;
use crate::metrics;

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

/// One queue's gauges.
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
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Per-queue gauges.
    pub queues: Vec<QueueSample>,
    /// Idle-in-transaction sessions by application_name.
    pub idle_in_transaction: Vec<(String, i64)>,
    /// Transaction age of the oldest idle-in-transaction session.
    pub idle_in_transaction_max_age: f64,
    /// Age of the oldest open transaction on the server.
    pub oldest_transaction_age: f64,
    /// `pg_notification_queue_usage()`.
    pub notification_queue_usage: f64,
    /// Dead tuples of `pgwake.jobs`.
    pub dead_tuples: i64,
    /// Paused queues (`pgwake queue pause`), by name.
    pub paused: Vec<String>,
    /// Queues with a max-running limit (`pgwake queue set --max-running`)
    /// and that limit, by name.
    pub max_running: Vec<(String, i32)>,
    /// Queues with a rate limit (`pgwake queue set --rate`) and that rate
    /// in admissions per second, by name.
    pub rate: Vec<(String, f64)>,
    /// How long the sample took (connection checkout included).
    pub duration: Duration,
}

/// The sampler service.
pub struct Sampler {
    pool: deadpool_postgres::Pool,
    interval: Duration,
    health: Arc<Health>,
    depth_cap: i64,
    time_limit: Duration,
    seen_queues: HashSet<String>,
    /// Queue labels last published as paused.
    seen_paused: HashSet<String>,
    /// Queue labels last published with a max-running limit.
    seen_limited: HashSet<String>,
    /// Queue labels last published with a rate limit.
    seen_rated: HashSet<String>,
    seen_apps: HashSet<String>,
}

impl Sampler {
    /// A sampler reading through `pool` every `interval`.
    pub fn new(pool: deadpool_postgres::Pool, interval: Duration, health: Arc<Health>) -> Sampler {
        Sampler {
            pool,
            interval,
            health,
            depth_cap: DEPTH_CAP_DEFAULT,
            time_limit: TIME_LIMIT_DEFAULT,
            seen_queues: HashSet::new(),
            seen_paused: HashSet::new(),
            seen_limited: HashSet::new(),
            seen_rated: HashSet::new(),
            seen_apps: HashSet::new(),
        }
    }

    /// Sample until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            self.publish_pool();
            match sample_with(&self.pool, self.depth_cap, Some(self.time_limit)).await {
                Ok(s) => {
                    self.health.set_db(true);
                    self.publish(&s);
                }
                Err(e) => {
                    ::metrics::counter!(metrics::SAMPLER_ERRORS).increment(1);
                    if e.is_transient() {
                        self.health.set_db(false);
                    }
                    tracing::warn!(error = %e, "sampler: database sample failed");
                }
            }
        }
    }

    fn publish_pool(&self) {
        let status = self.pool.status();
        let idle = status.available as f64;
        let in_use = status.size.saturating_sub(status.available) as f64;
        ::metrics::gauge!(metrics::POOL_CONNECTIONS, "state" => "in_use").set(in_use);
        ::metrics::gauge!(metrics::POOL_CONNECTIONS, "state" => "idle").set(idle);
    }

    /// Publish a sample as gauges; label sets that vanished drop to 0.
    /// Queues beyond the label cap are summed into `queue="other"` (the
    /// oldest age is their maximum).
    pub fn publish(&mut self, s: &Sample) {
        let mut by_label: std::collections::BTreeMap<String, (i64, i64, i64, f64)> =
            Default::default();
        for q in &s.queues {
            let e = by_label
                .entry(metrics::queue_label(&q.queue))
                .or_insert((0, 0, 0, 0.0));
            e.0 += q.ready;
            e.1 += q.scheduled;
            e.2 += q.dead;
            e.3 = e.3.max(q.oldest_ready_age);
        }
        let mut now_queues = HashSet::new();
        for (name, (ready, scheduled, dead, age)) in by_label {
            ::metrics::gauge!(metrics::QUEUE_DEPTH, "queue" => name.clone(), "state" => "ready")
                .set(ready as f64);
            ::metrics::gauge!(metrics::QUEUE_DEPTH, "queue" => name.clone(), "state" => "scheduled").set(scheduled as f64);
            ::metrics::gauge!(metrics::QUEUE_OLDEST_READY_AGE, "queue" => name.clone()).set(age);
            ::metrics::gauge!(metrics::DEAD_JOBS, "queue" => name.clone()).set(dead as f64);
            now_queues.insert(name);
        }
        for gone in self.seen_queues.difference(&now_queues) {
            ::metrics::gauge!(metrics::QUEUE_DEPTH, "queue" => gone.clone(), "state" => "ready")
                .set(0.0);
            ::metrics::gauge!(metrics::QUEUE_DEPTH, "queue" => gone.clone(), "state" => "scheduled").set(0.0);
            ::metrics::gauge!(metrics::QUEUE_OLDEST_READY_AGE, "queue" => gone.clone()).set(0.0);
            ::metrics::gauge!(metrics::DEAD_JOBS, "queue" => gone.clone()).set(0.0);
        }
        self.seen_queues.extend(now_queues);
        // Paused queues: 1; a queue resumed since the last sample: 0.
        let paused: HashSet<String> = s.paused.iter().map(|q| metrics::queue_label(q)).collect();
        for q in &paused {
            ::metrics::gauge!(metrics::QUEUE_PAUSED, "queue" => q.clone()).set(1.0);
        }
        for q in self.seen_paused.difference(&paused) {
            ::metrics::gauge!(metrics::QUEUE_PAUSED, "queue" => q.clone()).set(0.0);
        }
        self.seen_paused = paused;
        // Limits per queue (summed over the queues reported as `other`); a
        // queue whose limit was removed since the last sample: 0, which no
        // limit can be (max_running > 0, a rate > 0).
        self.seen_limited = publish_limit(
            metrics::QUEUE_MAX_RUNNING,
            s.max_running.iter().map(|(q, n)| (q, f64::from(*n))),
            &self.seen_limited,
        );
        self.seen_rated = publish_limit(
            metrics::QUEUE_RATE_LIMIT,
            s.rate.iter().map(|(q, r)| (q, *r)),
            &self.seen_rated,
        );
        // application_name is whatever a client sets: capped like queues.
        let mut apps: std::collections::BTreeMap<String, i64> = Default::default();
        for (app, n) in &s.idle_in_transaction {
            *apps.entry(metrics::application_label(app)).or_insert(0) += n;
        }
        let mut now_apps = HashSet::new();
        for (app, n) in apps {
            ::metrics::gauge!(metrics::IDLE_IN_TX_SESSIONS, "application" => app.clone())
                .set(n as f64);
            now_apps.insert(app);
        }
        for gone in self.seen_apps.difference(&now_apps) {
            ::metrics::gauge!(metrics::IDLE_IN_TX_SESSIONS, "application" => gone.clone()).set(0.0);
        }
        self.seen_apps.extend(now_apps);
        ::metrics::gauge!(metrics::IDLE_IN_TX_MAX_AGE).set(s.idle_in_transaction_max_age);
        ::metrics::gauge!(metrics::OLDEST_TX_AGE).set(s.oldest_transaction_age);
        ::metrics::gauge!(metrics::NOTIFY_QUEUE_USAGE).set(s.notification_queue_usage);
        ::metrics::gauge!(metrics::QUEUE_TABLE_DEAD_TUPLES).set(s.dead_tuples as f64);
        ::metrics::gauge!(metrics::SAMPLER_DURATION).set(s.duration.as_secs_f64());
    }
}

/// Read one sample within [`TIME_LIMIT_DEFAULT`]; see [`sample_with`].
pub async fn sample(pool: &deadpool_postgres::Pool, depth_cap: i64) -> Result<Sample> {
    sample_with(pool, depth_cap, Some(TIME_LIMIT_DEFAULT)).await
}

/// Publish one per-queue limit gauge: each queue label's value (summed
/// over the queues reported as `other`), and 0 for the labels in `seen`
/// that have none now. Returns the labels published.
fn publish_limit<'a>(
    metric: &'static str,
    values: impl Iterator<Item = (&'a String, f64)>,
    seen: &HashSet<String>,
) -> HashSet<String> {
    let mut by_label: std::collections::BTreeMap<String, f64> = Default::default();
    for (q, v) in values {
        *by_label.entry(metrics::queue_label(q)).or_insert(0.0) += v;
    }
    for (q, v) in &by_label {
        ::metrics::gauge!(metric, "queue" => q.clone()).set(*v);
    }
    let now: HashSet<String> = by_label.into_keys().collect();
    for q in seen.difference(&now) {
        ::metrics::gauge!(metric, "queue" => q.clone()).set(0.0);
    }
    now
}

/// Read one sample: three pipelined queries in one read-only transaction on a
/// pooled connection, under `statement_timeout` = `time_limit` (`None`: no
/// limit, as `pgwake stats` reads). Counts stop at `depth_cap` (`i64::MAX`:
/// no cap).
pub async fn sample_with(
    pool: &deadpool_postgres::Pool,
    depth_cap: i64,
    time_limit: Option<Duration>,
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
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&depth_cap, &window];
    let db = Db::unnamed(tx.client());
    let (queues, pressure, settings) = tokio::join!(
        db.query(&sql::SAMPLE_QUEUES, &params),
        db.query_one(&sql::SAMPLE_PRESSURE, &[]),
        db.query(&sql::SAMPLE_QUEUE_SETTINGS, &[]),
    );
    // Pipelined: when the first fails (e.g. statement_timeout), the others
    // only say "transaction aborted"; report the first.
    let (queues, pressure, settings) = match (queues, pressure, settings) {
        (Ok(q), Ok(p), Ok(z)) => (q, p, z),
        (Err(e), _, _) | (Ok(_), Err(e), _) | (Ok(_), Ok(_), Err(e)) => {
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
        duration: started.elapsed(),
    })
}
