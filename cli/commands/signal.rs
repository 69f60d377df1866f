//! `pgwake signal KEY [--payload JSON] [--keep DURATION]`: send a signal,
//! on top of [`pgwake::client::signal_keep`].

use clap::Args;
use pgwake::error::Error;
use pgwake::{admin::schema, connect};

use super::database::Db;

#[derive(Args)]
pub struct SignalArgs {
    #[command(flatten)]
    db: Db,
    /// The payload, as JSON, handed to each job it wakes (JobContext::signal).
    #[arg(long, value_name = "JSON")]
    payload: Option<String>,
    /// How long to keep the signal if it wakes no job, for the first job that begins to wait
    /// for KEY (at most 7d; 0s keeps nothing).
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = humantime::parse_duration)]
    keep: std::time::Duration,
    /// The key the jobs wait for (Outcome::WaitFor), e.g. payment:42.
    key: String,
}

/// Send the signal and say how many jobs it woke (or that it is kept).
pub async fn command(args: SignalArgs) -> Result<(), Error> {
    let payload = match &args.payload {
        Some(text) => Some(serde_json::from_str::<serde_json::Value>(text).map_err(|e| {
            Error::Config(format!(
                "--payload is not JSON ({e}): quote a string as '\"text\"', an object as '{{\"paid\": true}}'"
            ))
        })?),
        None => None,
    };
    let client = connect::connect(&args.db.config()?).await?;
    schema::check(&client).await?;
    let woke = pgwake::client::signal_keep(&client, &args.key, payload.as_ref(), args.keep).await?;
    let key = pgwake::admin::stats::printable(&args.key);
    if woke > 0 {
        println!("signal {key}: woke {woke} waiting job(s)");
    } else if args.keep.is_zero() {
        println!("signal {key}: no job waits for it; not kept (--keep 0s)");
    } else {
        println!(
            "signal {key}: no job waits for it; kept {} for the first job that waits for it",
            humantime::format_duration(args.keep)
        );
    }
    Ok(())
}
