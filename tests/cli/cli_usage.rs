//! The command line's promises about input and output: every bad input
//! exits 2 with a message naming the flag or the NDJSON line, before any
//! start-up work and without changing anything; defaults, help and README
//! agree; what it prints is meant for a person (no server notices, no Rust
//! debug syntax, colour only on a terminal).

use crate::common;

use std::process::{Output, Stdio};
use std::time::Duration;

use common::*;
use common::{run_pgwake as run, stderr_of as stderr};

/// Run `pgwake` with `stdin` as its standard input.
fn run_with_stdin(args: &[&str], url: &str, stdin: &str) -> Output {
    use std::io::Write;
    let mut child = pgwake_cmd()
        .env("DATABASE_URL", url)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[tokio::test]
async fn bad_enqueue_input_exits_2_naming_the_flag_or_line_and_inserts_nothing() {
    let db = migrated_db().await;
    let url = Some(db.url.as_str());
    for (args, expect) in [
        (
            vec!["enqueue", "--task", "t", "--run-at", "banana"],
            "--run-at",
        ),
        (
            vec!["enqueue", "--task", "t", "--max-attempts", "0"],
            "--max-attempts",
        ),
        (vec!["enqueue", "--task", "t", "--queue", ""], "--queue"),
        (vec!["enqueue", "--task", ""], "--task"),
    ] {
        let o = run(&args, url);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(expect), "{args:?}: {}", stderr(&o));
    }
    let o = run_with_stdin(
        &["enqueue", "--ndjson"],
        &db.url,
        "{\"task\":\"ok\"}\n{\"task\":\"t\",\"run_at\":\"banana\"}\n",
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("stdin line 2") && e.contains("run_at"), "{e}");
    assert_eq!(
        remaining(&db).await,
        0,
        "nothing of a rejected input is inserted"
    );
}

#[tokio::test]
async fn run_at_accepts_rfc3339_with_an_offset() {
    let db = migrated_db().await;
    let o = run(
        &[
            "enqueue",
            "--task",
            "t",
            "--run-at",
            "2030-01-01T10:00:00+02:00",
        ],
        Some(&db.url),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let at: String = db
        .scalar("SELECT to_char(run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') FROM pgwake.jobs")
        .await;
    assert_eq!(at, "2030-01-01 08:00");
}

#[test]
fn a_negative_number_is_refused_naming_the_flag() {
    let o = run(
        &["run", "--handler", "t=exec:true", "--concurrency", "-3"],
        Some("postgres://u@127.0.0.1:1/x"),
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("--concurrency"), "{e}");
    assert!(!e.contains("unexpected argument"), "{e}");
}

#[test]
fn a_claim_pace_out_of_range_is_refused_naming_the_flag_and_the_range() {
    let o = run(
        &["run", "--handler", "t=exec:true", "--claim-pace", "2s"],
        Some("postgres://u@127.0.0.1:1/x"),
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("--claim-pace") && e.contains("between 0 (off) and 1s"),
        "{e}"
    );
}

#[test]
fn a_task_given_two_handlers_is_refused() {
    let o = run(
        &[
            "run",
            "--handler",
            "t=exec:true",
            "--handler",
            "t=exec:false",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
        Some("postgres://u@127.0.0.1:1/x"),
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("--handler") && e.contains("\"t\""), "{e}");
}

#[test]
fn a_taken_metrics_port_is_reported_before_any_start_up_work() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    // The database is unreachable: had the worker connected first, this
    // would exit 1 about the database.
    let o = run(
        &["run", "--handler", "t=exec:true", "--metrics-addr", &addr],
        Some("postgres://u@127.0.0.1:1/x?connect_timeout=2"),
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("--metrics-addr") && e.contains(&addr), "{e}");
    assert!(!e.contains("database"), "{e}");
}

#[tokio::test]
async fn dead_retry_or_purge_of_a_missing_id_fails_and_changes_nothing() {
    let db = migrated_db().await;
    let id = insert_jobs(&db, "t", 1).await[0];
    db.client()
        .await
        .batch_execute(&format!(
            "WITH d AS (DELETE FROM pgwake.jobs WHERE id = {id} RETURNING *)
             INSERT INTO pgwake.dead_jobs (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error, created_at)
             SELECT id, queue, task, payload, priority, run_at, 25, 25, 'gave up', created_at FROM d"
        ))
        .await
        .unwrap();
    let missing = (id + 1000).to_string();
    for action in ["retry", "purge"] {
        let o = run(
            &["dead", action, "--id", &id.to_string(), "--id", &missing],
            Some(&db.url),
        );
        assert_eq!(o.status.code(), Some(2), "{action}: {}", stderr(&o));
        assert!(stderr(&o).contains(&missing), "{action}: {}", stderr(&o));
        let dead: i64 = db.scalar("SELECT count(*) FROM pgwake.dead_jobs").await;
        assert_eq!(dead, 1, "{action}: the existing dead job is untouched");
    }
}

#[tokio::test]
async fn migrate_prints_no_server_notices_and_logs_to_a_pipe_without_colour() {
    let db = empty_db().await;
    for _ in 0..2 {
        let o = run(&["migrate"], Some(&db.url));
        assert!(o.status.success(), "{}", stderr(&o));
        let all = format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
        assert!(!all.contains("NOTICE"), "{all}");
        assert!(!all.contains("skipping"), "{all}");
        assert!(!all.contains('\u{1b}'), "colour codes in a pipe: {all:?}");
    }
}

/// `pgwake migrate` says each step once: the applied migrations and
/// definitions on stdout, not also as log lines on stderr.
#[tokio::test]
async fn migrate_says_each_step_once() {
    let db = empty_db().await;
    let o = run(&["migrate"], Some(&db.url));
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let err = stderr(&o);
    assert!(out.contains("applied migrations"), "{out}");
    assert!(out.contains("schema at version"), "{out}");
    assert!(out.contains("revoked EXECUTE from PUBLIC"), "{out}");
    for step in ["applied migration", "applied definition"] {
        assert!(
            !err.contains(step),
            "{step:?} said on stdout and again on stderr: {err}"
        );
    }
}

/// An upgrade says whose grants it re-applied (issue 33, item 13); a
/// migrate that changes nothing grants nothing.
#[tokio::test]
async fn migrate_says_whose_grants_it_reapplied() {
    let db = migrated_db().await;
    db.client()
        .await
        .batch_execute(
            "DO $$ BEGIN
                 IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cli_grantee') THEN
                     CREATE ROLE cli_grantee;
                 END IF;
             END $$;
             SELECT pgwake.grant_producer('cli_grantee');
             DELETE FROM pgwake.schema_definitions WHERE name = 'enqueue.sql';",
        )
        .await
        .unwrap();
    let o = run(&["migrate"], Some(&db.url));
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        out.contains("re-applied the grants of cli_grantee (producer)"),
        "{out}"
    );
    let o = run(&["migrate"], Some(&db.url));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(out.contains("nothing changed"), "{out}");
    assert!(!out.contains("grants"), "{out}");
}

