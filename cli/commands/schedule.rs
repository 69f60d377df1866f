//! `pgwake schedule add|list|remove`: recurring jobs from the command line,
//! on top of [`pgwake::admin::schedules`].

use clap::{Args, Subcommand};
use pgwake::admin::schedules::{self, CatchUp, NewSchedule, ScheduleError, ScheduleInfo};
use pgwake::error::Error;
use pgwake::{admin::schema, connect};

use super::database::Db;

/// Upcoming ticks `schedule add` prints.
const PREVIEW_TICKS: usize = 3;

#[derive(Subcommand)]
pub enum ScheduleAction {
    /// Add a recurring job: enqueue TASK at every tick of a cron expression.
    Add(AddArgs),
    /// List schedules with their next tick and counters.
    List {
        #[command(flatten)]
        db: Db,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a schedule (jobs it already enqueued stay queued).
    Remove {
        #[command(flatten)]
        db: Db,
        /// The schedule's name.
        name: String,
    },
    /// Stop serving a schedule without removing it (no tick is enqueued while disabled).
    Disable {
        #[command(flatten)]
        db: Db,
        /// The schedule's name.
        name: String,
    },
    /// Serve a disabled schedule again, from its first tick after now (no catch-up).
    Enable {
        #[command(flatten)]
        db: Db,
        /// The schedule's name.
        name: String,
    },
}

#[derive(Args)]
pub struct AddArgs {
    #[command(flatten)]
    db: Db,
    /// Unique name of the schedule.
    #[arg(long)]
    name: String,
    /// Cron expression: 5 fields (minute hour day-of-month month day-of-week)
    /// or 6 with seconds first, e.g. '0 3 * * *' or '*/10 * * * * *'.
    #[arg(long)]
    cron: String,
    /// Task of the enqueued jobs.
    #[arg(long)]
    task: String,
    /// JSON payload of every enqueued job.
    #[arg(long, default_value = "{}")]
    payload: String,
    /// Queue of the enqueued jobs (default: default).
    #[arg(long)]
    queue: Option<String>,
    /// Priority of the enqueued jobs (lower runs first).
    #[arg(long, default_value_t = 0)]
    priority: i32,
    /// IANA time zone the expression is read in, e.g. Europe/Berlin.
    #[arg(long, default_value = schedules::TZ_DEFAULT)]
    tz: String,
    /// Ticks missed while no worker ran: skip them, or enqueue up to N of
    /// them (1-1000). The latest due tick is enqueued either way.
    #[arg(long, value_name = "skip|N", default_value = "skip")]
    catch_up: CatchUp,
    /// Redefine the schedule if the name exists (its next tick is computed
    /// afresh from now; counters are kept).
    #[arg(long)]
    replace: bool,
}

/// Run a `pgwake schedule` command.
pub async fn command(action: ScheduleAction) -> Result<(), Error> {
    match action {
        ScheduleAction::Add(args) => add(args).await,
        ScheduleAction::List { db, json } => {
            let client = client(&db).await?;
            let all = schedules::list(&client).await.map_err(cli_error)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&all).unwrap_or_default());
            } else {
                print!("{}", render_table(&all));
            }
            Ok(())
        }
        ScheduleAction::Remove { db, name } => {
            let client = client(&db).await?;
            schedules::remove(&client, &name).await.map_err(cli_error)?;
            println!("removed schedule {name:?}");
            Ok(())
        }
        ScheduleAction::Disable { db, name } => set_enabled(&db, &name, false).await,
        ScheduleAction::Enable { db, name } => set_enabled(&db, &name, true).await,
    }
}

async fn set_enabled(db: &Db, name: &str, enabled: bool) -> Result<(), Error> {
    let client = client(db).await?;
    schedules::set_enabled(&client, name, enabled)
        .await
        .map_err(cli_error)?;
    if enabled {
        println!("enabled schedule {name:?}: served again from its first tick after now");
    } else {
        println!("disabled schedule {name:?}: no tick is enqueued until it is enabled");
    }
    Ok(())
}

