//! The pages: Overview (queues and database pressure), Workers, Jobs (with
//! the explanation badge of each waiting job), Job, Queues, Schedules, and
//! the login form. Each reads through [`crate::admin`] in one read-only
//! transaction.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{Html, IntoResponse, Response};
use maud::{html, Markup};
use serde::Deserialize;

use super::auth;
pub(crate) use super::error::{PageError, PageResult};
use super::input::{JobId, Query};
use super::view::{self, at, count, encode, page, seconds, when, Who};
use super::App;
use crate::admin::{activity, gauges, jobs, pressure, queues, schedules, workers};
use crate::error::Error;

/// Rows per page of the Jobs page.
pub(crate) const PAGE: i32 = 50;

/// A job's recorded errors shown on its page (the latest); the rest on
/// `/jobs/{id}/errors`, [`ERRORS_PAGE`] a page.
pub(crate) const ERRORS_ON_JOB_PAGE: usize = 20;

/// Errors per page of `/jobs/{id}/errors`.
pub(crate) const ERRORS_PAGE: usize = 100;

/// Characters of one error, result or history entry a page shows.
pub(crate) const TEXT_SHOWN_MAX: usize = 4_000;

/// Characters of a payload the job page shows.
pub(crate) const PAYLOAD_SHOWN_MAX: usize = 64 * 1024;

/// Characters of a running job's progress value (and of its message) the
/// jobs list shows; the job page shows all of it (at most 4 KiB).
pub(crate) const PROGRESS_SHOWN_MAX: usize = 80;

/// Characters of a recorded step's output the job page shows (outputs may
/// be 64 KiB).
pub(crate) const STEP_OUTPUT_SHOWN_MAX: usize = 1_000;

/// At most `max` characters of `s`, with "…" when there were more.
fn clip(s: &str, max: usize) -> String {
    let mut shown: String = s.chars().take(max).collect();
    if s.chars().nth(max).is_some() {
        shown.push('…');
    }
    shown
}

/// At most `max` characters of `s` in a `pre`, and how many more there are
/// (`pgwake job show ID --json` shows everything).
fn cut(s: &str, max: usize, id: &str) -> Markup {
    let more = s.chars().count().saturating_sub(max);
    let shown: String = s.chars().take(max).collect();
    html! {
        pre id=[(!id.is_empty()).then_some(id)] { (shown) @if more > 0 { "…" } }
        @if more > 0 {
            p.muted { (count(more as i64)) " characters more: " code { "pgwake job show ID --json" } " shows everything." }
        }
    }
}

/// Counts on the overview stop here (then shown as "≥ N" with the table's
/// estimate): an exact count of a huge backlog costs more than it tells.
pub(crate) const DEPTH_CAP: i64 = gauges::DEPTH_CAP_DEFAULT;

/// Ready jobs per queue and priority the overview checks for a worker
/// that can run them (a lower bound beyond).
const UNSERVED_HEAD: i32 = 100;

/// The governor's changes the overview lists: the last hour, at most this
/// many (newest first).
const PRESSURE_LOG_SHOWN: i64 = 50;

/// A connection of the console's pool.
pub(crate) async fn conn(app: &App) -> Result<deadpool_postgres::Object, PageError> {
    app.pool
        .get()
        .await
        .map_err(|e| PageError::Db(Error::pool("console: no connection")(e)))
}

/// A read-only transaction under the console's `statement_timeout`.
pub(crate) async fn read_tx<'a>(
    app: &App,
    conn: &'a mut deadpool_postgres::Object,
) -> Result<deadpool_postgres::Transaction<'a>, PageError> {
    let tx = conn
        .build_transaction()
        .read_only(true)
        .start()
        .await
        .map_err(Error::db("console: begin"))?;
    limits(app, &tx).await?;
    Ok(tx)
}

/// `statement_timeout`, a short `lock_timeout`, no JIT, and custom plans
/// for this transaction. Custom plans: the SQL functions the pages call
/// (`pgwake.list_jobs`) take filters that are often NULL; a generic plan,
/// which PL/pgSQL may switch to after a few calls on a pooled connection,
/// keeps every branch and filters row by row (2 s instead of a few ms for
/// finished jobs over 10,000,000 history rows).
pub(crate) async fn limits(
    app: &App,
    tx: &deadpool_postgres::Transaction<'_>,
) -> Result<(), PageError> {
    let ms = app.config.statement_timeout.as_millis().max(1);
    tx.batch_execute(&format!(
        "SET LOCAL statement_timeout = {ms}; SET LOCAL lock_timeout = 2000; SET LOCAL jit = off; \
         SET LOCAL plan_cache_mode = force_custom_plan"
    ))
    .await
    .map_err(Error::db("console: settings"))?;
    Ok(())
}

/// Who the header shows, for a page at `path`: on a read-only console
/// whose reads need a login, the session's logout.
pub(crate) fn who<'a>(
    app: &App,
    headers: &HeaderMap,
    csrf: &'a Option<String>,
    path: &'a str,
) -> Who<'a> {
    match (app.config.actions, csrf) {
        (false, _) => match auth::reader(app, headers) {
            Some(c) => Who::Reader(c),
            None => Who::ReadOnly,
        },
        (true, Some(c)) => Who::LoggedIn(c),
        (true, None) => Who::LoggedOut(path),
    }
}

fn html_page(markup: Markup) -> Response {
    Html(markup.into_string()).into_response()
}

/// What an action did, shown on the page it returns to (`?did=…`). Only
/// these fixed messages: nothing from the query string is shown as is.
#[derive(Deserialize, Default)]
pub(crate) struct Did {
    did: Option<String>,
    n: Option<i64>,
    /// The page of a paged list (`/queues`), from 1.
    #[serde(default)]
    page: String,
}

/// The highest page number a paged list takes: with 200 rows a page, two
/// million rows in. A page reads the rows before it too (an offset), so
/// the number is bounded like every other input.
pub(crate) const PAGE_NUMBER_MAX: u32 = 10_000;

/// The page number of `?page=N` (1 when absent), from 1 to
/// [`PAGE_NUMBER_MAX`]; 400 for anything else.
fn page_number(page: &str) -> Result<usize, PageError> {
    match page.trim() {
        "" => Ok(1),
        s => s
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=PAGE_NUMBER_MAX).contains(n))
            .map(|n| n as usize)
            .ok_or_else(|| {
                PageError::BadRequest(format!(
                    "page {s:?}: write a page number from 1 to {PAGE_NUMBER_MAX}"
                ))
            }),
    }
}

/// The `?page=N` of a paged list without actions (`/workers`).
#[derive(Deserialize, Default)]
pub(crate) struct PageQuery {
    #[serde(default)]
    page: String,
}

/// The rows of page `n` (from 1) of `size` a page: the offset of its first
/// row, and how many rows to ask for (one more than a page, to know
/// whether there is a next one).
fn window(n: usize, size: usize) -> (i64, i64) {
    ((n as i64 - 1) * size as i64, size as i64 + 1)
}

