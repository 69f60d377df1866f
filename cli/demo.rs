//! `pgwake demo`: the whole product in one command, and a place to look
//! around. Starts a throwaway PostgreSQL (unless a database URL is given),
//! migrates it, enqueues a mix of jobs (most succeed, some fail once and
//! retry, one ends dead, some are scheduled a few seconds ahead), runs a
//! worker with metrics, prints each outcome as it happens and a per-queue
//! summary, then keeps the database and the worker up — printing the
//! `DATABASE_URL` and commands to try from another terminal — until one
//! Ctrl-C (or SIGTERM), and removes the cluster.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use pgwake::client::{enqueue_many, NewJob};
use pgwake::error::{Error, Result};
use pgwake::{async_trait, Worker, WorkerConfig};
use pgwake::{BoxError, Handler, JobContext};
use pgwake::{Job, Outcome, Resolution};

/// Demo settings.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Use this database instead of a throwaway cluster.
    pub database_url: Option<String>,
    /// Where to serve metrics; `None`: the default address, or a free port
    /// if that is taken.
    pub metrics_addr: Option<SocketAddr>,
    /// Where to serve the read-only console; `None`: the default address,
    /// or a free port if that is taken.
    pub ui_addr: Option<SocketAddr>,
    /// Who may reach the console (`--ui-host`, `--ui-open-reads`,
    /// `--ui-secure-cookie`), as for `pgwake ui`.
    pub console: crate::commands::ui::ConsoleFlags,
}

struct Resize;
#[async_trait]
impl Handler for Resize {
    async fn handle(&self, job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let ms = 20 + (job.id as u64 * 37) % 130;
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(Outcome::Done)
    }
    fn delivery(&self) -> pgwake::Delivery {
        pgwake::Delivery::Lease
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
    fn delivery(&self) -> pgwake::Delivery {
        pgwake::Delivery::Lease
    }
}

struct SyncCrm;
#[async_trait]
impl Handler for SyncCrm {
    async fn handle(&self, _job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        Err("CRM API answered 500 Internal Server Error".into())
    }
    fn delivery(&self) -> pgwake::Delivery {
        pgwake::Delivery::Lease
    }
}

struct Remind;
#[async_trait]
impl Handler for Remind {
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        // Written in the claim transaction: commits with the job's removal.
        if let Some(tx) = ctx.transaction().await? {
            tx.execute(
                "SELECT pg_notify('pgwake_demo', $1)",
                &[&job.id.to_string()],
            )
            .await?;
        }
        Ok(Outcome::Done)
    }
}

/// The queues the demo's jobs go into: on its own cluster the everyday
/// names; on the user's database (`--database-url`) queues of its own,
/// which its worker alone claims, so that it never touches a real job.
struct DemoQueues {
    main: &'static str,
    email: &'static str,
}

const OWN_CLUSTER: DemoQueues = DemoQueues {
    main: "default",
    email: "email",
};

const USER_DATABASE: DemoQueues = DemoQueues {
    main: "pgwake-demo",
    email: "pgwake-demo-email",
};

fn demo_jobs(q: &DemoQueues) -> Vec<NewJob> {
    let mut jobs = Vec::new();
    for i in 0..24 {
        jobs.push(
            NewJob::new(
                "resize_image",
                serde_json::json!({"image": format!("photo-{i}.jpg"), "width": 640}),
            )
            .queue(q.main),
        );
    }
    for i in 0..6 {
        jobs.push(
            NewJob::new(
                "send_email",
                serde_json::json!({"to": format!("user{i}@example.com")}),
            )
            .queue(q.email),
        );
    }
    jobs.push(
        NewJob::new("sync_crm", serde_json::json!({"account": 42}))
            .queue(q.main)
            .max_attempts(3),
    );
    for i in 0..5u64 {
        let at = SystemTime::now() + Duration::from_secs(3 + i);
        jobs.push(
            NewJob::new("send_reminder", serde_json::json!({"reminder": i}))
                .queue(q.main)
                .run_at(at),
        );
    }
    jobs
}

