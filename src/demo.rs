//! `pgwake demo`: the whole product in one command. Starts a throwaway
//! PostgreSQL (unless a database URL is given), migrates it, enqueues a mix
//! of jobs (most succeed, some fail once and retry, one ends dead, some are
//! scheduled a few seconds ahead), runs a worker with metrics on
//! `127.0.0.1:9187`, prints each outcome as it happens, and removes the
//! cluster when every job is resolved or on Ctrl-C.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::client::{enqueue_many, NewJob};
use crate::error::{Error, Result};
use crate::handler::{BoxError, Handler, JobContext};
use crate::job::{Job, Outcome, Resolution};
use crate::{async_trait, Worker, WorkerConfig};

/// Demo settings.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Use this database instead of a throwaway cluster.
    pub database_url: Option<String>,
    /// Where to serve metrics.
    pub metrics_addr: SocketAddr,
    /// Keep the worker (and metrics) running after the jobs are done, until
    /// Ctrl-C.
    pub keep_running: bool,
}

struct Resize;
#[async_trait]
impl Handler for Resize {
    async fn handle(&self, job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let ms = 20 + (job.id as u64 * 37) % 130;
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(Outcome::Done)
    }
    fn uses_transaction(&self) -> bool {
        false
    }
}

struct SendEmail;
#[async_trait]
impl Handler for SendEmail {
    async fn handle(&self, job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        if job.attempt == 1 {
            return Err("SMTP 451: mailbox temporarily unavailable".into());
        }
        Ok(Outcome::Done)
    }
    fn uses_transaction(&self) -> bool {
        false
    }
}

struct SyncCrm;
#[async_trait]
impl Handler for SyncCrm {
    async fn handle(&self, _job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        Err("CRM API answered 500 Internal Server Error".into())
    }
    fn uses_transaction(&self) -> bool {
        false
    }
}

struct Remind;
#[async_trait]
impl Handler for Remind {
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        // Written in the claim transaction: commits with the job's removal.
        if let Some(tx) = ctx.transaction() {
            tx.execute(
                "SELECT pg_notify('pgwake_demo', $1)",
                &[&job.id.to_string()],
            )
            .await?;
        }
        Ok(Outcome::Done)
    }
}

fn demo_jobs() -> Vec<NewJob> {
    let mut jobs = Vec::new();
    for i in 0..24 {
        jobs.push(NewJob::new(
            "resize_image",
            serde_json::json!({"image": format!("photo-{i}.jpg"), "width": 640}),
        ));
    }
    for i in 0..6 {
        jobs.push(
            NewJob::new(
                "send_email",
                serde_json::json!({"to": format!("user{i}@example.com")}),
            )
            .queue("email"),
        );
    }
    jobs.push(NewJob::new("sync_crm", serde_json::json!({"account": 42})).max_attempts(3));
    for i in 0..5u64 {
        let at = SystemTime::now() + Duration::from_secs(3 + i);
        jobs.push(NewJob::new("send_reminder", serde_json::json!({"reminder": i})).run_at(at));
    }
    jobs
}

/// Run the demo.
pub async fn run(opts: DemoOptions) -> Result<()> {
    let mut cluster = None;
    let url = match &opts.database_url {
        Some(url) => url.clone(),
        None => {
            println!("starting a throwaway PostgreSQL …");
            let c = tokio::task::spawn_blocking(crate::embedded::Cluster::start)
                .await
                .map_err(|e| Error::Embedded(e.to_string()))??;
            println!(
                "PostgreSQL is up on 127.0.0.1:{} (data in a temp dir, removed on exit)",
                c.port()
            );
            let url = c.url("postgres");
            cluster = Some(c);
            url
        }
    };
    let result = run_on(&url, &opts).await;
    if let Some(mut c) = cluster {
        tokio::task::spawn_blocking(move || c.shutdown()).await.ok();
        println!("throwaway PostgreSQL stopped and removed");
    }
    result
}

async fn run_on(url: &str, opts: &DemoOptions) -> Result<()> {
    let db = crate::connect::parse_url(url)?;
    let mut client = crate::connect::connect(&db).await?;
    crate::schema::migrate(&mut client).await?;
    let jobs = demo_jobs();
    let total = jobs.len();
    enqueue_many(&client, &jobs).await?;
    println!("enqueued {total} jobs: 24 resize_image, 6 send_email (fail once, then succeed), 1 sync_crm (always fails, 3 attempts), 5 send_reminder scheduled 3–7 s ahead");

    let worker = Worker::builder(db)
        .config(WorkerConfig {
            concurrency: 4,
            batch: 4,
            retry_base: Duration::from_millis(500),
            retry_max: Duration::from_secs(2),
            poll_interval: Duration::from_secs(1),
            sample_interval: Some(Duration::from_secs(1)),
            ..WorkerConfig::default()
        })
        .handler("resize_image", Resize)
        .handler("send_email", SendEmail)
        .handler("sync_crm", SyncCrm)
        .handler("send_reminder", Remind)
        .build()?;
    let mut events = worker.subscribe();
    let handle = crate::metrics::install();
    let stop = CancellationToken::new();
    let abort = CancellationToken::new();
    let (addr, http) =
        crate::endpoint::serve(opts.metrics_addr, handle, worker.health(), stop.clone()).await?;
    println!("worker running; metrics at http://{addr}/metrics (Ctrl-C to stop)\n");
    let run = tokio::spawn(worker.run(stop.clone(), abort.clone()));

    let mut resolved = 0;
    let (mut done, mut retried, mut dead) = (0, 0, 0);
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => { println!("\ninterrupted"); break; }
            ev = events.recv() => {
                let Ok(ev) = ev else { continue };
                let mark = match ev.resolution {
                    Resolution::Done => { done += 1; resolved += 1; "done " }
                    Resolution::Retry => { retried += 1; "retry" }
                    Resolution::Dead => { dead += 1; resolved += 1; "dead " }
                    Resolution::Returned => "back ",
                };
                println!(
                    "{mark} job {:>3} {:<14} queue={:<8} attempt={} {}",
                    ev.id, ev.task, ev.queue, ev.attempt, ev.error.as_deref().unwrap_or("")
                );
                if resolved == total && !opts.keep_running {
                    break;
                }
            }
        }
    }
    println!("\n{done} done, {retried} retries, {dead} dead (see `pgwake dead list`)");
    if let Ok(stats) =
        crate::stats::read(&crate::connect::pool(&crate::connect::parse_url(url)?, 1)?).await
    {
        print!("{}", crate::stats::render_table(&stats));
    }
    if opts.keep_running && resolved == total {
        println!("keeping the worker running; Ctrl-C to stop");
        let _ = tokio::signal::ctrl_c().await;
    }
    stop.cancel();
    run.await.map_err(|e| Error::Embedded(e.to_string()))??;
    let _ = http.await;
    Ok(())
}
