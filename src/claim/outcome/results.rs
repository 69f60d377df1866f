//! What the claim path records of a finished job for history: whether it
//! records at all ([`Switch`], the database's setting as last read), the
//! result a handler returned ([`result_of`]) and the rows counted.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::job::Outcome;
use crate::metrics;

/// Whether this worker records history right now (the database's setting
/// as last read). Off costs the claim path one relaxed atomic load.
#[derive(Debug, Default)]
pub(crate) struct Switch(AtomicBool);

impl Switch {
    pub(crate) fn on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    pub(crate) fn set(&self, on: bool) {
        let was = self.0.swap(on, Ordering::Relaxed);
        if was != on {
            tracing::info!(
                history = on,
                "history of finished jobs turned {}",
                if on { "on" } else { "off" }
            );
        }
    }
}

/// The result a handler's outcome carries, as JSON text the database always
/// accepts (`None` when there is none).
pub(crate) fn result_of(outcome: &Outcome) -> Option<String> {
    match outcome {
        Outcome::DoneWith(value) if !value.is_null() => {
            let mut value = value.clone();
            scrub(&mut value);
            serde_json::to_string(&value).ok()
        }
        _ => None,
    }
}

/// PostgreSQL's `jsonb` cannot hold U+0000: replace it in strings and keys
/// (a result must never make the outcome write fail).
fn scrub(value: &mut serde_json::Value) {
    use serde_json::Value;
    let clean = |s: &str| s.replace('\0', "\u{FFFD}");
    match value {
        Value::String(s) if s.contains('\0') => *s = clean(s),
        Value::Array(items) => items.iter_mut().for_each(scrub),
        Value::Object(map) => {
            if map.keys().any(|k| k.contains('\0')) {
                let old = std::mem::take(map);
                for (k, v) in old {
                    map.insert(clean(&k), v);
                }
            }
            map.values_mut().for_each(scrub);
        }
        _ => {}
    }
}

/// Count rows this worker recorded (the `pgwake_history_rows_total` metric).
pub(crate) fn count_recorded(outcome: &'static str, n: u64) {
    if n > 0 {
        ::metrics::counter!(metrics::HISTORY_ROWS, "outcome" => outcome).increment(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_lose_nul_and_keep_numbers() {
        let v = serde_json::json!({"a\u{0}": ["x\u{0}y", 1]});
        let text = result_of(&Outcome::DoneWith(v)).unwrap();
        assert!(!text.contains("\\u0000"), "{text}");
        let big: serde_json::Value = serde_json::from_str("12345678901234567890123").unwrap();
        assert_eq!(
            result_of(&Outcome::DoneWith(big)).unwrap(),
            "12345678901234567890123"
        );
        assert_eq!(result_of(&Outcome::Done), None);
        assert_eq!(result_of(&Outcome::DoneWith(serde_json::Value::Null)), None);
    }
}
