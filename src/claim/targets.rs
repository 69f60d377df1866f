//! One claim round's walk over its targets (the queues a spec claims from,
//! in turn, until one has jobs), shared by both delivery modes: before each
//! target its rate admissions are taken (committed on a connection of their
//! own, so they hold across workers), the previous target's given back
//! unused; after the claim, what it did not use is given back.

use std::time::SystemTime;

use crate::claim::context::ClaimContext;
use crate::claim::plan::Target;
use crate::claim::rate::{self, Admission};
use crate::error::Result;

/// The walk: [`Walk::next`] until the claims found enough jobs, then
/// [`Walk::settle`]. A round fills its batch across plain queues (many
/// small queues drain in batches, not a job per round); a limited or
/// rate-limited queue is claimed only by a round that found nothing before
/// it, and ends the round (its jobs hold slots or admissions of their own:
/// see [`Walk::fills_with`]).
pub(crate) struct Walk<'a> {
    ctx: &'a ClaimContext,
    targets: std::slice::Iter<'a, Target>,
    limit: i64,
    admission: Option<Admission>,
    current: Option<&'a Target>,
}

impl<'a> Walk<'a> {
    /// A walk over `targets` for claims of up to `limit` jobs.
    pub(crate) fn new(ctx: &'a ClaimContext, targets: &'a [Target], limit: i64) -> Self {
        Walk {
            ctx,
            targets: targets.iter(),
            limit,
            admission: None,
            current: None,
        }
    }

    /// The next target to claim from, its admissions taken (see
    /// [`Walk::admission`]); `None` once every target was tried.
    pub(crate) async fn next(&mut self) -> Result<Option<&'a Target>> {
        let Some(target) = self.targets.next() else {
            return Ok(None);
        };
        rate::settle(self.ctx, self.admission.as_ref(), 0).await?;
        self.admission = rate::reserve_for(self.ctx, target, self.limit).await?;
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

    /// The claim took `used` jobs from the current target: give back the
    /// admissions it did not use. Returns the target claimed last and, for
    /// a rate-limited one, when its jobs were admitted.
    pub(crate) async fn settle(
        self,
        used: usize,
    ) -> Result<(Option<&'a Target>, Option<SystemTime>)> {
        rate::settle(self.ctx, self.admission.as_ref(), used).await?;
        Ok((
            self.current,
            self.admission.as_ref().and_then(|a| a.admitted()),
        ))
    }
}
