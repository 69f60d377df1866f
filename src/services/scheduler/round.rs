//! One scheduler round, one transaction: claim due schedules (`FOR UPDATE
//! SKIP LOCKED`), work out each one's ticks in Rust ([`CronSchedule::due`]
//! on the database's `now()`), then for the whole batch at once: find the
//! previous jobs still waiting, enqueue the ticks' jobs, advance the
//! schedules. Four statements per batch however many schedules are due.
//!
//! If a batch statement fails for a reason other than the connection (a
//! user trigger on `pgwake.jobs` refusing one job, say), the batch is rolled
//! back to a savepoint and served again one schedule per savepoint, so one
//! schedule that cannot be served does not hold back the others; it stays
//! due and is retried next round.

use std::collections::HashSet;

use chrono::{DateTime, Utc};

use super::{RoundReport, Served};
use crate::admin::cron::CronSchedule;
use crate::db::sql::{self, Db};
use crate::error::{Error, Result};
use crate::metrics;

/// Claim up to `batch` due schedules and serve them; returns what was done,
/// per schedule for the metrics (to be recorded once committed).
pub(super) async fn serve(
    conn: &mut deadpool_postgres::Object,
    batch: i64,
) -> Result<(RoundReport, Vec<Served>)> {
    let mut tx = conn
        .transaction()
        .await
        .map_err(Error::db("scheduler: begin"))?;
    let rows = Db::unnamed(tx.client())
        .query(&sql::SCHEDULE_CLAIM, &[&batch])
        .await
        .map_err(Error::db("scheduler: claim"))?;
    let plans: Vec<Plan> = rows.iter().map(Plan::of_row).collect();
    let mut report = RoundReport {
        claimed: plans.len(),
        ..RoundReport::default()
    };
    let mut served = Vec::new();
    if !plans.is_empty() {
        let sp = tx
            .savepoint("round")
            .await
            .map_err(Error::db("scheduler: savepoint"))?;
        match apply(&sp, &plans).await {
            Ok(s) => {
                sp.commit()
                    .await
                    .map_err(Error::db("scheduler: release savepoint"))?;
                served = s;
            }
            Err(e) if e.is_connection_lost() => return Err(e),
            Err(e) => {
                sp.rollback()
                    .await
                    .map_err(Error::db("scheduler: roll back savepoint"))?;
                tracing::warn!(error = %e, "scheduler: a batch failed; serving its schedules one by one");
                for plan in &plans {
                    let sp = tx
                        .savepoint("schedule")
                        .await
                        .map_err(Error::db("scheduler: savepoint"))?;
                    match apply(&sp, std::slice::from_ref(plan)).await {
                        Ok(mut s) => {
                            sp.commit()
                                .await
                                .map_err(Error::db("scheduler: release savepoint"))?;
                            served.append(&mut s);
                        }
                        Err(e) if e.is_connection_lost() => return Err(e),
                        Err(e) => {
                            sp.rollback()
                                .await
                                .map_err(Error::db("scheduler: roll back savepoint"))?;
                            ::metrics::counter!(metrics::SCHEDULER_ERRORS).increment(1);
                            tracing::warn!(schedule = %plan.name, error = %e, "scheduler: cannot serve a schedule; it stays due");
                            report.failed += 1;
                        }
                    }
                }
            }
        }
    }
    tx.commit().await.map_err(Error::db("scheduler: commit"))?;
    for s in &served {
        report.enqueued += s.enqueued;
        report.missed += s.missed;
        report.waiting += s.waiting;
        report.invalid += usize::from(s.invalid);
    }
    Ok((report, served))
}

/// A claimed schedule and what is due for it.
struct Plan {
    name: String,
    task: String,
    payload: serde_json::Value,
    queue: String,
    priority: i32,
    last_job_id: Option<i64>,
    now: DateTime<Utc>,
    /// The ticks, or why the schedule cannot be evaluated.
    due: std::result::Result<crate::admin::cron::Due, String>,
}

impl Plan {
    fn of_row(r: &tokio_postgres::Row) -> Plan {
        let (cron, tz): (String, String) = (r.get("cron"), r.get("tz"));
        let next_tick: DateTime<Utc> = r.get("next_tick");
        let fresh: bool = r.get("fresh");
        let catch_up: i32 = r.get("catch_up");
        let now: DateTime<Utc> = r.get("now");
        let due = CronSchedule::parse(&cron, &tz)
            .and_then(|c| {
                // A fresh row's next_tick is the instant it was defined.
                let first = if fresh {
                    c.next_after(next_tick)?
                } else {
                    next_tick
                };
                c.due(first, now, catch_up.max(0) as u32)
            })
            .map_err(|e| e.to_string());
        Plan {
            name: r.get("name"),
            task: r.get("task"),
            payload: r.get("payload"),
            queue: r.get("queue"),
            priority: r.get("priority"),
            last_job_id: r.get("last_job_id"),
            now,
            due,
        }
    }
}

