//! `pgwake bench --quick --json --mode tx,lease` runs end to end, on its own
//! throwaway cluster (or on the server of `DATABASE_URL`, in a database of
//! its own), and reports every phase, median, ratio and target of both
//! delivery modes as finite numbers. No timing thresholds: the quick sizes
//! measure nothing worth judging.

use std::process::Command;

use serde_json::Value;

/// Targets every mode is held to (tx mode adds its batch-B burn-down).
const MODE_TARGETS: &[&str] = &[
    "burn_down_vs_raw_batch_1",
    "idle_pickup_p50",
    "idle_pickup_p99",
    "producer_trigger_idle_8",
    "producer_trigger_idle_16",
    "producer_trigger_busy_8",
    "producer_trigger_busy_16",
    "backlog_large_vs_small",
    "backlog_large_vs_small_half_future",
    "sustained_drain",
    "sustained_drain_held_transaction",
];

const LATENCIES: &[&str] = &["p50", "p95", "p99", "max"];

const COSTS: &[&str] = &[
    "wal_bytes_per_job",
    "load_wal_bytes_per_job",
    "dead_tuples_per_job",
    "dead_tuples_left_per_job",
    "worker_cpu_s_per_1k_jobs",
    "machine_cpu_s_per_1k_jobs",
    "machine_cpu_busy_pct",
];

#[test]
fn quick_bench_reports_every_phase_and_target_as_finite_numbers() {
    let report = run_quick_bench();

    // serde_json writes NaN and infinities as null: no null anywhere means
    // every number in the report is finite.
    assert_no_nulls(&report, "");
    number(&report, "/elapsed_s");
    number(&report, "/peak_rss_mib");

    let modes = array(&report, "/modes");
    let targets = array(&report, "/targets");
    // Both modes compare batch 1 and the configured batch.
    for (mode, batches) in [("tx", vec![1.0, 100.0]), ("lease", vec![1.0, 100.0])] {
        let m = modes
            .iter()
            .find(|m| m["mode"] == mode)
            .unwrap_or_else(|| panic!("mode {mode} was not measured"));
        check_mode(m, &batches);
        let mut names: Vec<String> = MODE_TARGETS.iter().map(|n| n.to_string()).collect();
        names.push("burn_down_vs_raw_batch_100".into());
        for name in &names {
            check_target(targets, name, Some(mode));
        }
    }
    check_target(targets, "peak_rss", None);
    // Phase 0: each handler kind against its baseline, in the same run;
    // the persistent Python worker twice (against exec Python and the
    // lease no-op: the tests need python3, and run in the checkout).
    let kinds = array(&report, "/handler_kinds");
    assert_eq!(kinds.len(), 7, "{kinds:#?}");
    for k in kinds {
        for f in [
            "/jobs",
            "/jobs_per_s/median",
            "/baseline_jobs_per_s/median",
            "/ratio/median",
        ] {
            assert!(number(k, f) > 0.0, "handler kind {}: {f}", k["kind"]);
        }
    }
    for name in [
        "rust_noop_default_vs_raw",
        "rust_noop_using_tx_vs_raw",
        "rust_noop_lease_vs_raw",
        "sql_noop_vs_raw",
        "exec_true_vs_xargs",
        "persistent_python_vs_exec_python",
        "persistent_python_vs_rust_lease",
    ] {
        check_target(targets, name, None);
    }
    assert!(report["all_targets_pass"].is_boolean());
}

fn check_target(targets: &[Value], name: &str, mode: Option<&str>) {
    let t = targets
        .iter()
        .find(|t| t["name"] == name && t["mode"].as_str() == mode)
        .unwrap_or_else(|| panic!("target {name} ({mode:?}) missing from {targets:#?}"));
    number(t, "/measured");
    number(t, "/threshold");
    assert!(t["pass"].is_boolean(), "target {name} has no pass/fail");
    assert!(
        t["comparison"] == ">=" || t["comparison"] == "<=",
        "target {name}: comparison"
    );
}

