//! `pgwake dead list | retry | purge`, and how dead jobs are printed.

use pgwake::admin::dead::DeadJob;
use pgwake::admin::stats::printable;
use pgwake::error::Error;
use pgwake::{admin::dead, admin::schema, connect};

use super::args::{DeadAction, SelectArgs};

/// Characters of an error or payload shown in the table; `pgwake job show
/// ID` shows all of it.
const CUT: usize = 200;

/// `text` on one line of at most [`CUT`] characters: line breaks folded to
/// ` ⏎ ` (an `exec:` error is stderr's tail, a Python traceback is many
/// lines) so that every row keeps its columns, other control characters
/// escaped (the text is a producer's or a handler's), and a cut marked `…`.
fn one_line(text: &str) -> String {
    let folded = text.trim_end().replace("\r\n", "\n").replace('\n', " ⏎ ");
    let escaped = printable(&folded);
    let mut chars = escaped.chars();
    let mut out: String = chars.by_ref().take(CUT).collect();
    if chars.next().is_some() {
        out.push('…');
    }
    out
}

/// Two lines per dead job: what it was and why it died, then its payload.
fn render_table(rows: &[DeadJob]) -> String {
    if rows.is_empty() {
        return "no dead jobs\n".into();
    }
    let mut out = String::new();
    for r in rows {
        out.push_str(&format!(
            "{:>8}  {:<12} {:<20} attempts {}/{}  died {}  {}\n",
            r.id,
            printable(&r.queue),
            printable(&r.task),
            r.attempts,
            r.max_attempts,
            r.failed_at,
            one_line(r.last_error.as_deref().unwrap_or_default())
        ));
        // The payload as stored, cut at CUT characters.
        out.push_str(&format!("          payload {}\n", one_line(&r.payload)));
    }
    out
}

/// Refuse ids that name no dead job, before anything changes: a typo must
/// not look like success ("moved 0 dead jobs").
async fn refuse_missing(
    tx: &tokio_postgres::Transaction<'_>,
    sel: &SelectArgs,
) -> Result<(), Error> {
    let missing = dead::missing(tx, &sel.selection()).await?;
    if missing.is_empty() {
        return Ok(());
    }
    let ids = missing
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let queue = sel
        .queue
        .as_deref()
        .map(|q| format!(" in queue {q:?}"))
        .unwrap_or_default();
    Err(Error::Config(format!(
        "--id {ids}: no such dead job{queue}; nothing was changed (`pgwake dead list` shows the dead jobs)"
    )))
}

/// Run a `pgwake dead …` subcommand.
pub async fn command(action: DeadAction) -> Result<(), Error> {
    match action {
        DeadAction::List {
            db,
            queue,
            limit,
            json,
        } => {
            let client = connect::connect(&db.config()?).await?;
            schema::check(&client).await?;
            let rows = dead::list(&client, queue.as_deref(), limit).await?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&rows).unwrap_or_default()
                );
            } else {
                print!("{}", render_table(&rows));
            }
            Ok(())
        }
        DeadAction::Retry {
            db,
            sel,
            include_cancelled,
        } => {
            let mut client = connect::connect(&db.config()?).await?;
            schema::check(&client).await?;
            let tx = client
                .transaction()
                .await
                .map_err(Error::db("dead retry: begin"))?;
            refuse_missing(&tx, &sel).await?;
            let selection = sel.selection();
            let ids = if include_cancelled {
                dead::retry_including_cancelled(&tx, &selection).await?
            } else {
                dead::retry(&tx, &selection).await?
            };
            let left = if sel.all && !include_cancelled {
                dead::cancelled_count(&tx, &selection).await?
            } else {
                0
            };
            tx.commit().await.map_err(Error::db("dead retry: commit"))?;
            println!("moved {} dead jobs back to the queue", ids.len());
            if left > 0 {
                println!(
                    "left {left} cancelled jobs alone (cancelled on purpose?); add --include-cancelled to retry them too"
                );
            }
            Ok(())
        }
        DeadAction::Purge {
            db,
            sel,
            older_than,
        } => {
            let mut client = connect::connect(&db.config()?).await?;
            schema::check(&client).await?;
            let tx = client
                .transaction()
                .await
                .map_err(Error::db("dead purge: begin"))?;
            refuse_missing(&tx, &sel).await?;
            let n = dead::purge(&tx, &sel.selection(), older_than.map(Into::into)).await?;
            tx.commit().await.map_err(Error::db("dead purge: commit"))?;
            println!("purged {n} dead jobs");
            Ok(())
        }
    }
}
