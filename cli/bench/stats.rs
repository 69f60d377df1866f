//! Medians over runs and percentiles over samples. Empty inputs give 0,
//! never NaN, so every reported number is finite.

use std::time::Duration;

use serde::Serialize;

/// One figure measured in several runs: the median and every run's value.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Measure {
    /// Median over the runs.
    pub median: f64,
    /// Each run's value, in run order.
    pub runs: Vec<f64>,
}

impl Measure {
    /// The median of `runs`.
    pub fn of(runs: Vec<f64>) -> Measure {
        Measure {
            median: median(&runs),
            runs,
        }
    }
}

/// The median (mean of the middle two for an even count).
pub(crate) fn median(xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// Latency percentiles of one run, in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `samples` (milliseconds).
    pub fn of(mut samples: Vec<f64>) -> Percentiles {
        samples.retain(|x| x.is_finite());
        if samples.is_empty() {
            return Percentiles::default();
        }
        samples.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let rank = (q * samples.len() as f64).ceil() as usize;
            samples[rank.clamp(1, samples.len()) - 1]
        };
        Percentiles {
            p50: at(0.50),
            p95: at(0.95),
            p99: at(0.99),
            max: samples[samples.len() - 1],
        }
    }
}

/// Percentiles measured in several runs: each the median over the runs.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LatencyMs {
    /// Median of the runs' p50.
    pub p50: Measure,
    /// Median of the runs' p95.
    pub p95: Measure,
    /// Median of the runs' p99.
    pub p99: Measure,
    /// Median of the runs' max.
    pub max: Measure,
}

impl LatencyMs {
    /// Combine per-run percentiles.
    pub fn of(runs: &[Percentiles]) -> LatencyMs {
        let pick = |f: fn(&Percentiles) -> f64| Measure::of(runs.iter().map(f).collect());
        LatencyMs {
            p50: pick(|p| p.p50),
            p95: pick(|p| p.p95),
            p99: pick(|p| p.p99),
            max: pick(|p| p.max),
        }
    }
}

/// `count` per `elapsed`, 0 for an empty interval.
pub(crate) fn rate(count: f64, elapsed: Duration) -> f64 {
    let s = elapsed.as_secs_f64();
    if s > 0.0 {
        count / s
    } else {
        0.0
    }
}

/// `a / b`, 0 when `b` is 0.
pub(crate) fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// Milliseconds from `from` to `to`, negative when `to` came first.
pub(crate) fn signed_ms(from: std::time::Instant, to: std::time::Instant) -> f64 {
    match to.checked_duration_since(from) {
        Some(d) => d.as_secs_f64() * 1e3,
        None => -(from.duration_since(to).as_secs_f64() * 1e3),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let p = Percentiles::of((1..=100).map(f64::from).collect());
        assert_eq!((p.p50, p.p95, p.p99, p.max), (50.0, 95.0, 99.0, 100.0));
        let one = Percentiles::of(vec![7.0]);
        assert_eq!((one.p50, one.p99), (7.0, 7.0));
    }
}