async fn add(args: AddArgs) -> Result<(), Error> {
    let payload: serde_json::Value = serde_json::from_str(&args.payload)
        .map_err(|e| Error::Config(format!("--payload is not valid JSON: {e}")))?;
    let mut schedule = NewSchedule::new(&args.name, &args.cron, &args.task)
        .payload(payload)
        .priority(args.priority)
        .tz(&args.tz)
        .catch_up(args.catch_up);
    schedule.queue = args.queue;
    // Everything that needs no database is checked before connecting.
    let cron = schedule.validate().map_err(cli_error)?;
    let client = client(&args.db).await?;
    if args.replace {
        schedules::replace(&client, &schedule).await
    } else {
        schedules::add(&client, &schedule).await
    }
    .map_err(cli_error)?;
    let now: chrono::DateTime<chrono::Utc> = pgwake::internal::sql::Db::unnamed(&client)
        .query_one(&pgwake::internal::sql::SCHEDULE_NOW, &[])
        .await
        .map_err(Error::db("reading the database clock"))?
        .get(0);
    let next: Vec<String> = cron
        .upcoming(now, PREVIEW_TICKS)
        .iter()
        .map(|t| t.with_timezone(&cron.tz()).to_rfc3339())
        .collect();
    println!(
        "{} schedule {:?}: {:?} in {}, task {:?}, catch-up {}; next ticks {}",
        if args.replace { "set" } else { "added" },
        schedule.name,
        schedule.cron,
        schedule.tz,
        schedule.task,
        schedule.catch_up,
        next.join(", ")
    );
    Ok(())
}

async fn client(db: &Db) -> Result<tokio_postgres::Client, Error> {
    let client = connect::connect(&db.config()?).await?;
    schema::check(&client).await?;
    Ok(client)
}

/// Invalid input exits 2 naming the flag; a taken or unknown name exits 1.
fn cli_error(e: ScheduleError) -> Error {
    match e {
        ScheduleError::Invalid { field, reason } => {
            Error::Config(format!("{}: {reason}", field.flag()))
        }
        ScheduleError::Exists(_) | ScheduleError::NotFound(_) => Error::Refused(e.to_string()),
        ScheduleError::Db(e) => e,
        other => Error::Refused(other.to_string()),
    }
}

fn render_table(all: &[ScheduleInfo]) -> String {
    if all.is_empty() {
        return "no schedules\n".into();
    }
    let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
        t.map_or("-".to_string(), |t| {
            t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        })
    };
    let mut out = format!(
        "{:<20} {:<18} {:<14} {:<16} {:<10} {:<8} {:<21} {:<21} {:>8} {:>7} {:>7}\n",
        "NAME",
        "CRON",
        "TZ",
        "TASK",
        "QUEUE",
        "CATCHUP",
        "NEXT TICK",
        "LAST TICK",
        "ENQUEUED",
        "MISSED",
        "WAITING"
    );
    for s in all {
        out.push_str(&format!(
            "{:<20} {:<18} {:<14} {:<16} {:<10} {:<8} {:<21} {:<21} {:>8} {:>7} {:>7}\n",
            s.name,
            s.cron,
            s.tz,
            s.task,
            s.queue,
            s.catch_up.to_string(),
            if s.error.is_some() {
                "INVALID".to_string()
            } else if !s.enabled {
                "(disabled)".to_string()
            } else {
                s.next_tick
                    .map_or("(pending)".to_string(), |t| time(Some(t)))
            },
            time(s.last_tick),
            s.ticks_enqueued,
            s.ticks_missed,
            s.ticks_waiting
        ));
        if let Some(e) = &s.error {
            out.push_str(&format!("  ! {}: {e}\n", s.name));
        }
    }
    out
}
