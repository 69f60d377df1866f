//! The last hour as small inline SVG charts, drawn on the server from the
//! per-minute rollup (`pgwake.minute_stats`, `pgwake.minute_depth`): no
//! script, no library, no CDN. Three charts, one slot per minute:
//!
//! - throughput by outcome: stacked bars (done, retried, dead);
//! - pickup latency: the mean and the maximum of each minute, as lines;
//! - depth: ready jobs at the minute's last sample, as a line.
//!
//! Each `svg` has `role="img"` and a `<title>` (its accessible name) that
//! sums it up; each bar and point has its own `<title>`; and a table of the
//! same numbers follows in a `<details>`, for screen readers and for
//! copying. Names come from producers: they reach the page only through
//! maud, which escapes them.

use maud::{html, Markup};

use crate::db::sql::{self, Db};
use crate::error::{Error, Result};

/// The window the charts show.
pub(crate) const WINDOW_MINUTES: i64 = 60;

const WIDTH: f64 = 360.0;
const HEIGHT: f64 = 90.0;
/// Room at the top for the scale's label.
const TOP: f64 = 12.0;

/// One minute of the rollup.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Minute {
    pub done: i64,
    pub retried: i64,
    pub dead: i64,
    pub pickup_mean: Option<f64>,
    pub pickup_max: Option<f64>,
    pub ready: Option<i64>,
}

/// The last [`WINDOW_MINUTES`] minutes, oldest first, of one queue or all.
#[derive(Debug, Clone, Default)]
pub(crate) struct Series {
    /// Epoch minute of the first slot.
    pub first: i64,
    pub minutes: Vec<Minute>,
}

impl Series {
    /// Whether any minute holds a count or a depth sample.
    pub(crate) fn is_empty(&self) -> bool {
        self.minutes.iter().all(|m| *m == Minute::default())
    }

    fn label(&self, i: usize) -> String {
        chrono::DateTime::from_timestamp((self.first + i as i64) * 60, 0)
            .map(|t| t.format("%H:%M").to_string())
            .unwrap_or_default()
    }
}

/// Read the last hour of `queue` (`None`: every queue) in `c`'s
/// transaction.
pub(crate) async fn read(c: &tokio_postgres::Client, queue: Option<&str>) -> Result<Series> {
    let window = (WINDOW_MINUTES * 60) as f64;
    let now: i64 = Db::unnamed(c)
        .query_one(&sql::ROLLUP_NOW, &[])
        .await
        .map_err(Error::db("charts: reading the clock"))?
        .get(0);
    let first = now - WINDOW_MINUTES;
    let mut series = Series {
        first,
        minutes: vec![Minute::default(); WINDOW_MINUTES as usize + 1],
    };
    let slot = |m: i64| {
        usize::try_from(m - first)
            .ok()
            .filter(|i| *i <= WINDOW_MINUTES as usize)
    };
    for r in Db::unnamed(c)
        .query(&sql::ROLLUP_SERIES, &[&window, &queue])
        .await
        .map_err(Error::db("charts: reading the rollup"))?
    {
        if let Some(i) = slot(r.get(0)) {
            let m = &mut series.minutes[i];
            m.done = r.get(1);
            m.retried = r.get(2);
            m.dead = r.get(3);
            m.pickup_mean = r.get(4);
            m.pickup_max = r.get(5);
        }
    }
    for r in Db::unnamed(c)
        .query(&sql::ROLLUP_DEPTH_SERIES, &[&window, &queue])
        .await
        .map_err(Error::db("charts: reading the depth"))?
    {
        if let Some(i) = slot(r.get(0)) {
            series.minutes[i].ready = Some(r.get(1));
        }
    }
    Ok(series)
}

fn x_of(i: usize, n: usize) -> f64 {
    i as f64 * WIDTH / n as f64
}

fn y_of(v: f64, max: f64) -> f64 {
    HEIGHT - (v / max) * (HEIGHT - TOP)
}

fn num(v: f64) -> String {
    format!("{v:.1}")
}

fn secs(v: f64) -> String {
    crate::console::view::seconds(v)
}