/// Resolves on the first SIGINT (Ctrl-C) or SIGTERM. Both streams are
/// installed up front, so a signal that arrives while the demo is busy is
/// not lost, and one is enough.
struct StopSignal {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl StopSignal {
    fn install() -> Result<StopSignal> {
        let io = |source| Error::Io {
            context: "cannot install signal handlers".into(),
            source,
        };
        Ok(StopSignal {
            int: signal(SignalKind::interrupt()).map_err(io)?,
            term: signal(SignalKind::terminate()).map_err(io)?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}

/// Bind the metrics address before any start-up work. An address the user
/// chose must be free; the default falls back to a free port.
async fn bind_metrics(addr: Option<SocketAddr>) -> Result<tokio::net::TcpListener> {
    match addr {
        Some(addr) => crate::commands::run::bind_metrics(addr).await,
        None => {
            let default = pgwake::config::METRICS_ADDR_DEFAULT;
            match pgwake::endpoint::bind(default).await {
                Ok(l) => Ok(l),
                Err(_) => {
                    let l = crate::commands::run::bind_metrics(SocketAddr::new(default.ip(), 0))
                        .await?;
                    if let Ok(a) = l.local_addr() {
                        println!(
                            "{default} is taken (another pgwake?); serving metrics on {a} instead"
                        );
                    }
                    Ok(l)
                }
            }
        }
    }
}

/// Bind the read-only console's address. An address the user chose must be
/// free, and off loopback needs `PGWAKE_UI_TOKEN` for reads unless
/// `--ui-open-reads` (as `pgwake ui --ui-addr`); the default falls back to
/// a free port beside it.
async fn bind_console(
    addr: Option<SocketAddr>,
    flags: &crate::commands::ui::ConsoleFlags,
) -> Result<(tokio::net::TcpListener, pgwake::console::ConsoleConfig)> {
    let default: SocketAddr = pgwake::console::UI_ADDR_DEFAULT
        .parse()
        .map_err(|_| Error::Unexpected("the console's default address"))?;
    if addr.is_some() || flags.any() {
        return crate::commands::ui::prepare(addr.unwrap_or(default), false, flags).await;
    }
    let listener = match pgwake::console::bind(default).await {
        Ok(l) => l,
        Err(_) => pgwake::console::bind(SocketAddr::new(default.ip(), 0)).await?,
    };
    Ok((listener, pgwake::console::ConsoleConfig::default()))
}

/// Run the demo until a signal.
pub async fn run(opts: DemoOptions) -> Result<()> {
    let mut stop_signal = StopSignal::install()?;
    let metrics = bind_metrics(opts.metrics_addr).await?;
    let console = bind_console(opts.ui_addr, &opts.console).await?;
    let mut cluster = None;
    let url = match &opts.database_url {
        Some(url) => url.clone(),
        None => {
            println!("starting a throwaway PostgreSQL …");
            let c = tokio::task::spawn_blocking(crate::embedded::Cluster::start)
                .await
                .map_err(|_| Error::Panicked("starting the throwaway PostgreSQL"))??;
            println!(
                "PostgreSQL is up on a Unix socket in {} (a private directory, no TCP; removed when the demo stops)",
                c.socket_dir().display()
            );
            let url = c.url("postgres");
            cluster = Some(c);
            url
        }
    };
    let result = run_on(&url, metrics, console, &mut stop_signal, cluster.is_some()).await;
    if let Some(mut c) = cluster {
        tokio::task::spawn_blocking(move || c.shutdown()).await.ok();
        println!("throwaway PostgreSQL stopped and removed");
    }
    result
}

/// Outcomes of one queue so far.
#[derive(Default)]
struct QueueTally {
    done: u32,
    retries: u32,
    dead: u32,
}

fn print_summary(tally: &BTreeMap<String, QueueTally>) {
    let total: u32 = tally.values().map(|t| t.done + t.dead).sum();
    println!("\nall {total} jobs resolved; per queue:");
    println!(
        "  {:<10} {:>5} {:>8} {:>5}",
        "queue", "done", "retries", "dead"
    );
    for (queue, t) in tally {
        println!(
            "  {:<10} {:>5} {:>8} {:>5}",
            queue, t.done, t.retries, t.dead
        );
    }
}

/// How to run this binary from another terminal: `pgwake` when that is
/// this program on PATH, else its full path.
fn pgwake_command() -> String {
    let me = std::env::current_exe().and_then(std::fs::canonicalize).ok();
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("pgwake"))
            .find(|p| p.is_file())
            .and_then(|p| std::fs::canonicalize(p).ok())
    });
    match (me, on_path) {
        (Some(me), Some(found)) if me == found => "pgwake".into(),
        (Some(me), _) => me.display().to_string(),
        (None, _) => "pgwake".into(),
    }
}

fn print_look_around(
    url: &str,
    metrics: SocketAddr,
    console: &str,
    keeps_cluster: bool,
    email_queue: &str,
) {
    use crate::commands::shell::quote;
    let pgwake = pgwake_command();
    // Its full path may hold a space.
    let pgwake = quote(&pgwake);
    println!(
        "\n{} up until Ctrl-C.\n\nIn a browser, the console (queues, jobs and why they wait, workers):\n\n  {console}\n\nFrom another terminal, try:\n",
        if keeps_cluster {
            "The worker and the database stay"
        } else {
            "The worker stays"
        }
    );
    if keeps_cluster {
        // Quoted: a socket URL carries `&`, which a shell would take as a command end.
        println!("  export DATABASE_URL={}", quote(url));
    } else {
        // The user's own URL may hold a password: never echoed.
        println!("  export DATABASE_URL=…   # the URL given to --database-url");
    }
    println!("  {pgwake} stats");
    println!("  {pgwake} dead list");
    println!("  {pgwake} enqueue --task send_email --queue {} --payload '{{\"to\": \"you@example.com\"}}'", quote(email_queue));
    println!("  curl -s http://{metrics}/metrics | grep '^pgwake_jobs_total'");
    println!("  psql \"$DATABASE_URL\" -c 'TABLE pgwake.dead_jobs'");
    println!("\n(Ctrl-C to stop)");
}

async fn run_on(
    url: &str,
    metrics: tokio::net::TcpListener,
    console: (tokio::net::TcpListener, pgwake::console::ConsoleConfig),
    stop_signal: &mut StopSignal,
    own_cluster: bool,
) -> Result<()> {
    let db = pgwake::connect::parse_url(url)?;
    let console_db = db.clone();
    let mut client = pgwake::connect::connect(&db).await?;
    let queues = if own_cluster {
        OWN_CLUSTER
    } else {
        USER_DATABASE
    };
    pgwake::admin::schema::migrate(&mut client).await?;
    if !own_cluster {
        refuse_leftover_demo_jobs(&client, &queues).await?;
    }
    let jobs = demo_jobs(&queues);
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
            // On the user's database: its own queues only, and no schedules
            // (they are the user's to serve).
            queues: (!own_cluster).then(|| vec![queues.main.into(), queues.email.into()]),
            scheduler: if own_cluster {
                WorkerConfig::default().scheduler
            } else {
                None
            },
            ..WorkerConfig::default()
        })
        .handler("resize_image", Resize)
        .handler("send_email", SendEmail)
        .handler("sync_crm", SyncCrm)
        .handler("send_reminder", Remind)
        .build()?;
    let mut events = worker.subscribe();
    let handle = pgwake::metrics::install();
    let stop = CancellationToken::new();
    let abort = CancellationToken::new();
    let (addr, http) = pgwake::endpoint::serve_on(metrics, handle, worker.health(), stop.clone())?;
    println!("worker running; metrics at http://{addr}/metrics");
    let (console_listener, console_config) = console;
    let (console_url, console) =
        crate::commands::ui::start(console_listener, console_config, &console_db, stop.clone())?;
    println!("console (read-only) at {console_url}\n");
    let run = tokio::spawn(worker.run(stop.clone(), abort.clone()));

    let mut resolved = 0;
    let mut tally: BTreeMap<String, QueueTally> = BTreeMap::new();
    let mut summarised = false;
    loop {
        tokio::select! {
            _ = stop_signal.recv() => break,
            ev = events.recv() => {
                let Ok(ev) = ev else { continue };
                let t = tally.entry(ev.queue.clone()).or_default();
                let mark = match ev.resolution {
                    Resolution::Done => { t.done += 1; resolved += 1; "done " }
                    Resolution::Retry { .. } => { t.retries += 1; "retry" }
                    Resolution::Dead { .. } => { t.dead += 1; resolved += 1; "dead " }
                    Resolution::Snoozed { .. } => "snooz",
                    Resolution::Sleeping { .. } => "sleep",
                    Resolution::Returned | Resolution::Lost => "back ",
                    Resolution::Cancelled => { t.dead += 1; resolved += 1; "cancl" }
                    _ => "     ",
                };
                // Jobs enqueued from another terminal show up here too.
                println!(
                    "{mark} job {:>3} {:<14} queue={:<8} attempt={} {}",
                    ev.id, ev.task, ev.queue, ev.attempt, ev.resolution.reason().unwrap_or("")
                );
                if resolved == total && !summarised {
                    summarised = true;
                    print_summary(&tally);
                    print_look_around(url, addr, &console_url, own_cluster, queues.email);
                }
            }
        }
    }
    println!("\nstopping …");
    stop.cancel();
    run.await
        .map_err(|_| Error::Panicked("the demo worker"))??;
    let _ = http.await;
    let _ = console.await;
    Ok(())
}

/// The demo counts its own jobs: jobs left in its queues by an earlier demo
/// on this database would blur the count. Refuse, saying how to clear them.
async fn refuse_leftover_demo_jobs(client: &tokio_postgres::Client, q: &DemoQueues) -> Result<()> {
    let queues = vec![q.main.to_string(), q.email.to_string()];
    let left: i64 = client
        .query_one(
            "SELECT (SELECT count(*) FROM pgwake.jobs WHERE queue = ANY($1))
                  + (SELECT count(*) FROM pgwake.leased_jobs WHERE queue = ANY($1))",
            &[&queues],
        )
        .await
        .map_err(Error::db("demo: cannot check the database for demo jobs"))?
        .get(0);
    if left > 0 {
        return Err(Error::Config(format!(
            "--database-url: {left} jobs of an earlier demo are still waiting in the queues {} and {}; delete them (DELETE FROM pgwake.jobs WHERE queue IN ('{}', '{}')) or use another database",
            q.main, q.email, q.main, q.email
        )));
    }
    Ok(())
}