/// The previous and next links of page `n` of a list at `path`.
fn pager(path: &str, n: usize, more: bool) -> Markup {
    html! {
        div.pager {
            @if n > 1 { a #prev href={ (path) "?page=" (n - 1) } { "« previous page" } }
            @if more { a #next href={ (path) "?page=" (n + 1) } { "next page »" } }
        }
    }
}

/// Queues listed on one page of `/queues`.
pub(crate) const QUEUES_PAGE: usize = 200;

/// Live workers listed on one page of `/workers`.
pub(crate) const WORKERS_PAGE: usize = 200;

/// Gone workers `/workers` lists (the latest; every page shows them).
pub(crate) const GONE_WORKERS_SHOWN: usize = 200;

/// Schedules listed on one page of `/schedules`.
pub(crate) const SCHEDULES_PAGE: usize = 200;

fn notice(did: &Did) -> Markup {
    let n = did.n.unwrap_or(0);
    let text = match did.did.as_deref() {
        Some("retried") => "Retried: the job is back in its queue, attempts reset.".to_string(),
        Some("not_dead") => "Nothing to retry: the job is not dead (any more).".to_string(),
        Some("cancelled") => "Cancelled: the job left its queue.".to_string(),
        Some("cancel_requested") => {
            "Cancel requested: the worker running it stops it and records it as cancelled."
                .to_string()
        }
        Some("not_cancelled") => {
            "Nothing to cancel: the job is no longer waiting or running.".to_string()
        }
        Some("paused") => "Queue paused: no new job of it starts.".to_string(),
        Some("resumed") => "Queue resumed.".to_string(),
        Some("limits") => "Limits saved; every worker reads them at its next claim.".to_string(),
        Some("run_now") => "Enqueued now, as its next tick would.".to_string(),
        Some("bulk") => format!("Done: {} job(s) changed.", count(n)),
        _ => return html! {},
    };
    html! { div.panel.notice { (text) } }
}

// ─── Overview ────────────────────────────────────────────────────────────

/// The overview's last rendering, with when it was sampled: every tab and
/// request within the refresh interval gets it, and requests that arrive
/// while it is being sampled wait for that one sample (issue 33, item 7:
/// with 2,020 (queue, priority) pairs a sample took 0.8–1.6 s, every open
/// tab repeated it every 3 s, and 12 requests at once took 8 s).
/// With it, the per-queue counts of that sample, which the Jobs page shows
/// above its table.
#[derive(Default)]
pub(crate) struct SharedOverview(tokio::sync::Mutex<Option<Sampled>>);

/// One sample of the overview: when, its rendering, its counts.
struct Sampled {
    at: std::time::Instant,
    body: String,
    counts: std::sync::Arc<Counts>,
}

/// Jobs per state of each queue, as the overview's sample counted them
/// (capped at [`DEPTH_CAP`]), and when.
#[derive(Default)]
pub(crate) struct Counts {
    /// By queue.
    pub(crate) queues: BTreeMap<String, StateCounts>,
    /// When they were sampled.
    pub(crate) sampled: chrono::DateTime<chrono::Utc>,
}

/// One queue's (or every queue's) jobs per state.
#[derive(Default, Clone, Copy)]
pub(crate) struct StateCounts {
    pub(crate) waiting: i64,
    pub(crate) scheduled: i64,
    pub(crate) retrying: i64,
    pub(crate) running: i64,
    pub(crate) dead: i64,
}

impl std::ops::AddAssign for StateCounts {
    fn add_assign(&mut self, o: StateCounts) {
        self.waiting += o.waiting;
        self.scheduled += o.scheduled;
        self.retrying += o.retrying;
        self.running += o.running;
        self.dead += o.dead;
    }
}

/// Most queues the overview lists (the Queues page has every one).
pub(crate) const OVERVIEW_QUEUES_MAX: usize = 200;

/// The overview's body: the shared sample if it is fresher than the
/// refresh interval, else a new one.
async fn overview_shared(app: &App) -> Result<Markup, PageError> {
    Ok(maud::PreEscaped(overview_sample(app).await?.0))
}

/// The shared sample (fresh within the refresh interval): its rendering
/// and its counts.
async fn overview_sample(app: &App) -> Result<(String, std::sync::Arc<Counts>), PageError> {
    let mut last = app.overview.0.lock().await;
    if let Some(s) = last.as_ref() {
        if s.at.elapsed() < app.config.refresh {
            return Ok((s.body.clone(), s.counts.clone()));
        }
    }
    let (body, counts) = overview_body(app).await?;
    let counts = std::sync::Arc::new(counts);
    *last = Some(Sampled {
        at: std::time::Instant::now(),
        body: body.clone().into_string(),
        counts: counts.clone(),
    });
    Ok((body.into_string(), counts))
}

/// `GET /`.
pub(crate) async fn overview(State(app): State<App>, headers: HeaderMap) -> PageResult {
    let body = overview_shared(&app).await?;
    let csrf = auth::session(&app, &headers);
    let every = app.config.refresh.as_millis().to_string();
    Ok(html_page(page(
        "Overview",
        "/",
        who(&app, &headers, &csrf, "/"),
        html! {
            div data-refresh="/fragment/overview" data-every=(every) { (body) }
        },
    )))
}

/// `GET /fragment/overview`: the overview's body alone, for its refresh.
pub(crate) async fn overview_fragment(State(app): State<App>) -> PageResult {
    Ok(html_page(overview_shared(&app).await?))
}

/// One queue's line of the overview.
#[derive(Default)]
struct Line {
    ready: i64,
    scheduled: i64,
    dead: i64,
    oldest: f64,
    leased: i64,
    tx_running: i64,
    retrying: i64,
    paused: bool,
    shed: bool,
    max_running: Option<i32>,
    slots_used: Option<i64>,
    rate: Option<queues::RateLimit>,
    rate_used: i64,
    finished: Option<i64>,
    /// Its settings, for the limit keys' column.
    settings: Option<queues::QueueSettings>,
}

fn capped(n: i64) -> String {
    if n >= DEPTH_CAP {
        format!("≥ {}", count(n))
    } else {
        count(n)
    }
}

async fn overview_body(app: &App) -> Result<(Markup, Counts), PageError> {
    let sample =
        gauges::sample_with(&app.pool, DEPTH_CAP, Some(app.config.statement_timeout)).await?;
    let mut conn = conn(app).await?;
    let tx = read_tx(app, &mut conn).await?;
    let c = tx.client();
    let activity = activity::queues(c).await?;
    let window = std::time::Duration::from_secs(60);
    let finished = activity::finished(c, window).await?;
    let horizon = activity::horizon(c, 5).await?;
    let tables = activity::tables(c).await?;
    let settings = queues::list(c).await?;
    let unserved = workers::unserved(c, UNSERVED_HEAD, 2000)
        .await
        .map_err(Error::db("reading unserved jobs"))?;
    let fleet = workers::list(c).await?;
    let governor = pressure::recorded(c).await?;
    let changes =
        pressure::log(c, std::time::Duration::from_secs(3600), PRESSURE_LOG_SHOWN).await?;
    let last_hour = super::charts::read(c, None).await?;
    tx.commit().await.map_err(Error::db("console: commit"))?;

    let mut lines: BTreeMap<String, Line> = BTreeMap::new();
    for q in &sample.queues {
        let l = lines.entry(q.queue.clone()).or_default();
        l.ready = q.ready;
        l.scheduled = q.scheduled;
        l.dead = q.dead;
        l.oldest = q.oldest_ready_age;
    }
    for a in &activity {
        let l = lines.entry(a.queue.clone()).or_default();
        l.leased = a.leased;
        l.tx_running = a.tx_running;
        l.slots_used = a.slots_used;
        l.rate_used = a.rate_used;
        l.retrying = a.retrying;
    }
    for s in &settings {
        let l = lines.entry(s.queue.clone()).or_default();
        l.paused = s.paused;
        l.shed = s.paused && s.paused_by.as_deref() == Some("pressure");
        l.max_running = s.max_running;
        l.rate = s.rate;
        l.settings = Some(s.clone());
    }
    if let Some(f) = &finished {
        for l in lines.values_mut() {
            l.finished = Some(0);
        }
        for (q, n) in f {
            lines.entry(q.clone()).or_default().finished = Some(*n);
        }
    }
    let estimate = |name: &str| tables.iter().find(|t| t.table == name);
    let live = fleet.iter().filter(|w| w.live).count();
    let total_ready: i64 = sample.queues.iter().map(|q| q.ready).sum();
    let total_running: i64 = activity.iter().map(|a| a.leased + a.tx_running).sum();
    let total_dead: i64 = sample.queues.iter().map(|q| q.dead).sum();
    let notify = sample.notification_queue_usage * 100.0;
    let sampled = chrono::Utc::now();
    let more_queues = lines.len().saturating_sub(OVERVIEW_QUEUES_MAX);
    let counts = Counts {
        queues: lines
            .iter()
            .map(|(q, l)| {
                (
                    q.clone(),
                    StateCounts {
                        waiting: l.ready,
                        scheduled: l.scheduled,
                        retrying: l.retrying,
                        running: l.leased + l.tx_running,
                        dead: l.dead,
                    },
                )
            })
            .collect(),
        sampled,
    };
    let body = html! {
        (pressure_banner(&governor, &settings))
        p.muted.sampled data-sampled=(sampled.timestamp_millis()) {
            "Sampled " (at(Some(sampled))) "; every open tab shares one sample per refresh."
        }
        div.cards {
            div.card { div.label { "Ready" } div.value { (capped(total_ready)) }
                @if let Some(t) = estimate("jobs").filter(|t| t.estimated_rows > 0) { div.note { "≈ " (count(t.estimated_rows)) " rows in pgwake.jobs" } } }
            div.card { div.label { "Running" } div.value { (count(total_running)) } div.note { "lease and tx mode" } }
            div.card { div.label { "Dead" } div.value { (capped(total_dead)) }
                @if let Some(t) = estimate("dead_jobs").filter(|t| t.estimated_rows > 0) { div.note { "≈ " (count(t.estimated_rows)) " rows" } } }
            div.card { div.label { "Live workers" } div.value { (live) }
                div.note { a href="/workers" { "see workers" } } }
            div.card { div.label { "Oldest transaction" } div.value { (seconds(sample.oldest_transaction_age)) }
                div.note { "on this database" } }
        }
        h2 { "Last hour" }
        (super::charts::panel(&last_hour, "every queue"))
        h2 { "Queues" }
        div.panel {
            @if lines.is_empty() {
                p.muted { "No queue has jobs or settings yet." }
            } @else {
                table {
                    thead { tr {
                        th { "Queue" } th { "State" } th.num { "Ready" } th.num { "Scheduled" }
                        th.num title="scheduled again after a failed attempt" { "Retrying" }
                        th.num { "Running" } th.num { "Dead" } th.num { "Oldest ready" }
                        th.num { "Max running" } th.num { "Rate" } th { "Limit keys" }
                        @if finished.is_some() { th.num title="finished in the last minute, from the history" { "Jobs/s (1 min)" } }
                    } }
                    tbody {
                        @for (name, l) in lines.iter().take(OVERVIEW_QUEUES_MAX) {
                            tr {
                                td { a href={ "/jobs?queue=" (encode(name)) } { (name) } }
                                td { @if l.shed { span.badge.b-bad title="paused by the governor while the database pressure is critical" { "shed" } } @else if l.paused { span.badge.b-warn { "paused" } } @else { span.badge.b-ok { "running" } } }
                                td.num { a href={ "/jobs?state=waiting&queue=" (encode(name)) } { (capped(l.ready)) } }
                                td.num { (capped(l.scheduled)) }
                                td.num { (count(l.retrying)) }
                                td.num title={ (l.leased) " lease, " (l.tx_running) " tx" } { (count(l.leased + l.tx_running)) }
                                td.num { @if l.dead > 0 { a href={ "/jobs?state=dead&queue=" (encode(name)) } { (capped(l.dead)) } } @else { "0" } }
                                td.num { @if l.ready > 0 { (seconds(l.oldest)) } @else { span.muted { "—" } } }
                                td.num { @match l.max_running {
                                    Some(m) => { (l.slots_used.unwrap_or(0)) " / " (m) },
                                    None => span.muted { "—" },
                                } }
                                td.num { @match l.rate {
                                    Some(r) => { (l.rate_used) " / " (r) },
                                    None => span.muted { "—" },
                                } }
                                td.keys { @match &l.settings { Some(s) => (key_limits(s, "—")), None => span.muted { "—" } } }
                                @if finished.is_some() {
                                    td.num { (format!("{:.1}", l.finished.unwrap_or(0) as f64 / window.as_secs_f64())) }
                                }
                            }
                        }
                    }
                }
                @if more_queues > 0 {
                    p.muted { "And " (count(more_queues as i64)) " more queues: " a href="/queues" { "the Queues page" } " lists every one." }
                }
                @if finished.is_none() {
                    p.muted { "Jobs/s needs the history (pgwake run --keep-finished); it is off." }
                }
            }
        }
        @if !unserved.is_empty() {
            div.panel.warning {
                strong { "Waiting for a worker: " }
                "no live worker works these queues with a handler for these tasks."
                table {
                    thead { tr { th { "Queue" } th { "Task" } th.num { "Jobs" } th.num { "Oldest" } } }
                    tbody { @for u in &unserved { tr {
                        td { (u.queue) } td { (u.task) } td.num { (count(u.jobs)) @if u.jobs >= UNSERVED_HEAD as i64 { "+" } } td.num { (seconds(u.oldest_age_seconds)) }
                    } } }
                }
            }
        }
        h2 { "Database pressure" }
        div.cards {
            div.card { div.label { "Idle in transaction" }
                div.value { (sample.idle_in_transaction.iter().map(|(_, n)| n).sum::<i64>()) }
                div.note { "oldest " (seconds(sample.idle_in_transaction_max_age)) } }
            div.card { div.label { "NOTIFY queue" } div.value { (format!("{notify:.2} %")) } div.note { "of its 8 GB" } }
            @for t in &tables {
                div.card { div.label { "Dead tuples: " (t.table) } div.value { (count(t.dead_tuples)) }
                    div.note { "last vacuum " (at(t.last_vacuum)) } }
            }
        }
        div.panel {
            p.muted { "What holds back the vacuum horizon (oldest snapshots first): while they last, dead rows of the queue tables cannot be removed." }
            @if horizon.is_empty() {
                p { "Nothing: no other session has a transaction open." }
            } @else {
                table {
                    thead { tr { th { "Kind" } th.num { "PID" } th { "Application" } th { "State" }
                        th.num { "Transaction age" } th.num { "Xmin age" } th { "Statement" } } }
                    tbody { @for h in &horizon { tr {
                        td { (h.kind) }
                        td.num { @if let Some(p) = h.pid { (p) } }
                        td { (h.who) }
                        td { (h.state.as_deref().unwrap_or("")) }
                        td.num { @if let Some(a) = h.xact_age_seconds { (seconds(a)) } }
                        td.num { @if let Some(x) = h.xmin_age { (count(x)) } }
                        td { @if let Some(q) = &h.query { code.clip title=(q) { (q) } } }
                    } } }
                }
            }
            @if !sample.idle_in_transaction.is_empty() {
                p { "Idle in transaction, by application: "
                    @for (i, (app_name, n)) in sample.idle_in_transaction.iter().enumerate() {
                        @if i > 0 { ", " } code { (app_name) } " (" (n) ")"
                    }
                }
            }
        }
        (pressure_timeline(&changes))
    };
    Ok((body, counts))
}

/// The badge of a governor level.
fn level_badge(level: pressure::Level) -> Markup {
    let class = match level {
        pressure::Level::Ok => "badge b-ok",
        pressure::Level::Elevated => "badge b-warn",
        pressure::Level::Critical => "badge b-bad",
    };
    html! { span class=(class) { (level) } }
}

/// The banner at the top of the overview while the governor's recorded
/// level is not ok: the level, since when, its causes (as recorded at the
/// change; every text from the database escaped), and the queues it shed.
fn pressure_banner(
    governor: &(
        pressure::Level,
        chrono::DateTime<chrono::Utc>,
        Vec<pressure::Cause>,
    ),
    settings: &[queues::QueueSettings],
) -> Markup {
    let (level, since, causes) = governor;
    if *level == pressure::Level::Ok {
        return html! {};
    }
    let shed: Vec<&str> = settings
        .iter()
        .filter(|s| s.paused && s.paused_by.as_deref() == Some("pressure"))
        .map(|s| s.queue.as_str())
        .collect();
    html! {
        div.panel.warning.pressure-banner {
            strong { "Database pressure " (level_badge(*level)) } " since " (at(Some(*since))) ". "
            @if *level == pressure::Level::Critical {
                "Queues marked to shed under pressure are paused until it falls below critical."
            }
            ul { @for c in causes { li { code { (c.kind) } " " (c.detail) } } }
            @if !shed.is_empty() {
                p { "Shed: " @for (i, q) in shed.iter().enumerate() {
                    @if i > 0 { ", " } a href={ "/jobs?queue=" (encode(q)) } { (q) }
                } }
            }
            p.muted { "SELECT * FROM pgwake.pressure() reads it now; see the operations runbook, \"Database pressure\"." }
        }
    }
}

/// The governor's changes of the last hour, newest first.
fn pressure_timeline(changes: &[pressure::Change]) -> Markup {
    html! {
        div.panel.pressure-log {
            p.muted { "The governor's changes of level in the last hour (pgwake.pressure_log), newest first." }
            @if changes.is_empty() {
                p { "None: the level has not changed in the last hour." }
            } @else {
                table {
                    thead { tr { th { "At" } th { "Level" } th { "Causes" } th { "Shed" } } }
                    tbody { @for ch in changes { tr {
                        td { (at(Some(ch.at))) }
                        td { (level_badge(ch.previous)) " → " (level_badge(ch.level)) }
                        td { @for (i, c) in ch.causes.iter().enumerate() {
                            @if i > 0 { br; } (c.detail)
                        } }
                        td {
                            @if !ch.paused.is_empty() { "paused " (ch.paused.join(", ")) }
                            @if !ch.resumed.is_empty() { "resumed " (ch.resumed.join(", ")) }
                        }
                    } } }
                }
            }
        }
    }
}

// ─── Workers ─────────────────────────────────────────────────────────────

/// `GET /workers?page=N`: the live workers, [`WORKERS_PAGE`] a page by
/// id, and the latest [`GONE_WORKERS_SHOWN`] gone ones (issue 33, item 7:
/// thousands of workers were one page).
pub(crate) async fn workers(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<PageQuery>,
) -> PageResult {
    let n = page_number(&q.page)?;
    let (offset, rows) = window(n, WORKERS_PAGE);
    let mut conn = conn(&app).await?;
    let tx = read_tx(&app, &mut conn).await?;
    let mut live = workers::live_page(tx.client(), offset, rows).await?;
    let gone = workers::gone(tx.client(), GONE_WORKERS_SHOWN as i64).await?;
    tx.commit().await.map_err(Error::db("console: commit"))?;
    let more = live.len() > WORKERS_PAGE;
    live.truncate(WORKERS_PAGE);
    let table = |ws: &[workers::WorkerInfo]| {
        html! {
            table {
                thead { tr { th { "Host" } th.num { "PID" } th { "Version" } th { "Application" }
                    th { "Queues" } th { "Handlers" } th.num { "Running" } th { "Processes" } th { "Started" } th { "Last heartbeat" } } }
                tbody { @for w in ws { tr data-worker=(w.id) {
                    td { (w.host) } td.num { (w.pid) } td { (w.version) } td { (w.application_name) }
                    td { @match &w.queues { Some(q) => (q.join(", ")), None => span.muted { "every queue" } } }
                    td { (handlers(&w.handlers, &w.tasks)) }
                    td.num { (w.running) " / " (w.concurrency) }
                    td { (processes(&w.processes)) }
                    td { (at(Some(w.started_at))) }
                    td { (at(Some(w.seen_at))) }
                } } }
            }
        }
    };
    let csrf = auth::session(&app, &headers);
    Ok(html_page(page(
        "Workers",
        "/workers",
        who(&app, &headers, &csrf, "/workers"),
        html! {
            h1 { "Workers" }
            div.panel {
                @if live.is_empty() && n == 1 {
                    p { "No live worker. Start one with " code { "pgwake run" } "." }
                } @else if live.is_empty() {
                    p { "No live worker on page " (n) ". " a href="/workers?page=1" { "The first page" } }
                } @else { (table(&live)) }
                @if n > 1 || more {
                    p.muted { "Live workers by id, " (WORKERS_PAGE) " a page; page " (n) "." }
                    (pager("/workers", n, more))
                }
                p.muted { "Each worker renews its row every 10 s; one that stops renewing (killed, host lost) leaves this list 30 s after its last heartbeat." }
                p.muted { "Processes: each persistent handler command's processes live of configured (--processes), jobs in flight of the room their hellos give, restarts so far, and jobs waiting for a free process (more --processes or a higher in-flight limit add room), as of the last heartbeat." }
            }
            @if !gone.is_empty() {
                h2 { "Gone in the last hour (stopped without deregistering)" }
                div.panel {
                    (table(&gone))
                    @if gone.len() >= GONE_WORKERS_SHOWN {
                        p.muted { "The latest " (GONE_WORKERS_SHOWN) " shown." }
                    }
                }
            }
        },
    )))
}

/// A worker's persistent handler processes, one line per command.
fn processes(pools: &[workers::ProcessPool]) -> Markup {
    html! {
        @if pools.is_empty() {
            span.muted { "none" }
        }
        @for (i, p) in pools.iter().enumerate() {
            @if i > 0 { br; }
            code { (p.command) } " "
            span.muted { "(" (p.tasks.join(", ")) ")" } " "
            @if p.live < p.processes {
                span.badge.b-warn title="processes live of configured" { (p.live) " / " (p.processes) " live" }
            } @else {
                span { (p.live) " / " (p.processes) " live" }
            }
            ", " (p.in_flight) " / " (p.capacity) " in flight, "
            (p.restarts) " restart" @if p.restarts != 1 { "s" }
            @if p.waiting > 0 {
                ", " span.badge.b-warn title="jobs started, waiting for a free process: raise --processes or the processes' in-flight limit" {
                    (p.waiting) " waiting for a process"
                }
            }
        }
    }
}

/// A worker's handlers as `task (mode)`, from its registry JSON.
fn handlers(json: &str, tasks: &[String]) -> Markup {
    let parsed: Vec<(String, String)> = serde_json::from_str::<serde_json::Value>(json)
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|h| {
            Some((
                h.get("task")?.as_str()?.to_string(),
                h.get("mode")?.as_str()?.to_string(),
            ))
        })
        .collect();
    html! {
        @if parsed.is_empty() {
            (tasks.join(", "))
        } @else {
            @for (i, (task, mode)) in parsed.iter().enumerate() {
                @if i > 0 { ", " }
                code { (task) } " " span.muted { "(" (mode) ")" }
            }
        }
    }
}

// ─── Jobs ────────────────────────────────────────────────────────────────

/// The Jobs page's filters (query string; the bulk forms send the same).
#[derive(Deserialize, Default, Clone)]
pub(crate) struct Filters {
    #[serde(default)]
    pub(crate) queue: String,
    #[serde(default)]
    pub(crate) task: String,
    #[serde(default)]
    pub(crate) state: String,
    #[serde(default)]
    pub(crate) ordering_key: String,
    #[serde(default)]
    pub(crate) unique_key: String,
    #[serde(default)]
    pub(crate) id: String,
    #[serde(default)]
    pub(crate) payload: String,
    /// `2026-11-25 14:00` (UTC) or RFC 3339.
    #[serde(default)]
    pub(crate) since: String,
    #[serde(default)]
    pub(crate) after: String,
    /// After a bulk action (POST, redirect, GET): `bulk_ACTION`.
    #[serde(default)]
    pub(crate) did: String,
    /// After a bulk action: how many jobs it changed.
    #[serde(default)]
    pub(crate) changed: String,
    /// After a bulk action: `1` when more jobs matched than it changed.
    #[serde(default)]
    pub(crate) more: String,
}

/// A "since" filter: RFC 3339 (`2026-11-25T14:00:00+01:00`), or a date and
/// time without a zone (`2026-11-25 14:00`, `2026-11-25T14:00`, seconds
/// optional), read as UTC.
pub(crate) fn since_filter(s: &str) -> Result<chrono::DateTime<chrono::Utc>, PageError> {
    use chrono::Datelike;
    let t = since_any(s)?;
    // Years PostgreSQL's timestamptz and every reader agree on.
    if !(1..=9999).contains(&t.year()) {
        return Err(PageError::BadRequest(format!(
            "since {:?}: the year must be between 1 and 9999",
            s.trim()
        )));
    }
    Ok(t)
}

fn since_any(s: &str) -> Result<chrono::DateTime<chrono::Utc>, PageError> {
    let s = s.trim();
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&chrono::Utc));
    }
    for format in [
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%d %H:%M",
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%dT%H:%M",
    ] {
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(s, format) {
            return Ok(t.and_utc());
        }
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Ok(d.and_hms_opt(0, 0, 0).expect("midnight").and_utc());
    }
    Err(PageError::BadRequest(format!(
        "since {s:?}: write a date and time in UTC (2026-11-25 14:00) or RFC 3339 (2026-11-25T14:00:00+01:00)"
    )))
}

