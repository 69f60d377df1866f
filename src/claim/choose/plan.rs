//! The claim plan: which claim statements a worker runs, each in which
//! delivery mode. The mode follows the handler ([`Handler::delivery`]);
//! `--tx-queues` / `--lease-queues` override it per queue.
//!
//! A worker claims only the tasks it has handlers for: every claim is
//! filtered by task name (`task = ANY(…)`), unless the worker has a `*`
//! catch-all, whose claim takes every task the other mode's claim does not.
//! A job of a task this worker cannot run is never claimed: it waits for a
//! worker that can (two fleets on one queue, a rolling deploy), and the
//! sampler reports it if no live worker can (`services::registry`). A
//! claim steps over the ready jobs it does not take, so it gets slower as
//! they pile up ahead of it: give each fleet, and long jobs, their own
//! queue. A queue that mixes modes is claimed once per mode.

use crate::config::WorkerConfig;
use crate::handler::{Delivery, Registry};

/// Which queues one claim statement reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Queues {
    /// Every queue but these (claimed by another spec).
    AllExcept(Vec<String>),
    /// These queues, one claim statement each, tried in turn.
    Listed(Vec<String>),
}

/// One claim: a mode, its queues, and which tasks it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClaimSpec {
    pub mode: Delivery,
    pub queues: Queues,
    /// Only these tasks (`None`: any task not in `tasks_not_in`).
    pub tasks_in: Option<Vec<String>>,
    /// Never these tasks.
    pub tasks_not_in: Vec<String>,
}

/// One claim statement of a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// The all-queues statement ("every queue but `except`").
    All,
    /// `queue = $2`, an ordered index scan.
    Queue(String),
    /// A queue with a `max_running` limit: `claim_*_limited.sql`.
    Limited(String),
    /// A queue with a rate limit or a per-key rate (and perhaps other
    /// limits): admissions first (`rate_reserve.sql`,
    /// `key_rate_reserve.sql`), then `claim_*_limited.sql`.
    Rated(String, Rates),
}

/// Which admissions a limited queue's claim takes first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Rates {
    /// The queue has a rate limit (`--rate`).
    pub queue: bool,
    /// The queue has a rate limit per limit key (`--rate-per-key`).
    pub per_key: bool,
}

impl Rates {
    /// Whether the claim needs admissions at all.
    pub(crate) fn any(self) -> bool {
        self.queue || self.per_key
    }
}

/// Where one claim round looks, resolved from a spec's [`Queues`].
pub(crate) struct Targets {
    /// The claim statements to try, in order.
    pub queues: Vec<Target>,
    /// Queues the all-queues statement leaves to other specs.
    pub except: Vec<String>,
}

impl ClaimSpec {
    /// Where to claim this round. Listed queues start at a position that
    /// advances with `cursor`, so no queue is always tried first. "Every
    /// queue" tries the queues that had ready jobs (`ready`, see
    /// `fair.rs`) the same way, then the all-queues statement. A queue in
    /// `limited` is claimed with the slot-taking statement, after taking
    /// admissions if it is rate-limited (its [`Rates`]).
    pub(crate) fn targets(
        &self,
        cursor: &std::sync::atomic::AtomicUsize,
        ready: &[String],
        limited: &std::collections::HashMap<String, Rates>,
    ) -> Targets {
        let target = |q: &String| match limited.get(q) {
            Some(r) if r.any() => Target::Rated(q.clone(), *r),
            Some(_) => Target::Limited(q.clone()),
            None => Target::Queue(q.clone()),
        };
        match &self.queues {
            Queues::AllExcept(except) => {
                let mine: Vec<&String> = rotated(ready, cursor)
                    .into_iter()
                    .filter(|q| !except.contains(q))
                    .collect();
                // One plain queue ready: nothing to be fair between, so the
                // all-queues statement alone takes it (one statement a round
                // rather than `queue = $2` and then, once it is empty, the
                // all-queues statement anyway).
                let plain = mine
                    .iter()
                    .filter(|q| !limited.contains_key(q.as_str()))
                    .count();
                Targets {
                    queues: mine
                        .into_iter()
                        .filter(|q| plain > 1 || limited.contains_key(q.as_str()))
                        .map(target)
                        .chain(std::iter::once(Target::All))
                        .collect(),
                    except: except.clone(),
                }
            }
            Queues::Listed(q) => Targets {
                queues: rotated(q, cursor).into_iter().map(target).collect(),
                except: Vec::new(),
            },
        }
    }
}

