//! A real Prometheus for a test, and `promtool`: the server started on a
//! free port, scraping one target and loading rule files; its HTTP API;
//! waits until it scrapes, until every dashboard expression has data, until
//! the alert rules evaluate.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::common::wait::wait_for_every;
use super::dashboard::{Dashboard, Query};
use super::http::http_get;
use super::DEADLINE;

/// Prometheus scrapes (and evaluates rules) this often.
pub const SCRAPE_INTERVAL: &str = "1s";

/// An installed tool, or a failure that says how to install it.
pub fn tool(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not installed: these tests need Prometheus and promtool \
                 (Debian/Ubuntu: `apt-get install prometheus`; .ci/run installs them)"
            )
        })
}

/// Run `promtool check metrics` on `text`: (exit status ok, findings).
pub fn promtool_check_metrics(text: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new(tool("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), findings.trim().to_string())
}

/// A Prometheus server started for one test; killed on drop.
pub struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Start Prometheus on a free loopback port, scraping `target` every
    /// [`SCRAPE_INTERVAL`] and loading `rule_files`; wait until it is ready.
    pub async fn start(target: SocketAddr, rule_files: &[PathBuf]) -> Prometheus {
        let binary = tool("prometheus");
        let rules: String = rule_files
            .iter()
            .map(|p| format!("  - {:?}\n", p.display().to_string()))
            .collect();
        let config = format!(
            "global:\n  scrape_interval: {SCRAPE_INTERVAL}\n  scrape_timeout: {SCRAPE_INTERVAL}\n  \
             evaluation_interval: {SCRAPE_INTERVAL}\n\
             rule_files:\n{rules}\
             scrape_configs:\n  - job_name: pgwake\n    static_configs:\n      \
             - targets: [\"{target}\"]\n"
        );
        // The port is free when picked; another process may take it before
        // Prometheus binds it, so a failed start tries another.
        for _ in 0..3 {
            let dir = tempfile::tempdir().unwrap();
            let config_file = dir.path().join("prometheus.yml");
            std::fs::write(&config_file, &config).unwrap();
            let addr = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .unwrap();
            let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
            let child = Command::new(&binary)
                .arg(format!("--config.file={}", config_file.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
            let mut prometheus = Prometheus { child, addr, dir };
            if prometheus.until_ready().await {
                return prometheus;
            }
        }
        panic!("Prometheus did not start (three ports tried)");
    }

    /// Wait for `/-/ready`; false if the process exited first.
    pub async fn until_ready(&mut self) -> bool {
        let exited = wait_for_every(
            "Prometheus to be ready",
            DEADLINE,
            Duration::from_millis(100),
            async || {
                if let Some(status) = self.child.try_wait().unwrap() {
                    return Ok(Some(status));
                }
                match http_get(self.addr, "/-/ready").await {
                    Ok((200, _)) => Ok(None),
                    _ => Err(self.log()),
                }
            },
        )
        .await;
        if let Some(status) = exited {
            eprintln!("prometheus exited ({status}):\n{}", self.log());
        }
        exited.is_none()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET /api/v1/<path>`: the `data` of a successful answer.
    pub async fn api(&self, path: &str) -> Value {
        let (status, body) = http_get(self.addr, &format!("/api/v1/{path}"))
            .await
            .unwrap();
        let json: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("GET /api/v1/{path}: {status} {e}: {body}"));
        assert_eq!(json["status"], "success", "GET /api/v1/{path}: {body}");
        json["data"].clone()
    }

    /// An instant query's result: vector samples as (labels, value).
    pub async fn query(&self, expr: &str) -> Vec<(Value, String)> {
        let data = self
            .api(&format!("query?query={}", percent_encode(expr)))
            .await;
        let value = |v: &Value| v[1].as_str().unwrap_or_default().to_string();
        match data["resultType"].as_str() {
            Some("vector") => data["result"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| (s["metric"].clone(), value(&s["value"])))
                .collect(),
            Some("scalar") => vec![(Value::Null, value(&data["result"]))],
            other => panic!("{expr}: unexpected result type {other:?}"),
        }
    }

    /// Wait until Prometheus scrapes the worker successfully.
    pub async fn until_up(&self) {
        wait_for_every(
            "Prometheus to scrape the worker",
            DEADLINE,
            Duration::from_millis(200),
            async || {
                let up = self.query(r#"up{job="pgwake"}"#).await;
                if up.iter().any(|(_, v)| v == "1") {
                    return Ok(());
                }
                let targets = self.api("targets").await;
                Err(format!("{up:?}\n{targets}\n{}", self.log()))
            },
        )
        .await
    }

    /// Query every dashboard expression until each returns a non-empty
    /// result without NaN; returns how many were checked.
    pub async fn until_dashboard_has_data(&self, dashboard: &Dashboard) -> usize {
        let queries = dashboard.queries();
        wait_for_every(
            "every dashboard expression to have data",
            DEADLINE,
            Duration::from_millis(500),
            async || {
                let mut failures = Vec::new();
                for (title, query) in &queries {
                    if let Err(why) = self.check(query).await {
                        failures.push(format!("{title}: {why}"));
                    }
                }
                if failures.is_empty() {
                    return Ok(queries.len());
                }
                Err(format!(
                    "{} of {} dashboard expressions have no data:\n{}",
                    failures.len(),
                    queries.len(),
                    failures.join("\n")
                ))
            },
        )
        .await
    }

    pub async fn check(&self, query: &Query) -> Result<(), String> {
        match query {
            Query::Expr(expr) => {
                let result = self.query(expr).await;
                if result.is_empty() {
                    return Err(format!("{expr} -> empty"));
                }
                let nan = |(_, v): &&(Value, String)| v.eq_ignore_ascii_case("nan");
                // A quantile of a histogram that saw nothing in the window
                // is NaN (a queue or task the worker knows, idle): every
                // series exists from start-up at 0. Such an expression
                // needs one series with data; any other NaN is a mistake.
                let bad = if expr.contains("histogram_quantile") {
                    result.iter().all(|r| nan(&r))
                } else {
                    result.iter().any(|r| nan(&r))
                };
                if bad {
                    return Err(format!("{expr} -> NaN in {result:?}"));
                }
            }
            Query::LabelOf { metric, label } => {
                let result = self.query(metric).await;
                if result.is_empty() || result.iter().any(|(m, _)| m[label.as_str()].is_null()) {
                    return Err(format!(
                        "{metric} has no series with label {label}: {result:?}"
                    ));
                }
            }
            Query::LabelValues(label) => {
                let values = self.api(&format!("label/{label}/values")).await;
                if values.as_array().is_none_or(|v| v.is_empty()) {
                    return Err(format!("label {label} has no values"));
                }
            }
        }
        Ok(())
    }

    /// Wait until every alert rule has been evaluated, and check that none
    /// failed.
    pub async fn until_rules_evaluate_cleanly(&self) {
        wait_for_every(
            "every alert rule to be evaluated",
            DEADLINE,
            Duration::from_millis(200),
            async || {
                let groups = self.api("rules").await;
                let rules: Vec<&Value> = groups["groups"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|g| g["rules"].as_array().into_iter().flatten())
                    .collect();
                assert!(!rules.is_empty(), "no rules loaded: {groups}");
                let failed: Vec<_> = rules.iter().filter(|r| r["health"] == "err").collect();
                assert!(
                    failed.is_empty(),
                    "alert rules fail to evaluate: {failed:?}"
                );
                if rules.iter().all(|r| r["health"] == "ok") {
                    Ok(())
                } else {
                    Err(groups.to_string())
                }
            },
        )
        .await
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Percent-encode a query parameter (RFC 3986 unreserved characters stay).
pub fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
