//! The bench's result: every figure, the targets it is held to (PASS/FAIL),
//! rendered as a table or one JSON object.

use std::fmt::Write;
use std::time::Duration;

use serde::Serialize;

use super::backlog::Backlog;
use super::burn::BurnDown;
pub(crate) use super::database::ServerInfo;
use super::drain::LongDrain;
use super::handlers::PERSISTENT_KIND;
use super::mode::Mode;
use super::pickup::IdlePickup;
use super::producers::Producers;
use super::steady::SteadyLevel;
use super::Plan;
use pgwake::error::{Error, Result};

/// Everything measured for one delivery mode.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ModeReport {
    /// The mode.
    #[serde(serialize_with = "mode_name")]
    pub mode: Mode,
    /// Phases 1, 2 and 7: raw ceiling, burn-down and costs, per batch.
    pub burn_down: Vec<BurnDown>,
    /// Phase 3.
    pub idle_pickup: IdlePickup,
    /// Phase 4, per offered rate.
    pub steady_state: Vec<SteadyLevel>,
    /// Phase 5.
    pub producers: Producers,
    /// Phase 6a.
    pub backlog: Backlog,
    /// Phase 6b, without and with a held transaction.
    pub long_drain: Vec<LongDrain>,
}

fn mode_name<S: serde::Serializer>(mode: &Mode, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(mode.as_str())
}

/// The sizes the bench ran with.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Settings {
    runs: usize,
    concurrency: usize,
    batch: usize,
    jobs: u64,
    backlog_small: u64,
    backlog_large: u64,
    duration_s: f64,
    pickup_samples: usize,
    producers: Vec<usize>,
    quick: bool,
}

/// One target and whether it was met.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Target {
    /// Stable name, e.g. `burn_down_vs_raw_batch_1`.
    pub name: String,
    /// The mode it was measured in (absent: the whole process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<&'static str>,
    /// What it says, for a person.
    pub description: String,
    /// The measured value.
    pub measured: f64,
    /// `>=` or `<=`.
    pub comparison: &'static str,
    /// The bound.
    pub threshold: f64,
    /// Unit of `measured` and `threshold`.
    pub unit: &'static str,
    /// Whether the target is met.
    pub pass: bool,
}

impl Target {
    fn at_least(
        name: String,
        mode: Option<Mode>,
        description: String,
        measured: f64,
        threshold: f64,
        unit: &'static str,
    ) -> Target {
        Target {
            name,
            mode: mode.map(Mode::as_str),
            description,
            pass: measured >= threshold,
            measured,
            comparison: ">=",
            threshold,
            unit,
        }
    }

    fn at_most(
        name: String,
        mode: Option<Mode>,
        description: String,
        measured: f64,
        threshold: f64,
        unit: &'static str,
    ) -> Target {
        Target {
            pass: measured <= threshold,
            comparison: "<=",
            ..Target::at_least(name, mode, description, measured, threshold, unit)
        }
    }
}

/// The whole result.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
    pgwake_version: &'static str,
    server: ServerInfo,
    settings: Settings,
    /// Each kind of handler against its baseline (phase 0).
    handler_kinds: Vec<super::handlers::KindRun>,
    /// What phase 0 left out, and how its Python rows ran.
    handler_notes: Vec<String>,
    modes: Vec<ModeReport>,
    /// Peak RSS of this process (worker in-process + bench harness), MiB.
    peak_rss_mib: f64,
    targets: Vec<Target>,
    all_targets_pass: bool,
    elapsed_s: f64,
}

/// Peak RSS bound, MiB.
const PEAK_RSS_MAX_MIB: f64 = 64.0;

