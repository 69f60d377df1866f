//! The database sampler: every `--sample-interval` it reads the queue
//! gauges and the database-pressure gauges with two pipelined queries of
//! bounded cost (never a `count(*)` per scrape), the queue settings (paused,
//! max running) with a third, and the pool's state.
//! A failed sample counts in `pgwake_sampler_errors_total` and, when the
//! database is unreachable, marks it not ready; the gauges keep their last
//! values.
//!
//! Cost: each count stops at [`DEPTH_CAP_DEFAULT`] and reads only index
//! ranges (see `db/sql/sample_queues.sql`), so a table of millions of rows costs
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
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use crate::admin::gauges::{
    sample, sample_parts, sample_with, QueueSample, Sample, DEPTH_CAP_DEFAULT,
    RUNNING_CHECK_WINDOW, TIME_LIMIT_DEFAULT,
};
use crate::admin::pressure::{self, Pressure};
use crate::error::Error;
use crate::health::Health;
use crate::metrics;

/// How often, between samples, the sampler reads the age of the oldest
/// open transaction alone (`db/sql/oldest_transaction_age.sql`, no table
/// read): claims resume after their cursor once a transaction has been open
/// for `HORIZON_HELD` (health.rs, 5 s, or from 1 s at a high claim rate:
/// `horizon_held`; claim/choose/cursor.rs), and
/// with only the full sample every 5 s they started up to 5 s late, walking
/// the dead index entries the held horizon had left by then
/// (docs/src/performance.md, "Under a pinned vacuum horizon").
pub const HORIZON_PROBE_EVERY: Duration = Duration::from_secs(1);

/// While claims resume after their cursor (`Health::claims_resume`: a
/// transaction open 5 s, or the governor's level above ok), the queue
/// gauges are read at most once per this many sample intervals (30 s at
/// the default 5 s); the ticks between read the pressure alone (the
/// governor and the oldest transaction's age). The queue gauges walk the
/// dead index entries a held horizon keeps, which no read can skip: 88 ms
/// of a core every 5 s after two pinned minutes at 1,500 jobs/s, each a
/// stall the producers' inserts queued behind (docs/src/performance.md,
/// "Where the producers' latency goes"); once a (queue, priority) since
/// they start their counts at the first row the pair's probe found (22–27
/// ms a sample three minutes into such a pin: "One walk of the dead entries
/// a read").
pub const PRESSURE_QUEUE_GAUGES_EVERY: u32 = 6;

/// Whether a sample tick at `now` reads the queue gauges: always without
/// pressure; under it (`pressed`), when none were read within
/// [`PRESSURE_QUEUE_GAUGES_EVERY`] intervals (half an interval early, for
/// the ticks' jitter).
pub fn reads_queue_gauges(
    pressed: bool,
    last_read: Option<std::time::Instant>,
    now: std::time::Instant,
    interval: Duration,
) -> bool {
    let every = interval * PRESSURE_QUEUE_GAUGES_EVERY;
    !pressed || last_read.is_none_or(|at| now.saturating_duration_since(at) + interval / 2 >= every)
}

/// How the sampler runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SamplerConfig {
    /// Time between samples (the worker's `--sample-interval`; default
    /// [`SAMPLE_INTERVAL_DEFAULT`](crate::config::SAMPLE_INTERVAL_DEFAULT)).
    pub interval: Duration,
    /// Rows counted per queue and state at most (default [`DEPTH_CAP_DEFAULT`]).
    pub depth_cap: i64,
    /// The server's statement timeout for one sample (default
    /// [`TIME_LIMIT_DEFAULT`]).
    pub time_limit: Duration,
    /// Record each queue's depth per minute in `pgwake.minute_depth` (the
    /// console's depth chart; one statement per sample). Default true;
    /// the worker sets it from its rollup setting.
    pub depth_minutes: bool,
    /// How many jobs the worker may claim while a transaction is open
    /// before its claims resume after their cursor, from 1 s
    /// (`WorkerConfig::horizon_held_claims`, health.rs `horizon_held`).
    pub horizon_held_claims: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            interval: crate::config::SAMPLE_INTERVAL_DEFAULT,
            depth_cap: DEPTH_CAP_DEFAULT,
            time_limit: TIME_LIMIT_DEFAULT,
            depth_minutes: true,
            horizon_held_claims: crate::config::HORIZON_HELD_CLAIMS_DEFAULT,
        }
    }
}

