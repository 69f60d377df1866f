//! A worker under steady load for the observability tests: successes,
//! retries, dead jobs, a rescued lease, a scheduled job per queue, a
//! limited queue, a rate-limited one, a paused one and a session idle in transaction, with its
//! endpoint served; and waiting until
//! its `/metrics` exports what the dashboard names.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use pgwake::{BoxError, Job, Outcome, Worker, WorkerConfig};
use tokio_util::sync::CancellationToken;

use super::common::*;
use super::http::http_get;
use super::DEADLINE;

/// The queues of the load; `leases` runs in lease mode.
pub const QUEUES: [&str; 3] = ["emails", "reports", "leases"];

/// A worker under steady load (successes, retries, dead jobs, a rescued
/// lease, a scheduled job per queue, a limited queue and a paused one, a
/// session idle in transaction), with its endpoint served.
pub struct Load {
    pub endpoint: SocketAddr,
    pub ledger: Ledger,
    pub running: Running,
    pub producer: tokio::task::JoinHandle<Vec<(i64, String)>>,
    pub producing: CancellationToken,
    pub rescued: i64,
    /// The rate-limited queue's jobs (each runs exactly once).
    pub metered: Vec<i64>,
    _idle: tokio_postgres::Client,
    _http: tokio::task::JoinHandle<()>,
    pub http_stop: CancellationToken,
}

