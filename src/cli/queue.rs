//! `pgwake queue list | pause Q | resume Q`, on top of [`pgwake::queues`].

use clap::Subcommand;
use pgwake::error::Error;
use pgwake::{connect, queues, schema};

use super::args::Db;

/// `pgwake queue …` subcommands.
#[derive(Subcommand)]
pub enum QueueAction {
    /// Every queue with settings or waiting jobs, and its state.
    List {
        #[command(flatten)]
        db: Db,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Start no new job of QUEUE on any worker until it is resumed (running jobs finish).
    Pause {
        #[command(flatten)]
        db: Db,
        /// The queue.
        #[arg(value_name = "QUEUE", value_parser = queue_name)]
        queue: String,
    },
    /// Let workers start jobs of a paused QUEUE again.
    Resume {
        #[command(flatten)]
        db: Db,
        /// The queue.
        #[arg(value_name = "QUEUE", value_parser = queue_name)]
        queue: String,
    },
}

fn queue_name(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("the queue name must not be empty".into());
    }
    Ok(s.to_string())
}

/// Run one `pgwake queue` subcommand.
pub async fn command(action: QueueAction) -> Result<(), Error> {
    match action {
        QueueAction::List { db, json } => {
            let client = connect::connect(&db.config()?).await?;
            schema::check(&client).await?;
            let list = queues::list(&client).await?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&list).unwrap_or_default()
                );
            } else {
                print!("{}", queues::render_table(&list));
            }
        }
        QueueAction::Pause { db, queue } => {
            let client = connect::connect(&db.config()?).await?;
            schema::check(&client).await?;
            if queues::pause(&client, &queue).await? {
                println!("{queue}: paused (running jobs finish; no new job starts until `pgwake queue resume {queue}`)");
            } else {
                println!("{queue}: already paused");
            }
        }
        QueueAction::Resume { db, queue } => {
            let client = connect::connect(&db.config()?).await?;
            schema::check(&client).await?;
            if queues::resume(&client, &queue).await? {
                println!("{queue}: resumed");
            } else {
                println!("{queue}: was not paused");
            }
        }
    }
    Ok(())
}