fn some(s: &str) -> Option<String> {
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// `path=value` (`customer=42`, `order.id="a"`) → `{"customer": 42}`: the
/// value is JSON when it reads as JSON, else a string.
pub(crate) fn payload_filter(s: &str) -> Result<serde_json::Value, PageError> {
    let (path, value) = s.split_once('=').ok_or_else(|| {
        PageError::BadRequest(format!(
            "payload filter {s:?}: write path=value, e.g. customer=42 or order.id=\"a-1\""
        ))
    })?;
    let path = path.trim();
    if path.is_empty() || path.split('.').any(str::is_empty) {
        return Err(PageError::BadRequest(format!(
            "payload filter {s:?}: the path is empty (write path=value)"
        )));
    }
    // Each segment nests the filter one level deeper: a bound keeps the
    // containment object (and dropping it) shallow.
    let depth = path.split('.').count();
    if depth > super::input::PAYLOAD_DEPTH_MAX {
        return Err(PageError::BadRequest(format!(
            "payload filter: the path has {depth} segments, at most {} are accepted",
            super::input::PAYLOAD_DEPTH_MAX
        )));
    }
    let value = value.trim();
    let mut v = serde_json::from_str(value)
        .unwrap_or_else(|_| serde_json::Value::String(value.to_string()));
    for key in path.rsplit('.') {
        let mut obj = serde_json::Map::new();
        obj.insert(key.to_string(), v);
        v = serde_json::Value::Object(obj);
    }
    Ok(v)
}

impl Filters {
    /// The library's filter; `None` id when no id is asked for.
    pub(crate) fn to_filter(&self) -> Result<(jobs::JobFilter, Option<i64>), PageError> {
        let id = match some(&self.id) {
            None => None,
            Some(s) => Some(
                s.parse::<i64>()
                    .map_err(|_| PageError::BadRequest(format!("job id {s:?} is not a number")))?,
            ),
        };
        let after = match some(&self.after) {
            None => 0,
            Some(s) => s.parse::<i64>().map_err(|_| {
                PageError::BadRequest(format!("after {s:?} is not a job id (a whole number)"))
            })?,
        };
        let payload = some(&self.payload)
            .map(|p| payload_filter(&p))
            .transpose()?;
        let since = some(&self.since).map(|s| since_filter(&s)).transpose()?;
        Ok((
            jobs::JobFilter {
                state: some(&self.state),
                queue: some(&self.queue),
                task: some(&self.task),
                ordering_key: some(&self.ordering_key),
                unique_key: some(&self.unique_key),
                payload,
                since,
                after_id: match id {
                    Some(id) => id.saturating_sub(1),
                    None => after,
                },
                page: if id.is_some() { 1 } else { PAGE },
            },
            id,
        ))
    }

    /// The query string of these filters (without `after`), for links.
    pub(crate) fn query(&self) -> String {
        [
            ("queue", &self.queue),
            ("task", &self.task),
            ("state", &self.state),
            ("ordering_key", &self.ordering_key),
            ("unique_key", &self.unique_key),
            ("id", &self.id),
            ("payload", &self.payload),
            ("since", &self.since),
        ]
        .iter()
        .filter(|(_, v)| !v.trim().is_empty())
        .map(|(k, v)| format!("{k}={}", encode(v.trim())))
        .collect::<Vec<_>>()
        .join("&")
    }

    /// Hidden fields carrying these filters (without `after`).
    pub(crate) fn hidden(&self) -> Markup {
        html! {
            input type="hidden" name="queue" value=(self.queue);
            input type="hidden" name="task" value=(self.task);
            input type="hidden" name="state" value=(self.state);
            input type="hidden" name="ordering_key" value=(self.ordering_key);
            input type="hidden" name="unique_key" value=(self.unique_key);
            input type="hidden" name="payload" value=(self.payload);
            input type="hidden" name="id" value=(self.id);
            input type="hidden" name="since" value=(self.since);
        }
    }

    /// The filters in words.
    pub(crate) fn describe(&self) -> Markup {
        let parts: Vec<(&str, &str)> = [
            ("state", self.state.trim()),
            ("queue", self.queue.trim()),
            ("task", self.task.trim()),
            ("ordering key", self.ordering_key.trim()),
            ("unique key", self.unique_key.trim()),
            ("payload", self.payload.trim()),
            ("id", self.id.trim()),
            ("since", self.since.trim()),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .collect();
        html! {
            @if parts.is_empty() { "every job" }
            @for (i, (k, v)) in parts.iter().enumerate() {
                @if i > 0 { ", " }
                (k) " " code { (v) }
            }
        }
    }
}

const STATES: &[&str] = &[
    "waiting",
    "scheduled",
    "running",
    "buffered",
    "dead",
    "cancelled",
    "finished",
];

/// `GET /jobs`.
pub(crate) async fn jobs(
    State(app): State<App>,
    headers: HeaderMap,
    Query(f): Query<Filters>,
) -> PageResult {
    let (filter, id) = f.to_filter()?;
    // The counts per state above the table: the overview's shared sample.
    let (_, counts) = overview_sample(&app).await?;
    let mut conn = conn(&app).await?;
    let tx = read_tx(&app, &mut conn).await?;
    let c = tx.client();
    let mut rows = jobs::list(c, &filter).await?;
    if let Some(id) = id {
        rows.retain(|r| r.id == id);
    }
    let waiting: Vec<i64> = rows
        .iter()
        .filter(|r| r.state == "waiting" || r.state == "scheduled")
        .map(|r| r.id)
        .collect();
    // One pipelined round of explain calls on the page's connection.
    let reasons = futures::future::join_all(waiting.iter().map(|id| jobs::explain(c, *id))).await;
    let mut badge: BTreeMap<i64, jobs::Reason> = BTreeMap::new();
    for (id, r) in waiting.iter().zip(reasons) {
        if let Some(first) = r?.into_iter().next() {
            badge.insert(*id, first);
        }
    }
    // What the reasons' words need: the queues' settings and limit use, and
    // the running jobs of keys at their limit.
    let settings = queues::list(c).await?;
    let activity = activity::queues(c).await?;
    let keys =
        super::reasons::keys_needed(rows.iter().filter_map(|r| badge.get(&r.id).map(|b| (r, b))));
    let key_running = if keys.is_empty() {
        Vec::new()
    } else {
        activity::key_running(c, &keys).await?
    };
    // What the running ones last reported (one statement).
    let running: Vec<i64> = rows
        .iter()
        .filter(|r| r.state == "running")
        .map(|r| r.id)
        .collect();
    let progress = jobs::progress(c, &running).await?;
    // A queue's page: its last hour, from the per-minute rollup.
    let queue = (!f.queue.is_empty()).then_some(f.queue.as_str());
    let last_hour = match queue {
        Some(q) => Some(super::charts::read(c, Some(q)).await?),
        None => None,
    };
    tx.commit().await.map_err(Error::db("console: commit"))?;
    let next = (id.is_none() && rows.len() == PAGE as usize)
        .then(|| rows.last().map(|r| r.id))
        .flatten();
    let mut cx = super::reasons::Context::new(&settings, &activity);
    cx.key_running = key_running.into_iter().collect();
    let csrf = auth::session(&app, &headers);
    let here = format!("/jobs?{}", f.query());
    Ok(html_page(page(
        "Jobs",
        "/jobs",
        who(&app, &headers, &csrf, &here),
        html! {
            h1 { "Jobs" }
            div.panel {
                form.filters method="get" action="/jobs" {
                    label { "Queue" input name="queue" value=(f.queue); }
                    label { "Task" input name="task" value=(f.task); }
                    label { "State" select name="state" {
                        option value="" selected[f.state.is_empty()] { "any (not finished)" }
                        @for s in STATES { option value=(s) selected[f.state == *s] { (s) } }
                    } }
                    label { "Ordering key" input name="ordering_key" value=(f.ordering_key); }
                    label { "Unique key" input name="unique_key" value=(f.unique_key); }
                    label { "Job id" input name="id" inputmode="numeric" value=(f.id); }
                    label { "Payload path=value" input name="payload" placeholder="customer=42" value=(f.payload); }
                    label { "Since (UTC)" input name="since" placeholder="2026-11-25 14:00" value=(f.since); }
                    div { button.primary type="submit" { "Filter" } " " a href="/jobs" { "clear" } }
                }
            }
            (state_counts(&counts, queue, &f))
            (bulk_notice(&f))
            @if let (Some(s), Some(q)) = (&last_hour, queue) {
                h2 { "Last hour of queue " (q) }
                (super::charts::panel(s, &format!("queue {q}")))
            }
            div.panel {
                @if rows.is_empty() {
                    p.muted { "No job matches." }
                } @else {
                    table #jobs {
                        thead { tr { th.num { "Id" } th { "State" } th { "Why not running" } th { "Queue" } th { "Task" }
                            th.num { "Attempts" } th { "Runs at" } th { "Enqueued" } th { "Keys" } th { "Last error" } } }
                        tbody { @for r in &rows { tr data-job=(r.id) {
                            td.num { a href={ "/jobs/" (r.id) } { (r.id) } }
                            td { span class=(view::state_class(&r.state)) { (r.state) } }
                            td { @if let Some(b) = badge.get(&r.id) { (super::reasons::badge(b, Some(r), &cx)) }
                            @else if let Some(p) = progress.get(&r.id) {
                                span.progress title={ "progress reported " (p.at) } {
                                    code { (clip(&p.value, PROGRESS_SHOWN_MAX)) }
                                    @if let Some(m) = &p.message { " " (clip(m, PROGRESS_SHOWN_MAX)) }
                                }
                            } }
                            td { (r.queue) }
                            td { (r.task) }
                            td.num { (r.attempts) @if let Some(m) = r.max_attempts { " / " (m) } }
                            td { (when(r.run_at.as_deref())) }
                            td { (when(Some(&r.created_at))) }
                            td {
                                @if let Some(k) = &r.ordering_key { span.muted { "order " } code { (k) } " " }
                                @if let Some(k) = &r.unique_key { span.muted { "unique " } code { (k) } " " }
                                @if let Some(k) = &r.limit_key { span.muted { "limit " } code.limit-key { (k) } }
                            }
                            td { @if let Some(e) = &r.last_error { span.clip title=(e) { (e) } } }
                        } } }
                    }
                }
                div.pager {
                    @if filter.after_id > 0 && id.is_none() { a href={ "/jobs?" (f.query()) } { "« first page" } }
                    @if let Some(n) = next { a #next href={ "/jobs?" (f.query()) "&after=" (n) } { "next page »" } }
                    span.muted { "ordered by id; " (rows.len()) " shown" }
                }
            }
            @if let Some(csrf) = &csrf {
                h2 { "Act on every job matching these filters" }
                div.panel {
                    form.inline method="post" action="/bulk/review" {
                        input type="hidden" name="csrf" value=(csrf);
                        (f.hidden())
                        select name="action" {
                            option value="retry" { "Retry (dead and cancelled jobs)" }
                            option value="cancel" { "Cancel (waiting, scheduled, running, buffered jobs)" }
                            option value="delete" { "Delete (dead and cancelled jobs)" }
                        }
                        button type="submit" { "Review…" }
                    }
                    p.muted { "You see the count and confirm before anything changes." }
                }
            }
        },
    )))
}

/// Jobs per state of the queue filtered on (or of every queue) above the
/// Jobs table, each a link to that state; from the overview's sample.
fn state_counts(counts: &Counts, queue: Option<&str>, f: &Filters) -> Markup {
    let mut n = StateCounts::default();
    for (q, c) in &counts.queues {
        if queue.is_none_or(|want| want == q) {
            n += *c;
        }
    }
    let link = |state: &str| {
        let mut g = Filters {
            state: state.to_string(),
            ..Filters::default()
        };
        if let Some(q) = queue {
            g.queue = q.to_string();
        }
        format!("/jobs?{}", g.query())
    };
    let others = !(f.task.trim().is_empty()
        && f.ordering_key.trim().is_empty()
        && f.unique_key.trim().is_empty()
        && f.payload.trim().is_empty()
        && f.id.trim().is_empty()
        && f.since.trim().is_empty());
    html! {
        div.panel.state-counts #state-counts {
            span.muted { @match queue { Some(q) => { "Queue " code { (q) } }, None => "Every queue" } ": " }
            a.count data-state="waiting" href=(link("waiting")) { span class=(view::state_class("waiting")) { "waiting" } " " strong { (capped(n.waiting)) } }
            a.count data-state="scheduled" href=(link("scheduled")) { span class=(view::state_class("scheduled")) { "scheduled" } " " strong { (capped(n.scheduled)) }
                @if n.retrying > 0 { span.muted { " (" (count(n.retrying)) " retrying)" } } }
            a.count data-state="running" href=(link("running")) { span class=(view::state_class("running")) { "running" } " " strong { (count(n.running)) } }
            a.count data-state="dead" href=(link("dead")) { span class=(view::state_class("dead")) { "dead or cancelled" } " " strong { (capped(n.dead)) } }
            span.muted { " · sampled " (at(Some(counts.sampled))) " with the overview"
                @if others { "; the other filters are not counted" } }
        }
    }
}

/// What a bulk action did, on the Jobs page it redirects to (fixed words
/// and numbers only: nothing of the query string is shown as is).
fn bulk_notice(f: &Filters) -> Markup {
    let Some(action) = f
        .did
        .strip_prefix("bulk_")
        .and_then(|a| a.parse::<crate::admin::bulk::BulkAction>().ok())
    else {
        return html! {};
    };
    let changed: i64 = f.changed.trim().parse().unwrap_or(0);
    html! {
        div.panel.notice {
            p #bulk-done { (action.as_str()) ": " strong { (count(changed)) } " job(s) changed (" (f.describe()) ")." }
            @if f.more == "1" { p { "More jobs match: repeat the action for the rest." } }
        }
    }
}

// ─── Job ─────────────────────────────────────────────────────────────────

/// `GET /jobs/{id}`.
pub(crate) async fn job(
    State(app): State<App>,
    headers: HeaderMap,
    JobId(id): JobId,
    Query(did): Query<Did>,
) -> PageResult {
    let mut conn = conn(&app).await?;
    let tx = read_tx(&app, &mut conn).await?;
    let detail = jobs::show(tx.client(), id).await?;
    let Some(d) = detail else {
        return Err(PageError::NotFound(format!(
            "no job {id}: it never existed, or it finished while history was off"
        )));
    };
    // What the reasons' words need (as on the Jobs page).
    let settings = queues::list(tx.client()).await?;
    let activity = activity::queues(tx.client()).await?;
    let keys = match &d.job {
        Some(j) => super::reasons::keys_needed(d.explanation.iter().map(|r| (j, r))),
        None => Vec::new(),
    };
    let key_running = if keys.is_empty() {
        Vec::new()
    } else {
        activity::key_running(tx.client(), &keys).await?
    };
    tx.commit().await.map_err(Error::db("console: commit"))?;
    let mut cx = super::reasons::Context::new(&settings, &activity);
    cx.key_running = key_running.into_iter().collect();
    // Only its history remains: it finished, and explain has nothing on it.
    let finished = !d.history.is_empty()
        && d.explanation
            .first()
            .is_some_and(|r| r.reason == "not_found");
    let csrf = auth::session(&app, &headers);
    let here = format!("/jobs/{id}");
    let state = d
        .job
        .as_ref()
        .map(|j| j.state.clone())
        .or_else(|| d.history.last().map(|h| h.outcome.clone()))
        .unwrap_or_default();
    let live = d.job.is_some() && !finished;
    // The explanation's title follows the state: only a job that waits is
    // asked why it is not running.
    let title = match state.as_str() {
        _ if finished => "Finished",
        "waiting" | "scheduled" => "Why isn't it running?",
        "running" | "buffered" => "What it is doing",
        "dead" => "Why it is dead",
        "cancelled" => "Cancelled",
        _ => "Where it is",
    };
    Ok(html_page(page(
        &format!("Job {id}"),
        "/jobs",
        who(&app, &headers, &csrf, &here),
        html! {
            h1 { "Job " (id) " " span #state class=(view::state_class(&state)) { (state) } }
            (notice(&did))
            @if let (Some(csrf), true) = (&csrf, live) {
                div.actions {
                    @if state == "dead" || state == "cancelled" {
                        form.inline method="post" action="/actions/job" {
                            input type="hidden" name="csrf" value=(csrf);
                            input type="hidden" name="id" value=(id);
                            button.primary type="submit" name="op" value="retry" { "Retry" }
                        }
                    }
                    @if state == "waiting" || state == "scheduled" || state == "running" || state == "buffered" {
                        form.inline method="post" action="/actions/job" {
                            input type="hidden" name="csrf" value=(csrf);
                            input type="hidden" name="id" value=(id);
                            button.danger type="submit" name="op" value="cancel" {
                                @if state == "running" || state == "buffered" { "Cancel…" } @else { "Cancel" }
                            }
                        }
                    }
                }
            }
            div.panel #explanation {
                h2.first #why { (title) }
                @if finished {
                    @if let Some(h) = d.history.last() {
                        p #finished-words {
                            span class=(view::state_class(&h.outcome)) { (h.outcome) }
                            " after " (h.attempts) " attempt(s), " (when(Some(&h.finished_at)))
                            @if d.history.len() > 1 { " (its newest of " (d.history.len()) " finished runs, below)" }
                        }
                    }
                } @else {
                ol.reasons {
                    @for r in &d.explanation {
                        li {
                            (super::reasons::badge(r, d.job.as_ref(), &cx))
                            span {
                                span.detail { (r.detail) }
                                @if let Some(u) = &r.until { " " span.muted { "(until " (when(Some(u))) ")" } }
                                @if let Some(b) = r.blocking_job { " " a href={ "/jobs/" (b) } { "job " (b) } }
                            }
                        }
                    }
                }
                }
            }
            @if let Some(j) = &d.job {
                div.panel {
                    dl.facts {
                        dt { "Queue" } dd { a href={ "/jobs?queue=" (encode(&j.queue)) } { (j.queue) } }
                        dt { "Task" } dd { code { (j.task) } }
                        dt { "Attempts" } dd { (j.attempts) @if let Some(m) = j.max_attempts { " of " (m) } }
                        @if let Some(p) = j.priority { dt { "Priority" } dd { (p) } }
                        dt { "Enqueued" } dd { (when(Some(&j.created_at))) " " span.muted { (j.created_at) } }
                        @if let Some(r) = &j.run_at { dt { "Runs at" } dd { (when(Some(r))) " " span.muted { (r) } } }
                        @if let Some(k) = &j.ordering_key { dt { "Ordering key" } dd { code { (k) } } }
                        @if let Some(k) = &j.limit_key { dt { "Limit key" } dd { code { (k) } } }
                        @if let Some(k) = &j.unique_key { dt { "Unique key" } dd { code { (k) } } }
                        @if let Some(w) = &j.worker { dt { "Worker" } dd { code { (w) } } }
                        @if let Some(p) = &d.progress {
                            dt { "Progress" } dd #progress {
                                code { (p.value) }
                                @if let Some(m) = &p.message { " " span.progress-message { (m) } }
                                " " span.muted { "reported " (when(Some(&p.at))) }
                            }
                        }
                        @if let Some(s) = &d.snoozes {
                            dt { "Snoozes" } dd #snoozes { (s.count) " (no attempt used); the last " (when(Some(&s.last_at))) ", until " (when(Some(&s.last_until))) }
                        }
                        @if let Some(t) = &d.trace {
                            // The trace id is 32 hex digits (the database keeps
                            // valid traceparents only); escaped all the same.
                            dt { "Trace" } dd #trace {
                                code #trace-id { (t.trace_id()) }
                                @if let Some(link) = &app.config.trace_link {
                                    " " a #trace-link rel="noopener noreferrer" href=(link.replace("{trace_id}", t.trace_id())) { "open the trace" }
                                }
                            }
                        }
                    }
                }
                @if let Some(e) = &j.last_error {
                    h2 { "Last error" }
                    (cut(e, TEXT_SHOWN_MAX, "last-error"))
                }
            }
            (relatives("parents", "Parents", "It waits for these jobs.", &d.parents))
            (relatives("children", "Children", "These jobs wait for it.", &d.children))
            h2 { "Payload" }
            @match &d.payload {
                Some(p) => (cut(p, PAYLOAD_SHOWN_MAX, "payload")),
                None => p.muted { "Not kept (the job finished; history keeps results and errors)." },
            }
            @if !d.steps.is_empty() {
                h2 { "Steps" }
                table #steps {
                    thead { tr { th { "Step" } th { "Attempt" } th { "Recorded" } th { "Output" } } }
                    tbody {
                        @for s in &d.steps {
                            tr {
                                td { code { (s.name) } }
                                td { (s.attempt) }
                                td { (when(Some(&s.at))) }
                                td { code.step-output { (clip(&s.output, STEP_OUTPUT_SHOWN_MAX)) } }
                            }
                        }
                    }
                }
            }
            h2 { "Errors" }
            @if d.errors.is_empty() {
                p.muted { "No failed attempt recorded (errors are kept seven days)." }
            } @else {
                @if d.errors.len() > ERRORS_ON_JOB_PAGE {
                    p #errors-count {
                        (count(d.errors.len() as i64)) " recorded errors; the latest "
                        (ERRORS_ON_JOB_PAGE) " below. "
                        a href={ "/jobs/" (id) "/errors" } { "All of them, " (ERRORS_PAGE) " a page" }
                    }
                }
                (errors_list(&d.errors[d.errors.len().saturating_sub(ERRORS_ON_JOB_PAGE)..]))
            }
            h2 { "History" }
            @if d.not_finished_yet() {
                p #not-finished { "Not finished yet: history records the run that finishes it." }
            }
            @if d.history.is_empty() {
                @if !d.not_finished_yet() {
                    p.muted { "No finished run recorded (history is kept when workers run with --keep-finished)." }
                }
            } @else {
                ul.timeline {
                    @for h in &d.history {
                        li {
                            span class=(view::state_class(&h.outcome)) { (h.outcome) }
                            " after " (h.attempts) " attempt(s), " (when(Some(&h.finished_at)))
                            @if let Some(w) = &h.worker { " by " code { (w) } }
                            @if let Some(s) = &h.started_at { " " span.muted { "(started " (when(Some(s))) ")" } }
                            @if let Some(e) = &h.error { (cut(e, TEXT_SHOWN_MAX, "")) }
                            @if let Some(r) = &h.result { div.muted { "Result" } (cut(r, TEXT_SHOWN_MAX, "")) }
                        }
                    }
                }
            }
        },
    )))
}

