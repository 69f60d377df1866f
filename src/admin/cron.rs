//! Cron expressions and their ticks: parsing (the `croner` crate), the
//! schedule's time zone (`chrono-tz`, the IANA database compiled in), and the
//! pure arithmetic of which ticks are due. No I/O and no clock: every
//! function takes the instant it reasons about (the scheduler passes the
//! database's `now()`).
//!
//! Expressions are standard 5-field crontab (`minute hour day-of-month month
//! day-of-week`) or 6 fields with seconds first; `@hourly`, `@daily`,
//! `@weekly`, `@monthly`, `@yearly` are accepted too. Day-of-month and
//! day-of-week combine with OR, as in Vixie cron (prefix the weekday with `+`
//! for AND). A 7th (year) field is refused.
//!
//! Daylight saving time follows croner's documented rule (croner 4, "DST
//! Handling"), which is Vixie cron's:
//! - spring forward (a wall-clock hour does not exist): a *fixed-time* job
//!   (numbers in the second, minute and hour fields, e.g. `30 2 * * *`) runs
//!   once at the first instant after the gap (03:00 in Europe/Berlin); an
//!   *interval* job (`*` or `/` in those fields, e.g. `*/15 * * * *`) loses
//!   the ticks inside the gap and carries on at its next tick after it;
//! - fall back (a wall-clock hour happens twice): a fixed-time job runs once,
//!   at the first occurrence; an interval job runs in both passes.
//!
//! Time always moves forward: ticks are instants (UTC), strictly increasing.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Direction;

/// At most this many missed ticks are counted per schedule and catch-up
/// round (a per-second schedule down for a month would otherwise take
/// seconds to count). The ticks enqueued never depend on it.
pub const MISSED_COUNT_MAX: u64 = 10_000;

/// Why an expression or a zone was refused.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    /// The expression does not parse.
    #[error("{expr:?} is not a cron expression: {reason} (expected 5 fields `minute hour day-of-month month day-of-week`, or 6 with seconds first, e.g. '*/5 * * * *' or '0 30 9 * * MON-FRI')")]
    Syntax {
        /// The expression as given.
        expr: String,
        /// croner's explanation.
        reason: String,
    },
    /// The expression parses but no instant ever matches it (e.g. 30 February).
    #[error("{0:?} never matches any time (e.g. a day that does not exist in that month)")]
    NeverMatches(String),
    /// The time zone is not an IANA zone name.
    #[error(
        "unknown time zone {0:?}: use an IANA name such as UTC, Europe/Berlin or America/New_York"
    )]
    UnknownZone(String),
}

/// A parsed cron expression in a time zone.
#[derive(Debug, Clone)]
pub struct CronSchedule {
    expr: String,
    cron: croner::Cron,
    tz: Tz,
}

impl CronSchedule {
    /// Parse `expr` in the IANA zone `tz` (e.g. `UTC`, `Europe/Berlin`).
    /// Checks syntax and zone only; see [`CronSchedule::next_after`] for
    /// expressions that never match.
    pub fn parse(expr: &str, tz: &str) -> Result<CronSchedule, CronError> {
        let tz = Tz::from_str(tz).map_err(|_| CronError::UnknownZone(tz.to_string()))?;
        let syntax = |reason: String| CronError::Syntax {
            expr: expr.to_string(),
            reason,
        };
        let fields = expr.split_whitespace().count();
        if !expr.trim_start().starts_with('@') && !(5..=6).contains(&fields) {
            return Err(syntax(format!("it has {fields} fields")));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(expr)
            .map_err(|e| syntax(e.to_string()))?;
        Ok(CronSchedule {
            expr: expr.to_string(),
            cron,
            tz,
        })
    }

    /// The expression as given.
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// The time zone.
    pub fn tz(&self) -> Tz {
        self.tz
    }

    /// The first tick strictly after `t`.
    pub fn next_after(&self, t: DateTime<Utc>) -> Result<DateTime<Utc>, CronError> {
        self.cron
            .find_next_occurrence(&t.with_timezone(&self.tz), false)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|_| CronError::NeverMatches(self.expr.clone()))
    }

    /// The next `n` ticks strictly after `t` (fewer if the expression stops
    /// matching, which croner's year limit makes possible in theory).
    pub fn upcoming(&self, t: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        self.cron
            .iter_after(t.with_timezone(&self.tz))
            .take(n)
            .map(|t| t.with_timezone(&Utc))
            .collect()
    }

