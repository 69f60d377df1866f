//! One claim round's walk over its targets (the queues a spec claims from,
//! in turn, until one has jobs), shared by both delivery modes: before each
//! target its rate admissions (queue and per key) are taken (committed on a
//! connection of their own, so they hold across workers), the previous
//! target's given back unused; after the claim, what it did not use is
//! given back.

use std::time::SystemTime;

use crate::claim::choose::key_rate::{self, KeyAdmission};
use crate::claim::choose::key_rotation::KeyCursors;
use crate::claim::choose::plan::{ClaimSpec, Target};
use crate::claim::choose::rate::{self, Admission, Ledger};
use crate::claim::choose::wake::{Trigger, Wakeup};
use crate::error::Result;

/// The walk: [`Walk::next`] until the claims found enough jobs, then
/// [`Walk::settle`]. A round fills its batch across plain queues (many
/// small queues drain in batches, not a job per round); a limited or
/// rate-limited queue is claimed only by a round that found nothing before
/// it, and ends the round (its jobs hold slots or admissions of their own:
/// see [`Walk::fills_with`]).
pub(crate) struct Walk<'a> {
    /// Where its admissions are taken.
    ledger: Ledger<'a>,
    /// This worker's rotation between a fair-keys queue's limit keys.
    key_cursors: &'a KeyCursors,
    /// Woken when keys behind a fair-keys claim's bound were left unvisited.
    wake: &'a Wakeup,
    spec: &'a ClaimSpec,
    targets: std::slice::Iter<'a, Target>,
    limit: i64,
    admission: Option<Admission>,
    key_admission: Option<KeyAdmission>,
    current: Option<&'a Target>,
}

/// What a walk's last claim ran on: its target and, for a rate-limited
/// one, when its jobs were admitted.
pub(crate) struct Settled<'a> {
    /// The target claimed last.
    pub tried: Option<&'a Target>,
    /// The queue rate's admission time (`None`: no queue rate).
    pub admitted_at: Option<SystemTime>,
    /// The per-key admission time of its keyed jobs (`None`: no per-key
    /// rate).
    pub key_admitted_at: Option<SystemTime>,
}

impl Settled<'_> {
    /// When a job with (`true`) or without a limit key was admitted: the
    /// per-key admission for a keyed job under a per-key rate, else the
    /// queue's.
    pub(crate) fn admitted_at(&self, keyed: bool) -> Option<SystemTime> {
        match self.key_admitted_at {
            Some(at) if keyed => Some(at),
            _ => self.admitted_at,
        }
    }
}

impl<'a> Walk<'a> {
    /// A walk over `targets` for claims of up to `limit` jobs of `spec`
    /// (`ClaimContext::walk` gives it the worker's `ledger`, `key_cursors`
    /// and `wake`).
    pub(crate) fn new(
        ledger: Ledger<'a>,
        key_cursors: &'a KeyCursors,
        wake: &'a Wakeup,
        spec: &'a ClaimSpec,
        targets: &'a [Target],
        limit: i64,
    ) -> Self {
        Walk {
            ledger,
            key_cursors,
            wake,
            spec,
            targets: targets.iter(),
            limit,
            admission: None,
            key_admission: None,
            current: None,
        }
    }

    /// The next target to claim from, its admissions taken (see
    /// [`Walk::admission`], [`Walk::key_admission`]); `None` once every
    /// target was tried.
    pub(crate) async fn next(&mut self) -> Result<Option<&'a Target>> {
        let Some(target) = self.targets.next() else {
            return Ok(None);
        };
        rate::settle(self.ledger, self.admission.take().as_ref(), 0).await?;
        key_rate::settle(
            self.ledger,
            self.key_admission.take().as_ref(),
            std::iter::empty(),
        )
        .await?;
        self.admission = rate::reserve_for(self.ledger, target, self.limit).await?;
        if let Target::Rated(q, rates) = target {
            if rates.per_key && !self.admission.as_ref().is_some_and(|a| a.none()) {
                let after = self.key_cursors.after(q);
                self.key_admission = Some(
                    key_rate::reserve(
                        self.ledger,
                        key_rate::Wanted {
                            queue: q,
                            after: after.as_deref(),
                            count: self.limit,
                            tasks_in: &self.spec.tasks_in,
                            tasks_not_in: &self.spec.tasks_not_in,
                            job: None,
                        },
                    )
                    .await?,
                );
            }
        }
        self.current = Some(target);
        Ok(Some(target))
    }

    /// The target [`Walk::next`] would take next, without taking it.
    pub(crate) fn peek(&self) -> Option<&'a Target> {
        self.targets.clone().next()
    }

    /// Whether a round that already holds jobs may go on to `target`: only
    /// to a plain queue. A limited queue's claim takes slots and
    /// admissions for itself alone (a tx batch would hold a slot for every
    /// job run after it), so it is taken first in a round or not at all.
    pub(crate) fn fills_with(target: &Target) -> bool {
        matches!(target, Target::All | Target::Queue(_))
    }

    /// The current target's admissions (`None` unless it is rate-limited).
    pub(crate) fn admission(&self) -> Option<&Admission> {
        self.admission.as_ref()
    }

    /// A claim of fair-keys queue `queue` that started after `after` took
    /// jobs of `keys` (`None`: a job without a key); `stop`: the key where
    /// its walk between keys stopped at the bound. Moves this worker's
    /// rotation on (to where the reservation's walk stopped, if it did: it
    /// went furthest), and wakes a claim task to claim again at once when
    /// keys behind the bound were left unvisited by a walk that took
    /// nothing ([`KeyCursors::served`](crate::claim::choose::key_rotation::KeyCursors::served)).
    pub(crate) fn served<'k>(
        &self,
        queue: &str,
        after: Option<&str>,
        keys: impl Iterator<Item = Option<&'k str>>,
        stop: Option<&str>,
    ) {
        let stop = self
            .key_admission
            .as_ref()
            .and_then(|a| a.stop.as_deref())
            .or(stop);
        if self.key_cursors.served(queue, after, keys, stop) {
            self.wake.wake_one(Trigger::Drain);
        }
    }

    /// The keys admitted for the current target's claim, one entry per
    /// admission (`None` unless it has a per-key rate).
    pub(crate) fn admitted_keys(&self) -> Option<&[String]> {
        self.key_admission.as_ref().and_then(|a| a.keys())
    }

    /// The claim took jobs of `used` limit keys (`None`: a job without a
    /// key) from the current target: give back the admissions it did not
    /// use.
    pub(crate) async fn settle<'k>(self, used: &[Option<&'k str>]) -> Result<Settled<'a>> {
        rate::settle(self.ledger, self.admission.as_ref(), used.len()).await?;
        key_rate::settle(
            self.ledger,
            self.key_admission.as_ref(),
            used.iter().copied(),
        )
        .await?;
        Ok(Settled {
            tried: self.current,
            admitted_at: self.admission.as_ref().and_then(|a| a.admitted()),
            key_admitted_at: self
                .key_admission
                .as_ref()
                .filter(|a| a.any())
                .and_then(|a| a.admitted()),
        })
    }
}