/// Enqueue and advance `plans` (in the caller's transaction or savepoint).
async fn apply(tx: &tokio_postgres::Transaction<'_>, plans: &[Plan]) -> Result<Vec<Served>> {
    // Previous jobs still waiting (in the queue, not held by a claim).
    let previous: Vec<i64> = plans
        .iter()
        .filter(|p| p.due.as_ref().is_ok_and(|d| !d.ticks.is_empty()))
        .filter_map(|p| p.last_job_id)
        .collect();
    let waiting: HashSet<i64> = if previous.is_empty() {
        HashSet::new()
    } else {
        Db::unnamed(tx.client())
            .query(&sql::SCHEDULE_PREVIOUS_WAITING, &[&previous])
            .await
            .map_err(Error::db("scheduler: previous jobs"))?
            .iter()
            .map(|r| r.get(0))
            .collect()
    };

    let mut served: Vec<Served> = Vec::with_capacity(plans.len());
    let (mut task, mut payload, mut queue, mut priority, mut tick) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut bad_names, mut bad_reasons) = (Vec::new(), Vec::new());
    for p in plans {
        let mut s = Served {
            name: p.name.clone(),
            ..Served::default()
        };
        match &p.due {
            Err(reason) => {
                tracing::error!(schedule = %p.name, error = %reason, "scheduler: schedule cannot be evaluated; marked invalid");
                bad_names.push(p.name.as_str());
                bad_reasons.push(reason.as_str());
                s.invalid = true;
            }
            Ok(due) => {
                s.missed = due.missed;
                if p.last_job_id.is_some_and(|id| waiting.contains(&id)) {
                    s.waiting = due.ticks.len() as u64;
                } else {
                    for t in &due.ticks {
                        task.push(p.task.as_str());
                        payload.push(&p.payload);
                        queue.push(p.queue.as_str());
                        priority.push(p.priority);
                        tick.push(*t);
                        s.delays
                            .push((p.now - *t).num_milliseconds().max(0) as f64 / 1000.0);
                    }
                    s.enqueued = due.ticks.len() as u64;
                }
            }
        }
        served.push(s);
    }

    // The new jobs' ids, in the order of the arrays (the statement returns
    // them in input order, as `enqueue.sql` does).
    let mut ids = if tick.is_empty() {
        Vec::new()
    } else {
        Db::unnamed(tx.client())
            .query(
                &sql::SCHEDULE_ENQUEUE,
                &[&task, &payload, &queue, &priority, &tick],
            )
            .await
            .map_err(Error::db("scheduler: enqueue"))?
            .iter()
            .map(|r| r.get::<_, i64>(0))
            .collect::<Vec<_>>()
    }
    .into_iter();

    let mut adv = Advance::default();
    for (p, s) in plans.iter().zip(&served) {
        let Ok(due) = &p.due else { continue };
        let mut last_job = None;
        for _ in 0..s.enqueued {
            last_job = ids.next();
        }
        adv.name.push(p.name.as_str());
        adv.next_tick.push(due.next_tick);
        adv.last_tick
            .push(due.ticks.last().copied().filter(|_| s.enqueued > 0));
        adv.last_job.push(last_job);
        adv.enqueued.push(s.enqueued as i64);
        adv.missed.push(s.missed as i64);
        adv.waiting.push(s.waiting as i64);
    }
    if !adv.name.is_empty() {
        Db::unnamed(tx.client())
            .execute(
                &sql::SCHEDULE_ADVANCE,
                &[
                    &adv.name,
                    &adv.next_tick,
                    &adv.last_tick,
                    &adv.last_job,
                    &adv.enqueued,
                    &adv.missed,
                    &adv.waiting,
                ],
            )
            .await
            .map_err(Error::db("scheduler: advance"))?;
    }
    if !bad_names.is_empty() {
        Db::unnamed(tx.client())
            .execute(&sql::SCHEDULE_INVALID, &[&bad_names, &bad_reasons])
            .await
            .map_err(Error::db("scheduler: mark invalid"))?;
    }
    Ok(served)
}

/// Columns of the advance statement.
#[derive(Default)]
struct Advance<'a> {
    name: Vec<&'a str>,
    next_tick: Vec<DateTime<Utc>>,
    last_tick: Vec<Option<DateTime<Utc>>>,
    last_job: Vec<Option<i64>>,
    enqueued: Vec<i64>,
    missed: Vec<i64>,
    waiting: Vec<i64>,
}
