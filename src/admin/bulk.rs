//! Actions on every job a filter matches ("retry everything dead in queue
//! `mail`"): first [`select`] the jobs (the same filters as
//! [`crate::admin::jobs::list`], keyset-paginated, at most [`BULK_MAX`]),
//! show the count, then [`apply`] the action to them through the single-job
//! functions: [`crate::admin::dead::retry`], [`crate::cancel()`],
//! [`crate::admin::dead::purge`].

use serde::Serialize;

use crate::admin::dead::{self, Selection};
use crate::admin::jobs::{self, JobFilter};
use crate::error::{Error, Result};

/// Most jobs one bulk action touches; a filter matching more acts on the
/// first this many by id (say it again for the rest).
pub const BULK_MAX: usize = 10_000;

/// What a bulk action does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BulkAction {
    /// Dead jobs back into their queue ([`dead::retry`]); cancelled ones
    /// only when the filter names the cancelled state.
    Retry,
    /// Waiting, scheduled, running and buffered jobs cancelled
    /// ([`crate::cancel()`]).
    Cancel,
    /// Dead and cancelled jobs deleted for good ([`dead::purge`]).
    Delete,
}

impl BulkAction {
    /// `retry`, `cancel` or `delete`.
    pub fn as_str(self) -> &'static str {
        match self {
            BulkAction::Retry => "retry",
            BulkAction::Cancel => "cancel",
            BulkAction::Delete => "delete",
        }
    }

    /// The job states it applies to.
    pub fn states(self) -> &'static [&'static str] {
        match self {
            BulkAction::Retry | BulkAction::Delete => &["dead", "cancelled"],
            BulkAction::Cancel => &["waiting", "scheduled", "running", "buffered"],
        }
    }

    /// The states it applies to when the filter names none: a bulk retry
    /// revives dead jobs only, never one an operator cancelled on purpose
    /// (filter on the cancelled state to retry those).
    pub fn default_states(self) -> &'static [&'static str] {
        match self {
            BulkAction::Retry => &["dead"],
            other => other.states(),
        }
    }
}

impl std::str::FromStr for BulkAction {
    type Err = Error;

    fn from_str(s: &str) -> Result<BulkAction> {
        match s {
            "retry" => Ok(BulkAction::Retry),
            "cancel" => Ok(BulkAction::Cancel),
            "delete" => Ok(BulkAction::Delete),
            _ => Err(Error::Config(format!(
                "unknown bulk action {s:?}: use retry, cancel or delete"
            ))),
        }
    }
}

/// The jobs a bulk action would touch.
#[derive(Debug, Clone, PartialEq)]
pub struct Matching {
    /// Their ids, ascending (at most [`BULK_MAX`]).
    pub ids: Vec<i64>,
    /// Whether more matched than [`BULK_MAX`].
    pub more: bool,
}

/// The jobs matching `filter` that `action` applies to: those of
/// `filter.state` when it names one of the action's states, else of its
/// [`default_states`](BulkAction::default_states). A state the action does not apply to is
/// refused (cancelling dead jobs, retrying waiting ones).
pub async fn select(
    client: &tokio_postgres::Client,
    filter: &JobFilter,
    action: BulkAction,
) -> Result<Matching> {
    let states: Vec<&str> = match filter.state.as_deref() {
        None => action.default_states().to_vec(),
        Some(s) if action.states().contains(&s) => vec![s],
        Some(s) => {
            return Err(Error::Config(format!(
                "{} applies to {} jobs, not {s} ones",
                action.as_str(),
                action.states().join(", ")
            )))
        }
    };
    let mut ids = Vec::new();
    for state in states {
        let mut page = JobFilter {
            state: Some(state.to_string()),
            after_id: filter.after_id,
            page: 1000,
            ..filter.clone()
        };
        loop {
            let rows = jobs::list(client, &page).await?;
            let full = rows.len() == page.page as usize;
            if let Some(last) = rows.last() {
                page.after_id = last.id;
            }
            ids.extend(rows.iter().map(|r| r.id));
            if !full || ids.len() > BULK_MAX {
                break;
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    let more = ids.len() > BULK_MAX;
    ids.truncate(BULK_MAX);
    Ok(Matching { ids, more })
}

/// Apply `action` to the jobs `ids` (from [`select`]); returns how many it
/// changed (jobs that moved on meanwhile are left alone). Run inside the
/// caller's transaction if `client` is one.
pub async fn apply<C: tokio_postgres::GenericClient>(
    client: &C,
    action: BulkAction,
    ids: &[i64],
) -> Result<u64> {
    if ids.is_empty() {
        return Ok(0);
    }
    let sel = Selection {
        ids: Some(ids.to_vec()),
        queue: None,
        all: false,
    };
    match action {
        BulkAction::Retry => Ok(dead::retry(client, &sel).await?.len() as u64),
        BulkAction::Delete => dead::purge(client, &sel, None).await,
        BulkAction::Cancel => {
            let mut n = 0;
            for id in ids {
                if crate::admin::cancel::cancel(client, *id)
                    .await?
                    .is_cancelled()
                {
                    n += 1;
                }
            }
            Ok(n)
        }
    }
}
