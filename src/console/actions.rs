//! The state-changing requests (only with `--ui-actions`, each checked by
//! [`auth::authorize`]): retry or cancel a job, pause, resume or limit a
//! queue, run a schedule now, and bulk actions by filter (review with a
//! count, then apply). Each runs in one transaction as the console's
//! database role, through [`crate::admin`].

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{Html, IntoResponse, Redirect};
use maud::html;
use serde::Deserialize;

use super::auth;
use super::input::Form;
use super::pages::{self, conn, limits, who, Filters, PageError, PageResult};
use super::view::{count, page};
use super::App;
use crate::admin::bulk::{self, BulkAction};
use crate::admin::dead::{self, Selection};
use crate::admin::{queues, schedules};
use crate::error::Error;

/// A read-write transaction under the console's limits.
async fn write_tx<'a>(
    app: &App,
    conn: &'a mut deadpool_postgres::Object,
) -> Result<deadpool_postgres::Transaction<'a>, PageError> {
    let tx = conn
        .transaction()
        .await
        .map_err(Error::db("console: begin"))?;
    limits(app, &tx).await?;
    Ok(tx)
}

/// The job form's fields.
#[derive(Deserialize)]
pub(crate) struct JobForm {
    #[serde(default)]
    csrf: String,
    id: i64,
    op: String,
    /// `yes` once the operator confirmed cancelling a running job.
    #[serde(default)]
    confirm: String,
}

/// Whether job `id` runs now (explain's first reason): cancelling it
/// interrupts a handler mid-work, so the console asks first.
async fn runs_now(app: &App, id: i64) -> Result<bool, PageError> {
    let mut conn = conn(app).await?;
    let tx = pages::read_tx(app, &mut conn).await?;
    let reasons = crate::admin::jobs::explain(tx.client(), id).await?;
    tx.commit().await.map_err(Error::db("console: commit"))?;
    Ok(reasons
        .first()
        .is_some_and(|r| r.reason == "running" || r.reason == "buffered"))
}

/// The confirmation before cancelling a running job: a form of its own
/// (CSRF token in it), so it works without a script.
fn confirm_cancel(app: &App, headers: &HeaderMap, csrf: &str, id: i64) -> PageResult {
    let token = Some(csrf.to_string());
    let here = format!("/jobs/{id}");
    let body = html! {
        h1 { "Cancel running job " (id) "?" }
        div.panel.warning #confirm-cancel {
            p { "Job " a href=(here) { (id) } " is running now. Cancelling it stops its handler in the middle of its work "
                "(the worker running it interrupts it, as " code { "pgwake cancel" } " does) and records it as cancelled; "
                "whatever the handler did so far stays done." }
            form.inline method="post" action="/actions/job" {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="id" value=(id);
                input type="hidden" name="op" value="cancel";
                input type="hidden" name="confirm" value="yes";
                button.danger #confirm type="submit" { "Cancel job " (id) }
                " " a href=(here) { "keep it running" }
            }
        }
    };
    Ok(
        Html(page("Confirm", "/jobs", who(app, headers, &token, &here), body).into_string())
            .into_response(),
    )
}

/// `POST /actions/job`: `op=retry` (a dead or cancelled job) or
/// `op=cancel`.
pub(crate) async fn job_action(
    State(app): State<App>,
    headers: HeaderMap,
    Form(f): Form<JobForm>,
) -> PageResult {
    auth::authorize(&app, &headers, &f.csrf)?;
    if f.op == "cancel" && f.confirm != "yes" && runs_now(&app, f.id).await? {
        return confirm_cancel(&app, &headers, &f.csrf, f.id);
    }
    let mut conn = conn(&app).await?;
    let tx = write_tx(&app, &mut conn).await?;
    let did = match f.op.as_str() {
        "retry" => {
            let sel = Selection {
                ids: Some(vec![f.id]),
                queue: None,
                all: false,
            };
            if dead::retry(tx.client(), &sel).await?.is_empty() {
                "not_dead"
            } else {
                "retried"
            }
        }
        "cancel" => match crate::admin::cancel::cancel(tx.client(), f.id).await? {
            crate::CancelOutcome::Cancelled => "cancelled",
            crate::CancelOutcome::Requested => "cancel_requested",
            _ => "not_cancelled",
        },
        other => {
            return Err(PageError::BadRequest(format!(
                "unknown job action {other:?}: retry or cancel"
            )))
        }
    };
    tx.commit().await.map_err(Error::db("console: commit"))?;
    tracing::info!(job = f.id, action = %f.op, "console: job action");
    Ok(Redirect::to(&format!("/jobs/{}?did={did}", f.id)).into_response())
}