#[tokio::test]
async fn the_worker_start_line_shows_queues_as_a_person_would_write_them() {
    let db = migrated_db().await;
    // The prefetch buffer's rule, not only its cap: "prefetch=200" read as
    // 200 jobs held by every worker. Teeth: the cap alone fails the first
    // and the third case.
    let by_rate =
        "prefetch=the lease-mode jobs this worker starts in 50ms at its measured rate, 1 to 1000";
    for (args, expect) in [
        (
            vec!["--handler", "t=exec:true"],
            vec!["queues=all", by_rate],
        ),
        (
            vec!["--handler", "t=exec:true", "--queues", "a,b"],
            vec!["queues=a,b"],
        ),
        (
            vec!["--handler", "t=exec:true", "--prefetch", "8"],
            vec!["prefetch=8 lease-mode jobs (--prefetch)"],
        ),
        (
            vec!["--handler", "t=exec:true", "--prefetch", "0"],
            vec!["prefetch=off (--prefetch 0)"],
        ),
    ] {
        let mut child = spawn_pgwake_run(&db.url, &args);
        let log = tail_stderr(&mut child);
        let l = log.clone();
        eventually("the worker started", Duration::from_secs(30), || {
            let l = l.clone();
            async move { l.lock().unwrap().contains("worker started") }
        })
        .await;
        send_signal(&child, libc::SIGTERM);
        wait_exit(child, Duration::from_secs(30)).await;
        let log = log.lock().unwrap().clone();
        let line = log.lines().find(|l| l.contains("worker started")).unwrap();
        for expect in expect {
            assert!(line.contains(expect), "{line}");
        }
        assert!(!line.contains("None") && !line.contains("Some("), "{line}");
        assert!(!log.contains('\u{1b}'), "colour codes in a pipe: {log:?}");
    }
}

