//! The in-process run ledger: every run of every job, recorded by a
//! handler, and the ledger check every reliability test ends with.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use pgwake::{async_trait, BoxError, Handler, Job, JobContext, Outcome};

/// Every run of every job: (job id, attempt), in the order they started.
#[derive(Clone, Default)]
pub struct Ledger {
    runs: Arc<Mutex<Vec<(i64, i32)>>>,
}

impl Ledger {
    /// Record a run.
    pub fn record(&self, job: &Job) {
        self.runs.lock().unwrap().push((job.id, job.attempt));
    }

    /// All runs so far.
    pub fn runs(&self) -> Vec<(i64, i32)> {
        self.runs.lock().unwrap().clone()
    }

    /// Runs per job id.
    pub fn counts(&self) -> HashMap<i64, usize> {
        let mut m = HashMap::new();
        for (id, _) in self.runs() {
            *m.entry(id).or_insert(0) += 1;
        }
        m
    }

    /// The ledger check: every id in `expected` ran at least once, none is
    /// missing; returns the ids that ran more than once (for the caller to
    /// judge against its scenario).
    pub fn check(&self, expected: &[i64]) -> Vec<(i64, usize)> {
        let counts = self.counts();
        let missing: Vec<i64> = expected
            .iter()
            .filter(|id| !counts.contains_key(id))
            .copied()
            .collect();
        assert!(
            missing.is_empty(),
            "{} jobs never ran, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(10)]
        );
        let mut dupes: Vec<(i64, usize)> = counts.into_iter().filter(|(_, n)| *n > 1).collect();
        dupes.sort();
        dupes
    }
}

/// A handler that records each run and then does what `behaviour` says.
pub struct Recording<F> {
    pub ledger: Ledger,
    pub behaviour: F,
}

#[async_trait]
impl<F> Handler for Recording<F>
where
    F: Fn(&Job) -> Result<Outcome, BoxError> + Send + Sync + 'static,
{
    async fn handle(&self, job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        self.ledger.record(job);
        (self.behaviour)(job)
    }
}

/// A recording handler that always succeeds.
pub fn ok_handler(
    ledger: &Ledger,
) -> Recording<impl Fn(&Job) -> Result<Outcome, BoxError> + Send + Sync + 'static> {
    Recording {
        ledger: ledger.clone(),
        behaviour: |_: &Job| Ok(Outcome::Done),
    }
}