/// The queue form's fields.
#[derive(Deserialize)]
pub(crate) struct QueueForm {
    #[serde(default)]
    csrf: String,
    queue: String,
    op: String,
    #[serde(default)]
    max_running: String,
    #[serde(default)]
    rate: String,
    /// `op=keys`: the payload field jobs take their limit key from (empty: none).
    #[serde(default)]
    limit_key_path: String,
    /// `op=keys`: jobs of any one key running at once (empty: no limit).
    #[serde(default)]
    max_running_per_key: String,
    /// `op=keys`: starts of any one key per window (empty: no rate).
    #[serde(default)]
    rate_per_key: String,
    /// `op=keys`: `on` (a ticked box) takes ready jobs in rotation between keys.
    #[serde(default)]
    fair_keys: String,
    /// `op=key_limit`: the limit key with a limit of its own.
    #[serde(default)]
    key: String,
    /// `op=key_limit`: its own limit (empty: the queue's per-key limit again).
    #[serde(default)]
    key_max_running: String,
}

/// A whole number from a form field named `what` (empty: `None`).
fn whole(s: &str, what: &str) -> Result<Option<i32>, PageError> {
    match s.trim() {
        "" => Ok(None),
        s => s.parse::<i32>().map(Some).map_err(|_| {
            PageError::BadRequest(format!(
                "{what} {s:?} is not a whole number (leave it empty for no limit)"
            ))
        }),
    }
}

/// A rate from a form field (empty: `None`).
fn rate_field(s: &str) -> Result<Option<queues::RateLimit>, PageError> {
    match s.trim() {
        "" => Ok(None),
        s => s
            .parse::<queues::RateLimit>()
            .map(Some)
            .map_err(PageError::BadRequest),
    }
}

/// `op=keys`: the queue's limit-key settings, as `pgwake queue set Q
/// --limit-key-path … --max-running-per-key … --rate-per-key …
/// --[no-]fair-keys` sets them; only those that differ from the queue's
/// current settings are set, in the caller's transaction.
async fn set_keys(tx: &tokio_postgres::Client, f: &QueueForm) -> Result<(), PageError> {
    let path = f.limit_key_path.trim();
    let path = (!path.is_empty()).then_some(path);
    let per_key = whole(&f.max_running_per_key, "max running per key")?;
    let rate = rate_field(&f.rate_per_key)?;
    let fair = match f.fair_keys.as_str() {
        "" => false,
        "on" => true,
        other => {
            return Err(PageError::BadRequest(format!(
                "fair keys {other:?}: tick the box (on) or leave it"
            )))
        }
    };
    let now = queues::list(tx)
        .await?
        .into_iter()
        .find(|q| q.queue == f.queue);
    let was = |get: &dyn Fn(&queues::QueueSettings) -> bool| now.as_ref().is_some_and(get);
    if !was(&|q| q.limit_key_path.as_deref() == path) && (path.is_some() || now.is_some()) {
        queues::set_limit_key_path(tx, &f.queue, path).await?;
    }
    if !was(&|q| q.max_running_per_key == per_key) && (per_key.is_some() || now.is_some()) {
        queues::set_max_running_per_key(tx, &f.queue, per_key).await?;
    }
    if !was(&|q| q.rate_per_key == rate) && (rate.is_some() || now.is_some()) {
        queues::set_rate_per_key(tx, &f.queue, rate).await?;
    }
    if !was(&|q| q.fair_keys == fair) && (fair || now.is_some()) {
        queues::set_fair_keys(tx, &f.queue, fair).await?;
    }
    Ok(())
}