/// The mode of each named task, and of everything else.
fn modes(registry: &Registry) -> (Vec<String>, Vec<String>, Delivery) {
    let mut tx = Vec::new();
    let mut lease = Vec::new();
    for (task, handler) in registry.named() {
        match handler.delivery() {
            Delivery::Tx => tx.push(task.clone()),
            Delivery::Lease => lease.push(task.clone()),
        }
    }
    tx.sort();
    lease.sort();
    let rest = match registry.catch_all() {
        Some(h) => h.delivery(),
        None if !tx.is_empty() => Delivery::Tx,
        None => Delivery::Lease,
    };
    (tx, lease, rest)
}

/// The claims a worker with `config` and `registry` makes.
pub(crate) fn build(config: &WorkerConfig, registry: &Registry) -> Vec<ClaimSpec> {
    let forced: Vec<String> = config
        .lease_queues
        .iter()
        .chain(&config.tx_queues)
        .cloned()
        .collect();
    let unforced = match &config.queues {
        None => Some(Queues::AllExcept(forced.clone())),
        Some(list) => {
            let rest: Vec<String> = list
                .iter()
                .filter(|q| !forced.contains(q))
                .cloned()
                .collect();
            (!rest.is_empty()).then_some(Queues::Listed(rest))
        }
    };
    let mut specs = Vec::new();
    let catch_all = registry.catch_all().is_some();
    if let Some(queues) = unforced {
        let (tx, lease, rest) = modes(registry);
        let spec = |mode, tasks_in, tasks_not_in| ClaimSpec {
            mode,
            queues: queues.clone(),
            tasks_in,
            tasks_not_in,
        };
        if catch_all {
            // The catch-all's mode takes every task but the other mode's.
            let (other, other_mode) = match rest {
                Delivery::Tx => (lease, Delivery::Lease),
                Delivery::Lease => (tx, Delivery::Tx),
            };
            if other.is_empty() {
                specs.push(spec(rest, None, Vec::new()));
            } else {
                specs.push(spec(rest, None, other.clone()));
                specs.push(spec(other_mode, Some(other), Vec::new()));
            }
        } else {
            for (mode, tasks) in [(Delivery::Tx, tx), (Delivery::Lease, lease)] {
                if !tasks.is_empty() {
                    specs.push(spec(mode, Some(tasks), Vec::new()));
                }
            }
        }
    }
    // Forced queues run every task this worker has a handler for in their
    // mode (every task, with a catch-all).
    let mut named: Vec<String> = registry.named().map(|(t, _)| t.clone()).collect();
    named.sort();
    for (mode, queues) in [
        (Delivery::Lease, &config.lease_queues),
        (Delivery::Tx, &config.tx_queues),
    ] {
        if !queues.is_empty() {
            specs.push(ClaimSpec {
                mode,
                queues: Queues::Listed(queues.clone()),
                tasks_in: (!catch_all).then(|| named.clone()),
                tasks_not_in: Vec::new(),
            });
        }
    }
    specs
}

/// `items` starting at a position that advances on every call, so no queue
/// (or claim spec) is always tried first.
pub(crate) fn rotated<'a, T>(
    items: &'a [T],
    cursor: &std::sync::atomic::AtomicUsize,
) -> Vec<&'a T> {
    if items.is_empty() {
        return Vec::new();
    }
    let start = cursor.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % items.len();
    items[start..].iter().chain(&items[..start]).collect()
}

