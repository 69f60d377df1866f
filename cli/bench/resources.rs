//! Process and machine resource readings (Linux): this process's CPU time
//! (`getrusage(RUSAGE_SELF)`: the in-process worker plus the bench
//! harness), its peak RSS (`VmHWM`), and the whole machine's busy CPU time
//! from `/proc/stat` (PostgreSQL included; on a shared host, everyone else
//! too).

use std::time::Duration;

use pgwake::error::{Error, Result};

/// CPU time (user + system) this process has used.
pub(crate) fn process_cpu() -> Result<Duration> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a full rusage into the pointer it is given,
    // which points at properly sized and aligned memory.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return Err(Error::Io {
            context: "bench: getrusage".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: getrusage returned 0, so it initialised the struct.
    let usage = unsafe { usage.assume_init() };
    let tv =
        |t: libc::timeval| Duration::new(t.tv_sec.max(0) as u64, (t.tv_usec.max(0) as u32) * 1000);
    Ok(tv(usage.ru_utime) + tv(usage.ru_stime))
}

/// Peak resident set size of this process (`VmHWM`), in MiB.
pub(crate) fn peak_rss_mib() -> Result<f64> {
    let status = read("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kib| kib / 1024.0)
        .ok_or_else(|| Error::Io {
            context: "bench: no VmHWM in /proc/self/status".into(),
            source: std::io::ErrorKind::InvalidData.into(),
        })
}

/// Machine CPU time so far: (busy, total) in seconds over every core.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MachineCpu {
    busy: f64,
    total: f64,
}

impl MachineCpu {
    /// Read `/proc/stat`'s aggregate line.
    pub fn now() -> Result<MachineCpu> {
        let stat = read("/proc/stat")?;
        let fields: Vec<f64> = stat
            .lines()
            .next()
            .filter(|l| l.starts_with("cpu "))
            .map(|l| {
                l.split_whitespace()
                    .skip(1)
                    .filter_map(|f| f.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        if fields.len() < 5 {
            return Err(Error::Io {
                context: "bench: unexpected /proc/stat".into(),
                source: std::io::ErrorKind::InvalidData.into(),
            });
        }
        // user nice system idle iowait irq softirq steal (guest is in user).
        let total: f64 = fields.iter().take(8).sum();
        let idle = fields[3] + fields[4];
        let hz = clock_ticks();
        Ok(MachineCpu {
            busy: (total - idle) / hz,
            total: total / hz,
        })
    }

    /// Busy CPU seconds since `earlier`, and the busy share of all cores.
    pub fn since(&self, earlier: &MachineCpu) -> (f64, f64) {
        let busy = self.busy - earlier.busy;
        (busy, super::stats::ratio(busy, self.total - earlier.total))
    }
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as f64
    } else {
        100.0
    }
}

fn read(path: &str) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        context: format!("bench: cannot read {path}"),
        source,
    })
}