#[test]
fn handler_help_and_readme_agree_on_the_handler_syntax() {
    let o = run(&["run", "--help"], None);
    let help = String::from_utf8_lossy(&o.stdout).to_string();
    let readme = include_str!("../../docs/src/handlers.md");
    for syntax in ["TASK=exec:COMMAND [ARGS]", "TASK=sql:[SCHEMA.]FUNCTION"] {
        assert!(help.contains(syntax), "--help lacks {syntax}: {help}");
        assert!(
            readme.contains(syntax),
            "docs/src/handlers.md lacks {syntax}"
        );
    }
}

#[test]
fn ci_script_refers_only_to_readme_sections_that_exist() {
    // Comments may wrap: `README\n# "Section"`.
    let ci = include_str!("../../.ci/run").replace("\n# ", " ");
    let readme = include_str!("../../README.md");
    let headings: Vec<&str> = readme
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| l.trim_start_matches('#').trim())
        .collect();
    for (i, _) in ci.match_indices("README \"") {
        let rest = &ci[i + "README \"".len()..];
        let section = &rest[..rest.find('"').unwrap()];
        assert!(
            headings.contains(&section),
            ".ci/run names README section {section:?}, which does not exist"
        );
    }
}

/// Every setting `WorkerConfig::validate` can reject, each made invalid on
/// its own.
fn each_invalid_config() -> Vec<pgwake::WorkerConfig> {
    use pgwake::WorkerConfig;
    use std::time::Duration;
    let d = WorkerConfig::default;
    let zero = Duration::ZERO;
    vec![
        WorkerConfig {
            concurrency: 0,
            ..d()
        },
        WorkerConfig { batch: 0, ..d() },
        WorkerConfig {
            queues: Some(vec![]),
            ..d()
        },
        WorkerConfig {
            queues: Some(vec![String::new()]),
            ..d()
        },
        WorkerConfig {
            lease_queues: vec![String::new()],
            ..d()
        },
        WorkerConfig {
            lease_duration: zero,
            ..d()
        },
        WorkerConfig {
            tx_queues: vec![String::new()],
            ..d()
        },
        WorkerConfig {
            rescue_interval: zero,
            ..d()
        },
        WorkerConfig {
            poll_interval: zero,
            ..d()
        },
        WorkerConfig {
            job_timeout: zero,
            ..d()
        },
        WorkerConfig {
            job_timeout: Duration::from_millis(1),
            ..d()
        },
        WorkerConfig {
            retry_base: zero,
            ..d()
        },
        WorkerConfig {
            retry_max: zero,
            ..d()
        },
        WorkerConfig {
            listener_ping_interval: zero,
            ..d()
        },
        WorkerConfig {
            listener_ping_timeout: zero,
            ..d()
        },
        WorkerConfig {
            reconnect_min: zero,
            ..d()
        },
        WorkerConfig {
            reconnect_max: zero,
            ..d()
        },
        WorkerConfig {
            retry_base: Duration::from_secs(10),
            retry_max: Duration::from_secs(1),
            ..d()
        },
        WorkerConfig {
            reconnect_min: Duration::from_secs(10),
            reconnect_max: Duration::from_secs(1),
            ..d()
        },
        WorkerConfig {
            sample_interval: Some(zero),
            ..d()
        },
        WorkerConfig {
            claim_pace: Duration::from_secs(2),
            ..d()
        },
        WorkerConfig {
            application_name: String::new(),
            ..d()
        },
        WorkerConfig {
            rollup: Some(pgwake::config::RollupConfig {
                retention: Duration::from_secs(60),
                ..Default::default()
            }),
            ..d()
        },
        WorkerConfig {
            rollup: Some(pgwake::config::RollupConfig {
                flush_interval: zero,
                ..Default::default()
            }),
            ..d()
        },
    ]
}

#[test]
fn config_errors_name_only_flags_that_exist() {
    let o = run(&["run", "--help"], None);
    let help = String::from_utf8_lossy(&o.stdout).to_string();
    for config in each_invalid_config() {
        let msg = config.validate().unwrap_err().to_string();
        for flag in msg
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .filter(|w| w.starts_with("--"))
        {
            assert!(
                help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                "{msg:?} names {flag}, which `pgwake run` does not have"
            );
        }
    }
}

#[tokio::test]
async fn the_documented_job_defaults_are_the_table_defaults() {
    let db = migrated_db().await;
    let row = db
        .client()
        .await
        .query_one(
            "INSERT INTO pgwake.jobs (task) VALUES ('t') RETURNING queue, priority, max_attempts",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), pgwake::config::QUEUE_DEFAULT);
    assert_eq!(row.get::<_, i32>(1), pgwake::config::PRIORITY_DEFAULT);
    assert_eq!(row.get::<_, i32>(2), pgwake::config::MAX_ATTEMPTS_DEFAULT);
    let readme = include_str!("../../docs/src/producing.md");
    for row in [
        format!("| `queue` | `{}` |", pgwake::config::QUEUE_DEFAULT),
        format!("| `priority` | {} ", pgwake::config::PRIORITY_DEFAULT),
        format!(
            "| `max_attempts` | {} |",
            pgwake::config::MAX_ATTEMPTS_DEFAULT
        ),
    ] {
        assert!(readme.contains(&row), "docs/src/producing.md lacks {row}");
    }
}

