//! Failover: a multi-host connection string with
//! `target_session_attrs=read-write`, a real streaming standby made with
//! `pg_basebackup`, and the primary stopped and the standby promoted while
//! the worker runs and a producer keeps inserting. The worker (pool and
//! listener) follows the new primary; every job whose insert committed runs.

use crate::common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::embedded::{Cluster, ClusterOptions};
use common::*;
use pgwake::Worker;

fn multi_host_url(a: &Cluster, b: &Cluster) -> String {
    // key=value: the URL form takes a socket directory in `?host=` as one
    // path, commas and all.
    format!(
        "host={},{} port={},{} user=postgres dbname=postgres target_session_attrs=read-write connect_timeout=2",
        a.socket_dir().display(),
        b.socket_dir().display(),
        a.port(),
        b.port()
    )
}

#[tokio::test]
async fn the_worker_follows_a_promoted_standby_and_loses_nothing() {
    let primary = tokio::task::spawn_blocking(|| {
        Cluster::start_with(ClusterOptions {
            durable: true,
            ..ClusterOptions::default()
        })
    })
    .await
    .unwrap()
    .expect("start the primary");
    {
        let mut c = pgwake::connect::connect(
            &pgwake::connect::parse_url(&primary.url("postgres")).unwrap(),
        )
        .await
        .unwrap();
        pgwake::admin::schema::migrate(&mut c).await.unwrap();
    }
    let (primary, standby) = tokio::task::spawn_blocking(move || {
        let standby = primary.start_standby().expect("pg_basebackup a standby");
        (primary, standby)
    })
    .await
    .unwrap();
    let url = multi_host_url(&primary, &standby);
    let db = pgwake::connect::parse_url(&url).unwrap();
    if let Err(e) = pgwake::connect::connect(&db).await {
        panic!("multi-host connect: {e} ({db:?})");
    }

    let ledger = Ledger::default();
    let worker = Worker::builder(db.clone())
        .config(pgwake::WorkerConfig {
            poll_interval: Duration::from_millis(500),
            ..test_config()
        })
        .handler("t", ok_handler(&ledger))
        .build()
        .unwrap();
    let w = Running::start(worker);
    w.until_listening().await;

    // A producer that keeps inserting through the same multi-host string,
    // reconnecting after errors; it records the ids whose insert committed.
    let committed: Arc<Mutex<Vec<i64>>> = Arc::default();
    let stop_producing = tokio_util::sync::CancellationToken::new();
    let producer = {
        let committed = committed.clone();
        let stop = stop_producing.clone();
        let db = db.clone();
        tokio::spawn(async move {
            let mut client: Option<tokio_postgres::Client> = None;
            while !stop.is_cancelled() {
                if client.as_ref().is_none_or(|c| c.is_closed()) {
                    client = pgwake::connect::connect(&db).await.ok();
                }
                if let Some(c) = &client {
                    match c.query_one("SELECT pgwake.enqueue('t')", &[]).await {
                        Ok(row) => committed.lock().unwrap().push(row.get(0)),
                        Err(_) => client = None,
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let committed_count = || committed.lock().unwrap().len();
    eventually(
        "jobs flowing through the primary",
        Duration::from_secs(30),
        || async { committed_count() >= 50 && ledger.runs().len() >= 20 },
    )
    .await;

    // Fail over: the primary goes away, the standby is promoted.
    let before = committed_count();
    let (primary, standby) = tokio::task::spawn_blocking(move || {
        primary.stop("fast").expect("stop the primary");
        standby.promote().expect("promote the standby");
        (primary, standby)
    })
    .await
    .unwrap();
    eventually(
        "the producer writing to the new primary",
        Duration::from_secs(60),
        || async { committed_count() >= before + 50 },
    )
    .await;
    stop_producing.cancel();
    producer.await.unwrap();

    let expected: Vec<i64> = committed.lock().unwrap().clone();
    eventually(
        "every committed job ran",
        Duration::from_secs(90),
        || async {
            let ran: HashSet<i64> = ledger.runs().iter().map(|(id, _)| *id).collect();
            expected.iter().all(|id| ran.contains(id))
        },
    )
    .await;
    ledger.check(&expected);
    // The worker's sessions are on the promoted standby, listener included.
    let admin =
        pgwake::connect::connect(&pgwake::connect::parse_url(&standby.url("postgres")).unwrap())
            .await
            .unwrap();
    let listening: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgwake-listener'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(listening, 1);
    let left: i64 = admin
        .query_one("SELECT count(*) FROM pgwake.jobs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
    w.stop.cancel();
    w.join.await.unwrap().unwrap();
    drop(primary);
}
