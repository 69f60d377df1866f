//! `pgwake jobs list`, `pgwake job show ID` and `pgwake explain ID`: look at
//! jobs in every state and say why one is not running, on top of
//! [`pgwake::admin::jobs`] (the same SQL functions as the console).

use clap::{Args, Subcommand};
use pgwake::admin::jobs::{self, JobDetail, JobFilter, JobRow, Reason};
use pgwake::admin::stats::printable;
use pgwake::error::Error;
use pgwake::{admin::schema, connect};

use super::database::Db;

/// Characters of a recorded step's output `pgwake job show` prints.
const STEP_OUTPUT_SHOWN: usize = 200;

/// `pgwake jobs …`.
#[derive(Subcommand)]
pub enum JobsAction {
    /// List jobs in every state (waiting, scheduled, running, buffered, dead, cancelled; finished with
    /// --state finished), oldest id first, a page at a time (--after the last id shown).
    List(ListArgs),
}

/// `pgwake jobs list` flags.
#[derive(Args)]
pub struct ListArgs {
    #[command(flatten)]
    db: Db,
    /// waiting, scheduled, running, buffered (claimed ahead into a worker's prefetch
    /// buffer, not started), dead, cancelled or finished (history); default: every
    /// state but finished.
    #[arg(long)]
    state: Option<String>,
    /// Only this queue.
    #[arg(long)]
    queue: Option<String>,
    /// Only this task.
    #[arg(long)]
    task: Option<String>,
    /// Only jobs with this ordering key.
    #[arg(long)]
    ordering_key: Option<String>,
    /// Only jobs with this unique key.
    #[arg(long)]
    unique_key: Option<String>,
    /// Only jobs whose payload has PATH=VALUE (repeatable): `customer=42`, `user.id="u1"`;
    /// VALUE is JSON when it parses as JSON, else a string.
    #[arg(long, value_name = "PATH=VALUE", value_parser = payload_filter)]
    payload: Vec<(Vec<String>, serde_json::Value)>,
    /// Only jobs enqueued (waiting, scheduled, running), failed or cancelled (dead,
    /// cancelled) or finished (history) at or after this RFC 3339 time, e.g.
    /// 2026-11-25T14:00:00Z.
    #[arg(long, value_name = "TIMESTAMP", value_parser = super::timestamp::parse)]
    since: Option<std::time::SystemTime>,
    /// Only ids above this one (the last id of the previous page).
    #[arg(long, default_value_t = 0, value_name = "ID")]
    after: i64,
    /// At most this many jobs (1-1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i32).range(1..=1000))]
    limit: i32,
    /// Print JSON (an array) instead of a table.
    #[arg(long)]
    json: bool,
}

/// `pgwake job …`.
#[derive(Subcommand)]
pub enum JobAction {
    /// Everything about one job: where it is, payload, attempts, last error, result,
    /// history, and why it is not running.
    Show(IdArgs),
}

/// A command about one job.
#[derive(Args)]
pub struct IdArgs {
    #[command(flatten)]
    db: Db,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// The job's id.
    #[arg(value_name = "ID", value_parser = clap::value_parser!(i64).range(1..))]
    id: i64,
}

/// `customer=42` → (["customer"], 42); `a.b=x` → (["a", "b"], "x").
fn payload_filter(s: &str) -> Result<(Vec<String>, serde_json::Value), String> {
    let (path, value) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: use PATH=VALUE, e.g. customer=42"))?;
    let path: Vec<String> = path.split('.').map(str::to_string).collect();
    if path.iter().any(String::is_empty) {
        return Err(format!(
            "{s:?}: the path must name a key (a.b.c), e.g. customer=42"
        ));
    }
    let value = serde_json::from_str(value).unwrap_or_else(|_| value.into());
    Ok((path, value))
}

/// The payload filters as one JSON object the payload must contain.
fn containment(filters: &[(Vec<String>, serde_json::Value)]) -> Option<serde_json::Value> {
    if filters.is_empty() {
        return None;
    }
    let mut root = serde_json::Value::Object(Default::default());
    for (path, value) in filters {
        let mut at = &mut root;
        for (i, key) in path.iter().enumerate() {
            if !at.is_object() {
                *at = serde_json::Value::Object(Default::default());
            }
            let map = at.as_object_mut().expect("an object");
            if i + 1 == path.len() {
                map.insert(key.clone(), value.clone());
                break;
            }
            at = map
                .entry(key.clone())
                .or_insert_with(|| serde_json::Value::Object(Default::default()));
        }
    }
    Some(root)
}