fn check_mode(m: &Value, batches: &[f64]) {
    let burns = array(m, "/burn_down");
    let measured: Vec<f64> = burns.iter().map(|b| number(b, "/batch")).collect();
    assert_eq!(measured, batches, "burn-down batches of mode {}", m["mode"]);
    for b in burns {
        for f in [
            "/jobs",
            "/raw_jobs_per_s/median",
            "/worker_jobs_per_s/median",
            "/ratio/median",
        ] {
            number(b, f);
        }
        assert!(
            number(b, "/raw_jobs_per_s/median") > 0.0,
            "raw ceiling measured nothing"
        );
        assert!(
            number(b, "/worker_jobs_per_s/median") > 0.0,
            "burn-down measured nothing"
        );
        for c in COSTS {
            number(b, &format!("/costs/{c}/median"));
        }
        assert!(
            !object(b, "/costs/dead_tuples_per_job_by_table").is_empty(),
            "dead tuples per table"
        );
    }

    for series in ["from_commit_ms", "from_send_ms"] {
        for p in LATENCIES {
            number(m, &format!("/idle_pickup/{series}/{p}/median"));
        }
    }
    assert!(
        m["idle_pickup"]["definition"].is_string(),
        "the pickup figure says what it times"
    );

    let levels = array(m, "/steady_state");
    assert_eq!(levels.len(), 2, "steady state at 50% and 90%");
    for l in levels {
        number(l, "/fraction");
        number(l, "/offered_jobs_per_s");
        number(l, "/inserted_jobs_per_s/median");
        for p in LATENCIES {
            number(l, &format!("/latency_ms/{p}/median"));
        }
    }

    let cells = array(m, "/producers/cells");
    for workers in ["idle", "busy"] {
        for producers in [1.0, 8.0, 16.0] {
            let cell = cells
                .iter()
                .find(|c| c["workers"] == workers && c["producers"].as_f64() == Some(producers))
                .unwrap_or_else(|| {
                    panic!("no producer cell for {producers} producers, workers {workers}")
                });
            for f in [
                "/with_trigger/median",
                "/without_trigger/median",
                "/ratio/median",
            ] {
                number(cell, f);
            }
        }
    }

    let variants = array(m, "/backlog/variants");
    assert_eq!(
        variants.len(),
        4,
        "small and large backlog, all ready and half in the future"
    );
    for v in variants {
        number(v, "/waiting");
        number(v, "/drained");
        number(v, "/jobs_per_s/median");
    }
    number(m, "/backlog/large_vs_small/median");
    number(m, "/backlog/large_vs_small_half_future/median");

    let drains = array(m, "/long_drain");
    assert_eq!(
        drains.len(),
        2,
        "long drain without and with a held transaction"
    );
    for d in drains {
        for f in [
            "/backlog",
            "/window_s",
            "/first_jobs_per_s",
            "/last_jobs_per_s",
            "/ratio",
        ] {
            number(d, f);
        }
        assert!(d["held_transaction"].is_boolean());
        for (i, _) in array(d, "/curve_jobs_per_s").iter().enumerate() {
            number(d, &format!("/curve_jobs_per_s/{i}"));
        }
    }
}

fn run_quick_bench() -> Value {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pgwake"));
    cmd.args(["bench", "--quick", "--json", "--mode", "tx,lease"])
        .env("RUST_LOG", "warn");
    if let Ok(url) = std::env::var("DATABASE_URL") {
        cmd.args(["--database-url", &url]);
    }
    let out = cmd.output().expect("run pgwake bench");
    assert!(
        out.status.success(),
        "pgwake bench --quick --json --mode tx,lease failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON object ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn number(v: &Value, pointer: &str) -> f64 {
    let x = v
        .pointer(pointer)
        .unwrap_or_else(|| panic!("{pointer} missing"))
        .as_f64()
        .unwrap_or_else(|| panic!("{pointer} is not a number"));
    assert!(x.is_finite(), "{pointer} is not finite: {x}");
    x
}

fn array<'a>(v: &'a Value, pointer: &str) -> &'a Vec<Value> {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("{pointer} is not an array"))
}

fn object<'a>(v: &'a Value, pointer: &str) -> &'a serde_json::Map<String, Value> {
    v.pointer(pointer)
        .and_then(Value::as_object)
        .unwrap_or_else(|| panic!("{pointer} is not an object"))
}

fn assert_no_nulls(v: &Value, path: &str) {
    match v {
        Value::Null => panic!("{path} is null (a NaN or infinite number?)"),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                assert_no_nulls(item, &format!("{path}/{i}"));
            }
        }
        Value::Object(fields) => {
            for (k, item) in fields {
                assert_no_nulls(item, &format!("{path}/{k}"));
            }
        }
        _ => {}
    }
}
