//! Producers in other languages, with their own drivers: Python's psycopg2
//! (libpq underneath, client-side parameter interpolation) and psql's
//! `\copy` bulk load. They use only what the README shows — a plain
//! `INSERT`, `pgwake.enqueue(…)` with named arguments, `COPY` — and every job
//! they add runs exactly once, its payload reaching the handler digit for
//! digit.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

const LONG: Duration = Duration::from_secs(60);

/// Debian's Python, where apt's `python3-psycopg2` lands (`.ci/deps`).
const PYTHON: &str = "/usr/bin/python3";

const PRODUCER: &str = r#"
import sys, psycopg2
conn = psycopg2.connect(sys.argv[1])
cur = conn.cursor()
ids = []
# A plain INSERT, payload as JSON text (big numbers stay text end to end).
for i in range(5):
    cur.execute(
        "INSERT INTO pgwake.jobs (task, payload) VALUES (%s, %s::jsonb) RETURNING id",
        ("keep", '{"i": %d, "big": 12345678901234567890123, "dec": 0.10000000000000000001}' % i),
    )
    ids.append(cur.fetchone()[0])
# The SQL function with named arguments, in one transaction with the INSERTs.
cur.execute(
    "SELECT pgwake.enqueue(task => %s, payload => %s::jsonb, queue => %s, max_attempts => %s)",
    ("keep", '{"named": "é ✓ \\u0001"}', "py", 3),
)
ids.append(cur.fetchone()[0])
conn.commit()
print(" ".join(str(i) for i in ids))
"#;

fn have_psycopg2() -> bool {
    Command::new(PYTHON)
        .args(["-c", "import psycopg2"])
        .status()
        .is_ok_and(|s| s.success())
}

fn written(dir: &Path, id: i64) -> Result<String, String> {
    std::fs::read_to_string(dir.join(id.to_string())).map_err(|e| e.to_string())
}

#[tokio::test]
async fn a_python_producer_and_a_psql_bulk_load_are_each_run_once_exactly() {
    assert!(
        have_psycopg2(),
        "{PYTHON} lacks psycopg2: run the tests through .ci/test, which installs python3-psycopg2"
    );
    let db = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let handler = format!(
        "keep=exec:sh -c 'cat >> {}/$PGWAKE_JOB_ID'",
        dir.path().display()
    );
    let mut worker = spawn_pgwake_run(&db.url, &["--handler", &handler]);

    let out = Command::new(PYTHON)
        .args(["-c", PRODUCER, &db.url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python producer: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids: Vec<i64> = String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(ids.len(), 6);

    // psql's \copy: a bulk load of 200 jobs in one statement.
    let rows: String = (0..200)
        .map(|i| format!("keep\t{{\"copied\": {i}}}\n"))
        .collect();
    let mut psql = Command::new("psql")
        .args([
            &db.url,
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            r"\copy pgwake.jobs (task, payload) FROM STDIN",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    psql.stdin
        .take()
        .unwrap()
        .write_all(rows.as_bytes())
        .unwrap();
    let copied = psql.wait_with_output().unwrap();
    assert!(
        copied.status.success(),
        "psql \\copy: {}",
        String::from_utf8_lossy(&copied.stderr)
    );

    eventually("every job done", LONG, || async {
        let left: i64 = db
            .scalar("SELECT (SELECT count(*) FROM pgwake.jobs) + (SELECT count(*) FROM pgwake.leased_jobs)")
            .await;
        left == 0
    })
    .await;
    send_signal(&worker, libc::SIGTERM);
    assert!(worker.wait().unwrap().success());

    let dead: i64 = db.scalar("SELECT count(*) FROM pgwake.dead_jobs").await;
    assert_eq!(dead, 0);
    // Each job ran once (its file holds one payload) and got it exactly.
    for (i, id) in ids[..5].iter().enumerate() {
        let got = written(dir.path(), *id).unwrap();
        assert_eq!(
            got,
            format!(
                r#"{{"i": {i}, "big": 12345678901234567890123, "dec": 0.10000000000000000001}}"#
            ),
            "job {id}"
        );
    }
    let named = written(dir.path(), ids[5]).unwrap();
    assert_eq!(named, r#"{"named": "é ✓ \u0001"}"#);
    let files = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(files, 206, "one file per job");
    let mut copied_seen = 0;
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        if text.starts_with(r#"{"copied": "#) {
            assert_eq!(text.matches("copied").count(), 1, "ran once: {text}");
            copied_seen += 1;
        }
    }
    assert_eq!(copied_seen, 200);
}