/// `pgwake jobs …`.
pub async fn jobs_command(action: JobsAction) -> Result<(), Error> {
    let JobsAction::List(args) = action;
    let client = connect::connect(&args.db.config()?).await?;
    schema::check(&client).await?;
    let filter = JobFilter {
        state: args.state,
        queue: args.queue,
        task: args.task,
        ordering_key: args.ordering_key,
        unique_key: args.unique_key,
        payload: containment(&args.payload),
        since: args.since.map(chrono::DateTime::<chrono::Utc>::from),
        after_id: args.after,
        page: args.limit,
    };
    let rows = jobs::list(&client, &filter).await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
    } else {
        print!("{}", render_list(&rows, args.limit));
    }
    Ok(())
}

fn or_dash(s: &Option<String>) -> String {
    s.as_deref()
        .map_or("-".into(), |s| printable(s).into_owned())
}

fn render_list(rows: &[JobRow], limit: i32) -> String {
    let mut out = format!(
        "{:>10}  {:<10}  {:<16}  {:<20}  {:>8}  {:<32}  {}\n",
        "ID", "STATE", "QUEUE", "TASK", "ATTEMPTS", "RUN AT", "KEYS"
    );
    for r in rows {
        let attempts = match r.max_attempts {
            Some(m) => format!("{}/{m}", r.attempts),
            None => r.attempts.to_string(),
        };
        let keys = [
            ("ordering", &r.ordering_key),
            ("unique", &r.unique_key),
            ("limit", &r.limit_key),
        ]
        .iter()
        .filter(|(_, k)| k.is_some())
        .map(|(name, k)| format!("{name} {}", or_dash(k)))
        .collect::<Vec<_>>()
        .join(" ");
        out.push_str(&format!(
            "{:>10}  {:<10}  {:<16}  {:<20}  {:>8}  {:<32}  {}\n",
            r.id,
            r.state,
            printable(&r.queue),
            printable(&r.task),
            attempts,
            r.run_at.as_deref().unwrap_or("-"),
            keys
        ));
    }
    match rows.last() {
        None => out.push_str("(no jobs)\n"),
        Some(last) if rows.len() as i32 == limit => {
            out.push_str(&format!("(more: --after {})\n", last.id));
        }
        Some(_) => {}
    }
    out
}

/// `pgwake job …`.
pub async fn job_command(action: JobAction) -> Result<(), Error> {
    let JobAction::Show(args) = action;
    let client = connect::connect(&args.db.config()?).await?;
    schema::check(&client).await?;
    let Some(detail) = jobs::show(&client, args.id).await? else {
        return Err(Error::Config(format!(
            "no job {} (not waiting, running, dead, or in the history)",
            args.id
        )));
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&detail).unwrap_or_default()
        );
    } else {
        print!("{}", render_detail(args.id, &detail));
    }
    Ok(())
}