#[test]
fn the_run_reference_shows_the_defaults_run_help_prints() {
    let o = run(&["run", "--help"], None);
    let help = String::from_utf8_lossy(&o.stdout).to_string();
    // Flag → its default, from the help's "[default: …]" after the flag.
    let default_of = |flag: &str| -> Option<String> {
        let at = help.find(&format!("{flag} <"))?;
        let rest = &help[at..];
        // Up to the next line that starts a flag.
        let mut end = rest.len();
        let mut offset = 0;
        for line in rest.split_inclusive('\n') {
            if offset > 0 && line.trim_start().starts_with('-') {
                end = offset;
                break;
            }
            offset += line.len();
        }
        let block = &rest[..end];
        let d = block.find("[default: ")? + "[default: ".len();
        Some(block[d..block[d..].find(']')? + d].to_string())
    };
    let readme = include_str!("../../docs/src/cli.md");
    let table = &readme[readme.find("## `pgwake run` reference").unwrap()..];
    let mut checked = 0;
    for row in table.lines().skip(4).take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // `--retry-base` / `--retry-max` | 1s / 1h: one default per flag.
        let flags: Vec<&str> = cells[1]
            .split('`')
            .skip(1)
            .step_by(2)
            .filter_map(|f| f.split_whitespace().next())
            .filter(|f| f.starts_with("--"))
            .collect();
        let defaults: Vec<&str> = cells[2].split(" / ").collect();
        if flags.len() != defaults.len() {
            continue;
        }
        for (flag, default) in flags.iter().zip(defaults) {
            if let Some(printed) = default_of(flag) {
                assert_eq!(
                    default, printed,
                    "docs/src/cli.md says {flag} defaults to {default}, --help says {printed}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 12, "only {checked} defaults compared");
}

/// `.ci/deps` reads "check|package" lines; a check that itself holds `||`
/// once made it hand apt the string "| [ -x /usr/sbin" as a package name,
/// which only a fresh machine (one that lacks pgbouncer) ever saw.
#[test]
fn the_install_step_reads_every_needed_package_name() {
    let root = env!("CARGO_MANIFEST_DIR");
    let o = std::process::Command::new("bash")
        .arg(format!("{root}/.ci/deps"))
        .arg("--list")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let listed = String::from_utf8(o.stdout).unwrap();
    let packages: Vec<&str> = listed.lines().collect();
    for package in ["postgresql", "prometheus", "pgbouncer", "faketime"] {
        assert!(packages.contains(&package), "{package} missing: {listed:?}");
    }
    for package in &packages {
        let valid = !package.is_empty()
            && package
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c));
        assert!(valid, "not an apt package name: {package:?}");
    }
}

/// The command a suggestion of pgwake's quotes (between the first and the
/// last backtick: the name may hold one), run through bash as a user pasting
/// it would, with `pgwake` this binary.
fn run_suggestion(printed: &str, url: &str) -> Output {
    let at = printed
        .find("`pgwake ")
        .unwrap_or_else(|| panic!("no suggestion: {printed}"));
    let command = &printed[at + 1..printed.rfind('`').unwrap()];
    std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("\"$PGWAKE\"{}", &command["pgwake".len()..]))
        .env("PGWAKE", env!("CARGO_BIN_EXE_pgwake"))
        .env("DATABASE_URL", url)
        .output()
        .unwrap()
}

#[tokio::test]
async fn the_resume_command_queue_pause_suggests_works_for_any_name() {
    let db = migrated_db().await;
    for name in [
        "my queue",
        "a,b",
        "it's",
        "$HOME",
        "a b,c'd$e `id`",
        "-dash",
        "ünï 名",
    ] {
        let o = run(&["queue", "pause", "--", name], Some(&db.url));
        assert!(o.status.success(), "{name:?}: {}", stderr(&o));
        let printed = String::from_utf8_lossy(&o.stdout).to_string();
        let resumed = run_suggestion(&printed, &db.url);
        let out = String::from_utf8_lossy(&resumed.stdout).to_string();
        assert!(
            resumed.status.success() && out == format!("{name}: resumed\n"),
            "{name:?}: {printed} → {out} {}",
            stderr(&resumed)
        );
    }
}

