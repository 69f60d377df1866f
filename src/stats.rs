//! `pgwake stats`: per queue, ready and scheduled depth, dead count, the
//! oldest ready job's age and whether the queue is paused; uncapped counts (this is an on-demand command, not
//! the per-interval sampler). Running tx-mode claims are left out of `ready`
//! among each queue's first `sampler::RUNNING_CHECK_WINDOW` ready jobs.

use serde::Serialize;

use crate::error::Result;

/// One queue's line.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct QueueStats {
    /// Queue name.
    pub queue: String,
    /// Jobs ready to run now (running jobs excluded).
    pub ready: i64,
    /// Jobs scheduled for later.
    pub scheduled: i64,
    /// Jobs in `dead_jobs`.
    pub dead: i64,
    /// Age of the oldest ready job, seconds (0 when none is ready).
    pub oldest_ready_age_seconds: f64,
    /// Whether the queue is paused (`pgwake queue pause`): its jobs wait.
    pub paused: bool,
}

/// Read every queue's numbers.
pub async fn read(pool: &deadpool_postgres::Pool) -> Result<Vec<QueueStats>> {
    // Every queue, uncapped counts, no time limit: an on-demand command.
    let sample = crate::sampler::sample_with(pool, i64::MAX, None).await?;
    let mut stats: Vec<QueueStats> = sample
        .queues
        .into_iter()
        .map(|q| QueueStats {
            paused: sample.paused.contains(&q.queue),
            queue: q.queue,
            ready: q.ready,
            scheduled: q.scheduled,
            dead: q.dead,
            oldest_ready_age_seconds: q.oldest_ready_age,
        })
        .collect();
    // A paused queue shows even when it holds no job.
    for p in &sample.paused {
        if !stats.iter().any(|s| &s.queue == p) {
            stats.push(QueueStats {
                queue: p.clone(),
                ready: 0,
                scheduled: 0,
                dead: 0,
                oldest_ready_age_seconds: 0.0,
                paused: true,
            });
        }
    }
    stats.sort_by(|a, b| a.queue.cmp(&b.queue));
    Ok(stats)
}

/// Render as a fixed-width table.
pub fn render_table(stats: &[QueueStats]) -> String {
    let width = stats
        .iter()
        .map(|s| s.queue.chars().count())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut out = format!(
        "{:<width$}  {:>10}  {:>10}  {:>10}  {:>16}  {}\n",
        "QUEUE", "READY", "SCHEDULED", "DEAD", "OLDEST READY (s)", "STATE"
    );
    for s in stats {
        out.push_str(&format!(
            "{:<width$}  {:>10}  {:>10}  {:>10}  {:>16.3}  {}\n",
            s.queue,
            s.ready,
            s.scheduled,
            s.dead,
            s.oldest_ready_age_seconds,
            if s.paused { "paused" } else { "running" }
        ));
    }
    if stats.is_empty() {
        out.push_str("(no jobs)\n");
    }
    out
}