impl SamplerConfig {
    /// The defaults, sampling every `interval`.
    pub fn every(interval: Duration) -> Self {
        SamplerConfig {
            interval,
            ..SamplerConfig::default()
        }
    }
}

/// The sampler service.
pub struct Sampler {
    pool: deadpool_postgres::Pool,
    config: SamplerConfig,
    health: Arc<Health>,
    seen_queues: HashSet<String>,
    /// Queue labels last published as paused.
    seen_paused: HashSet<String>,
    seen_shed: HashSet<String>,
    /// Queue labels last published with a max-running limit.
    seen_limited: HashSet<String>,
    /// Queue labels last published with a rate limit.
    seen_rated: HashSet<String>,
    /// Queue labels last published with a per-key running limit.
    seen_per_key: HashSet<String>,
    /// Queue labels last published with a per-key rate.
    seen_key_rated: HashSet<String>,
    /// Queue labels last published with fair keys on.
    seen_fair: HashSet<String>,
    seen_apps: HashSet<String>,
    /// (queue label, reason) pairs last published with waiting jobs.
    seen_waiting: HashSet<(String, String)>,
    /// When the queue gauges were last read ([`reads_queue_gauges`]).
    queue_gauges_read: Option<std::time::Instant>,
    /// The worker's claim count at the last reading of the horizon, and
    /// when ([`Sampler::claim_rate`]).
    claims_seen: Option<(u64, std::time::Instant)>,
}

impl Sampler {
    /// A sampler reading through `pool`, reporting failures to `health`.
    pub fn new(
        pool: deadpool_postgres::Pool,
        config: SamplerConfig,
        health: Arc<Health>,
    ) -> Sampler {
        Sampler {
            pool,
            config,
            health,
            seen_queues: HashSet::new(),
            seen_paused: HashSet::new(),
            seen_shed: HashSet::new(),
            seen_limited: HashSet::new(),
            seen_rated: HashSet::new(),
            seen_per_key: HashSet::new(),
            seen_key_rated: HashSet::new(),
            seen_fair: HashSet::new(),
            seen_apps: HashSet::new(),
            seen_waiting: HashSet::new(),
            queue_gauges_read: None,
            claims_seen: None,
        }
    }

