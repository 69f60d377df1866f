//! `pgwake demo`: a place to look around. It keeps its throwaway cluster
//! and worker until one Ctrl-C, says how to reach them from another
//! terminal, and summarises every queue.

use crate::common;

use std::io::{BufRead, Read, Write};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;

/// Collect the child's stdout as it is written.
fn tail_stdout(child: &mut std::process::Child) -> Arc<Mutex<String>> {
    let out = Arc::new(Mutex::new(String::new()));
    let o = out.clone();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let mut o = o.lock().unwrap();
            o.push_str(&line);
            o.push('\n');
        }
    });
    out
}

/// The value after `key` on the first line that has it, up to whitespace.
fn value_after(text: &str, key: &str) -> String {
    let i = text
        .find(key)
        .unwrap_or_else(|| panic!("no {key:?} in {text}"))
        + key.len();
    text[i..].split_whitespace().next().unwrap().to_string()
}

fn http_get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body
}

#[tokio::test]
async fn the_demo_stays_up_until_one_ctrl_c_and_says_how_to_look_around() {
    // A port that was free a moment ago, for --ui-addr (the default, 9190,
    // falls back to a free port when taken: it would not show the flag).
    let ui_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let ui_addr = format!("127.0.0.1:{ui_port}");
    let mut child = pgwake_cmd()
        .args([
            "demo",
            "--metrics-addr",
            "127.0.0.1:0",
            "--ui-addr",
            &ui_addr,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = tail_stdout(&mut child);
    let o = out.clone();
    eventually("every demo job resolved", Duration::from_secs(120), || {
        let o = o.clone();
        async move { o.lock().unwrap().contains("Ctrl-C to stop") }
    })
    .await;
    let text = out.lock().unwrap().clone();
    // The summary covers every queue the demo uses.
    let summary = &text[text.find("per queue").expect("a per-queue summary")..];
    for queue in ["default", "email"] {
        assert!(
            summary.lines().any(|l| l.trim_start().starts_with(queue)),
            "{queue} missing from the summary: {summary}"
        );
    }
    // What it tells the user to try from another terminal works, while the
    // demo keeps running.
    let url = value_after(&text, "DATABASE_URL=")
        .trim_matches('\'')
        .to_string();
    for cmd in ["pgwake stats", "pgwake dead list", "curl"] {
        assert!(text.contains(cmd), "{cmd} not suggested: {text}");
    }
    let o = pgwake_cmd()
        .env("DATABASE_URL", &url)
        .args(["dead", "list"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("sync_crm"));
    let metrics_url = value_after(&text, "curl -s http://");
    let addr = metrics_url.split('/').next().unwrap().to_string();
    let metrics = http_get(&addr, "/metrics");
    assert!(metrics.contains("pgwake_jobs_total"), "{metrics}");
    // The console it prints is on --ui-addr and serves the overview.
    // Teeth: without --ui-addr the console is on 9190 (or a free port).
    let console = value_after(&text, "console (read-only) at http://");
    let console = console.trim_end_matches('/');
    assert_eq!(console, ui_addr);
    // Its URL is shown for a browser, not as macOS's `open` (no such
    // command on Linux, where `open` is openvt). Teeth: the line
    // `open http://…` it printed before.
    let advice = &text[text.find("up until Ctrl-C").unwrap()..];
    assert!(
        advice
            .lines()
            .any(|l| l.trim() == format!("http://{ui_addr}/")),
        "{advice}"
    );
    assert!(
        !advice.lines().any(|l| l.trim_start().starts_with("open ")),
        "{advice}"
    );
    let page = http_get(console, "/");
    assert!(page.contains("<title>Overview"), "{page}");
    assert!(page.contains("Live workers"), "{page}");
    assert!(
        child.try_wait().unwrap().is_none(),
        "the demo is still running"
    );

    // One Ctrl-C stops it.
    send_signal(&child, libc::SIGINT);
    let o = wait_exit(child, Duration::from_secs(60)).await;
    assert_eq!(o.status.code(), Some(0));
    let text = out.lock().unwrap().clone();
    let after = &text[text.find("Ctrl-C to stop").unwrap()..];
    assert!(
        !after.contains("pgwake dead list"),
        "no advice about a cluster that is gone: {after}"
    );
}

/// `--ui-addr` is the user's choice: taken, it stops the demo with the
/// fix instead of moving the console elsewhere; off loopback without
/// PGWAKE_UI_TOKEN, it is refused as `pgwake ui` refuses it. Both before a
/// cluster starts. Teeth: with the flag ignored, the demo starts.
#[test]
fn a_taken_or_open_ui_addr_stops_the_demo_before_it_starts_a_cluster() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    for (ui_addr, expect) in [
        (addr.as_str(), format!("--ui-addr {addr}: cannot listen")),
        ("0.0.0.0:0", "PGWAKE_UI_TOKEN".to_string()),
    ] {
        let o = pgwake_cmd()
            .env_remove("PGWAKE_UI_TOKEN")
            .args([
                "demo",
                "--metrics-addr",
                "127.0.0.1:0",
                "--ui-addr",
                ui_addr,
            ])
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{ui_addr}: {e}");
        assert!(e.contains(&expect), "{ui_addr}: {e}");
        assert!(
            !String::from_utf8_lossy(&o.stdout).contains("starting a throwaway PostgreSQL"),
            "checked before the start-up work"
        );
    }
}

#[test]
fn a_taken_metrics_port_stops_the_demo_before_it_starts_a_cluster() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let o = pgwake_cmd()
        .args(["demo", "--metrics-addr", &addr])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("--metrics-addr") && e.contains(&addr), "{e}");
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("starting a throwaway PostgreSQL"),
        "checked before the start-up work"
    );
}