/// A line through the points that have a value (gaps break it).
fn polyline(points: &[Option<f64>], max: f64, class: &str, what: &str, s: &Series) -> Markup {
    let n = points.len();
    let step = WIDTH / n as f64;
    let mut runs: Vec<Vec<(usize, f64)>> = Vec::new();
    let mut run = Vec::new();
    for (i, p) in points.iter().enumerate() {
        match p {
            Some(v) => run.push((i, *v)),
            None if !run.is_empty() => runs.push(std::mem::take(&mut run)),
            None => {}
        }
    }
    if !run.is_empty() {
        runs.push(run);
    }
    html! {
        @for run in &runs {
            polyline class=(class) points=(run.iter().map(|(i, v)| format!("{},{}", num(x_of(*i, n) + step / 2.0), num(y_of(*v, max)))).collect::<Vec<_>>().join(" ")) {}
            @for (i, v) in run {
                circle class=(class) cx=(num(x_of(*i, n) + step / 2.0)) cy=(num(y_of(*v, max))) r="1.6" {
                    title { (s.label(*i)) " " (what) " " (if class.starts_with("s-pickup") { secs(*v) } else { format!("{v}") }) }
                }
            }
        }
    }
}

fn svg(id: &str, title: &str, scale: &str, body: Markup) -> Markup {
    html! {
        svg.chart id=(id) role="img" aria-labelledby={ (id) "-title" } viewBox={ "0 0 " (WIDTH) " " (HEIGHT) }
            preserveAspectRatio="none" xmlns="http://www.w3.org/2000/svg" {
            title id={ (id) "-title" } { (title) }
            line.axis x1="0" y1=(HEIGHT) x2=(WIDTH) y2=(HEIGHT) {}
            text.scale x="2" y="9" { (scale) }
            (body)
        }
    }
}