impl Report {
    /// Assemble the report and evaluate the targets.
    pub fn new(
        plan: &Plan,
        server: ServerInfo,
        (handler_kinds, handler_notes): super::handlers::Kinds,
        modes: Vec<ModeReport>,
        elapsed: Duration,
    ) -> Result<Report> {
        let peak_rss_mib = super::resources::peak_rss_mib()?;
        let mut targets: Vec<Target> = handler_targets(&handler_kinds);
        targets.extend(modes.iter().flat_map(mode_targets));
        targets.push(Target::at_most(
            "peak_rss".into(),
            None,
            "peak RSS of the bench process (worker + harness)".into(),
            peak_rss_mib,
            PEAK_RSS_MAX_MIB,
            "MiB",
        ));
        Ok(Report {
            pgwake_version: env!("CARGO_PKG_VERSION"),
            server,
            settings: Settings {
                runs: plan.runs,
                concurrency: plan.concurrency,
                batch: plan.batch,
                jobs: plan.jobs,
                backlog_small: plan.backlog_small,
                backlog_large: plan.backlog_large,
                duration_s: plan.duration.as_secs_f64(),
                pickup_samples: plan.pickup_samples,
                producers: plan.producers.clone(),
                quick: plan.quick,
            },
            handler_kinds,
            handler_notes,
            modes,
            peak_rss_mib,
            all_targets_pass: targets.iter().all(|t| t.pass),
            targets,
            elapsed_s: elapsed.as_secs_f64(),
        })
    }

    /// One JSON object.
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string_pretty(self).map_err(|e| Error::Io {
            context: "bench: cannot render the report as JSON".into(),
            source: e.into(),
        })
    }

    /// The table.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = self.write_table(&mut out);
        out
    }

    fn write_table(&self, out: &mut String) -> std::fmt::Result {
        let s = &self.settings;
        let srv = &self.server;
        writeln!(
            out,
            "pgwake bench {}: PostgreSQL {} ({}, fsync={}, synchronous_commit={}, shared_buffers={})",
            self.pgwake_version,
            srv.version,
            if srv.embedded { "throwaway cluster" } else { "--database-url" },
            srv.fsync,
            srv.synchronous_commit,
            srv.shared_buffers
        )?;
        writeln!(
            out,
            "concurrency {}, batch {}, {} run(s) per figure (median){}; took {}",
            s.concurrency,
            s.batch,
            s.runs,
            if s.quick { ", --quick sizes" } else { "" },
            humantime::format_duration(Duration::from_secs(self.elapsed_s.round() as u64))
        )?;
        write_kinds(out, &self.handler_kinds)?;
        for note in &self.handler_notes {
            writeln!(out, "  note: {note}")?;
        }
        for m in &self.modes {
            write_mode(out, m)?;
        }
        writeln!(
            out,
            "\nPeak RSS (VmHWM, worker in-process + harness): {:.1} MiB",
            self.peak_rss_mib
        )?;
        write_targets(out, &self.targets)
    }
}

/// Each handler kind against its baseline: (kind, baseline, target, bound,
/// unit: `%` or `×`). Delivery v2's (issue 22), then the persistent
/// handler's (issue 34).
const KIND_TARGETS: [(&str, &str, &str, f64, &str); 7] = [
    (
        "rust no-op (tx, default)",
        "raw",
        "rust_noop_default_vs_raw",
        80.0,
        "%",
    ),
    (
        "rust no-op using the tx",
        "raw",
        "rust_noop_using_tx_vs_raw",
        60.0,
        "%",
    ),
    (
        "rust no-op, lease queue",
        "raw",
        "rust_noop_lease_vs_raw",
        50.0,
        "%",
    ),
    ("sql no-op function", "raw", "sql_noop_vs_raw", 60.0, "%"),
    (
        "exec:true (lease, default)",
        "xargs",
        "exec_true_vs_xargs",
        80.0,
        "%",
    ),
    (
        PERSISTENT_KIND,
        "exec py",
        "persistent_python_vs_exec_python",
        30.0,
        "×",
    ),
    (
        PERSISTENT_KIND,
        "lease",
        "persistent_python_vs_rust_lease",
        30.0,
        "%",
    ),
];

fn handler_targets(kinds: &[super::handlers::KindRun]) -> Vec<Target> {
    kinds
        .iter()
        .filter_map(|k| {
            let (_, _, name, bound, unit) = KIND_TARGETS
                .iter()
                .find(|t| t.0 == k.kind && t.1 == k.baseline)?;
            let scale = if *unit == "%" { 100.0 } else { 1.0 };
            Some(Target::at_least(
                name.to_string(),
                None,
                format!("{} vs {} in the same run", k.kind, k.baseline),
                k.ratio.median * scale,
                *bound,
                unit,
            ))
        })
        .collect()
}