    /// Sample until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.config.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut probe = tokio::time::interval(HORIZON_PROBE_EVERY);
        probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let probing = self.config.interval > HORIZON_PROBE_EVERY;
        loop {
            let sample = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => true,
                _ = probe.tick(), if probing => false,
            };
            if !sample {
                self.probe_horizon().await;
                continue;
            }
            self.publish_pool();
            let now = std::time::Instant::now();
            // Under pressure, most ticks leave the queue gauges at their
            // last values and read the rest (settings, shed queues, waits).
            let read_queues = reads_queue_gauges(
                self.health.claims_resume(),
                self.queue_gauges_read,
                now,
                self.config.interval,
            );
            match sample_parts(
                &self.pool,
                self.config.depth_cap,
                Some(self.config.time_limit),
                read_queues,
            )
            .await
            {
                Ok(s) => {
                    if read_queues {
                        self.queue_gauges_read = Some(now);
                    }
                    self.health.set_db(true);
                    self.read_horizon(s.oldest_transaction_age);
                    self.publish(&s);
                    if self.config.depth_minutes && s.queues_read {
                        self.record_depth(&s).await;
                    }
                    self.govern().await;
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

    /// Read the age of the oldest open transaction alone, for the claims'
    /// cursor ([`HORIZON_PROBE_EVERY`]). A failure is left to the next
    /// sample to report.
    pub async fn probe_horizon(&mut self) {
        let read = async {
            let conn = self.pool.get().await.map_err(Error::pool("sampler"))?;
            crate::db::sql::Db::unnamed(&conn)
                .query_one(&crate::db::sql::OLDEST_TRANSACTION_AGE, &[])
                .await
                .map_err(Error::db("sampler: reading the oldest transaction's age"))
        };
        match read.await {
            Ok(row) => self.read_horizon(row.get(0)),
            Err(e) => tracing::debug!(error = %e, "sampler: horizon probe failed"),
        }
    }

    /// Tell the claims whether the oldest open transaction, `age` seconds
    /// old, holds the horizon long enough for them to resume after their
    /// cursor (health.rs, `horizon_held`: from its age and the worker's
    /// claim rate).
    fn read_horizon(&mut self, age: f64) {
        let rate = self.claim_rate();
        let held = crate::health::horizon_held(age, rate, self.config.horizon_held_claims);
        if held != self.health.horizon_held() {
            if held {
                tracing::info!(
                    oldest_transaction_seconds = format_args!("{age:.1}"),
                    claims_per_second = format_args!("{rate:.0}"),
                    "a transaction holds the vacuum horizon: claims resume after the last job claimed"
                );
            } else {
                tracing::info!("the vacuum horizon moves again: claims start at the head");
            }
        }
        self.health.set_horizon_held(held);
    }

    /// Jobs this worker claimed per second since the last reading of the
    /// horizon (about a second ago; 0 at the first).
    fn claim_rate(&mut self) -> f64 {
        let (now, claimed) = (std::time::Instant::now(), self.health.claimed());
        let rate = match self.claims_seen {
            Some((before, at)) if now > at => {
                claimed.saturating_sub(before) as f64 / (now - at).as_secs_f64()
            }
            _ => 0.0,
        };
        self.claims_seen = Some((claimed, now));
        rate
    }

    /// Read the governor's level (`pgwake.pressure()`, which records a
    /// change and sheds or resumes queues in the same call), publish it, and
    /// log a change this call made: each change is logged once, by the
    /// sampler whose call made it, whatever the number of workers.
    pub async fn govern(&self) -> Option<Pressure> {
        let read = async {
            let conn = self.pool.get().await.map_err(Error::pool("sampler"))?;
            pressure::read(&conn).await
        };
        match read.await {
            Ok(p) => {
                publish_pressure(&p);
                self.health
                    .set_under_pressure(p.level > pressure::Level::Ok);
                Some(p)
            }
            Err(e) => {
                ::metrics::counter!(metrics::SAMPLER_ERRORS).increment(1);
                tracing::warn!(error = %e, "sampler: reading the database pressure failed");
                None
            }
        }
    }

    /// Record the sample's depth per queue for this minute
    /// (`pgwake.minute_depth`); a failure counts as a sampler error.
    pub async fn record_depth(&self, s: &Sample) {
        let queues: Vec<&str> = s.queues.iter().map(|q| q.queue.as_str()).collect();
        let ready: Vec<i64> = s.queues.iter().map(|q| q.ready).collect();
        let scheduled: Vec<i64> = s.queues.iter().map(|q| q.scheduled).collect();
        let write = async {
            let conn = self.pool.get().await.map_err(Error::pool("sampler"))?;
            crate::db::sql::Db::unnamed(&conn)
                .execute(
                    &crate::db::sql::ROLLUP_DEPTH,
                    &[&queues, &ready, &scheduled],
                )
                .await
                .map_err(Error::db("sampler: recording the depth per minute"))
        };
        if let Err(e) = write.await {
            ::metrics::counter!(metrics::SAMPLER_ERRORS).increment(1);
            tracing::warn!(error = %e, "sampler: recording the depth per minute failed");
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
        if s.queues_read {
            self.publish_queues(s);
        }
        self.publish_rest(s);
    }

    /// The per-queue gauges: depth, oldest ready age, dead jobs.
    fn publish_queues(&mut self, s: &Sample) {
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
    }

    /// Everything else a sample read: waits, queue settings, pressure.
    fn publish_rest(&mut self, s: &Sample) {
        // Waiting jobs by reason (summed over the queues reported as
        // `other`); a pair with none since the last sample: 0.
        let mut waiting: std::collections::BTreeMap<(String, String), i64> = Default::default();
        for (q, reason, n) in &s.waiting {
            *waiting
                .entry((metrics::queue_label(q), reason.clone()))
                .or_insert(0) += n;
        }
        for ((q, reason), n) in &waiting {
            ::metrics::gauge!(metrics::JOBS_WAITING, "queue" => q.clone(), "reason" => reason.clone())
                .set(*n as f64);
        }
        let now_waiting: HashSet<(String, String)> = waiting.into_keys().collect();
        for (q, reason) in self.seen_waiting.difference(&now_waiting) {
            ::metrics::gauge!(metrics::JOBS_WAITING, "queue" => q.clone(), "reason" => reason.clone())
                .set(0.0);
        }
        self.seen_waiting = now_waiting;
        // Paused queues: 1; a queue resumed since the last sample: 0.
        let paused: HashSet<String> = s.paused.iter().map(|q| metrics::queue_label(q)).collect();
        for q in &paused {
            ::metrics::gauge!(metrics::QUEUE_PAUSED, "queue" => q.clone()).set(1.0);
        }
        for q in self.seen_paused.difference(&paused) {
            ::metrics::gauge!(metrics::QUEUE_PAUSED, "queue" => q.clone()).set(0.0);
        }
        self.seen_paused = paused;
        // Likewise the queues the governor paused (shed) under pressure.
        let shed: HashSet<String> = s.shed.iter().map(|q| metrics::queue_label(q)).collect();
        for q in &shed {
            ::metrics::gauge!(metrics::QUEUE_SHED, "queue" => q.clone()).set(1.0);
        }
        for q in self.seen_shed.difference(&shed) {
            ::metrics::gauge!(metrics::QUEUE_SHED, "queue" => q.clone()).set(0.0);
        }
        self.seen_shed = shed;
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
        self.seen_per_key = publish_limit(
            metrics::QUEUE_MAX_RUNNING_PER_KEY,
            s.max_running_per_key
                .iter()
                .map(|(q, n)| (q, f64::from(*n))),
            &self.seen_per_key,
        );
        self.seen_key_rated = publish_limit(
            metrics::QUEUE_RATE_PER_KEY_LIMIT,
            s.rate_per_key.iter().map(|(q, r)| (q, *r)),
            &self.seen_key_rated,
        );
        // Fair keys: 1 per queue (a label that sums queues reported as
        // `other` counts them).
        self.seen_fair = publish_limit(
            metrics::QUEUE_FAIR_KEYS,
            s.fair_keys.iter().map(|q| (q, 1.0)),
            &self.seen_fair,
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
        ::metrics::gauge!(metrics::TRACE_CONTEXT_REJECTED).set(s.trace_context_rejected as f64);
        ::metrics::gauge!(metrics::SAMPLER_DURATION).set(s.duration.as_secs_f64());
    }
}

/// Publish a pressure reading as gauges, and log it when this reading
/// changed the level (warn when it rose, info when it fell).
fn publish_pressure(p: &Pressure) {
    ::metrics::gauge!(metrics::PRESSURE_LEVEL).set(p.level.gauge());
    for kind in metrics::PRESSURE_KINDS {
        let level = p
            .causes
            .iter()
            .filter(|c| c.kind == *kind)
            .map(|c| match c.level.as_str() {
                "critical" => 2.0,
                "elevated" => 1.0,
                _ => 0.0,
            })
            .fold(0.0, f64::max);
        ::metrics::gauge!(metrics::PRESSURE_CAUSE, "kind" => *kind).set(level);
    }
    if !p.changed {
        return;
    }
    let causes = p
        .causes
        .iter()
        .map(|c| c.detail.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    if p.rose() {
        tracing::warn!(level = %p.level, previous = %p.previous, causes, "database pressure rose");
    } else {
        tracing::info!(level = %p.level, previous = %p.previous, causes, "database pressure fell");
    }
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

#[cfg(test)]
mod tests {
    use super::{reads_queue_gauges, PRESSURE_QUEUE_GAUGES_EVERY};
    use std::time::{Duration, Instant};

    #[test]
    fn under_pressure_the_queue_gauges_are_read_once_per_several_intervals() {
        let every = Duration::from_secs(5);
        let t0 = Instant::now();
        assert!(
            reads_queue_gauges(false, Some(t0), t0 + every, every),
            "no pressure: every tick"
        );
        assert!(
            reads_queue_gauges(true, None, t0, every),
            "under pressure: the first tick reads"
        );
        let reads: Vec<u32> = (1..=2 * PRESSURE_QUEUE_GAUGES_EVERY)
            .filter(|k| reads_queue_gauges(true, Some(t0), t0 + every * *k, every))
            .collect();
        assert_eq!(
            reads.first(),
            Some(&PRESSURE_QUEUE_GAUGES_EVERY),
            "ticks read the pressure alone until {PRESSURE_QUEUE_GAUGES_EVERY} intervals have passed"
        );
        // A tick a little early (the interval's jitter) still reads.
        assert!(reads_queue_gauges(
            true,
            Some(t0),
            t0 + every * PRESSURE_QUEUE_GAUGES_EVERY - Duration::from_millis(100),
            every
        ));
    }
}
