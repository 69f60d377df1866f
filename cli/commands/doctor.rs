//! `pgwake doctor`: run the library's checks (`pgwake::admin::doctor`) and
//! print each finding with its fix, for a person (text, escaped) or a
//! monitor (`--json`), and exit with the worst severity.
//!
//! Exit codes follow the monitoring plugins' convention, so they cannot be
//! mistaken for each other: 0 every finding ok, 1 a warning, 2 a problem,
//! 3 the checks could not run (no connection, a refused flag value); never
//! the other commands' 1 for a database error.

use std::process::ExitCode;

use clap::Args;
use pgwake::admin::doctor::{self, Report, Severity, Thresholds};
use pgwake::handlers::exec::escape_line;

use super::args::{duration, Db, HumanDuration};

/// The exit code when the checks could not run.
pub const EXIT_UNKNOWN: u8 = 3;

/// `pgwake doctor` flags.
#[derive(Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub db: Db,
    /// Print the report as JSON (every finding, ok ones included; stable ids).
    #[arg(long)]
    pub json: bool,
    /// A session or prepared transaction holding the vacuum horizon this long is a warning.
    #[arg(long, value_parser = duration, default_value_t = doctor::HORIZON_WARNING_DEFAULT.into())]
    pub horizon_warning: HumanDuration,
    /// A holder this long is a problem (at least --horizon-warning).
    #[arg(long, value_parser = duration, default_value_t = doctor::HORIZON_PROBLEM_DEFAULT.into())]
    pub horizon_problem: HumanDuration,
    /// Dead tuples in one pgwake table that make a warning (ten times as many: a problem).
    #[arg(long, default_value_t = doctor::DEAD_TUPLES_WARNING_DEFAULT,
          value_parser = clap::value_parser!(i64).range(1..))]
    pub dead_tuples_warning: i64,
    /// Smallest index, in MiB, that the bloat check reports.
    #[arg(long, value_name = "MIB", default_value_t = doctor::INDEX_BLOAT_MIN_BYTES_DEFAULT / 1024 / 1024,
          value_parser = clap::value_parser!(i64).range(0..=1 << 30))]
    pub index_bloat_min_size: i64,
}

/// Whether the command line names `doctor` as its subcommand (the first
/// word that is not a global flag or its value): its usage errors exit
/// [`EXIT_UNKNOWN`], not clap's 2, which means "problem" here.
pub fn is_doctor(args: &[String]) -> bool {
    let mut words = args.iter().skip(1);
    while let Some(w) = words.next() {
        if w == "--log-format" {
            words.next();
        } else if !w.starts_with('-') {
            return w == "doctor";
        }
    }
    false
}

/// Run the checks and print the report; the exit code says how it went.
pub async fn command(args: DoctorArgs) -> ExitCode {
    let thresholds = {
        let mut t = Thresholds::default();
        t.horizon_warning = args.horizon_warning.into();
        t.horizon_problem = args.horizon_problem.into();
        t.dead_tuples_warning = args.dead_tuples_warning;
        t.index_bloat_min_bytes = args.index_bloat_min_size * 1024 * 1024;
        t
    };
    let report = async {
        let config = args.db.config()?;
        // Two connections: the pooler check needs both at once.
        let pool = pgwake::connect::pool(&config, 2)?;
        doctor::examine(&pool, &thresholds).await
    }
    .await;
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "pgwake: error: {} (doctor: no check ran, exit {EXIT_UNKNOWN})",
                super::explain::explain(&e)
            );
            return ExitCode::from(EXIT_UNKNOWN);
        }
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        print!("{}", render(&report));
    }
    ExitCode::from(exit_code(report.severity))
}

/// 0 ok, 1 warning, 2 problem.
pub fn exit_code(severity: Severity) -> u8 {
    match severity {
        Severity::Ok => 0,
        Severity::Warning => 1,
        Severity::Problem => 2,
    }
}

/// The report for a terminal: problems first, then warnings, then one
/// line per ok check; everything that came from the database escaped.
pub fn render(report: &Report) -> String {
    let e = |s: &str| escape_line(s.as_bytes());
    let mut out = format!(
        "pgwake doctor {}: database {}, role {}\n\n",
        report.pgwake_version,
        e(&report.database),
        e(&report.role)
    );
    let mut findings: Vec<_> = report.findings.iter().collect();
    findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
    for f in findings {
        out.push_str(&format!(
            "{:<8} {}: {}\n",
            f.severity.as_str(),
            f.id,
            e(&f.summary)
        ));
        // Ok findings' details are in --json; a terminal gets one line.
        if f.severity == Severity::Ok {
            continue;
        }
        for d in &f.details {
            out.push_str(&format!("           {}\n", e(d)));
        }
        for (i, fix) in f.fix.iter().enumerate() {
            let label = if i == 0 { "fix:" } else { "    " };
            out.push_str(&format!("         {label} {}\n", e(fix)));
        }
    }
    let count = |s: Severity| report.findings.iter().filter(|f| f.severity == s).count();
    out.push_str(&format!(
        "\n{} problem(s), {} warning(s), {} ok\n",
        count(Severity::Problem),
        count(Severity::Warning),
        count(Severity::Ok)
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::is_doctor;

    #[test]
    fn the_subcommand_is_found_after_global_flags() {
        let args = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert!(is_doctor(&args("pgwake doctor --json")));
        assert!(is_doctor(&args("pgwake --log-format json doctor")));
        assert!(!is_doctor(&args("pgwake queue pause doctor")));
        assert!(!is_doctor(&args("pgwake --log-format doctor stats")));
    }
}
