//! `pgwake batch open|close|status`: batches with a callback
//! (docs/src/flows.md → "Batches"), on top of [`pgwake::client::batch_open`],
//! [`pgwake::client::batch_close`] and [`pgwake::client::batch_status`].

use clap::{Args, Subcommand};
use pgwake::client::BatchStatus;
use pgwake::error::Error;
use pgwake::{admin::schema, connect};

use super::database::Db;

#[derive(Subcommand)]
pub enum BatchAction {
    /// Open a batch: enqueue its callback job, held until the batch is closed and every
    /// job of it has ended; print the batch's id (the callback's job id).
    Open(OpenArgs),
    /// Close a batch: no job can be added; the callback runs once every job has ended
    /// (at once if they all have).
    Close(IdArgs),
    /// A batch's progress: jobs by outcome (done, dead, cancelled, pending), the failed
    /// ids, whether it is open, closed or released, and where its callback is.
    Status(StatusArgs),
}

#[derive(Args)]
pub struct OpenArgs {
    #[command(flatten)]
    db: Db,
    /// The callback's task.
    #[arg(long)]
    task: String,
    /// The callback's payload, as JSON.
    #[arg(long, value_name = "JSON", default_value = "{}")]
    payload: String,
    /// The callback's queue [default: default].
    #[arg(long)]
    queue: Option<String>,
    /// Close the batch after this long if nobody has (1s to 30d).
    #[arg(long, value_name = "DURATION", default_value = "1d", value_parser = humantime::parse_duration)]
    close_within: std::time::Duration,
}

#[derive(Args)]
pub struct IdArgs {
    #[command(flatten)]
    db: Db,
    /// The batch's id (what `pgwake batch open` printed).
    #[arg(value_name = "ID", value_parser = clap::value_parser!(i64).range(1..))]
    id: i64,
}

#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    db: Db,
    /// Print the status as one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// The batch's id (what `pgwake batch open` printed).
    #[arg(value_name = "ID", value_parser = clap::value_parser!(i64).range(1..))]
    id: i64,
}

/// Run `pgwake batch …`.
pub async fn command(action: BatchAction) -> Result<(), Error> {
    match action {
        BatchAction::Open(args) => {
            let payload: serde_json::Value = serde_json::from_str(&args.payload)
                .map_err(|e| Error::Config(format!("--payload is not valid JSON: {e}")))?;
            let client = connect::connect(&args.db.config()?).await?;
            schema::check(&client).await?;
            let id = pgwake::client::batch_open(
                &client,
                &args.task,
                &payload,
                args.queue.as_deref(),
                args.close_within,
            )
            .await?;
            println!("{id}");
        }
        BatchAction::Close(args) => {
            let client = connect::connect(&args.db.config()?).await?;
            schema::check(&client).await?;
            if pgwake::client::batch_close(&client, args.id).await? {
                println!("batch {}: closed", args.id);
            } else {
                println!("batch {}: closed already; nothing changed", args.id);
            }
        }
        BatchAction::Status(args) => {
            let client = connect::connect(&args.db.config()?).await?;
            schema::check(&client).await?;
            let s = pgwake::client::batch_status(&client, args.id).await?;
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string(&s).map_err(|e| Error::Config(e.to_string()))?
                );
            } else {
                print!("{}", render(&s));
            }
        }
    }
    Ok(())
}

/// The status as text, one fact a line.
pub fn render(s: &BatchStatus) -> String {
    let state = match s.state.as_str() {
        "open" => "open (jobs may be added; pgwake batch close ID when the last is)",
        "closed" => "closed (the callback runs when the last pending job ends)",
        "released" => "released (every job ended; the callback was released)",
        other => other,
    };
    let mut out = format!(
        "batch {}: {state}\ncallback: job {} ({})\njobs: {} total, {} done, {} dead, {} cancelled, {} pending\n",
        s.batch, s.batch, s.callback, s.total, s.done, s.dead, s.cancelled, s.pending
    );
    if !s.failed_ids.is_empty() {
        let shown: Vec<String> = s
            .failed_ids
            .iter()
            .take(20)
            .map(|i| i.to_string())
            .collect();
        let more = s.failed_ids.len() as i64 - shown.len() as i64 + s.failed_ids_omitted;
        out.push_str(&format!("failed: {}", shown.join(", ")));
        if more > 0 {
            out.push_str(&format!(" and {more} more (--json lists up to 1,000)"));
        }
        out.push('\n');
    }
    out
}