/// The three charts of `s`, titled for `whose` ("every queue" or a
/// queue's name), with their tables; `id` prefixes the elements' ids.
pub(crate) fn render(s: &Series, whose: &str) -> Markup {
    let n = s.minutes.len();
    let step = WIDTH / n as f64;
    let (done, retried, dead) = s.minutes.iter().fold((0, 0, 0), |a, m| {
        (a.0 + m.done, a.1 + m.retried, a.2 + m.dead)
    });
    let peak = s
        .minutes
        .iter()
        .map(|m| m.done + m.retried + m.dead)
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let pickup_peak = s
        .minutes
        .iter()
        .filter_map(|m| m.pickup_max)
        .fold(0.0, f64::max)
        .max(0.001);
    let depth_peak = s
        .minutes
        .iter()
        .filter_map(|m| m.ready)
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let pickup_mean = {
        let (sum, n) = s
            .minutes
            .iter()
            .filter_map(|m| {
                m.pickup_mean.map(|p| {
                    (
                        p * (m.done + m.retried + m.dead) as f64,
                        m.done + m.retried + m.dead,
                    )
                })
            })
            .fold((0.0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        (n > 0).then(|| sum / n as f64)
    };
    let last_ready = s.minutes.iter().rev().find_map(|m| m.ready);
    let throughput_title = format!(
        "Throughput of {whose}, last hour, per minute: {done} done, {retried} retried, {dead} dead"
    );
    let pickup_title = match pickup_mean {
        Some(m) => format!(
            "Pickup latency of {whose}, last hour: mean {}, max {}",
            secs(m),
            secs(pickup_peak)
        ),
        None => format!("Pickup latency of {whose}, last hour: no run"),
    };
    let depth_title = match last_ready {
        Some(r) => {
            format!("Ready jobs of {whose}, last hour: {r} at the last sample, peak {depth_peak}")
        }
        None => format!("Ready jobs of {whose}, last hour: not sampled"),
    };
    // Stacked: each outcome's bar starts where the one below ends.
    let mut bars = Vec::new();
    for (i, m) in s.minutes.iter().enumerate() {
        let mut base = 0i64;
        for (class, label, v) in [
            ("s-done", "done", m.done),
            ("s-retried", "retried", m.retried),
            ("s-dead", "dead", m.dead),
        ] {
            if v > 0 {
                bars.push((i, class, label, v, base));
                base += v;
            }
        }
    }
    html! {
        div.charts {
            figure {
                (svg("chart-throughput", &throughput_title, &format!("{peak} jobs/min"), html! {
                    @for (i, class, label, v, base) in &bars {
                        rect class=(class) x=(num(x_of(*i, n) + 0.5)) y=(num(y_of((base + v) as f64, peak)))
                            width=(num((step - 1.0).max(0.5)))
                            height=(num(y_of(*base as f64, peak) - y_of((base + v) as f64, peak))) {
                            title { (s.label(*i)) " " (label) " " (v) }
                        }
                    }
                }))
                figcaption { span.key.s-done { "done " (done) } " " span.key.s-retried { "retried " (retried) } " " span.key.s-dead { "dead " (dead) } }
            }
            figure {
                (svg("chart-pickup", &pickup_title, &format!("{} max", secs(pickup_peak)), html! {
                    (polyline(&s.minutes.iter().map(|m| m.pickup_max).collect::<Vec<_>>(), pickup_peak, "s-pickup-max", "pickup max", s))
                    (polyline(&s.minutes.iter().map(|m| m.pickup_mean).collect::<Vec<_>>(), pickup_peak, "s-pickup-mean", "pickup mean", s))
                }))
                figcaption { span.key.s-pickup-mean { "pickup mean" } " " span.key.s-pickup-max { "max" } }
            }
            figure {
                (svg("chart-depth", &depth_title, &format!("{depth_peak} ready"), html! {
                    (polyline(&s.minutes.iter().map(|m| m.ready.map(|r| r as f64)).collect::<Vec<_>>(), depth_peak, "s-ready", "ready", s))
                }))
                figcaption { span.key.s-ready { "ready" } }
            }
        }
        details.chart-table {
            summary { "The charts' numbers, per minute" }
            table {
                thead { tr { th { "Minute (UTC)" } th.num { "Done" } th.num { "Retried" } th.num { "Dead" }
                    th.num { "Pickup mean" } th.num { "Pickup max" } th.num { "Ready" } } }
                tbody {
                    @for (i, m) in s.minutes.iter().enumerate().filter(|(_, m)| **m != Minute::default()) {
                        tr {
                            td { (s.label(i)) }
                            td.num { (m.done) } td.num { (m.retried) } td.num { (m.dead) }
                            td.num { @if let Some(p) = m.pickup_mean { (secs(p)) } }
                            td.num { @if let Some(p) = m.pickup_max { (secs(p)) } }
                            td.num { @if let Some(r) = m.ready { (r) } }
                        }
                    }
                }
            }
        }
    }
}

/// The charts' panel: the charts, or why there are none.
pub(crate) fn panel(s: &Series, whose: &str) -> Markup {
    html! {
        div.panel #last-hour {
            @if s.is_empty() {
                p.muted { "Nothing counted in the last hour: workers add their outcomes to the per-minute rollup every few seconds (pgwake run --stats-flush-interval), and the sampler the depth." }
            } @else {
                (render(s, whose))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series() -> Series {
        let mut minutes = vec![Minute::default(); 61];
        minutes[59] = Minute {
            done: 5,
            retried: 2,
            dead: 1,
            pickup_mean: Some(0.01),
            pickup_max: Some(0.05),
            ready: Some(7),
        };
        Series { first: 0, minutes }
    }

    #[test]
    fn each_outcome_has_its_bar_and_the_title_sums_the_hour() {
        let html = render(&series(), "<q>").into_string();
        assert_eq!(html.matches("<rect class=\"s-done\"").count(), 1, "{html}");
        assert_eq!(html.matches("<rect class=\"s-retried\"").count(), 1);
        assert_eq!(html.matches("<rect class=\"s-dead\"").count(), 1);
        assert!(
            html.contains(
                "Throughput of &lt;q&gt;, last hour, per minute: 5 done, 2 retried, 1 dead"
            ),
            "{html}"
        );
        assert!(!html.contains("<q>"), "names are escaped");
    }

    #[test]
    fn an_empty_hour_draws_no_chart() {
        let s = Series {
            first: 0,
            minutes: vec![Minute::default(); 61],
        };
        assert!(s.is_empty());
        assert!(!panel(&s, "x").into_string().contains("<svg"));
    }
}
