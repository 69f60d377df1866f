//! `pgwake history`: finished jobs and their results, newest first.

use pgwake::admin::history::{self, FinishedJob};
use pgwake::admin::stats::printable;
use pgwake::error::Error;
use pgwake::{admin::schema, connect};

use super::args::{HistoryArgs, Since};

/// Cut `s` to `n` characters, marking the cut.
pub(super) fn cut(s: &str, n: usize) -> String {
    let kept: String = s.chars().take(n).collect();
    if kept.len() < s.len() {
        format!("{kept}…")
    } else {
        kept
    }
}

/// Two lines per finished job.
fn print_table(rows: &[FinishedJob], history_on: bool) {
    if rows.is_empty() {
        if history_on {
            println!("no finished jobs match");
        } else {
            println!(
                "no finished jobs match; history is off (turn it on with `pgwake run --keep-finished 7d`)"
            );
        }
        return;
    }
    for r in rows {
        println!(
            "{:>8}  {:<12} {:<20} {:<9} attempts {}  finished {}  {}",
            r.id,
            printable(&r.queue),
            printable(&r.task),
            r.outcome,
            r.attempts,
            r.finished_at,
            r.worker.as_deref().unwrap_or("")
        );
        match (&r.result, &r.error) {
            (Some(result), _) => println!("          result {}", printable(&cut(result, 200))),
            (None, Some(error)) => println!("          error {}", printable(&cut(error, 200))),
            _ => {}
        }
    }
}

/// Run `pgwake history`.
pub async fn command(args: HistoryArgs) -> Result<(), Error> {
    let client = connect::connect(&args.db.config()?).await?;
    schema::check(&client).await?;
    let (since, since_time) = match args.since {
        Some(Since::Ago(d)) => (Some(d), None),
        Some(Since::At(t)) => (None, Some(t)),
        None => (None, None),
    };
    let filter = history::Filter {
        queue: args.queue,
        task: args.task,
        outcome: args.outcome,
        since,
        since_time,
        limit: args.limit,
        after: args.after,
    };
    let page = history::list_page(&client, &filter).await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&page.rows).unwrap_or_default()
        );
        // The array stays the whole of stdout; the hint goes to stderr.
        if let Some(next) = page.next {
            eprintln!("more: --after {next}");
        }
    } else {
        let on = history::apply(&client, pgwake::config::KeepFinished::Unchanged)
            .await?
            .is_some();
        print_table(&page.rows, on);
        if let Some(next) = page.next {
            println!("(more: --after {next})");
        }
    }
    Ok(())
}