fn write_kinds(out: &mut String, kinds: &[super::handlers::KindRun]) -> std::fmt::Result {
    writeln!(
        out,
        "\nHandler kinds at batch B (concurrency C), against a baseline in the same run"
    )?;
    writeln!(
        out,
        "  {:<28} {:>8} {:>14} {:>8} {:>14} {:>7}",
        "kind", "jobs", "jobs/s", "vs", "baseline/s", "ratio"
    )?;
    for k in kinds {
        // Tens of times the baseline read better as a factor.
        let ratio = if k.ratio.median >= 10.0 {
            format!("{:>6.1}×", k.ratio.median)
        } else {
            format!("{:>6.0}%", k.ratio.median * 100.0)
        };
        writeln!(
            out,
            "  {:<28} {:>8} {:>14.0} {:>8} {:>14.0} {ratio}",
            k.kind, k.jobs, k.jobs_per_s.median, k.baseline, k.baseline_jobs_per_s.median,
        )?;
    }
    Ok(())
}

fn mode_targets(m: &ModeReport) -> Vec<Target> {
    let mode = Some(m.mode);
    let mut t = Vec::new();
    for b in &m.burn_down {
        t.push(Target::at_least(
            format!("burn_down_vs_raw_batch_{}", b.batch),
            mode,
            format!("worker burn-down vs raw claim ceiling at batch {}", b.batch),
            b.ratio.median * 100.0,
            80.0,
            "%",
        ));
    }
    let p = &m.idle_pickup.from_commit_ms;
    t.push(Target::at_most(
        "idle_pickup_p50".into(),
        mode,
        "idle pickup p50".into(),
        p.p50.median,
        1.0,
        "ms",
    ));
    t.push(Target::at_most(
        "idle_pickup_p99".into(),
        mode,
        "idle pickup p99".into(),
        p.p99.median,
        5.0,
        "ms",
    ));
    for c in m.producers.cells.iter().filter(|c| c.producers >= 8) {
        t.push(Target::at_least(
            format!("producer_trigger_{}_{}", c.workers, c.producers),
            mode,
            format!(
                "inserts/s with trigger vs without, {} producers, workers {}",
                c.producers, c.workers
            ),
            c.ratio.median * 100.0,
            90.0,
            "%",
        ));
    }
    let b = &m.backlog;
    for (name, label, r) in [
        ("backlog_large_vs_small", "all ready", &b.large_vs_small),
        (
            "backlog_large_vs_small_half_future",
            "half in the future",
            &b.large_vs_small_half_future,
        ),
    ] {
        t.push(Target::at_least(
            name.into(),
            mode,
            format!("burn-down with the large vs the small backlog waiting ({label})"),
            r.median * 100.0,
            80.0,
            "%",
        ));
    }
    for d in &m.long_drain {
        let (name, label) = match d.held_transaction {
            false => ("sustained_drain", ""),
            true => (
                "sustained_drain_held_transaction",
                ", transaction held open",
            ),
        };
        t.push(Target::at_least(
            name.into(),
            mode,
            format!(
                "long drain: last {0:.0} s vs first {0:.0} s{label}",
                d.end_s
            ),
            d.ratio * 100.0,
            80.0,
            "%",
        ));
    }
    t
}

fn write_mode(out: &mut String, m: &ModeReport) -> std::fmt::Result {
    writeln!(out, "\n== mode {} ==", m.mode.as_str())?;
    write_burn_down(out, &m.burn_down)?;
    write_pickup(out, &m.idle_pickup)?;
    write_steady(out, &m.steady_state)?;
    write_producers(out, &m.producers)?;
    write_backlog(out, &m.backlog, &m.long_drain)?;
    write_costs(out, &m.burn_down)
}