impl Load {
    pub async fn start(db: &TestDb) -> Load {
        let ledger = Ledger::default();
        let worker = Worker::builder(db.config())
            .config(WorkerConfig {
                application_name: "obs-load".into(),
                lease_queues: vec!["leases".into()],
                rescue_interval: Duration::from_millis(200),
                sample_interval: Some(Duration::from_millis(250)),
                // History on: the dashboard's history panels have data.
                history: pgwake::config::HistoryConfig::keeping(
                    pgwake::config::KeepFinished::Keep(Duration::from_secs(86400)),
                ),
                ..test_config()
            })
            .handler("send", ok_handler(&ledger))
            .handler(
                "flaky",
                Recording {
                    ledger: ledger.clone(),
                    behaviour: |_: &Job| -> Result<Outcome, BoxError> {
                        Err("the flaky task always fails".into())
                    },
                },
            )
            .build()
            .unwrap();
        let http_stop = CancellationToken::new();
        let (endpoint, http) = pgwake::endpoint::serve(
            "127.0.0.1:0",
            pgwake::metrics::install(),
            worker.health(),
            http_stop.clone(),
        )
        .await
        .unwrap();
        let running = Running::start(worker);
        running.until_listening().await;

        let client = db.client().await;
        // One job per queue waits for tomorrow: the `scheduled` state.
        client
            .execute(
                "INSERT INTO pgwake.jobs (queue, task, run_at)
                 SELECT q, 'send', now() + interval '1 day' FROM unnest($1::text[]) q",
                &[&QUEUES.to_vec()],
            )
            .await
            .unwrap();
        // A worker died holding a lease: the rescuer puts its job back.
        let rescued: i64 = client
            .query_one(
                "INSERT INTO pgwake.leased_jobs
                     (id, queue, task, payload, priority, run_at, attempts, max_attempts,
                      created_at, worker_id, lease_until)
                 VALUES (nextval(pg_get_serial_sequence('pgwake.jobs', 'id')), 'leases', 'send',
                         '{}', 0, now(), 1, 5, now(), 'a-worker-that-died', now() - interval '1 minute')
                 RETURNING id",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        // A per-second schedule: scheduler ticks, lateness and gauges.
        client
            .execute(
                "SELECT pgwake.schedule_add('obs-every-second', '* * * * * *', 'send', queue => 'emails')",
                &[],
            )
            .await
            .unwrap();
        // Queue settings: `reports` runs at most 4 jobs at once (the
        // limited claims); `metered` starts at most 20 jobs a second and
        // gets 100 `send` jobs at once (then 10 a second from the
        // producer), so its claims are throttled for about 5 s (each job
        // must still run exactly once); `archive`,
        // which has no jobs, is paused; `tenants`, which has none either,
        // has the per-key settings (the dashboard's settings table shows
        // them).
        client
            .batch_execute(
                "SELECT pgwake.set_queue_max_running('reports', 4);
                 SELECT pgwake.set_queue_rate('metered', 20, '1 second');
                 SELECT pgwake.pause_queue('archive');
                 SELECT pgwake.set_queue_max_running_per_key('tenants', 2);
                 SELECT pgwake.set_queue_rate_per_key('tenants', 5, '1 second');
                 SELECT pgwake.set_queue_fair_keys('tenants', true);",
            )
            .await
            .unwrap();
        let metered: Vec<i64> = client
            .query(
                "INSERT INTO pgwake.jobs (queue, task)
                 SELECT 'metered', 'send' FROM generate_series(1, 100) RETURNING id",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        // Another application keeps a transaction open.
        let idle = connect_as(db, "obs-report-tool").await;
        idle.batch_execute("BEGIN; SELECT txid_current();")
            .await
            .unwrap();

        let producing = CancellationToken::new();
        let producer = tokio::spawn(produce(db.client().await, producing.clone()));
        Load {
            endpoint,
            ledger,
            running,
            producer,
            producing,
            rescued,
            metered,
            _idle: idle,
            _http: http,
            http_stop,
        }
    }

    /// Stop producing, let the worker drain, stop it, and check the ledger:
    /// every `send` job ran exactly once, every `flaky` job twice and then
    /// went dead.
    pub async fn finish(self, db: &TestDb) {
        self.producing.cancel();
        let produced = self.producer.await.unwrap();
        eventually("the worker drains the queues", DEADLINE, || async {
            db.scalar::<i64>(
                "SELECT (SELECT count(*) FROM pgwake.jobs WHERE run_at < now() + interval '1 hour')
                      + (SELECT count(*) FROM pgwake.leased_jobs)",
            )
            .await
                == 0
        })
        .await;
        self.running.shutdown().await;
        self.http_stop.cancel();

        let send: Vec<i64> = produced
            .iter()
            .filter(|(_, task)| task == "send")
            .map(|(id, _)| *id)
            .chain([self.rescued])
            .chain(self.metered.iter().copied())
            .collect();
        let flaky: Vec<i64> = produced
            .iter()
            .filter(|(_, task)| task == "flaky")
            .map(|(id, _)| *id)
            .collect();
        let dupes = self.ledger.check(&send);
        let send_set: BTreeSet<i64> = send.iter().copied().collect();
        let twice: Vec<_> = dupes
            .iter()
            .filter(|(id, _)| send_set.contains(id))
            .collect();
        assert!(twice.is_empty(), "send jobs that ran twice: {twice:?}");
        let counts = self.ledger.counts();
        let odd: Vec<_> = flaky
            .iter()
            .filter(|id| counts.get(id) != Some(&2))
            .collect();
        if !odd.is_empty() {
            // Each odd job's runs (the attempt each saw) and where it ended,
            // to tell a lost outcome (runs 1, 1, 2) from a charge too many
            // (one run, then dead) in a log.
            let runs = self.ledger.runs();
            let client = db.client().await;
            let mut report = Vec::new();
            for id in &odd {
                let attempts: Vec<i32> =
                    runs.iter().filter(|(j, _)| j == *id).map(|r| r.1).collect();
                let ended: Vec<String> = client
                    .query(
                        "SELECT format('dead: attempts %s, %s', attempts, last_error) FROM pgwake.dead_jobs WHERE id = $1
                         UNION ALL SELECT format('waiting: attempts %s', attempts) FROM pgwake.jobs WHERE id = $1
                         UNION ALL SELECT format('charged %s', charged) FROM pgwake.tx_attempts WHERE job_id = $1",
                        &[*id],
                    )
                    .await
                    .unwrap()
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                report.push(format!(
                    "job {id}: runs with attempts {attempts:?}; {ended:?}"
                ));
            }
            panic!("flaky jobs not run exactly twice:\n{}", report.join("\n"));
        }
        let dead: i64 = db
            .client()
            .await
            .query_one(
                "SELECT count(*) FROM pgwake.dead_jobs WHERE id = ANY($1) AND attempts = 2",
                &[&flaky],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(dead as usize, flaky.len(), "every flaky job is dead");
        println!(
            "load: {} send jobs, {} flaky jobs, 1 rescued lease",
            send.len() - 1,
            flaky.len()
        );
    }
}

/// Enqueue, every 100 ms until `stop`, a `send` and a `flaky` job (at most
/// 2 attempts) on every queue of [`QUEUES`], and a `send` job on the
/// rate-limited `metered`; returns what it enqueued.
pub async fn produce(
    client: tokio_postgres::Client,
    stop: CancellationToken,
) -> Vec<(i64, String)> {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut produced = Vec::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return produced,
            _ = tick.tick() => {}
        }
        let rows = client
            .query(
                "INSERT INTO pgwake.jobs (queue, task, max_attempts)
                 SELECT q, t, 2 FROM unnest($1::text[]) q, unnest(ARRAY['send', 'flaky']) t
                 UNION ALL SELECT 'metered', 'send', 2
                 RETURNING id, task",
                &[&QUEUES.to_vec()],
            )
            .await
            .unwrap();
        produced.extend(rows.iter().map(|r| (r.get(0), r.get(1))));
    }
}

/// Poll `/metrics` until it exports every name in `wanted`; returns that
/// exposition.
pub async fn until_exported(endpoint: SocketAddr, wanted: &BTreeSet<String>) -> String {
    wait_for_every(
        "the worker to export every metric the dashboard names",
        DEADLINE,
        Duration::from_millis(100),
        async || {
            let (status, text) = http_get(endpoint, "/metrics").await.unwrap();
            assert_eq!(status, 200, "{text}");
            let exported = exported_names(&text);
            let missing: Vec<_> = wanted.difference(&exported).collect();
            if missing.is_empty() {
                Ok(text)
            } else {
                Err(format!("missing {missing:?}\n--- exposition ---\n{text}"))
            }
        },
    )
    .await
}

/// Sample names of a text exposition: the first word of each sample line.
pub fn exported_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}
