//! What operators see of persistent handler processes: each worker's
//! processes in the registry (live of configured, in flight of their room,
//! restarts, jobs waiting for a free process), `pgwake explain` naming a
//! full pool as what a started job may wait for, and the console's Workers
//! page showing them with the command escaped.

use std::time::Duration;

use crate::common::*;
use crate::support::*;

use pgwake::admin::workers::ProcessPool;
use pgwake::client::{enqueue, NewJob};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The registry renews every 10 s: a change shows within two renewals.
const RENEWED: Duration = Duration::from_secs(30);

/// The processes the registry has for the only worker.
async fn registered(db: &TestDb) -> Vec<ProcessPool> {
    let client = db.client().await;
    let workers = pgwake::admin::workers::list(&client).await.unwrap();
    workers
        .into_iter()
        .find(|w| w.live)
        .map(|w| w.processes)
        .unwrap_or_default()
}

#[tokio::test]
async fn the_registry_shows_each_pool_once_with_its_processes_and_restarts() {
    let db = migrated_db().await;
    // A copy of its own, so that the process killed below is this test's.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("registry-worker.py");
    std::fs::copy(example("worker.py"), &script).unwrap();
    let command = format!("python3 {} --inflight 3", script.display());
    let w = Running::start(worker(
        &db,
        &command,
        &["echo", "sleep"],
        &[],
        options(2),
        test_config(),
    ));
    // Two tasks on one command: one pool, listed once with both.
    let pools = wait_for("the registry to list the processes", RENEWED, async || {
        let p = registered(&db).await;
        match p.as_slice() {
            [one] if one.live == 2 => Ok(p),
            _ => Err(format!("{p:?}")),
        }
    })
    .await;
    let p = &pools[0];
    assert_eq!(p.command, command);
    assert_eq!(p.tasks, ["echo", "sleep"]);
    assert_eq!((p.processes, p.capacity, p.in_flight), (2, 6, 0));
    assert_eq!((p.restarts, p.waiting), (0, 0));
    // A process killed is restarted, and the registry counts it.
    let pid = children("registry-worker.py")[0];
    unsafe { libc::kill(pid, libc::SIGKILL) };
    wait_for("the restart in the registry", RENEWED, async || {
        let p = registered(&db).await;
        match p.as_slice() {
            [one] if one.restarts == 1 && one.live == 2 => Ok(()),
            _ => Err(format!("{p:?}")),
        }
    })
    .await;
    w.shutdown().await;
}

#[tokio::test]
async fn a_started_job_waiting_for_a_free_process_is_explained_as_such() {
    let db = migrated_db().await;
    let client = db.client().await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        ids.push(
            enqueue(&client, &NewJob::new("sleep", json!({"secs": 120})))
                .await
                .unwrap(),
        );
    }
    // Two slots, one process taking one job at once: one job runs on it,
    // the other is started by the worker and waits for the process.
    let config = pgwake::WorkerConfig {
        concurrency: 2,
        grace_period: Duration::from_millis(500),
        ..test_config()
    };
    let w = Running::start(worker(
        &db,
        &python_worker("--inflight 1"),
        &["sleep"],
        &[],
        options(1),
        config,
    ));
    for id in &ids {
        until_running(&db, *id).await;
    }
    let detail = wait_for("explain to name the full pool", RENEWED, async || {
        let reasons = pgwake::admin::jobs::explain(&client, ids[1]).await.unwrap();
        let kinds: Vec<&str> = reasons.iter().map(|r| r.reason.as_str()).collect();
        match kinds.as_slice() {
            ["running", "process_wait"] => Ok(reasons[1].detail.clone()),
            _ => Err(format!("{reasons:?}")),
        }
    })
    .await;
    assert!(detail.contains("had 1 job(s) waiting"), "{detail}");
    assert!(detail.contains("1 of 1 processes live"), "{detail}");
    assert!(detail.contains("1 of 1 in-flight places taken"), "{detail}");
    assert!(detail.contains("--processes"), "{detail}");
    // The registry says it too.
    let p = registered(&db).await;
    assert_eq!((p[0].waiting, p[0].in_flight, p[0].capacity), (1, 1, 1));
    w.shutdown().await;
}

