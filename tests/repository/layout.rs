//! The tree shows the roles (ARCHITECTURE.md, "The tree shows the roles"):
//! the library's modules import each other without cycles, the claim path
//! never reaches into the services or the admin API, the admin API and
//! the database layer never reach into the worker, the public files never
//! reach into the claim path, and the console reads through the admin API
//! only. Inside the claim path: choosing what to claim never reaches into
//! a delivery mode or the outcome, the outcome never into a mode, the
//! choice or the context, running a job into nothing else of it, the two
//! modes never into each other, and the worker only through the claim
//! path's entry point. Read from the source, so
//! a change that breaks a rule fails here, naming the files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's path (`claim::tx`) → the modules it names with `crate::…`
/// or `super::…` outside its tests.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    collect(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(&src, f)).collect();
    let mut graph = BTreeMap::new();
    for file in &files {
        let me = module_of(&src, file);
        let text = std::fs::read_to_string(file).unwrap();
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap();
        let mut uses = BTreeSet::new();
        for line in code.lines() {
            let line = line.trim_start();
            if line.starts_with("//") {
                continue;
            }
            for (prefix, base) in [("crate::", String::new()), ("super::", parent(&me))] {
                for (i, _) in line.match_indices(prefix) {
                    let rest = &line[i + prefix.len()..];
                    let path: String = rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                        .collect();
                    let mut full = base.clone();
                    for seg in path.split("::").filter(|s| !s.is_empty()) {
                        let next = if full.is_empty() {
                            seg.to_string()
                        } else {
                            format!("{full}::{seg}")
                        };
                        if !modules.contains(&next) {
                            break;
                        }
                        full = next;
                    }
                    if !full.is_empty() && full != me && !me.starts_with(&format!("{full}::")) {
                        uses.insert(full);
                    }
                }
            }
        }
        graph.insert(me, uses);
    }
    graph
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/claim/outcome/resolve.rs` → `claim::outcome::resolve`; `src/claim/mod.rs` → `claim`;
/// `src/lib.rs` → `` (the crate root).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .filter(|p| p != "mod" && p != "lib")
        .collect();
    parts.join("::")
}

fn parent(module: &str) -> String {
    module
        .rsplit_once("::")
        .map_or(String::new(), |(p, _)| p.into())
}

/// Every cycle's modules, as found by a depth-first search.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        found: &mut Vec<Vec<String>>,
    ) {
        if let Some(at) = stack.iter().position(|n| n == node) {
            found.push(stack[at..].to_vec());
            return;
        }
        if done.contains(node) {
            return;
        }
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            // A module's own submodules are declared, not imported.
            if next.starts_with(&format!("{node}::")) || node.is_empty() {
                continue;
            }
            visit(next, graph, stack, done, found);
        }
        stack.pop();
        done.insert(node.to_string());
    }
    let mut found = Vec::new();
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        visit(node, graph, &mut Vec::new(), &mut done, &mut found);
    }
    found
}

#[test]
fn the_library_has_no_import_cycles() {
    let found = cycles(&imports());
    assert!(found.is_empty(), "import cycles: {found:#?}");
}

#[test]
fn the_claim_path_never_imports_the_services_the_admin_api_or_the_worker() {
    let bad: Vec<String> = imports()
        .into_iter()
        .filter(|(m, _)| m == "claim" || m.starts_with("claim::"))
        .flat_map(|(m, uses)| {
            uses.into_iter()
                .filter(|u| {
                    ["services", "admin", "worker"]
                        .iter()
                        .any(|r| u == r || u.starts_with(&format!("{r}::")))
                })
                .map(move |u| format!("{m} -> {u}"))
        })
        .collect();
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn the_admin_api_and_the_database_layer_never_import_the_worker_side() {
    let bad: Vec<String> = imports()
        .into_iter()
        .filter(|(m, _)| {
            ["admin", "db"]
                .iter()
                .any(|r| m == r || m.starts_with(&format!("{r}::")))
        })
        .flat_map(|(m, uses)| {
            uses.into_iter()
                .filter(|u| {
                    ["claim", "services", "worker"]
                        .iter()
                        .any(|r| u == r || u.starts_with(&format!("{r}::")))
                })
                .map(move |u| format!("{m} -> {u}"))
        })
        .collect();
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn the_console_reads_through_the_admin_api_never_the_claim_path_or_the_worker() {
    let graph = imports();
    let bad: Vec<String> = graph
        .iter()
        .filter(|(m, _)| *m == "console" || m.starts_with("console::"))
        .flat_map(|(m, uses)| {
            uses.iter()
                .filter(|u| {
                    ["claim", "services", "worker"]
                        .iter()
                        .any(|r| *u == r || u.starts_with(&format!("{r}::")))
                })
                .map(move |u| format!("{m} -> {u}"))
        })
        .collect();
    assert!(bad.is_empty(), "{bad:#?}");
    // And nothing but the crate root names the console: it sits on top.
    let users: Vec<&String> = graph
        .iter()
        .filter(|(m, uses)| {
            !(m.is_empty() || *m == "console" || m.starts_with("console::"))
                && uses
                    .iter()
                    .any(|u| u == "console" || u.starts_with("console::"))
        })
        .map(|(m, _)| m)
        .collect();
    assert!(users.is_empty(), "{users:?} import the console");
    assert!(graph["console::pages"].contains("admin"));
}

#[test]
fn the_public_files_never_import_the_claim_path() {
    // What an embedder reads (handler.rs, job.rs, config.rs, client.rs,
    // handlers/, admin/, console/, …) stands on its own: a trait the claim
    // path must provide is defined beside its user and implemented in
    // claim/. The worker (the supervisor that starts the claim tasks), the
    // services beside the claim path and the crate root (re-exports) are
    // the only modules outside claim/ that name it.
    let inside = |m: &str| {
        ["claim", "services", "worker"]
            .iter()
            .any(|r| m == *r || m.starts_with(&format!("{r}::")))
    };
    let bad: Vec<String> = imports()
        .into_iter()
        .filter(|(m, _)| !m.is_empty() && !inside(m))
        .flat_map(|(m, uses)| {
            uses.into_iter()
                .filter(|u| u == "claim" || u.starts_with("claim::"))
                .map(move |u| format!("{m} -> {u}"))
        })
        .collect();
    assert!(
        bad.is_empty(),
        "public files import the claim path: {bad:#?}"
    );
}

/// Whether module `m` is `root` or under it.
fn under(m: &str, root: &str) -> bool {
    m == root || m.starts_with(&format!("{root}::"))
}

/// Every import (`module -> module`) from a module under `from` to one
/// under any of `to`.
fn imports_from_to(from: &str, to: &[&str]) -> Vec<String> {
    imports()
        .into_iter()
        .filter(|(m, _)| under(m, from))
        .flat_map(|(m, uses)| {
            uses.into_iter()
                .filter(|u| to.iter().any(|t| under(u, t)))
                .map(move |u| format!("{m} -> {u}"))
        })
        .collect()
}

#[test]
fn choosing_what_to_claim_never_imports_the_context_a_delivery_mode_or_the_outcome() {
    // claim/choose/ decides what a round takes and when; the modes call
    // it, never the other way round, and it is handed the pieces of the
    // claim context it needs (claim/choose/mod.rs).
    let bad = imports_from_to(
        "claim::choose",
        &[
            "claim::context",
            "claim::lease",
            "claim::tx",
            "claim::outcome",
            "claim::claimer",
            "claim::claims",
        ],
    );
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn the_outcome_never_imports_a_delivery_mode_the_choice_or_the_context() {
    // claim/outcome/ says what a run comes to and writes, the same for
    // both modes (claim/outcome/mod.rs).
    let bad = imports_from_to(
        "claim::outcome",
        &[
            "claim::lease",
            "claim::tx",
            "claim::choose",
            "claim::context",
            "claim::claimer",
            "claim::claims",
        ],
    );
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn running_a_job_imports_nothing_else_of_the_claim_path() {
    // claim/run/ is what both modes build on (claim/run/mod.rs).
    let bad: Vec<String> = imports_from_to("claim::run", &["claim"])
        .into_iter()
        .filter(|i| !i.ends_with(" -> claim::run") && !i.contains(" -> claim::run::"))
        .collect();
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn the_delivery_modes_never_import_each_other() {
    let mut bad = imports_from_to("claim::lease", &["claim::tx"]);
    bad.extend(imports_from_to("claim::tx", &["claim::lease"]));
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn the_worker_imports_only_the_claim_entry_point() {
    // worker.rs starts and stops the claim path through what
    // claim/mod.rs exports (claim::Claims), never through its files.
    let bad: Vec<String> = imports_from_to("worker", &["claim"])
        .into_iter()
        .filter(|i| i != "worker -> claim")
        .collect();
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn the_module_graph_is_read_from_the_source() {
    // The checks above see nothing if the reading finds nothing.
    let graph = imports();
    assert!(
        graph["claim::tx"].contains("claim::context"),
        "{:?}",
        graph["claim::tx"]
    );
    assert!(graph["services::poller"].contains("claim::choose::next_due"));
    assert!(graph["worker"].contains("claim"), "{:?}", graph["worker"]);
    assert!(graph["claim::lease"].contains("claim::run::row"));
}

/// The text of each claim statement, comments dropped and whitespace
/// collapsed: the four plain claims of `functions/claims.sql`, and the
/// statements of `src/db/sql/` that are not functions.
fn claims() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let normal = |text: &str| -> String {
        let code: Vec<&str> = text
            .lines()
            .map(|l| l.split("--").next().unwrap())
            .collect();
        code.join(" ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .replace("$3::text[]", "only_tasks")
            .replace("$4::text[]", "never_tasks")
            .replace("c.", "")
            .replace("l.", "")
    };
    let functions = std::fs::read_to_string(root.join("functions/claims.sql")).unwrap();
    let mut out = Vec::new();
    // claim_tx_all and claim_lease_all are wrappers of claim_tx_all_after
    // and claim_lease_all_after (from the head).
    for name in [
        "claim_tx_all_after",
        "claim_tx_queue",
        "claim_lease_all_after",
        "claim_lease_queue",
    ] {
        let start = functions
            .find(&format!("FUNCTION pgwake.{name}("))
            .unwrap_or_else(|| panic!("functions/claims.sql lacks {name}"));
        let end = start + functions[start..].find("\n$$;").unwrap();
        out.push((name.to_string(), normal(&functions[start..end])));
    }
    for name in ["claim_tx_limited", "claim_lease_limited", "claim_tx_one"] {
        let text = std::fs::read_to_string(root.join(format!("src/db/sql/{name}.sql"))).unwrap();
        out.push((name.to_string(), normal(&text)));
    }
    out
}

/// The part of `text` from `start` to the end of `end` after it.
fn between<'a>(text: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let a = text.rfind(start)?;
    let b = a + text[a..].find(end)? + end.len();
    Some(&text[a..b])
}

#[test]
fn every_claim_says_the_ordering_test_the_task_filter_and_its_columns_alike() {
    let claims = claims();
    assert_eq!(claims.len(), 7);
    let ordering = |t: &str| between(t, "CASE WHEN ordering_key IS NULL", "END").map(String::from);
    let tasks =
        |t: &str| between(t, "(only_tasks IS NULL", "task <> ALL(never_tasks)").map(String::from);
    let columns = |t: &str| {
        between(
            t,
            "id, queue, task, payload::text",
            "coalesce(ordering_at, run_at)",
        )
        .map(String::from)
    };
    let (first, text) = &claims[0];
    for (name, t) in &claims {
        assert_eq!(
            ordering(t),
            ordering(text),
            "{name} and {first}: the ordering-key test"
        );
        assert!(ordering(t).is_some(), "{name}");
        // Held jobs (migration 0017) are left out, so that the claim walks
        // the partial claim index that does not hold them.
        assert!(
            t.contains("AND NOT held AND CASE WHEN ordering_key IS NULL"),
            "{name}: leaves out held jobs"
        );
        if name != "claim_tx_one" {
            // The one-job claim takes a job by id, whatever its task.
            assert_eq!(tasks(t), tasks(text), "{name} and {first}: the task filter");
        }
        let mode_first = if name.starts_with("claim_tx") {
            &claims[0]
        } else {
            &claims[2]
        };
        assert_eq!(
            columns(t),
            columns(&mode_first.1),
            "{name} and {}: the columns returned",
            mode_first.0
        );
        assert!(columns(t).is_some(), "{name}");
    }
}
