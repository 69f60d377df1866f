//! Timestamps the user types (`--run-at`, NDJSON `run_at`): RFC 3339 with a
//! time zone, checked here so that a typo is an error naming the flag or
//! line, not a database error.

use std::time::{Duration, SystemTime};

/// What a timestamp must look like, for error messages.
pub const EXPECTED: &str =
    "expected an RFC 3339 timestamp with a time zone, e.g. 2026-12-01T08:00:00Z or 2026-12-01 10:00:00+02:00";

/// Parse `YYYY-MM-DD[T ]HH:MM:SS[.frac]` followed by `Z` or an offset
/// (`+02:00`, `+0200`, `+02`).
pub fn parse(s: &str) -> Result<SystemTime, String> {
    let s = s.trim();
    let bad = || format!("{s:?}: {EXPECTED}");
    // The offset starts after the date and time (at least "YYYY-MM-DDTHH:MM").
    let (local, offset) = if let Some(local) = s.strip_suffix(['Z', 'z']) {
        (local, 0i64)
    } else {
        let at = s
            .char_indices()
            .skip(16)
            .find(|(_, c)| *c == '+' || *c == '-')
            .map(|(i, _)| i)
            .ok_or_else(bad)?;
        (&s[..at], offset_seconds(&s[at..]).ok_or_else(bad)?)
    };
    let utc = humantime::parse_rfc3339_weak(local).map_err(|_| bad())?;
    let shifted = if offset >= 0 {
        utc.checked_sub(Duration::from_secs(offset as u64))
    } else {
        utc.checked_add(Duration::from_secs(offset.unsigned_abs()))
    };
    shifted.ok_or_else(bad)
}

/// `+HH`, `+HHMM` or `+HH:MM` (or `-…`) in seconds east of UTC.
fn offset_seconds(s: &str) -> Option<i64> {
    let sign = match s.as_bytes().first()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let digits: String = s[1..].chars().filter(|c| *c != ':').collect();
    if !digits.chars().all(|c| c.is_ascii_digit()) || !matches!(digits.len(), 2 | 4) {
        return None;
    }
    let hours: i64 = digits[..2].parse().ok()?;
    let minutes: i64 = if digits.len() == 4 {
        digits[2..].parse().ok()?
    } else {
        0
    };
    (hours <= 23 && minutes <= 59).then_some(sign * (hours * 3600 + minutes * 60))
}

/// The form sent to the database.
pub fn format(t: SystemTime) -> String {
    humantime::format_rfc3339_micros(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_and_zulu_name_the_same_instant() {
        let z = parse("2030-01-01T08:00:00Z").unwrap();
        for s in [
            "2030-01-01T10:00:00+02:00",
            "2030-01-01 10:00:00+0200",
            "2030-01-01T10:00:00+02",
            "2030-01-01T03:30:00-04:30",
            "2030-01-01T08:00:00.000Z",
        ] {
            assert_eq!(parse(s).unwrap(), z, "{s}");
        }
    }

    #[test]
    fn anything_else_is_refused() {
        for s in [
            "banana",
            "2030-01-01",
            "2030-01-01T08:00:00",
            "2030-13-01T08:00:00Z",
            "2030-01-01T08:00:00+25:00",
            "tomorrow",
        ] {
            assert!(parse(s).is_err(), "{s}");
        }
    }
}