    /// What is due at `now` for a schedule whose first unserved tick is
    /// `first` (itself a tick), under the catch-up policy `catch_up`: the
    /// number of missed ticks to enqueue besides the latest due one
    /// (0 = `skip`).
    ///
    /// The latest tick at or before `now` is always enqueued, however late
    /// (a restart across a tick must not lose it: River's issue #791, weekly
    /// jobs that never ran). The ticks before it are *missed*; the newest
    /// `catch_up` of them are enqueued too, the rest only counted.
    pub fn due(
        &self,
        first: DateTime<Utc>,
        now: DateTime<Utc>,
        catch_up: u32,
    ) -> Result<Due, CronError> {
        if first > now {
            return Ok(Due {
                ticks: Vec::new(),
                missed: 0,
                next_tick: first,
            });
        }
        let next_tick = self.next_after(now)?;
        let keep = catch_up as usize + 1;
        // Newest first, walking back from `now` (inclusive): cheap however
        // long the downtime was.
        let mut ticks: Vec<DateTime<Utc>> = self
            .cron
            .iter_from(now.with_timezone(&self.tz), Direction::Backward)
            .map(|t| t.with_timezone(&Utc))
            .take_while(|t| *t >= first)
            .take(keep)
            .collect();
        ticks.reverse();
        let missed = match ticks.first() {
            Some(&oldest) if oldest > first => self
                .cron
                .iter_from(first.with_timezone(&self.tz), Direction::Forward)
                .map(|t| t.with_timezone(&Utc))
                .take_while(|t| *t < oldest)
                .take(MISSED_COUNT_MAX as usize)
                .count() as u64,
            _ => 0,
        };
        Ok(Due {
            ticks,
            missed,
            next_tick,
        })
    }
}