/// The same in tx mode: each job's claim transaction holds it while it
/// waits for the process, and explain finds the worker from the batch's
/// mark (or, before the mark, from the holding session). Fails without the
/// tx branch's process_wait (only `running`).
#[tokio::test]
async fn a_tx_mode_job_waiting_for_a_free_process_is_explained_as_such() {
    let db = migrated_db().await;
    let client = db.client().await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        ids.push(
            enqueue(&client, &NewJob::new("sleep", json!({"secs": 120})))
                .await
                .unwrap(),
        );
    }
    let config = pgwake::WorkerConfig {
        concurrency: 2,
        grace_period: Duration::from_millis(500),
        ..test_config()
    };
    let w = Running::start(worker(
        &db,
        &python_worker("--inflight 1"),
        &["sleep"],
        &["sleep"],
        options(1),
        config,
    ));
    // Both claimed (tx mode: no lease row), one on the process.
    for id in &ids {
        let detail = wait_for("explain to name the full pool", RENEWED, async || {
            let reasons = pgwake::admin::jobs::explain(&client, *id).await.unwrap();
            let kinds: Vec<&str> = reasons.iter().map(|r| r.reason.as_str()).collect();
            match kinds.as_slice() {
                ["running", "process_wait"] if reasons[0].detail.contains("tx mode") => {
                    Ok(reasons[1].detail.clone())
                }
                _ => Err(format!("{reasons:?}")),
            }
        })
        .await;
        assert!(detail.contains("had 1 job(s) waiting"), "{detail}");
        assert!(detail.contains("1 of 1 in-flight places taken"), "{detail}");
    }
    w.shutdown().await;
}

#[tokio::test]
async fn a_job_on_a_pool_with_room_is_not_explained_as_waiting() {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(&client, &NewJob::new("sleep", json!({"secs": 120})))
        .await
        .unwrap();
    let config = pgwake::WorkerConfig {
        concurrency: 2,
        grace_period: Duration::from_millis(500),
        ..test_config()
    };
    let w = Running::start(worker(
        &db,
        &python_worker("--inflight 1"),
        &["sleep"],
        &[],
        options(1),
        config,
    ));
    until_running(&db, id).await;
    wait_for(
        "the registry to show the job in flight",
        RENEWED,
        async || {
            let p = registered(&db).await;
            match p.as_slice() {
                [one] if one.in_flight == 1 => Ok(()),
                _ => Err(format!("{p:?}")),
            }
        },
    )
    .await;
    let reasons = pgwake::admin::jobs::explain(&client, id).await.unwrap();
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert_eq!(reasons[0].reason, "running");
    w.shutdown().await;
}

/// `GET path` of a console at `addr`; the body.
async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut raw))
        .await
        .expect("the console answers within 30 s")
        .unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    raw
}

#[tokio::test]
async fn the_workers_page_shows_the_processes_with_the_command_escaped() {
    let db = migrated_db().await;
    // A command whose name is markup: the page must show it as text.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("<img src=x onerror=alert(1)>.py");
    std::fs::copy(example("worker.py"), &script).unwrap();
    let command = format!("python3 '{}' --inflight 2", script.display());
    let w = Running::start(worker(
        &db,
        &command,
        &["echo"],
        &[],
        options(2),
        test_config(),
    ));
    let listener = pgwake::console::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let (addr, _task) = pgwake::console::serve_on(
        listener,
        pgwake::console::pool(&db.config()).unwrap(),
        pgwake::console::ConsoleConfig::default(),
        stop.clone(),
    )
    .unwrap();
    let body = wait_for(
        "the Workers page to show the processes",
        RENEWED,
        async || {
            let body = get(addr, "/workers").await;
            if body.contains("2 / 2 live") {
                Ok(body)
            } else {
                Err(body)
            }
        },
    )
    .await;
    assert!(body.contains("0 / 4 in flight"), "{body}");
    assert!(body.contains("0 restarts"), "{body}");
    assert!(
        body.contains("&lt;img src=x onerror=alert(1)&gt;.py"),
        "the command, escaped: {body}"
    );
    assert!(!body.contains("<img"), "no markup from the command: {body}");
    stop.cancel();
    w.shutdown().await;
}
