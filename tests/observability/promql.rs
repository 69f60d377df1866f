//! Just enough of a PromQL lexer to find the metric names an expression
//! selects.

use std::collections::BTreeSet;

/// The metric names an expression selects: identifiers that are not
/// functions, keywords, label names, strings, numbers or durations.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    const GROUPING: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    const KEYWORDS: &[&str] = &[
        "bool",
        "and",
        "or",
        "unless",
        "offset",
        "inf",
        "nan", // operators, literals
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count", // aggregations
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "limit_ratio",
    ];
    let s: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut grouping = false;
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&s, i);
        } else if c == '{' || c == '[' || (c == '(' && grouping) {
            i = skip_group(&s, i);
            grouping = false;
        } else if c.is_ascii_digit() || c == '.' {
            while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == '_' || s[i] == ':') {
                i += 1;
            }
            let word: String = s[start..i].iter().collect();
            let next = s[i..].iter().find(|c| !c.is_whitespace());
            let lower = word.to_ascii_lowercase();
            if GROUPING.contains(&lower.as_str()) {
                // Its label list follows, if any: `on() …`, `group_left …`.
                grouping = next == Some(&'(');
            } else if !KEYWORDS.contains(&lower.as_str()) && next != Some(&'(') {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// The index after the string literal starting at `i`.
pub fn skip_string(s: &[char], i: usize) -> usize {
    let quote = s[i];
    let mut j = i + 1;
    while j < s.len() && s[j] != quote {
        j += if s[j] == '\\' && quote != '`' { 2 } else { 1 };
    }
    j + 1
}

/// The index after the bracketed group (`{…}`, `[…]`, `(…)`) starting at `i`.
pub fn skip_group(s: &[char], i: usize) -> usize {
    let close = match s[i] {
        '{' => '}',
        '[' => ']',
        _ => ')',
    };
    let mut j = i + 1;
    while j < s.len() && s[j] != close {
        j = if matches!(s[j], '"' | '\'' | '`') {
            skip_string(s, j)
        } else {
            j + 1
        };
    }
    j + 1
}
