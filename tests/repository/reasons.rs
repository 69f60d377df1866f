//! The reasons `pgwake explain` gives are the ones the book lists: the
//! function that gives them (`functions/jobs.sql`), the code's list
//! ([`pgwake::admin::jobs::REASONS`]) and the three pages that explain the
//! answer hold the same set. Two reasons (`key_max_running`,
//! `key_rate_limit`) were added to the function and missing from every
//! page before this test.

use std::collections::BTreeSet;
use std::path::Path;

use pgwake::admin::jobs::REASONS;

fn read(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The reasons the explain functions' bodies return: each row's first
/// column is a literal, `'name'::text` (a detail cast the same way is
/// prose, not a name), or the dead row's `CASE … THEN 'cancelled' ELSE
/// 'dead' END`.
fn reasons_in_sql() -> BTreeSet<String> {
    let sql = read("functions/jobs.sql");
    let start = sql
        .find("CREATE OR REPLACE FUNCTION pgwake.explain_process_wait")
        .expect("explain_process_wait in functions/jobs.sql");
    let end = start
        + sql[start..]
            .find("CREATE OR REPLACE FUNCTION pgwake.list_jobs")
            .expect("list_jobs after explain in functions/jobs.sql");
    let body: String = sql[start..end]
        .lines()
        .map(|l| l.split("--").next().unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = BTreeSet::new();
    for (i, _) in body.match_indices("'::text") {
        let name = &body[..i];
        let name = &name[name.rfind('\'').unwrap() + 1..];
        if !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            out.insert(name.to_string());
        }
    }
    assert!(
        body.contains("THEN 'cancelled' ELSE 'dead' END"),
        "the dead row's reason changed shape: update reasons_in_sql"
    );
    out.extend(["cancelled".to_string(), "dead".to_string()]);
    out
}

#[test]
fn the_codes_reason_list_is_what_explain_returns() {
    let code: BTreeSet<String> = REASONS.iter().map(|r| r.to_string()).collect();
    assert_eq!(code.len(), REASONS.len(), "a reason listed twice");
    assert_eq!(
        reasons_in_sql(),
        code,
        "functions/jobs.sql's explain and pgwake::admin::jobs::REASONS differ"
    );
}

#[test]
fn every_explain_reason_is_in_the_sql_console_and_cli_pages() {
    let mut missing = Vec::new();
    for page in ["docs/src/sql.md", "docs/src/console.md", "docs/src/cli.md"] {
        let text = read(page);
        for reason in REASONS {
            if !text.contains(&format!("`{reason}`")) {
                missing.push(format!("{page}: `{reason}`"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "explain reasons the docs do not list (as `name`): {missing:#?}"
    );
}