/// `--queues`, `--tx-queues` and `--lease-queues` take comma-separated
/// names, repeatable; a comma inside a name is written `\,`.
#[tokio::test]
async fn a_queue_name_with_a_comma_can_be_given_to_queues() {
    let db = migrated_db().await;
    for queue in ["a,b", "c", "a", "b"] {
        let o = run(&["enqueue", "--task", "t", "--queue", queue], Some(&db.url));
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let mut child = spawn_pgwake_run(
        &db.url,
        &[
            "--handler",
            "t=exec:true",
            "--queues",
            r"a\,b",
            "--queues",
            "c",
        ],
    );
    let log = tail_stderr(&mut child);
    let left = "SELECT string_agg(queue, ' ' ORDER BY queue) FROM pgwake.jobs";
    let db2 = &db;
    eventually(
        "the jobs of a,b and c ran",
        Duration::from_secs(30),
        || async move { db2.scalar::<Option<String>>(left).await.as_deref() == Some("a b") },
    )
    .await;
    send_signal(&child, libc::SIGTERM);
    wait_exit(child, Duration::from_secs(30)).await;
    let log = log.lock().unwrap().clone();
    let line = log.lines().find(|l| l.contains("worker started")).unwrap();
    assert!(line.contains(r"queues=a\,b,c"), "{line}");
    // The same parser reads the mode flags: one queue "x,y" in both is refused.
    let o = run(
        &[
            "run",
            "--handler",
            "t=exec:true",
            "--tx-queues",
            r"x\,y",
            "--lease-queues",
            r"x\,y",
        ],
        Some(&db.url),
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(r#"queue "x,y" is in both"#),
        "{}",
        stderr(&o)
    );
}

/// The subcommands a `--help` lists under "Commands:" (without `help`).
fn subcommands(help: &str) -> Vec<String> {
    let Some(at) = help.find("Commands:\n") else {
        return Vec::new();
    };
    help[at + "Commands:\n".len()..]
        .lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

/// The words of a text, lower-cased (so `set` is not found in `settings`).
fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric() && c != '-')
        .map(str::to_lowercase)
        .collect()
}

/// Every command is in the reference's table of commands, and a command
/// with subcommands names each of them in its one-line summary (what
/// `pgwake --help` shows) and in its row of that table.
#[test]
fn every_subcommand_is_named_by_its_parent_and_in_the_command_reference() {
    let top = String::from_utf8(run(&["--help"], None).stdout).unwrap();
    let reference = include_str!("../../docs/src/cli.md");
    let table = &reference[reference.find("## Every command").unwrap()..];
    let commands = subcommands(&top);
    assert!(commands.len() >= 10, "{top}");
    for command in &commands {
        let row = table
            .lines()
            .find(|l| {
                let rest = l
                    .strip_prefix(&format!("| `pgwake {command}"))
                    .unwrap_or("x");
                rest.starts_with([' ', '`'])
            })
            .unwrap_or_else(|| panic!("docs/src/cli.md's table lacks pgwake {command}"));
        let help = String::from_utf8(run(&[command, "--help"], None).stdout).unwrap();
        let summary = help.lines().next().unwrap();
        for sub in subcommands(&help) {
            assert!(
                words(summary).contains(&sub),
                "pgwake {command}'s summary does not name {sub}: {summary}"
            );
            assert!(
                words(row).contains(&sub),
                "docs/src/cli.md's row of pgwake {command} does not name {sub}: {row}"
            );
        }
    }
}

/// `--batch`: batches are sized by time, so the help must not advise
/// `--batch 1` for slow jobs while the docs call it rarely worth setting.
#[test]
fn the_batch_help_and_the_docs_give_the_same_advice() {
    let help = String::from_utf8(run(&["run", "--help"], None).stdout).unwrap();
    let help = &help[help.find("--batch <").unwrap()..];
    let help = help[..help.find("\n      --").unwrap()]
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let reference = include_str!("../../docs/src/cli.md");
    let row = reference
        .lines()
        .find(|l| l.starts_with("| `--batch"))
        .unwrap();
    let performance = include_str!("../../docs/src/performance.md")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    for (what, text) in [
        ("--help", help.as_str()),
        ("cli.md", row),
        ("performance.md", &performance),
    ] {
        assert!(!text.contains("use 1 for slow jobs"), "{what}: {text}");
        assert!(text.contains("sized by time"), "{what}: {text}");
        assert!(text.contains("rarely worth setting"), "{what}: {text}");
    }
}
