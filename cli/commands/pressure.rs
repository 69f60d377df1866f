//! `pgwake pressure show [--json] | set [--horizon-elevated 1m] [--horizon-critical 5m]
//! [--dead-tuples-elevated N] [--dead-tuples-critical N] [--notify-elevated F]
//! [--notify-critical F] [--leave-ratio F]`, on top of [`pgwake::admin::pressure`].

use clap::Subcommand;
use pgwake::admin::pressure::{self, Thresholds};
use pgwake::error::Error;
use pgwake::{admin::schema, connect};

use super::args::{duration, HumanDuration};
use super::database::Db;

/// `pgwake pressure …` subcommands.
#[derive(Subcommand)]
pub enum PressureAction {
    /// The database pressure now (`pgwake.pressure()`): the level, since when, each cause
    /// (who holds the vacuum horizon, dead tuples, the NOTIFY queue), and the thresholds.
    /// Records a change of level as the workers' samplers do.
    Show {
        #[command(flatten)]
        db: Db,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Change the thresholds of the levels (every worker's sampler uses them at its next
    /// sample); the others stay. Refused, with the range, unless elevated < critical.
    #[command(group(clap::ArgGroup::new("threshold").required(true).multiple(true)
        .args(["horizon_elevated", "horizon_critical", "dead_tuples_elevated",
               "dead_tuples_critical", "notify_elevated", "notify_critical", "leave_ratio"])))]
    Set {
        #[command(flatten)]
        db: Db,
        /// Elevated once a transaction of the database has held the vacuum horizon this long
        /// (default 1m).
        #[arg(long, value_name = "DURATION", value_parser = duration)]
        horizon_elevated: Option<HumanDuration>,
        /// Critical once it has held it this long (default 5m; at most 7d).
        #[arg(long, value_name = "DURATION", value_parser = duration)]
        horizon_critical: Option<HumanDuration>,
        /// Elevated at this many dead tuples in the queue tables (default 100000).
        #[arg(long, value_name = "N")]
        dead_tuples_elevated: Option<i64>,
        /// Critical at this many (default 1000000).
        #[arg(long, value_name = "N")]
        dead_tuples_critical: Option<i64>,
        /// Elevated at this fraction of the NOTIFY queue in use (default 0.25).
        #[arg(long, value_name = "FRACTION")]
        notify_elevated: Option<f64>,
        /// Critical at this fraction (default 0.5; at most 1).
        #[arg(long, value_name = "FRACTION")]
        notify_critical: Option<f64>,
        /// A level is left only when every measure is below its threshold × this ratio
        /// (default 0.5; between 0 and 1).
        #[arg(long, value_name = "RATIO")]
        leave_ratio: Option<f64>,
    },
}

/// Run a `pgwake pressure` subcommand.
pub async fn command(action: PressureAction) -> Result<(), Error> {
    match action {
        PressureAction::Show { db, json } => {
            let client = connect::connect(&db.config()?).await?;
            schema::check(&client).await?;
            let now = pressure::read(&client).await?;
            let thresholds = pressure::thresholds(&client).await?;
            if json {
                let v = serde_json::json!({ "pressure": now, "thresholds": thresholds });
                println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            } else {
                print!("{}", render(&now, &thresholds));
            }
        }
        PressureAction::Set {
            db,
            horizon_elevated,
            horizon_critical,
            dead_tuples_elevated,
            dead_tuples_critical,
            notify_elevated,
            notify_critical,
            leave_ratio,
        } => {
            let client = connect::connect(&db.config()?).await?;
            schema::check(&client).await?;
            let secs = |d: Option<HumanDuration>| d.map(|d| d.as_secs_f64());
            let mut wanted = Thresholds::default();
            wanted.horizon_elevated_seconds = secs(horizon_elevated);
            wanted.horizon_critical_seconds = secs(horizon_critical);
            wanted.dead_tuples_elevated = dead_tuples_elevated;
            wanted.dead_tuples_critical = dead_tuples_critical;
            wanted.notify_elevated = notify_elevated;
            wanted.notify_critical = notify_critical;
            wanted.leave_ratio = leave_ratio;
            let set = pressure::set_thresholds(&client, &wanted)
                .await
                .map_err(|e| match e {
                    Error::Config(m) => Error::Config(format!(
                        "{m}; nothing changed (`pgwake pressure show` prints the thresholds as set)"
                    )),
                    e => e,
                })?;
            println!("thresholds set (every worker uses them at its next sample):");
            print!("{}", render_thresholds(&set));
        }
    }
    Ok(())
}

fn render(p: &pressure::Pressure, t: &Thresholds) -> String {
    let mut out = format!(
        "level: {} since {}\n",
        p.level,
        p.since.format("%Y-%m-%d %H:%M:%S UTC")
    );
    if p.causes.is_empty() {
        out.push_str("causes: none\n");
    } else {
        out.push_str("causes:\n");
        for c in &p.causes {
            // The detail names sessions' application_name: a producer's
            // text, shown escaped.
            out.push_str(&format!(
                "  {:<9} {:<17} {}\n",
                c.level,
                c.kind,
                c.detail.escape_debug()
            ));
        }
    }
    out.push_str("thresholds (pgwake pressure set):\n");
    out.push_str(&render_thresholds(t));
    out
}

fn render_thresholds(t: &Thresholds) -> String {
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v}"));
    let secs = |v: Option<f64>| {
        v.map_or("-".to_string(), |v| {
            humantime::format_duration(std::time::Duration::from_secs_f64(v.max(0.0))).to_string()
        })
    };
    let n = |v: Option<i64>| v.map_or("-".to_string(), |v| v.to_string());
    format!(
        "  horizon held      elevated {:<10} critical {}\n  dead tuples       elevated {:<10} critical {}\n  NOTIFY queue      elevated {:<10} critical {}\n  leave below       threshold × {}\n",
        secs(t.horizon_elevated_seconds),
        secs(t.horizon_critical_seconds),
        n(t.dead_tuples_elevated),
        n(t.dead_tuples_critical),
        f(t.notify_elevated),
        f(t.notify_critical),
        f(t.leave_ratio),
    )
}