/// What one schedule owes at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// Ticks to enqueue, oldest first (empty when nothing is due).
    pub ticks: Vec<DateTime<Utc>>,
    /// Due ticks dropped by the catch-up policy (counted up to
    /// [`MISSED_COUNT_MAX`]).
    pub missed: u64,
    /// The first tick after `now`: where the schedule resumes.
    pub next_tick: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn berlin(expr: &str) -> CronSchedule {
        CronSchedule::parse(expr, "Europe/Berlin").unwrap()
    }

    fn ticks_between(c: &CronSchedule, from: &str, n: usize) -> Vec<String> {
        c.upcoming(utc(from), n)
            .into_iter()
            .map(|t| t.with_timezone(&c.tz()).to_rfc3339())
            .collect()
    }

    #[test]
    fn five_and_six_field_expressions_parse_and_others_are_refused_with_the_reason() {
        assert!(CronSchedule::parse("*/5 * * * *", "UTC").is_ok());
        assert!(CronSchedule::parse("*/2 * * * * *", "UTC").is_ok());
        assert!(CronSchedule::parse("0 9 * * MON-FRI", "UTC").is_ok());
        assert!(CronSchedule::parse("@daily", "UTC").is_ok());
        for bad in [
            "",
            "* * * *",
            "0 0 0 1 1 * 2030",
            "61 * * * *",
            "* * * * MONX",
            "hello",
        ] {
            let err = CronSchedule::parse(bad, "UTC").unwrap_err();
            assert!(
                matches!(err, CronError::Syntax { .. }),
                "{bad:?} must be refused as syntax: {err:?}"
            );
        }
        assert_eq!(
            CronSchedule::parse("* * * * *", "Mars/Olympus").unwrap_err(),
            CronError::UnknownZone("Mars/Olympus".into())
        );
        let never = CronSchedule::parse("0 0 30 2 *", "UTC").unwrap();
        assert!(matches!(
            never.next_after(utc("2026-01-01T00:00:00Z")),
            Err(CronError::NeverMatches(_))
        ));
    }

    #[test]
    fn a_fixed_time_job_in_the_spring_forward_gap_runs_once_right_after_the_gap() {
        // Europe/Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST.
        let c = berlin("30 2 * * *");
        assert_eq!(
            ticks_between(&c, "2026-03-27T12:00:00Z", 3),
            [
                "2026-03-28T02:30:00+01:00",
                "2026-03-29T03:00:00+02:00",
                "2026-03-30T02:30:00+02:00"
            ]
        );
    }

    #[test]
    fn an_interval_job_loses_the_ticks_inside_the_spring_forward_gap() {
        let c = berlin("*/30 * * * *");
        assert_eq!(
            ticks_between(&c, "2026-03-29T00:15:00Z", 3),
            [
                "2026-03-29T01:30:00+01:00",
                "2026-03-29T03:00:00+02:00",
                "2026-03-29T03:30:00+02:00"
            ]
        );
    }

    #[test]
    fn a_fixed_time_job_in_the_fall_back_overlap_runs_once_at_the_first_pass() {
        // Europe/Berlin, 2026-10-25: 03:00 CEST falls back to 02:00 CET.
        let c = berlin("30 2 * * *");
        assert_eq!(
            ticks_between(&c, "2026-10-24T12:00:00Z", 3),
            [
                "2026-10-25T02:30:00+02:00",
                "2026-10-26T02:30:00+01:00",
                "2026-10-27T02:30:00+01:00"
            ]
        );
    }

    #[test]
    fn an_interval_job_runs_in_both_passes_of_the_fall_back_overlap() {
        let c = berlin("*/30 * * * *");
        assert_eq!(
            ticks_between(&c, "2026-10-24T23:45:00Z", 5),
            [
                "2026-10-25T02:00:00+02:00",
                "2026-10-25T02:30:00+02:00",
                "2026-10-25T02:00:00+01:00",
                "2026-10-25T02:30:00+01:00",
                "2026-10-25T03:00:00+01:00"
            ]
        );
    }

    #[test]
    fn catch_up_across_a_dst_change_counts_real_ticks_not_wall_clock_hours() {
        // Hourly at minute 0 across the spring-forward night: Saturday 13:00
        // to Sunday 12:00 local is 23 ticks, not 24 (02:00 does not exist).
        let c = berlin("0 * * * *");
        let tz = c.tz();
        let first = tz
            .with_ymd_and_hms(2026, 3, 28, 13, 0, 0)
            .unwrap()
            .with_timezone(&Utc);
        let now = tz
            .with_ymd_and_hms(2026, 3, 29, 12, 0, 30)
            .unwrap()
            .with_timezone(&Utc);
        let due = c.due(first, now, 2).unwrap();
        assert_eq!(due.ticks.len(), 3);
        assert_eq!(due.missed, 20, "23 due ticks, 3 enqueued");
        assert_eq!(
            due.next_tick.with_timezone(&tz).to_rfc3339(),
            "2026-03-29T13:00:00+02:00"
        );
    }

    #[test]
    fn skip_enqueues_only_the_latest_due_tick_and_counts_the_rest_as_missed() {
        let c = CronSchedule::parse("* * * * *", "UTC").unwrap();
        let due = c
            .due(utc("2026-05-01T10:00:00Z"), utc("2026-05-01T10:09:30Z"), 0)
            .unwrap();
        assert_eq!(due.ticks, [utc("2026-05-01T10:09:00Z")]);
        assert_eq!(due.missed, 9);
        assert_eq!(due.next_tick, utc("2026-05-01T10:10:00Z"));
    }

    #[test]
    fn catch_up_n_enqueues_the_n_newest_missed_ticks_besides_the_latest() {
        let c = CronSchedule::parse("* * * * *", "UTC").unwrap();
        let due = c
            .due(utc("2026-05-01T10:00:00Z"), utc("2026-05-01T10:09:00Z"), 3)
            .unwrap();
        assert_eq!(
            due.ticks,
            [
                utc("2026-05-01T10:06:00Z"),
                utc("2026-05-01T10:07:00Z"),
                utc("2026-05-01T10:08:00Z"),
                utc("2026-05-01T10:09:00Z")
            ],
            "a tick exactly at now is due"
        );
        assert_eq!(due.missed, 6);
        // More allowance than missed ticks: all of them, none missed.
        let due = c
            .due(
                utc("2026-05-01T10:00:00Z"),
                utc("2026-05-01T10:02:10Z"),
                100,
            )
            .unwrap();
        assert_eq!(due.ticks.len(), 3);
        assert_eq!(due.missed, 0);
    }

    #[test]
    fn nothing_is_due_before_the_first_tick_and_a_long_downtime_is_counted_with_a_cap() {
        let c = CronSchedule::parse("* * * * * *", "UTC").unwrap();
        let due = c
            .due(utc("2026-05-01T10:00:05Z"), utc("2026-05-01T10:00:04Z"), 0)
            .unwrap();
        assert!(due.ticks.is_empty());
        assert_eq!(due.next_tick, utc("2026-05-01T10:00:05Z"));
        let due = c
            .due(utc("2026-05-01T00:00:00Z"), utc("2026-05-02T00:00:00Z"), 0)
            .unwrap();
        assert_eq!(due.ticks, [utc("2026-05-02T00:00:00Z")]);
        assert_eq!(due.missed, MISSED_COUNT_MAX);
    }
}