/// `POST /actions/queue`: `op=pause`, `op=resume`, `op=limits` (with
/// `max_running` and `rate`; empty removes the limit), `op=keys` (the
/// limit-key path, the per-key running limit and rate, fair keys) or
/// `op=key_limit` (one key's own running limit).
pub(crate) async fn queue_action(
    State(app): State<App>,
    headers: HeaderMap,
    Form(f): Form<QueueForm>,
) -> PageResult {
    auth::authorize(&app, &headers, &f.csrf)?;
    let mut conn = conn(&app).await?;
    let tx = write_tx(&app, &mut conn).await?;
    let did = match f.op.as_str() {
        "pause" => {
            queues::pause(tx.client(), &f.queue).await?;
            "paused"
        }
        "resume" => {
            queues::resume(tx.client(), &f.queue).await?;
            "resumed"
        }
        "limits" => {
            let max = whole(&f.max_running, "max running")?;
            let rate = rate_field(&f.rate)?;
            queues::set_max_running(tx.client(), &f.queue, max).await?;
            queues::set_rate(tx.client(), &f.queue, rate).await?;
            "limits"
        }
        "keys" => {
            set_keys(tx.client(), &f).await?;
            "limits"
        }
        "key_limit" => {
            if f.key.is_empty() {
                return Err(PageError::BadRequest(
                    "a key's own limit needs the limit key: fill in Key".into(),
                ));
            }
            let max = whole(&f.key_max_running, "the key's max running")?;
            queues::set_key_max_running(tx.client(), &f.queue, &f.key, max).await?;
            "limits"
        }
        other => {
            return Err(PageError::BadRequest(format!(
                "unknown queue action {other:?}: pause, resume, limits, keys or key_limit"
            )))
        }
    };
    tx.commit().await.map_err(Error::db("console: commit"))?;
    tracing::info!(queue = %f.queue, action = %f.op, "console: queue action");
    Ok(Redirect::to(&format!("/queues?did={did}")).into_response())
}

/// The schedule form's fields.
#[derive(Deserialize)]
pub(crate) struct ScheduleForm {
    #[serde(default)]
    csrf: String,
    name: String,
    /// `run_now` (the default), `disable` or `enable`.
    #[serde(default)]
    op: String,
}

/// `POST /actions/schedule`: enqueue one job of the schedule now, or
/// disable or enable it.
pub(crate) async fn schedule_action(
    State(app): State<App>,
    headers: HeaderMap,
    Form(f): Form<ScheduleForm>,
) -> PageResult {
    auth::authorize(&app, &headers, &f.csrf)?;
    let enable = match f.op.as_str() {
        "" | "run_now" => None,
        "disable" => Some(false),
        "enable" => Some(true),
        other => {
            return Err(PageError::BadRequest(format!(
                "unknown schedule action {other:?}: use run_now, disable or enable"
            )))
        }
    };
    let mut conn = conn(&app).await?;
    let tx = write_tx(&app, &mut conn).await?;
    if let Some(enabled) = enable {
        schedules::set_enabled(tx.client(), &f.name, enabled).await?;
        tx.commit().await.map_err(Error::db("console: commit"))?;
        tracing::info!(schedule = %f.name, enabled, "console: schedule enabled/disabled");
        return Ok(Redirect::to("/schedules").into_response());
    }
    let id = schedules::run_now(tx.client(), &f.name).await?;
    tx.commit().await.map_err(Error::db("console: commit"))?;
    tracing::info!(schedule = %f.name, job = id, "console: schedule run now");
    Ok(Redirect::to(&format!("/jobs/{id}?did=run_now")).into_response())
}