fn render_detail(id: i64, d: &JobDetail) -> String {
    let mut out = format!("job {id}\n");
    if let Some(j) = &d.job {
        out.push_str(&format!("  state      {}\n", j.state));
        out.push_str(&format!("  queue      {}\n", printable(&j.queue)));
        out.push_str(&format!("  task       {}\n", printable(&j.task)));
        if let Some(p) = j.priority {
            out.push_str(&format!("  priority   {p}\n"));
        }
        match j.max_attempts {
            Some(m) => out.push_str(&format!("  attempts   {} of {m}\n", j.attempts)),
            None => out.push_str(&format!("  attempts   {}\n", j.attempts)),
        }
        out.push_str(&format!("  enqueued   {}\n", j.created_at));
        if let Some(r) = &j.run_at {
            out.push_str(&format!("  run at     {r}\n"));
        }
        if j.ordering_key.is_some() {
            out.push_str(&format!("  ordering   {}\n", or_dash(&j.ordering_key)));
        }
        if j.unique_key.is_some() {
            out.push_str(&format!("  unique     {}\n", or_dash(&j.unique_key)));
        }
        if j.limit_key.is_some() {
            out.push_str(&format!("  limit key  {}\n", or_dash(&j.limit_key)));
        }
        if j.worker.is_some() {
            out.push_str(&format!("  worker     {}\n", or_dash(&j.worker)));
        }
        if j.last_error.is_some() {
            out.push_str(&format!("  last error {}\n", or_dash(&j.last_error)));
        }
    }
    if let Some(s) = &d.snoozes {
        out.push_str(&format!(
            "  snoozes    {} (no attempt used), the last at {} until {}\n",
            s.count, s.last_at, s.last_until
        ));
    }
    if let Some(p) = &d.progress {
        out.push_str(&format!(
            "  progress   {}{} (at {})\n",
            printable(&p.value),
            p.message
                .as_deref()
                .map_or(String::new(), |m| format!(" {}", printable(m))),
            p.at
        ));
    }
    if let Some(t) = &d.trace {
        // Stored only when valid (hex and dashes); the tracestate is
        // printable ASCII, escaped all the same.
        out.push_str(&format!(
            "  trace      {} (traceparent {})\n",
            t.trace_id(),
            printable(&t.traceparent)
        ));
        if let Some(state) = &t.tracestate {
            out.push_str(&format!("  tracestate {}\n", printable(state)));
        }
    }
    render_relatives(&mut out, "parents", &d.parents);
    render_relatives(&mut out, "children", &d.children);
    if let Some(p) = &d.payload {
        out.push_str("payload\n");
        for line in p.lines() {
            out.push_str(&format!("  {}\n", printable(line)));
        }
    }
    if !d.steps.is_empty() {
        // A step's output is the handler's JSON: cut to one screen line's
        // worth, escaped (a string in it may hold anything).
        out.push_str("steps\n");
        for s in &d.steps {
            out.push_str(&format!(
                "  {}  attempt {}  {}  {}\n",
                printable(&s.name),
                s.attempt,
                s.at,
                printable(&super::history::cut(&s.output, STEP_OUTPUT_SHOWN))
            ));
        }
    }
    if !d.errors.is_empty() {
        out.push_str("errors\n");
        for e in &d.errors {
            out.push_str(&format!(
                "  attempt {}  {}  {}\n",
                e.attempt,
                e.at,
                printable(&e.error)
            ));
        }
    }
    if d.not_finished_yet() || !d.history.is_empty() {
        out.push_str("history\n");
        if d.not_finished_yet() {
            out.push_str("  not finished yet (history records the run that finishes it)\n");
        }
        for h in &d.history {
            out.push_str(&format!(
                "  {}  {} after {} attempt(s){}{}\n",
                h.finished_at,
                h.outcome,
                h.attempts,
                h.worker
                    .as_deref()
                    .map_or(String::new(), |w| format!(", worker {}", printable(w))),
                h.error
                    .as_deref()
                    .map_or(String::new(), |e| format!(": {}", printable(e)))
            ));
            if let Some(r) = &h.result {
                for line in r.lines() {
                    out.push_str(&format!("    {}\n", printable(line)));
                }
            }
        }
    }
    out.push_str("why not running\n");
    out.push_str(&render_reasons(&d.explanation, "  "));
    out
}

/// One side of a flow's edges: id, task, where it is, the edge's policy;
/// bounded (jobs::RELATIVES_SHOWN), the rest counted.
fn render_relatives(out: &mut String, side: &str, r: &jobs::Relatives) {
    if r.total == 0 {
        return;
    }
    out.push_str(&format!("{side} ({})\n", r.total));
    for j in &r.shown {
        out.push_str(&format!(
            "  {}  {}  {}  on failure {}, edge {}\n",
            j.id,
            j.task.as_deref().map_or("-".into(), printable),
            j.state_words(),
            j.on_failure,
            j.edge
        ));
    }
    if r.more() > 0 {
        out.push_str(&format!("  … and {} more\n", r.more()));
    }
}

fn render_reasons(reasons: &[Reason], indent: &str) -> String {
    let mut out = String::new();
    for r in reasons {
        out.push_str(&format!("{indent}{}: {}\n", r.reason, printable(&r.detail)));
    }
    out
}

/// `pgwake explain ID`.
pub async fn explain_command(args: IdArgs) -> Result<(), Error> {
    let client = connect::connect(&args.db.config()?).await?;
    schema::check(&client).await?;
    let reasons = jobs::explain(&client, args.id).await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&reasons).unwrap_or_default()
        );
    } else {
        print!("{}", render_reasons(&reasons, ""));
    }
    if reasons.iter().any(|r| r.reason == "not_found") {
        return Err(Error::Config(format!("no job {}", args.id)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_filters_make_one_containment_object() {
        let f = |s: &str| payload_filter(s).unwrap();
        assert_eq!(
            containment(&[f("customer=42"), f("user.id=\"u1\""), f("user.plan=pro")]),
            Some(serde_json::json!({"customer": 42, "user": {"id": "u1", "plan": "pro"}}))
        );
        assert!(payload_filter("customer").is_err());
        assert!(payload_filter("a..b=1").is_err());
        assert_eq!(containment(&[]), None);
    }
}
