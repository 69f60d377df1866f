//! The Grafana dashboard as queries: every expression of
//! `grafana/pgwake-dashboard.json` with Grafana's macros and variables
//! replaced, ready to send to Prometheus.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::promql::metric_names;

/// What the dashboard's range macros (`$__rate_interval`, `$__range`,
/// `$__interval`) become: at a 1 s scrape interval it holds the two samples
/// `rate()` needs a few seconds after the first scrape.
pub const RANGE: &str = "1m";

pub fn grafana_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("grafana")
}

/// The expressions of `grafana/pgwake-dashboard.json`.
pub struct Dashboard {
    /// (panel title, expression) of every panel target and annotation.
    pub targets: Vec<(String, String)>,
    /// (name, query) of every templating variable.
    pub variables: Vec<(String, String)>,
    /// What each variable stands for when "All" is selected.
    pub all_values: BTreeMap<String, String>,
}

impl Dashboard {
    pub fn load() -> Dashboard {
        let path = grafana_dir().join("pgwake-dashboard.json");
        let json: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut targets = Vec::new();
        collect_exprs(&json, "dashboard", &mut targets);
        assert!(!targets.is_empty(), "no expressions in {}", path.display());
        let mut variables = Vec::new();
        let mut all_values = BTreeMap::new();
        for v in json["templating"]["list"].as_array().into_iter().flatten() {
            let name = v["name"].as_str().expect("variable name").to_string();
            match v["type"].as_str() {
                Some("query") => {
                    let query = match &v["query"] {
                        Value::String(q) => q.clone(),
                        q => q["query"].as_str().expect("variable query").to_string(),
                    };
                    let all = v["allValue"].as_str().unwrap_or(".*").to_string();
                    all_values.insert(name.clone(), all);
                    variables.push((name, query));
                }
                Some("datasource") => {}
                other => panic!("variable {name}: type {other:?} is not handled by this test"),
            }
        }
        Dashboard {
            targets,
            variables,
            all_values,
        }
    }

    /// Every expression to query: panel targets with the macros expanded,
    /// and what each variable's query reads.
    pub fn queries(&self) -> Vec<(String, Query)> {
        let mut out: Vec<(String, Query)> = self
            .targets
            .iter()
            .map(|(title, expr)| (title.clone(), Query::Expr(self.expand(expr))))
            .collect();
        for (name, query) in &self.variables {
            out.push((format!("variable ${name}"), Query::variable(query)));
        }
        out
    }

    /// Metric names the dashboard reads.
    pub fn metric_names(&self) -> BTreeSet<String> {
        self.queries()
            .iter()
            .flat_map(|(_, q)| match q {
                Query::Expr(e) => metric_names(e),
                Query::LabelOf { metric, .. } => metric_names(metric),
                Query::LabelValues(_) => BTreeSet::new(),
            })
            .collect()
    }

    /// Replace Grafana's macros: range macros by [`RANGE`], variables by
    /// their "All" value. Anything else left over fails the test.
    pub fn expand(&self, expr: &str) -> String {
        let mut out = String::new();
        let mut rest = expr;
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            let (name, len) = if let Some(braced) = after.strip_prefix('{') {
                let end = braced.find('}').expect("unterminated ${");
                (braced[..end].split(':').next().unwrap(), end + 2)
            } else {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], end)
            };
            let value = match name {
                "__rate_interval" | "__interval" | "__range" => RANGE.to_string(),
                _ => self
                    .all_values
                    .get(name)
                    .unwrap_or_else(|| panic!("unknown macro ${name} in {expr}"))
                    .clone(),
            };
            out.push_str(&value);
            rest = &after[len..];
        }
        out.push_str(rest);
        out
    }
}

/// Every `expr` under `v`, with the title of the panel it belongs to.
pub fn collect_exprs(v: &Value, title: &str, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(map) => {
            let title = map.get("title").and_then(Value::as_str).unwrap_or(title);
            if let Some(Value::String(expr)) = map.get("expr") {
                out.push((title.to_string(), expr.clone()));
            }
            for (key, child) in map {
                if key != "templating" {
                    collect_exprs(child, title, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| collect_exprs(i, title, out)),
        _ => {}
    }
}

/// One query against Prometheus.
pub enum Query {
    /// An instant query.
    Expr(String),
    /// `label_values(metric, label)`: the metric's series carry the label.
    LabelOf { metric: String, label: String },
    /// `label_values(label)`: the label has values.
    LabelValues(String),
}

impl Query {
    pub fn variable(query: &str) -> Query {
        let q = query.trim();
        if let Some(args) = q
            .strip_prefix("label_values(")
            .and_then(|a| a.strip_suffix(')'))
        {
            return match args.rsplit_once(',') {
                Some((metric, label)) => Query::LabelOf {
                    metric: metric.trim().to_string(),
                    label: label.trim().to_string(),
                },
                None => Query::LabelValues(args.trim().to_string()),
            };
        }
        if let Some(expr) = q
            .strip_prefix("query_result(")
            .and_then(|a| a.strip_suffix(')'))
        {
            return Query::Expr(expr.to_string());
        }
        panic!("variable query {query:?} is not handled by this test");
    }
}