/// With an id filter, that job alone (the selection starts at it).
fn only(mut m: bulk::Matching, id: Option<i64>) -> bulk::Matching {
    if let Some(id) = id {
        m.ids.retain(|x| *x == id);
        m.more = false;
    }
    m
}

/// The bulk forms' fields: the action and the Jobs page's filters.
#[derive(Deserialize)]
pub(crate) struct BulkForm {
    #[serde(default)]
    csrf: String,
    action: String,
    #[serde(flatten)]
    filters: Filters,
}

/// `POST /bulk/review`: how many jobs the action would change, and a form
/// to confirm.
pub(crate) async fn bulk_review(
    State(app): State<App>,
    headers: HeaderMap,
    Form(f): Form<BulkForm>,
) -> PageResult {
    auth::authorize(&app, &headers, &f.csrf)?;
    let action: BulkAction = f.action.parse()?;
    let (filter, id) = f.filters.to_filter()?;
    let mut conn = conn(&app).await?;
    let tx = pages::read_tx(&app, &mut conn).await?;
    let matching = only(bulk::select(tx.client(), &filter, action).await?, id);
    tx.commit().await.map_err(Error::db("console: commit"))?;
    let csrf = Some(f.csrf.clone());
    let n = matching.ids.len();
    let body = html! {
        h1 { "Confirm: " (action.as_str()) }
        div.panel.warning {
            p {
                strong #bulk-count { (count(n as i64)) @if matching.more { "+" } }
                " job(s) match " (f.filters.describe()) " and are "
                (action.states().join(", ")) "."
                @if matching.more { " This action changes the first " (count(bulk::BULK_MAX as i64)) " by id; repeat it for the rest." }
            }
            @if n > 0 {
                p.muted { "First ids: "
                    @for (i, id) in matching.ids.iter().take(20).enumerate() {
                        @if i > 0 { ", " } a href={ "/jobs/" (id) } { (id) }
                    }
                    @if n > 20 { ", …" }
                }
                form.inline method="post" action="/bulk/apply" {
                    input type="hidden" name="csrf" value=(f.csrf);
                    input type="hidden" name="action" value=(action.as_str());
                    (f.filters.hidden())
                    button.danger #confirm type="submit" { (action.as_str()) " " (count(n as i64)) " job(s)" }
                    " " a href={ "/jobs?" (f.filters.query()) } { "cancel" }
                }
            } @else {
                p { a href={ "/jobs?" (f.filters.query()) } { "Back to the jobs" } }
            }
        }
    };
    Ok(Html(
        page(
            "Confirm",
            "/jobs",
            who(&app, &headers, &csrf, "/jobs"),
            body,
        )
        .into_string(),
    )
    .into_response())
}

/// `POST /bulk/apply`: select the matching jobs again and apply the
/// action to them, in one transaction; then back to the Jobs page with
/// these filters, which says what changed.
pub(crate) async fn bulk_apply(
    State(app): State<App>,
    headers: HeaderMap,
    Form(f): Form<BulkForm>,
) -> PageResult {
    auth::authorize(&app, &headers, &f.csrf)?;
    let action: BulkAction = f.action.parse()?;
    let (filter, id) = f.filters.to_filter()?;
    let mut conn = conn(&app).await?;
    let tx = write_tx(&app, &mut conn).await?;
    let matching = only(bulk::select(tx.client(), &filter, action).await?, id);
    let changed = bulk::apply(tx.client(), action, &matching.ids).await?;
    tx.commit().await.map_err(Error::db("console: commit"))?;
    tracing::info!(action = action.as_str(), changed, "console: bulk action");
    // Post, redirect, get: a reload of the page shown after it does not
    // send the action again.
    let query = f.filters.query();
    let sep = if query.is_empty() { "" } else { "&" };
    let more = if matching.more { "&more=1" } else { "" };
    Ok(Redirect::to(&format!(
        "/jobs?{query}{sep}did=bulk_{}&changed={changed}{more}",
        action.as_str()
    ))
    .into_response())
}