/// On the user's own database (`--database-url`) the demo touches only its
/// own jobs: they go into its own queues (`pgwake-demo`,
/// `pgwake-demo-email`), and its worker claims from those alone, so a real
/// job enqueued meanwhile — even of a task the demo's fake handlers know,
/// in a queue the demo uses on its own cluster — waits untouched.
#[tokio::test]
async fn on_the_users_database_the_demo_touches_only_its_own_jobs() {
    let db = migrated_db().await;
    let mut child = pgwake_cmd()
        .args([
            "demo",
            "--metrics-addr",
            "127.0.0.1:0",
            "--database-url",
            &db.url,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = tail_stdout(&mut child);
    let o = out.clone();
    eventually("every demo job resolved", Duration::from_secs(120), || {
        let o = o.clone();
        async move { o.lock().unwrap().contains("Ctrl-C to stop") }
    })
    .await;
    let c = db.client().await;
    let mut real = Vec::new();
    for (task, queue) in [("resize_image", "default"), ("send_email", "email")] {
        real.push(
            pgwake::client::enqueue(
                &c,
                &pgwake::client::NewJob::new(task, serde_json::json!({"real": true})).queue(queue),
            )
            .await
            .unwrap(),
        );
    }
    // A job of the demo's own queue, enqueued after the real ones: once the
    // demo reports it, it has seen the notifications of the real ones too.
    let marker = pgwake::client::enqueue(
        &c,
        &pgwake::client::NewJob::new("resize_image", serde_json::json!({})).queue("pgwake-demo"),
    )
    .await
    .unwrap();
    let o = out.clone();
    eventually(
        "the demo ran its own new job",
        Duration::from_secs(60),
        || {
            let o = o.clone();
            let needle = format!("job {marker:>3} ");
            async move { o.lock().unwrap().contains(&needle) }
        },
    )
    .await;
    send_signal(&child, libc::SIGINT);
    let o = wait_exit(child, Duration::from_secs(60)).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    for id in real {
        let attempts: i32 = c
            .query_one("SELECT attempts FROM pgwake.jobs WHERE id = $1", &[&id])
            .await
            .unwrap()
            .get(0);
        assert_eq!(attempts, 0, "the real job {id} was touched");
    }
    let foreign: i64 = db
        .scalar(
            "SELECT (SELECT count(*) FROM pgwake.dead_jobs WHERE queue NOT LIKE 'pgwake-demo%')
                  + (SELECT count(*) FROM pgwake.jobs WHERE queue NOT LIKE 'pgwake-demo%' AND payload->>'real' IS NULL)",
        )
        .await;
    assert_eq!(foreign, 0, "the demo's jobs stay in its own queues");
}