fn write_burn_down(out: &mut String, burns: &[BurnDown]) -> std::fmt::Result {
    writeln!(
        out,
        "\n1+2. Burn-down of pre-inserted no-op jobs vs the raw claim ceiling, jobs/s"
    )?;
    writeln!(out, "     (raw: the claim statement, autocommit, tight loop; worker: Worker + no-op handler; same connection count)")?;
    writeln!(
        out,
        "  {:>6}  {:>9}  {:>12}  {:>12}  {:>10}",
        "batch", "jobs", "raw claim", "worker", "worker/raw"
    )?;
    for b in burns {
        writeln!(
            out,
            "  {:>6}  {:>9}  {:>12}  {:>12}  {:>10}",
            b.batch,
            thousands(b.jobs as f64),
            thousands(b.raw_jobs_per_s.median),
            thousands(b.worker_jobs_per_s.median),
            pct(b.ratio.median)
        )?;
    }
    Ok(())
}

fn write_pickup(out: &mut String, p: &IdlePickup) -> std::fmt::Result {
    writeln!(
        out,
        "\n3. Idle pickup latency, ms ({} jobs one at a time per run)",
        p.samples
    )?;
    writeln!(out, "   timed: {}", p.definition)?;
    writeln!(
        out,
        "  {:<22}  {:>7}  {:>7}  {:>7}  {:>7}",
        "", "p50", "p95", "p99", "max"
    )?;
    for (label, l) in [
        ("from commit returned", &p.from_commit_ms),
        ("from INSERT sent", &p.from_send_ms),
    ] {
        writeln!(
            out,
            "  {:<22}  {:>7.2}  {:>7.2}  {:>7.2}  {:>7.2}",
            label, l.p50.median, l.p95.median, l.p99.median, l.max.median
        )?;
    }
    Ok(())
}

fn write_steady(out: &mut String, levels: &[SteadyLevel]) -> std::fmt::Result {
    writeln!(
        out,
        "\n4. Steady state, open loop; latency = handler start - intended insert time, ms"
    )?;
    writeln!(
        out,
        "  {:>8}  {:>10}  {:>10}  {:>7}  {:>7}  {:>7}  {:>8}",
        "offered", "jobs/s", "inserted/s", "p50", "p95", "p99", "max"
    )?;
    for l in levels {
        writeln!(
            out,
            "  {:>8}  {:>10}  {:>10}  {:>7.2}  {:>7.2}  {:>7.2}  {:>8.2}",
            pct(l.fraction),
            thousands(l.offered_jobs_per_s),
            thousands(l.inserted_jobs_per_s.median),
            l.latency_ms.p50.median,
            l.latency_ms.p95.median,
            l.latency_ms.p99.median,
            l.latency_ms.max.median
        )?;
    }
    Ok(())
}

fn write_producers(out: &mut String, p: &Producers) -> std::fmt::Result {
    writeln!(
        out,
        "\n5. Producer single-row autocommit inserts/s, NOTIFY trigger on vs off ({:.1} s per count)",
        p.count_s
    )?;
    writeln!(
        out,
        "  {:>7}  {:>9}  {:>11}  {:>11}  {:>7}",
        "workers", "producers", "trigger on", "trigger off", "on/off"
    )?;
    for c in &p.cells {
        writeln!(
            out,
            "  {:>7}  {:>9}  {:>11}  {:>11}  {:>7}",
            c.workers,
            c.producers,
            thousands(c.with_trigger.median),
            thousands(c.without_trigger.median),
            pct(c.ratio.median)
        )?;
    }
    if p.backlog_ran_out {
        writeln!(
            out,
            "  note: the busy worker ran out of backlog during a count"
        )?;
    }
    Ok(())
}

