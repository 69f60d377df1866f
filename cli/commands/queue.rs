//! `pgwake queue list | pressure [Q] | pause Q | resume Q | set Q [--max-running N] [--rate N/s]
//! [--limit-key-path FIELD] [--fair-keys] [--max-running-per-key N]
//! [--rate-per-key N/s] [--key K --max-running N] [--shed-under-pressure on|off]`, on top of
//! [`pgwake::admin::queues`].

use clap::Subcommand;
use pgwake::error::Error;
use pgwake::{admin::queue_pressure, admin::queues, admin::schema, connect};

use super::database::Db;

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
    /// How much work QUEUE (or every queue) has for workers now: runnable jobs (a worker
    /// could start them now), ready, running, the oldest ready job's age. Answers in
    /// milliseconds however deep the queue: ready jobs are counted up to --cap.
    Pressure {
        #[command(flatten)]
        db: Db,
        /// The queue (none: every queue with waiting or leased jobs or settings).
        #[arg(value_name = "QUEUE", value_parser = queue_name)]
        queue: Option<String>,
        /// Count ready jobs up to N (a deeper queue shows N+).
        #[arg(long, value_name = "N", default_value_t = queue_pressure::CAP_DEFAULT,
              value_parser = clap::value_parser!(i32).range(1..=queue_pressure::CAP_MAX as i64))]
        cap: i32,
        /// Print JSON (one object per queue, in an array).
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
    /// Change a queue's limits (held across every worker, read without a restart).
    #[command(group(clap::ArgGroup::new("limit").required(true).multiple(true)
        .args(["max_running", "no_max_running", "rate", "no_rate", "limit_key_path",
               "no_limit_key_path", "fair_keys", "no_fair_keys", "max_running_per_key",
               "no_max_running_per_key", "rate_per_key", "no_rate_per_key",
               "shed_under_pressure"])))]
    Set {
        #[command(flatten)]
        db: Db,
        /// The queue.
        #[arg(value_name = "QUEUE", value_parser = queue_name)]
        queue: String,
        /// At most N jobs of QUEUE run at once, across every worker process (with --key: of
        /// that limit key of QUEUE).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(1..))]
        max_running: Option<i32>,
        /// Remove the --max-running limit (with --key: the key's own limit, back to
        /// --max-running-per-key).
        #[arg(long, conflicts_with = "max_running")]
        no_max_running: bool,
        /// At most N jobs of QUEUE start in any window of the given length (sliding), across
        /// every worker process: N/s, N/min, N/h or N/<duration> (20/s, 600/min, 1/50ms).
        #[arg(long, value_name = "N/WINDOW", value_parser = clap::value_parser!(queues::RateLimit))]
        rate: Option<queues::RateLimit>,
        /// Remove the --rate limit.
        #[arg(long, conflicts_with = "rate")]
        no_rate: bool,
        /// Jobs of QUEUE enqueued without a limit key take this top-level payload field as
        /// their key (e.g. customer_id); applies to jobs enqueued from now on.
        #[arg(long, value_name = "FIELD")]
        limit_key_path: Option<String>,
        /// Remove the --limit-key-path setting.
        #[arg(long, conflicts_with = "limit_key_path")]
        no_limit_key_path: bool,
        /// Claims take QUEUE's ready jobs in rotation between limit keys, so one key's
        /// backlog cannot starve another's (priority order within a key).
        #[arg(long)]
        fair_keys: bool,
        /// Claims take QUEUE's ready jobs in plain claim order again.
        #[arg(long, conflicts_with = "fair_keys")]
        no_fair_keys: bool,
        /// At most N jobs of any one limit key of QUEUE run at once, across every worker
        /// process (claims then take ready jobs in rotation between keys).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(1..))]
        max_running_per_key: Option<i32>,
        /// Remove the --max-running-per-key limit.
        #[arg(long, conflicts_with = "max_running_per_key")]
        no_max_running_per_key: bool,
        /// At most N jobs of any one limit key of QUEUE start in any window of the given
        /// length (sliding), across every worker process, written as --rate (20/s, 600/min);
        /// jobs without a key are not limited by it.
        #[arg(long, value_name = "N/WINDOW", value_parser = clap::value_parser!(queues::RateLimit))]
        rate_per_key: Option<queues::RateLimit>,
        /// Remove the --rate-per-key limit.
        #[arg(long, conflicts_with = "rate_per_key")]
        no_rate_per_key: bool,
        /// on: pause QUEUE while the database pressure (`pgwake.pressure()`) is critical and
        /// resume it when the pressure falls below critical; off: never.
        #[arg(long, value_name = "on|off", value_parser = on_off)]
        shed_under_pressure: Option<bool>,
        /// With --max-running N or --no-max-running: set that limit for this one limit key of
        /// QUEUE (e.g. a customer who paid for more), over --max-running-per-key.
        #[arg(long, value_name = "K")]
        key: Option<String>,
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

fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("{other:?}: expected on or off")),
    }
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
        QueueAction::Pressure {
            db,
            queue,
            cap,
            json,
        } => {
            let client = connect::connect(&db.config()?).await?;
            schema::check(&client).await?;
            let rows = queue_pressure::read(&client, queue.as_deref(), cap).await?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&rows).unwrap_or_default()
                );
            } else {
                print!("{}", queue_pressure::render_table(&rows));
            }
        }
        QueueAction::Pause { db, queue } => {
            let client = connect::connect(&db.config()?).await?;
            schema::check(&client).await?;
            if queues::pause(&client, &queue).await? {
                println!(
                    "{queue}: paused (running jobs finish; no new job starts until `pgwake queue resume {}`)",
                    super::shell::positional(&queue)
                );
            } else {
                println!("{queue}: already paused");
            }
        }
        QueueAction::Set {
            db,
            queue,
            max_running,
            no_max_running,
            rate,
            no_rate,
            limit_key_path,
            no_limit_key_path,
            fair_keys,
            no_fair_keys,
            max_running_per_key,
            no_max_running_per_key,
            rate_per_key,
            no_rate_per_key,
            shed_under_pressure,
            key,
        } => {
            let mut client = connect::connect(&db.config()?).await?;
            schema::check(&client).await?;
            // Every flag in one transaction: no moment with half the
            // settings (a per-key limit missing while its path is set),
            // and a refused flag changes nothing. What was set is said
            // once it is committed.
            let tx = client
                .transaction()
                .await
                .map_err(Error::db("queue set: begin"))?;
            let mut said: Vec<String> = Vec::new();
            macro_rules! say {
                ($($t:tt)*) => { said.push(format!($($t)*)) };
            }
            if let Some(key) = &key {
                if max_running.is_none() && !no_max_running {
                    return Err(Error::Config(
                        "--key needs --max-running N or --no-max-running (the key's own limit)"
                            .into(),
                    ));
                }
                queues::set_key_max_running(&tx, &queue, key, max_running).await?;
                match max_running {
                    Some(n) => say!(
                        "{queue}: at most {n} jobs of key {key:?} running at once, across every worker"
                    ),
                    None => say!("{queue}: key {key:?} back to the queue's per-key limit"),
                }
            } else if max_running.is_some() || no_max_running {
                queues::set_max_running(&tx, &queue, max_running).await?;
                match max_running {
                    Some(n) => {
                        say!("{queue}: at most {n} running at once, across every worker")
                    }
                    None => say!("{queue}: no max-running limit"),
                }
            }
            if rate.is_some() || no_rate {
                queues::set_rate(&tx, &queue, rate).await?;
                match rate {
                    Some(r) => say!(
                        "{queue}: at most {} started in any {} (rate {r}), across every worker",
                        r.count,
                        humantime::format_duration(r.per)
                    ),
                    None => say!("{queue}: no rate limit"),
                }
            }
            if limit_key_path.is_some() || no_limit_key_path {
                queues::set_limit_key_path(&tx, &queue, limit_key_path.as_deref()).await?;
                match limit_key_path {
                    Some(p) => say!(
                        "{queue}: jobs enqueued without a limit key take the payload's {p:?} field as their key"
                    ),
                    None => say!("{queue}: no limit key path"),
                }
            }
            if max_running_per_key.is_some() || no_max_running_per_key {
                queues::set_max_running_per_key(&tx, &queue, max_running_per_key).await?;
                match max_running_per_key {
                    Some(n) => say!(
                        "{queue}: at most {n} jobs of any one limit key running at once, across every worker"
                    ),
                    None => say!("{queue}: no per-key running limit"),
                }
            }
            if rate_per_key.is_some() || no_rate_per_key {
                queues::set_rate_per_key(&tx, &queue, rate_per_key).await?;
                match rate_per_key {
                    Some(r) => say!(
                        "{queue}: at most {} jobs of any one limit key started in any {} (rate {r} per key), across every worker",
                        r.count,
                        humantime::format_duration(r.per)
                    ),
                    None => say!("{queue}: no per-key rate limit"),
                }
            }
            if fair_keys || no_fair_keys {
                queues::set_fair_keys(&tx, &queue, fair_keys).await?;
                if fair_keys {
                    say!("{queue}: ready jobs are taken in rotation between limit keys");
                } else {
                    say!("{queue}: ready jobs are taken in claim order (no rotation between keys)");
                }
            }
            if let Some(shed) = shed_under_pressure {
                queues::set_shed_under_pressure(&tx, &queue, shed).await?;
                if shed {
                    say!("{queue}: paused while the database pressure is critical (from its next change to critical), resumed when it falls");
                } else {
                    say!("{queue}: not shed under pressure");
                }
            }
            tx.commit().await.map_err(Error::db("queue set: commit"))?;
            for line in said {
                println!("{line}");
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