/// One side of a job's flow edges (`jobs::Relatives`): each job linked,
/// with its task, where it is and the edge's policy; the first
/// [`jobs::RELATIVES_SHOWN`], the rest counted. Nothing when it has none.
fn relatives(key: &str, title: &str, words: &str, r: &jobs::Relatives) -> Markup {
    html! {
        @if r.total > 0 {
            h2 { (title) " " span.muted { "(" (count(r.total)) ")" } }
            p.muted { (words) }
            table id=(key) {
                thead { tr { th { "Job" } th { "Task" } th { "State" } th { "On parent failure" } th { "Edge" } } }
                tbody {
                    @for j in &r.shown {
                        tr data-job=(j.id) {
                            td { a href={ "/jobs/" (j.id) } { (j.id) } }
                            td { @match &j.task { Some(t) => code { (t) }, None => span.muted { "unknown" } } }
                            td { span class=(view::state_class(&j.state)) { (j.state_words()) } }
                            td { (j.on_failure) }
                            td { (j.edge) }
                        }
                    }
                }
            }
            @if r.more() > 0 {
                p.muted id={ (key) "-more" } { "… and " (count(r.more())) " more (the first " (r.shown.len()) " by id above)." }
            }
        }
    }
}

/// Recorded errors as a timeline, each cut at [`TEXT_SHOWN_MAX`].
fn errors_list(errors: &[jobs::AttemptError]) -> Markup {
    html! {
        ul.timeline {
            @for e in errors {
                li data-attempt=(e.attempt) {
                    "attempt " (e.attempt) ", " (when(Some(&e.at)))
                    (cut(&e.error, TEXT_SHOWN_MAX, ""))
                }
            }
        }
    }
}

