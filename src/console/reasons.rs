//! `pgwake.explain`'s reasons in words an operator reads ("waiting for a
//! slot of key `acme`: 2 of 2 running"), from the reason's machine name
//! (kept in the badge's tooltip, with explain's own detail) and what the
//! page already read: the job, its queue's settings and limit use, and its
//! limit key's running jobs. A reason this module does not know yet is
//! shown by its machine name and detail, as before.

use std::collections::BTreeMap;

use maud::{html, Markup};

use super::view::{self, when};
use crate::admin::activity::QueueActivity;
use crate::admin::jobs::{JobRow, Reason};
use crate::admin::queues::{QueueSettings, RateLimit};

/// What the words of a job's reasons may use; each part may be missing
/// (then the words say less, never something false).
#[derive(Default)]
pub(crate) struct Context<'a> {
    /// Every queue's settings, by name.
    pub settings: BTreeMap<&'a str, &'a QueueSettings>,
    /// Every queue's limit use, by name.
    pub activity: BTreeMap<&'a str, &'a QueueActivity>,
    /// Jobs running per (queue, limit key), for keys at their limit.
    pub key_running: BTreeMap<(String, String), i64>,
}

impl<'a> Context<'a> {
    /// A context over these settings and this activity.
    pub(crate) fn new(settings: &'a [QueueSettings], activity: &'a [QueueActivity]) -> Self {
        Context {
            settings: settings.iter().map(|s| (s.queue.as_str(), s)).collect(),
            activity: activity.iter().map(|a| (a.queue.as_str(), a)).collect(),
            key_running: BTreeMap::new(),
        }
    }
}