fn write_backlog(out: &mut String, b: &Backlog, drains: &[LongDrain]) -> std::fmt::Result {
    let drained = |half: bool| {
        b.variants
            .iter()
            .find(|v| v.half_future == half)
            .map_or(0, |v| v.drained)
    };
    writeln!(
        out,
        "\n6. Backlog: jobs/s draining as many jobs as the small backlog has ready ({} all ready, {} half in the future)",
        thousands(drained(false) as f64),
        thousands(drained(true) as f64)
    )?;
    writeln!(
        out,
        "  {:>10}  {:>10}  {:>18}",
        "waiting", "all ready", "half in the future"
    )?;
    let rate = |waiting: u64, half: bool| {
        b.variants
            .iter()
            .find(|v| v.waiting == waiting && v.half_future == half)
            .map_or(0.0, |v| v.jobs_per_s.median)
    };
    let mut sizes: Vec<u64> = b.variants.iter().map(|v| v.waiting).collect();
    sizes.sort_unstable();
    sizes.dedup();
    for w in sizes {
        writeln!(
            out,
            "  {:>10}  {:>10}  {:>18}",
            thousands(w as f64),
            thousands(rate(w, false)),
            thousands(rate(w, true))
        )?;
    }
    writeln!(
        out,
        "  {:>10}  {:>10}  {:>18}",
        "large/small",
        pct(b.large_vs_small.median),
        pct(b.large_vs_small_half_future.median)
    )?;
    for d in drains {
        writeln!(
            out,
            "  long drain{} of {} jobs, jobs/s per {:.1} s{}: last/first {:.1} s {}",
            if d.held_transaction {
                ", transaction held open,"
            } else {
                ""
            },
            thousands(d.backlog as f64),
            d.window_s,
            if d.drained {
                ""
            } else {
                " (time limit before the end)"
            },
            d.end_s,
            pct(d.ratio)
        )?;
        let curve: Vec<String> = d.curve_jobs_per_s.iter().map(|r| thousands(*r)).collect();
        writeln!(out, "    {}", curve.join(" "))?;
    }
    Ok(())
}

fn write_costs(out: &mut String, burns: &[BurnDown]) -> std::fmt::Result {
    writeln!(out, "\n7. Costs of the worker burn-downs, per job")?;
    writeln!(
        out,
        "  {:>6}  {:>10}  {:>12}  {:>11}  {:>11}  {:>15}  {:>16}  {:>12}",
        "batch",
        "WAL bytes",
        "(insert WAL)",
        "dead tuples",
        "dead left",
        "worker CPU s/1k",
        "machine CPU s/1k",
        "machine busy"
    )?;
    for b in burns {
        let c = &b.costs;
        writeln!(
            out,
            "  {:>6}  {:>10.0}  {:>12.0}  {:>11.2}  {:>11.2}  {:>15.3}  {:>16.3}  {:>11.0}%",
            b.batch,
            c.wal_bytes_per_job.median,
            c.load_wal_bytes_per_job.median,
            c.dead_tuples_per_job.median,
            c.dead_tuples_left_per_job.median,
            c.worker_cpu_s_per_1k_jobs.median,
            c.machine_cpu_s_per_1k_jobs.median,
            c.machine_cpu_busy_pct.median
        )?;
        let by_table: Vec<String> = c
            .dead_tuples_per_job_by_table
            .iter()
            .filter(|(_, m)| m.median > 0.0)
            .map(|(t, m)| format!("{t} {:.2}", m.median))
            .collect();
        if !by_table.is_empty() {
            writeln!(
                out,
                "          dead tuples by table: {}",
                by_table.join(", ")
            )?;
        }
    }
    writeln!(out, "  (dead tuples: n_tup_upd + n_tup_del made by the drain; dead left: n_dead_tup after it; worker CPU: getrusage of this process)")
}

fn write_targets(out: &mut String, targets: &[Target]) -> std::fmt::Result {
    writeln!(out, "\nTargets")?;
    for t in targets {
        writeln!(
            out,
            "  {}  {:<4} {:<70} {:>9.2} {} (target {} {} {})",
            if t.pass { "PASS" } else { "FAIL" },
            t.mode.unwrap_or("-"),
            t.description,
            t.measured,
            t.unit,
            t.comparison,
            t.threshold,
            t.unit
        )?;
    }
    let passed = targets.iter().filter(|t| t.pass).count();
    writeln!(out, "  {passed} of {} targets pass", targets.len())
}

/// `12345.6` → `12,346`.
fn thousands(x: f64) -> String {
    let digits = format!("{:.0}", x.abs());
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if x < -0.5 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `0.812` → `81%`.
fn pct(fraction: f64) -> String {
    format!("{:.0}%", fraction * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(12345.6), "12,346");
        assert_eq!(thousands(1_000_000.0), "1,000,000");
    }
}
