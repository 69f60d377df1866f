//! `pgwake cancel ID…`: cancel jobs, on top of [`pgwake::admin::cancel`].

use clap::Args;
use pgwake::admin::cancel::{self, CancelOutcome};
use pgwake::error::Error;
use pgwake::{admin::schema, connect};

use super::database::Db;

#[derive(Args)]
pub struct CancelArgs {
    #[command(flatten)]
    db: Db,
    /// Print one JSON object per job ({"id": …, "result": …}) instead of text.
    #[arg(long)]
    json: bool,
    /// Ids of the jobs to cancel.
    #[arg(required = true, value_name = "ID", value_parser = clap::value_parser!(i64).range(1..))]
    ids: Vec<i64>,
}

/// What the command prints for one job.
fn describe(outcome: CancelOutcome) -> &'static str {
    match outcome {
        CancelOutcome::Cancelled => "cancelled (it was waiting; now in dead_jobs)",
        CancelOutcome::Requested => {
            "cancel requested (it is running; its worker stops it and records it in dead_jobs as cancelled)"
        }
        CancelOutcome::Dead => "not cancelled: already dead (in dead_jobs)",
        CancelOutcome::Finished => {
            "not cancelled: finished (no longer queued, running or dead)"
        }
        CancelOutcome::NotFound => "not cancelled: no such job",
    }
}

/// Cancel every id, each on its own (one that cannot be cancelled does not
/// hold back the others), print what became of each, and fail (exit 2) if
/// any could not be cancelled.
pub async fn command(args: CancelArgs) -> Result<(), Error> {
    let client = connect::connect(&args.db.config()?).await?;
    schema::check(&client).await?;
    let mut refused = Vec::new();
    for &id in &args.ids {
        let outcome = cancel::cancel(&client, id).await?;
        if args.json {
            println!(
                "{}",
                serde_json::json!({ "id": id, "result": outcome.as_str() })
            );
        } else {
            println!("{id}: {}", describe(outcome));
        }
        if !outcome.is_cancelled() {
            refused.push(format!("{id} ({})", outcome.as_str()));
        }
    }
    if refused.is_empty() {
        return Ok(());
    }
    let others = if refused.len() < args.ids.len() {
        "; the others were"
    } else {
        ""
    };
    Err(Error::Config(format!(
        "{} of {} jobs could not be cancelled: {}{others}",
        refused.len(),
        args.ids.len(),
        refused.join(", ")
    )))
}
