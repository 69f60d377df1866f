//! The docs stay true: every relative link and anchor of the README, the
//! book (`docs/src/`) and ARCHITECTURE.md resolves, the book's summary lists
//! every page, every SQL block runs on a migrated database, and every
//! `pgwake …` command shown names a command and flags that exist. (The Rust
//! blocks are doctests: `src/lib.rs` includes the pages that hold them.)

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::*;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every Markdown file the docs are made of.
fn pages() -> Vec<PathBuf> {
    let mut out = vec![
        root().join("README.md"),
        root().join("ARCHITECTURE.md"),
        root().join("cli/bench/MEASUREMENTS.md"),
    ];
    let mut book: Vec<PathBuf> = std::fs::read_dir(root().join("docs/src"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    book.sort();
    out.extend(book);
    out
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Fenced code blocks as (info string, body, line of the fence).
fn blocks(text: &str) -> Vec<(String, String, usize)> {
    let mut out = Vec::new();
    let mut open: Option<(String, String, usize)> = None;
    for (n, line) in text.lines().enumerate() {
        if let Some(info) = line.strip_prefix("```") {
            match open.take() {
                Some(b) => out.push(b),
                None => open = Some((info.trim().to_string(), String::new(), n + 1)),
            }
        } else if let Some((_, body, _)) = open.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    out
}

/// Text outside code blocks.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with("```") {
            inside = !inside;
        } else if !inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The anchor GitHub and mdBook give a heading: lower case, punctuation
/// dropped, spaces as dashes.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| slug(l.trim_start_matches('#')))
        .collect()
}

/// `[text](target)` links of a page's prose.
fn links(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut out = Vec::new();
    for (i, _) in prose.match_indices("](") {
        let rest = &prose[i + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].to_string());
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut bad = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = read(&page);
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            checked += 1;
            if !target.exists() {
                bad.push(format!("{}: {link}: no such file", page.display()));
                continue;
            }
            if !anchor.is_empty() && !anchors(&read(&target)).contains(anchor) {
                bad.push(format!("{}: {link}: no such heading", page.display()));
            }
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
    assert!(checked >= 20, "only {checked} links seen");
}

#[test]
fn the_summary_lists_every_page_of_the_book() {
    let summary = read(&root().join("docs/src/SUMMARY.md"));
    let listed: BTreeSet<String> = links(&summary).into_iter().collect();
    for page in pages() {
        if !page.starts_with(root().join("docs/src")) {
            continue;
        }
        let name = page.file_name().unwrap().to_string_lossy().into_owned();
        if name != "SUMMARY.md" {
            assert!(listed.contains(&name), "SUMMARY.md does not list {name}");
        }
    }
    assert!(root().join("docs/book.toml").exists());
}

#[test]
fn the_readme_is_a_front_door() {
    let readme = read(&root().join("README.md"));
    let lines = readme.lines().count();
    assert!(
        lines <= 200,
        "README.md is {lines} lines: the reference belongs in docs/"
    );
    for section in [
        "## Quick start",
        "## A worked example",
        "## Guarantees",
        "## How pgwake compares",
        "## Dependencies",
    ] {
        assert!(readme.contains(section), "README.md lacks {section}");
    }
    // Guarantees one line each, the detail in the book.
    let guarantees = &readme[readme.find("## Guarantees").unwrap()..];
    let guarantees = &guarantees[..guarantees[3..].find("\n## ").unwrap() + 3];
    let items: Vec<&str> = guarantees.lines().filter(|l| l.starts_with("- ")).collect();
    assert!(items.len() >= 8, "{guarantees}");
    assert!(
        guarantees.lines().all(|l| l.is_empty()
            || l.starts_with("- ")
            || l.starts_with('#')
            || !l.starts_with(' ')),
        "a guarantee wraps onto a second line: {guarantees}"
    );
    assert!(
        guarantees.contains("docs/src/delivery.md#the-guarantees-and-the-tests-that-defend-them")
    );
    // The contributor sections live in the book, the README links them.
    assert!(readme.contains("docs/src/contributing.md#dependencies"));
    let contributing = read(&root().join("docs/src/contributing.md"));
    for section in ["## Layout", "## Dependencies"] {
        assert!(
            contributing.contains(section),
            "docs/src/contributing.md lacks {section}"
        );
    }
    // Each comparison names the other queue's own docs.
    for other in ["graphile-worker", "River", "Oban", "pg-boss", "solid_queue"] {
        assert!(
            readme.contains(&format!("| [{other}](http")),
            "README.md compares with {other} without a link to its docs"
        );
    }
}

/// A licence file for each licence the manifest names.
#[test]
fn every_licence_the_manifest_names_has_its_file() {
    let manifest = read(&root().join("Cargo.toml"));
    let license = manifest
        .lines()
        .find_map(|l| l.strip_prefix("license = "))
        .expect("Cargo.toml: no license")
        .trim_matches('"')
        .to_string();
    let ids: Vec<&str> = license.split(" OR ").collect();
    assert!(!ids.is_empty());
    for id in ids {
        let (file, first) = match id {
            "MIT" => ("LICENSE-MIT", "Permission is hereby granted"),
            "Apache-2.0" => ("LICENSE-APACHE", "Apache License"),
            other => panic!("Cargo.toml names {other}: add its file and a case here"),
        };
        let text = read(&root().join(file));
        assert!(text.contains(first), "{file} is not the {id} licence");
        assert!(
            manifest.contains(&format!("\"/{file}\"")),
            "Cargo.toml's include leaves {file} out of the package"
        );
    }
}

#[tokio::test]
async fn every_sql_block_runs_on_a_migrated_database() {
    let db = migrated_db().await;
    let client = db.client().await;
    let mut ran = 0;
    let mut bad = Vec::new();
    // ARCHITECTURE.md and the measurement log quote fragments of the
    // statements they discuss; the user's docs show statements to run.
    let user_docs = pages()
        .into_iter()
        .filter(|p| !p.ends_with("ARCHITECTURE.md") && !p.ends_with("MEASUREMENTS.md"));
    for page in user_docs {
        for (info, body, line) in blocks(&read(&page)) {
            if info != "sql" {
                continue;
            }
            // Each block alone, rolled back: blocks do not depend on each
            // other, and roles a block creates do not outlive it.
            client.batch_execute("BEGIN").await.unwrap();
            if let Err(e) = client.batch_execute(&body).await {
                bad.push(format!("{}:{line}: {e:?}", page.display()));
            }
            client.batch_execute("ROLLBACK").await.unwrap();
            ran += 1;
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
    assert!(ran >= 8, "only {ran} SQL blocks ran");
}

/// The `pgwake …` commands of a shell block, continuation lines joined and
/// comments dropped, as words.
fn commands(body: &str) -> Vec<Vec<String>> {
    let joined = body.replace("\\\n", " ");
    joined
        .lines()
        .filter_map(|l| {
            let l = l.split(" #").next().unwrap().trim();
            let at = l.find("pgwake ")?;
            // `cargo install … && pgwake demo`: the pgwake part.
            let cmd = l[at..]
                .split("&&")
                .next()
                .unwrap()
                .split('|')
                .next()
                .unwrap();
            (at == 0 || l[..at].ends_with("&& ") || l[..at].ends_with("; "))
                .then(|| shell_words::split(cmd).ok())
                .flatten()
        })
        .collect()
}

#[test]
fn every_command_shown_exists_with_the_flags_shown() {
    let mut checked = 0;
    let mut bad = Vec::new();
    for page in pages() {
        for (info, body, line) in blocks(&read(&page)) {
            if info != "sh" {
                continue;
            }
            for words in commands(&body) {
                // The subcommand path: words up to the first flag or value.
                let mut path = Vec::new();
                for w in &words[1..] {
                    if w.starts_with('-') {
                        break;
                    }
                    let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
                    args.push(w);
                    args.push("--help");
                    if !run_pgwake(&args, None).status.success() {
                        break;
                    }
                    path.push(w.clone());
                }
                if path.is_empty() {
                    bad.push(format!(
                        "{}:{line}: {words:?} names no command",
                        page.display()
                    ));
                    continue;
                }
                let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
                args.push("--help");
                let help = String::from_utf8_lossy(&run_pgwake(&args, None).stdout).into_owned();
                for w in &words {
                    let flag = w.split('=').next().unwrap();
                    if flag.starts_with("--")
                        && !help.contains(&format!("{flag} "))
                        && !help.contains(&format!("{flag}\n"))
                    {
                        bad.push(format!(
                            "{}:{line}: pgwake {} has no {flag}",
                            page.display(),
                            path.join(" ")
                        ));
                    }
                }
                checked += 1;
            }
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
    assert!(checked >= 15, "only {checked} commands checked");
}

/// The test command says what it installs and how long it takes: every
/// package `.ci/deps --list` may install is named on the Quick start page,
/// and the README's and the page's test line give the time. (The page
/// named four of the eleven: a newcomer's machine got Chromium and Node.js
/// unannounced.)
#[test]
fn the_test_command_says_what_it_installs_and_how_long_it_takes() {
    let list = std::process::Command::new(root().join(".ci/deps"))
        .arg("--list")
        .output()
        .unwrap();
    assert!(list.status.success());
    let packages: BTreeSet<String> = String::from_utf8_lossy(&list.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert!(packages.len() >= 8, "{packages:?}");
    let page = read(&root().join("docs/src/quick-start.md"));
    let missing: Vec<_> = packages
        .iter()
        .filter(|p| !page.contains(&format!("`{p}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/src/quick-start.md does not name {missing:?}, which .ci/deps installs"
    );
    for file in ["README.md", "docs/src/quick-start.md"] {
        let text = read(&root().join(file));
        let line = text
            .lines()
            .find(|l| l.starts_with(".ci/test "))
            .unwrap_or_else(|| panic!("{file}: no `.ci/test` line"));
        assert!(
            line.contains("apt") && line.contains(" min"),
            "{file}: the test line says neither what it installs nor how long it takes: {line}"
        );
    }
}

/// `mdbook build docs` leaves the work tree clean: the book is rendered
/// under target/, which git ignores (it wrote docs/book/, untracked).
#[test]
fn the_book_builds_outside_the_tracked_tree() {
    let toml = read(&root().join("docs/book.toml"));
    let dir = toml
        .lines()
        .find_map(|l| l.trim().strip_prefix("build-dir = "))
        .expect("docs/book.toml: no build-dir (mdbook would write docs/book/)");
    let dir = dir.trim_matches('"');
    let under = dir
        .strip_prefix("../")
        .expect("build-dir is relative to docs/");
    let ignored = read(&root().join(".gitignore"));
    let top = format!("/{}", under.split('/').next().unwrap());
    assert!(
        ignored.lines().any(|l| l.trim() == top),
        ".gitignore does not ignore {top}, where the book is built"
    );
}