/// The errors page's query.
#[derive(Deserialize, Default)]
pub(crate) struct ErrorsPage {
    #[serde(default)]
    page: String,
}

/// `GET /jobs/{id}/errors?page=N`: a job's recorded errors by attempt,
/// [`ERRORS_PAGE`] a page.
pub(crate) async fn job_errors(
    State(app): State<App>,
    headers: HeaderMap,
    JobId(id): JobId,
    Query(q): Query<ErrorsPage>,
) -> PageResult {
    let n: usize = match q.page.trim() {
        "" => 1,
        s => s.parse::<u32>().ok().filter(|n| *n >= 1).ok_or_else(|| {
            PageError::BadRequest(format!("page {s:?}: write a page number from 1"))
        })? as usize,
    };
    let mut conn = conn(&app).await?;
    let tx = read_tx(&app, &mut conn).await?;
    let errors = jobs::errors(tx.client(), id).await?;
    tx.commit().await.map_err(Error::db("console: commit"))?;
    if errors.is_empty() {
        return Err(PageError::NotFound(format!(
            "no recorded error of job {id} (errors are kept seven days)"
        )));
    }
    let pages = errors.len().div_ceil(ERRORS_PAGE);
    let start = (n - 1).saturating_mul(ERRORS_PAGE).min(errors.len());
    let shown = &errors[start..(start + ERRORS_PAGE).min(errors.len())];
    let csrf = auth::session(&app, &headers);
    let here = format!("/jobs/{id}/errors");
    Ok(html_page(page(
        &format!("Job {id}: errors"),
        "/jobs",
        who(&app, &headers, &csrf, &here),
        html! {
            h1 { "Errors of " a href={ "/jobs/" (id) } { "job " (id) } }
            p.muted { (count(errors.len() as i64)) " recorded errors, by attempt; page " (n) " of " (pages) "." }
            @if shown.is_empty() { p.muted { "No error on this page." } } @else { (errors_list(shown)) }
            div.pager {
                @if n > 1 { a #prev href={ (here) "?page=" (n - 1) } { "« previous page" } }
                @if n < pages { a #next href={ (here) "?page=" (n + 1) } { "next page »" } }
            }
        },
    )))
}

/// Own key limits a page lists per queue (the first by key; `pgwake queue
/// list --json` has every one).
pub(crate) const KEY_LIMITS_SHOWN: usize = 10;

/// A queue's limit-key settings in words: where jobs take their key, the
/// running limit and rate per key, keys with a limit of their own, and
/// whether claims rotate between keys.
pub(crate) fn key_limits(s: &queues::QueueSettings, none: &str) -> Markup {
    let unset = s.limit_key_path.is_none()
        && s.max_running_per_key.is_none()
        && s.key_max_running.is_empty()
        && s.rate_per_key.is_none()
        && !s.fair_keys;
    html! {
        @if unset { span.muted { (none) } } @else {
            ul.limits {
                @if let Some(p) = &s.limit_key_path {
                    li.key-path { "key: payload field " code { (p) } }
                }
                @if let Some(n) = s.max_running_per_key {
                    li.key-max { (n) " running per key" }
                }
                @if !s.key_max_running.is_empty() {
                    li.key-own { "own limits: "
                        @for (i, (k, n)) in s.key_max_running.iter().take(KEY_LIMITS_SHOWN).enumerate() {
                            @if i > 0 { ", " } code { (k) } " " (n)
                        }
                        @if s.key_max_running.len() > KEY_LIMITS_SHOWN {
                            ", and " (s.key_max_running.len() - KEY_LIMITS_SHOWN) " more"
                        }
                    }
                }
                @if let Some(r) = &s.rate_per_key {
                    li.key-rate title="starts of any one key in any window of this length" { (r) " per key" }
                }
                @if s.fair_keys {
                    li.key-fair title="claims take ready jobs in rotation between limit keys" { "fair between keys" }
                }
            }
        }
    }
}

/// The forms that set a queue's limits (the session's CSRF token in each):
/// max running and rate, the limit-key settings, and one key's own limit.
pub(crate) fn limit_forms(q: &queues::QueueSettings, csrf: &str) -> Markup {
    html! {
        form.inline method="post" action="/actions/queue" {
            input type="hidden" name="csrf" value=(csrf);
            input type="hidden" name="queue" value=(q.queue);
            input type="hidden" name="op" value="limits";
            input type="number" name="max_running" min="1" placeholder="max running"
                title="at most this many running at once; empty: no limit"
                value=[q.max_running];
            input name="rate" size="8" placeholder="rate, e.g. 20/s"
                title="N/s, N/min, N/h or N/<duration>; empty: no limit"
                value=[q.rate.map(|r| r.to_string())];
            button type="submit" { "Set" }
        }
        details.key-forms {
            summary { "Per-key limits…" }
            form.stack method="post" action="/actions/queue" {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="queue" value=(q.queue);
                input type="hidden" name="op" value="keys";
                label { "Limit key from payload field"
                    input name="limit_key_path" placeholder="customer_id"
                        title="jobs enqueued without a limit key take this top-level payload field as their key; empty: none"
                        value=[q.limit_key_path.as_deref()]; }
                label { "Max running per key"
                    input type="number" name="max_running_per_key" min="1" placeholder="no limit"
                        title="at most this many jobs of any one key running at once; empty: no limit"
                        value=[q.max_running_per_key]; }
                label { "Rate per key"
                    input name="rate_per_key" size="8" placeholder="e.g. 5/s"
                        title="N/s, N/min, N/h or N/<duration> for each key; empty: no limit"
                        value=[q.rate_per_key.map(|r| r.to_string())]; }
                label.check { input type="checkbox" name="fair_keys" value="on" checked[q.fair_keys];
                    " fair: take ready jobs in rotation between keys" }
                button type="submit" { "Set per-key limits" }
            }
            form.stack method="post" action="/actions/queue" {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="queue" value=(q.queue);
                input type="hidden" name="op" value="key_limit";
                label { "Key" input name="key" required placeholder="acme"; }
                label { "Its own max running"
                    input type="number" name="key_max_running" min="1" placeholder="the per-key limit"
                        title="empty: the queue's per-key limit again"; }
                button type="submit" { "Set the key's limit" }
            }
        }
    }
}

// ─── Queues ──────────────────────────────────────────────────────────────

/// `GET /queues`.
pub(crate) async fn queues(
    State(app): State<App>,
    headers: HeaderMap,
    Query(did): Query<Did>,
) -> PageResult {
    let n = page_number(&did.page)?;
    let mut conn = conn(&app).await?;
    let tx = read_tx(&app, &mut conn).await?;
    let all = queues::list(tx.client()).await?;
    let activity = activity::queues(tx.client()).await?;
    tx.commit().await.map_err(Error::db("console: commit"))?;
    let pages = all.len().div_ceil(QUEUES_PAGE).max(1);
    let start = (n - 1).saturating_mul(QUEUES_PAGE).min(all.len());
    let list = &all[start..(start + QUEUES_PAGE).min(all.len())];
    let csrf = auth::session(&app, &headers);
    Ok(html_page(page(
        "Queues",
        "/queues",
        who(&app, &headers, &csrf, "/queues"),
        html! {
            h1 { "Queues" }
            (notice(&did))
            div.panel {
                @if list.is_empty() { p.muted { "No queue has jobs or settings yet." } } @else {
                table {
                    thead { tr { th { "Queue" } th { "State" } th.num { "Running" } th { "Max running" } th { "Rate" }
                        th { "Limit keys" }
                        @if csrf.is_some() { th { "Change" } } } }
                    tbody { @for q in list {
                        @let a = activity.iter().find(|a| a.queue == q.queue);
                        tr data-queue=(q.queue) {
                            td { a href={ "/jobs?queue=" (encode(&q.queue)) } { (q.queue) } }
                            td { @if q.paused { span.badge.b-warn { "paused" } " " (at(q.paused_at)) } @else { span.badge.b-ok { "running" } } }
                            td.num { (a.map_or(0, |a| a.leased + a.tx_running)) }
                            td { @match q.max_running { Some(m) => { (a.and_then(|a| a.slots_used).unwrap_or(0)) " / " (m) }, None => span.muted { "no limit" } } }
                            td { @match q.rate { Some(r) => { (a.map_or(0, |a| a.rate_used)) " / " (r) }, None => span.muted { "no limit" } } }
                            td.keys { (key_limits(q, "no per-key limit")) }
                            @if let Some(csrf) = &csrf {
                                td {
                                    form.inline method="post" action="/actions/queue" {
                                        input type="hidden" name="csrf" value=(csrf);
                                        input type="hidden" name="queue" value=(q.queue);
                                        @if q.paused {
                                            button type="submit" name="op" value="resume" { "Resume" }
                                        } @else {
                                            button.danger type="submit" name="op" value="pause" { "Pause" }
                                        }
                                    }
                                    " "
                                    (limit_forms(q, csrf))
                                }
                            }
                        }
                    } }
                } }
                @if pages > 1 {
                    p.muted { (count(all.len() as i64)) " queues, " (QUEUES_PAGE) " a page; page " (n) " of " (pages) "." }
                    (pager("/queues", n, n < pages))
                }
                p.muted { "Workers read these settings at every claim: a change needs no restart. Pausing stops no running job." }
            }
        },
    )))
}

// ─── Schedules ───────────────────────────────────────────────────────────

/// `GET /schedules?page=N`: the schedules, [`SCHEDULES_PAGE`] a page by
/// name (issue 33, item 7: thousands of schedules were one page).
pub(crate) async fn schedules(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<PageQuery>,
) -> PageResult {
    let n = page_number(&q.page)?;
    let (offset, rows) = window(n, SCHEDULES_PAGE);
    let mut conn = conn(&app).await?;
    let tx = read_tx(&app, &mut conn).await?;
    let mut list = schedules::page(tx.client(), offset, rows).await?;
    tx.commit().await.map_err(Error::db("console: commit"))?;
    let more = list.len() > SCHEDULES_PAGE;
    list.truncate(SCHEDULES_PAGE);
    let csrf = auth::session(&app, &headers);
    Ok(html_page(page(
        "Schedules",
        "/schedules",
        who(&app, &headers, &csrf, "/schedules"),
        html! {
            h1 { "Schedules" }
            div.panel {
                @if list.is_empty() && n == 1 {
                    p.muted { "No schedule. Add one with " code { "pgwake schedule add" } "." }
                } @else if list.is_empty() {
                    p.muted { "No schedule on page " (n) ". " a href="/schedules?page=1" { "The first page" } }
                } @else {
                table {
                    thead { tr { th { "Name" } th { "Cron" } th { "Task" } th { "Queue" } th { "Next tick" } th { "Last tick" }
                        th.num { "Enqueued" } th.num { "Missed" } th.num { "Skipped (still waiting)" } th { "Problem" }
                        @if csrf.is_some() { th {} } } }
                    tbody { @for s in &list { tr data-schedule=(s.name) {
                        td { (s.name) }
                        td { code { (s.cron) } " " span.muted { (s.tz) } }
                        td { code { (s.task) } }
                        td { (s.queue) }
                        td { (at(s.next_tick)) }
                        td { (at(s.last_tick)) @if let Some(j) = s.last_job_id { " " a href={ "/jobs/" (j) } { "job " (j) } } }
                        td.num { (count(s.ticks_enqueued)) }
                        td.num { (count(s.ticks_missed)) }
                        td.num { (count(s.ticks_waiting)) }
                        td {
                            @if let Some(e) = &s.error { span.badge.b-bad title=(e) { "invalid" } " " (e) }
                            @if !s.enabled { span.badge { "disabled" } }
                        }
                        @if let Some(csrf) = &csrf {
                            td { form.inline method="post" action="/actions/schedule" {
                                input type="hidden" name="csrf" value=(csrf);
                                input type="hidden" name="name" value=(s.name);
                                button type="submit" name="op" value="run_now" { "Run now" }
                                " "
                                @if s.enabled {
                                    button type="submit" name="op" value="disable" { "Disable" }
                                } @else {
                                    button type="submit" name="op" value="enable" { "Enable" }
                                }
                            } }
                        }
                    } } }
                } }
                @if n > 1 || more {
                    p.muted { "Schedules by name, " (SCHEDULES_PAGE) " a page; page " (n) "." }
                    (pager("/schedules", n, more))
                }
            }
        },
    )))
}

// ─── Login, not found ────────────────────────────────────────────────────

/// The login page's query.
#[derive(Deserialize, Default)]
pub(crate) struct Next {
    #[serde(default)]
    next: String,
}

/// `GET /login`.
pub(crate) async fn login_page(State(app): State<App>, Query(q): Query<Next>) -> Response {
    Html(auth::login_markup(&app, auth::local_path(&q.next), false)).into_response()
}

/// Any other path.
pub(crate) async fn not_found() -> Response {
    PageError::NotFound("no such page".into()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_filters_become_containment_objects() {
        assert_eq!(
            payload_filter("customer=42").unwrap(),
            serde_json::json!({"customer": 42})
        );
        assert_eq!(
            payload_filter("order.id=a-1").unwrap(),
            serde_json::json!({"order": {"id": "a-1"}})
        );
        assert_eq!(
            payload_filter("flag=true").unwrap(),
            serde_json::json!({"flag": true})
        );
        assert!(payload_filter("customer").is_err());
        assert!(payload_filter("=1").is_err());
        assert!(payload_filter("a..b=1").is_err());
    }
}