/// The (queue, limit key) pairs whose running jobs the words of `reasons`
/// need (jobs held at their key's running limit).
pub(crate) fn keys_needed<'j>(
    reasons: impl IntoIterator<Item = (&'j JobRow, &'j Reason)>,
) -> Vec<(String, String)> {
    let mut keys: Vec<(String, String)> = reasons
        .into_iter()
        .filter(|(_, r)| r.reason == "key_max_running")
        .filter_map(|(j, _)| Some((j.queue.clone(), j.limit_key.clone()?)))
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// A rate in words: `20 per second`, `600 per minute`, `1 per 50ms`.
fn rate(r: &RateLimit) -> String {
    match r.per.as_secs_f64() {
        1.0 => format!("{} per second", r.count),
        60.0 => format!("{} per minute", r.count),
        3600.0 => format!("{} per hour", r.count),
        _ => format!("{} per {}", r.count, humantime::format_duration(r.per)),
    }
}

/// "U of N running", when U is known.
fn of(used: Option<i64>, limit: Option<i32>) -> Markup {
    html! {
        @match (used, limit) {
            (Some(u), Some(n)) => { ": " (u) " of " (n) " running" },
            (None, Some(n)) => { ": its limit of " (n) " running" },
            _ => {},
        }
    }
}

/// The reason `r` of `job` in words (without the machine name). `job` is
/// `None` when only the reason is known.
pub(crate) fn words(r: &Reason, job: Option<&JobRow>, cx: &Context<'_>) -> Markup {
    let queue = job.map(|j| j.queue.as_str());
    let settings = queue.and_then(|q| cx.settings.get(q).copied());
    let activity = queue.and_then(|q| cx.activity.get(q).copied());
    let key = job.and_then(|j| j.limit_key.as_deref());
    let until = || html! { @if let Some(u) = &r.until { " " (when(Some(u))) } };
    let q = || html! { @if let Some(q) = queue { " " code { (q) } } };
    match r.reason.as_str() {
        "ready" => html! { "ready: the next free worker takes it" },
        "running" => {
            if r.detail.starts_with("tx mode") {
                html! { "running (in a worker's claim transaction)" }
            } else {
                html! { "running (leased by a worker)" }
            }
        }
        "progress" => html! { "its handler reported: " (r.detail) },
        "process_wait" => html! { "may be waiting for a free handler process" },
        "buffered" => {
            html! { "claimed ahead by a worker: starts when one of its slots frees" }
        }
        "locked" => html! { "its row is locked by another session's transaction" },
        "scheduled" => html! { "scheduled: runs" (until()) },
        "snoozed" => html! { "snoozed by its handler until" (until()) },
        "sleeping" => html! { "sleeping (its handler's wait, no slot held) until" (until()) },
        "waiting_for_signal" => html! { (r.detail) },
        "retry_backoff" => html! {
            @if let Some(j) = job { "attempt " (j.attempts) " failed; retried" (until()) }
            @else { "a failed attempt: retried" (until()) }
        },
        "paused" => {
            if settings.is_some_and(|s| s.paused_by.as_deref() == Some("pressure")) {
                html! { "queue" (q()) " is shed while the database pressure is critical" }
            } else {
                html! { "queue" (q()) " is paused" }
            }
        }
        "waiting_for_parents" => html! {
            "waiting for its parents"
            @if let Some(b) = r.blocking_job { ", first open: job " (b) }
            ": released in the commit that ends the last"
        },
        "ordering_key" => html! {
            "behind "
            @if let Some(b) = r.blocking_job { "job " (b) } @else { "an earlier job" }
            @if let Some(k) = job.and_then(|j| j.ordering_key.as_deref()) { " of ordering key " code { (k) } }
        },
        "max_running" => html! {
            "waiting for a slot of queue" (q())
            (of(activity.and_then(|a| a.slots_used), settings.and_then(|s| s.max_running)))
        },
        "rate_limit" => html! {
            "queue" (q())
            @if let Some(r) = settings.and_then(|s| s.rate.as_ref()) { " started its " (rate(r)) }
            @else { " used its rate" }
            "; next start" (until())
        },
        "key_max_running" => {
            let limit = key.and_then(|k| {
                settings.and_then(|s| s.key_max_running.get(k).copied().or(s.max_running_per_key))
            });
            let used = queue
                .zip(key)
                .and_then(|(q, k)| cx.key_running.get(&(q.to_string(), k.to_string())).copied());
            html! {
                "waiting for a slot of key "
                @if let Some(k) = key { code { (k) } } @else { "(its limit key)" }
                (of(used, limit))
            }
        }
        "key_rate_limit" => html! {
            "key "
            @if let Some(k) = key { code { (k) } } @else { "(its limit key)" }
            @if let Some(r) = settings.and_then(|s| s.rate_per_key.as_ref()) { " started its " (rate(r)) }
            @else { " used its rate" }
            "; next start" (until())
        },
        "no_worker" => html! { "no live worker works queue" (q()) },
        "no_handler" => html! {
            "no live worker has a handler for task "
            @if let Some(j) = job { code { (j.task) } } @else { "this task" }
        },
        "saturated" => html! { "every worker slot that could run it is busy" },
        "dead" => html! { "dead: it failed its last attempt" },
        "cancelled" => html! { "cancelled by an operator" },
        "not_found" => html! { "not waiting, running or dead" },
        other => html! { (other) },
    }
}

/// A reason as a badge: the words, with the machine name and explain's
/// detail in its tooltip (`title`).
pub(crate) fn badge(r: &Reason, job: Option<&JobRow>, cx: &Context<'_>) -> Markup {
    html! {
        span class={ "reason words " (view::reason_class(&r.reason)) } data-reason=(r.reason)
            title={ (r.reason) ": " (r.detail) } { (words(r, job, cx)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reason `pgwake.explain` gives (checked against
    /// functions/jobs.sql by tests/repository/reasons.rs).
    use crate::admin::jobs::REASONS;

    fn reason(name: &str) -> Reason {
        Reason {
            reason: name.into(),
            detail: "d".into(),
            until: None,
            blocking_job: Some(7),
        }
    }

    #[test]
    fn every_reason_has_words_other_than_its_machine_name() {
        for name in REASONS {
            let w = words(&reason(name), None, &Context::default()).into_string();
            assert!(!w.is_empty() && w != *name, "{name}: {w}");
            assert!(!w.contains('_'), "{name}: {w}");
        }
        assert_eq!(
            words(&reason("new_reason"), None, &Context::default()).into_string(),
            "new_reason"
        );
    }

    #[test]
    fn a_key_at_its_limit_says_how_many_of_how_many_run() {
        let job = JobRow {
            id: 1,
            state: "waiting".into(),
            queue: "mail".into(),
            task: "send".into(),
            priority: Some(0),
            attempts: 0,
            max_attempts: Some(25),
            run_at: None,
            created_at: String::new(),
            ordering_key: None,
            unique_key: None,
            limit_key: Some("<acme>".into()),
            worker: None,
            last_error: None,
        };
        let mut s = QueueSettings {
            queue: "mail".into(),
            paused: false,
            paused_at: None,
            max_running: None,
            rate: None,
            limit_key_path: None,
            fair_keys: false,
            max_running_per_key: Some(2),
            key_max_running: BTreeMap::new(),
            rate_per_key: None,
            shed_under_pressure: false,
            paused_by: None,
        };
        let settings = [s.clone()];
        let mut cx = Context::new(&settings, &[]);
        cx.key_running.insert(("mail".into(), "<acme>".into()), 2);
        let w = words(&reason("key_max_running"), Some(&job), &cx).into_string();
        assert_eq!(
            w,
            "waiting for a slot of key <code>&lt;acme&gt;</code>: 2 of 2 running"
        );
        // A key's own limit comes before the queue's per-key limit.
        s.key_max_running.insert("<acme>".into(), 5);
        let settings = [s];
        let mut cx = Context::new(&settings, &[]);
        cx.key_running.insert(("mail".into(), "<acme>".into()), 5);
        let w = words(&reason("key_max_running"), Some(&job), &cx).into_string();
        assert!(w.ends_with(": 5 of 5 running"), "{w}");
        let b = badge(&reason("key_max_running"), Some(&job), &cx).into_string();
        assert!(b.contains("title=\"key_max_running: d\""), "{b}");
    }
}