/// One line per task for the start-up log: `task=mode`.
pub(crate) fn describe(config: &WorkerConfig, registry: &Registry) -> String {
    let mut parts: Vec<String> = registry
        .tasks()
        .iter()
        .filter_map(|t| {
            registry
                .get(t)
                .map(|h| format!("{t}={}", h.delivery().as_str()))
        })
        .collect();
    if !config.lease_queues.is_empty() {
        parts.push(format!("queues {:?}=lease", config.lease_queues));
    }
    if !config.tx_queues.is_empty() {
        parts.push(format!("queues {:?}=tx", config.tx_queues));
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::{BoxError, Handler, JobContext};
    use crate::job::{Job, Outcome};
    use std::sync::Arc;

    struct H(Delivery);
    #[async_trait::async_trait]
    impl Handler for H {
        async fn handle(&self, _: &Job, _: JobContext<'_>) -> Result<Outcome, BoxError> {
            Ok(Outcome::Done)
        }
        fn delivery(&self) -> Delivery {
            self.0
        }
    }

    fn registry(entries: &[(&str, Delivery)]) -> Registry {
        let mut r = Registry::default();
        for (t, d) in entries {
            r.insert(t, Arc::new(H(*d)));
        }
        r
    }

    fn names(v: &[&str]) -> Option<Vec<String>> {
        Some(v.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn one_mode_claims_only_the_tasks_with_handlers() {
        let specs = build(
            &WorkerConfig::default(),
            &registry(&[("a", Delivery::Lease), ("b", Delivery::Lease)]),
        );
        assert_eq!(specs.len(), 1);
        assert_eq!(specs[0].mode, Delivery::Lease);
        assert_eq!(specs[0].tasks_in, names(&["a", "b"]));
        assert!(specs[0].tasks_not_in.is_empty());
    }

    #[test]
    fn a_catch_all_claims_without_task_filter() {
        let specs = build(
            &WorkerConfig::default(),
            &registry(&[("*", Delivery::Lease), ("b", Delivery::Lease)]),
        );
        assert_eq!(specs.len(), 1);
        assert_eq!(specs[0].tasks_in, None);
        assert!(specs[0].tasks_not_in.is_empty());
    }

    #[test]
    fn mixed_modes_split_by_task() {
        let specs = build(
            &WorkerConfig::default(),
            &registry(&[("a", Delivery::Tx), ("b", Delivery::Lease)]),
        );
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[0].mode, Delivery::Tx);
        assert_eq!(specs[0].tasks_in, names(&["a"]));
        assert_eq!(specs[1].mode, Delivery::Lease);
        assert_eq!(specs[1].tasks_in, names(&["b"]));
        // With a catch-all (tx), the tx claim takes every task but `b`.
        let specs = build(
            &WorkerConfig::default(),
            &registry(&[("*", Delivery::Tx), ("b", Delivery::Lease)]),
        );
        assert_eq!(specs[0].mode, Delivery::Tx);
        assert_eq!(specs[0].tasks_in, None);
        assert_eq!(specs[0].tasks_not_in, vec!["b".to_string()]);
        assert_eq!(specs[1].tasks_in, names(&["b"]));
    }

    #[test]
    fn one_ready_plain_queue_is_claimed_by_the_all_queues_statement() {
        let spec = &build(&WorkerConfig::default(), &registry(&[("a", Delivery::Tx)]))[0];
        let cursor = std::sync::atomic::AtomicUsize::new(0);
        let rated = Rates {
            queue: true,
            per_key: false,
        };
        let limited: std::collections::HashMap<String, Rates> = [
            ("lim".to_string(), Rates::default()),
            ("rated".to_string(), rated),
        ]
        .into();
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // One plain queue (with limited ones): the plain one by `All`.
        let t = spec.targets(&cursor, &names(&["lim", "q", "rated"]), &limited);
        let mut got = t.queues.clone();
        got.sort_by_key(|t| format!("{t:?}"));
        assert_eq!(
            got,
            vec![
                Target::All,
                Target::Limited("lim".into()),
                Target::Rated("rated".into(), rated)
            ]
        );
        // Two plain queues: each by name (fairness), then `All`.
        let t = spec.targets(&cursor, &names(&["a", "b"]), &limited);
        assert_eq!(t.queues.len(), 3);
        assert!(t.queues.contains(&Target::Queue("a".into())));
        assert_eq!(t.queues.last(), Some(&Target::All));
    }

    #[test]
    fn queue_flags_override_handlers() {
        let config = WorkerConfig {
            lease_queues: vec!["slow".into()],
            tx_queues: vec!["db".into()],
            ..WorkerConfig::default()
        };
        let specs = build(&config, &registry(&[("a", Delivery::Tx)]));
        assert_eq!(
            specs[0].queues,
            Queues::AllExcept(vec!["slow".into(), "db".into()])
        );
        assert_eq!(specs[1].mode, Delivery::Lease);
        assert_eq!(specs[1].queues, Queues::Listed(vec!["slow".into()]));
        assert_eq!(specs[2].mode, Delivery::Tx);
    }
}
