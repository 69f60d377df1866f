//! `pgwake enqueue --ndjson`: one job per line of stdin, every line checked
//! before anything is inserted; an error names the line.

use std::io::BufRead;

use pgwake::client::NewJob;
use pgwake::error::Error;

/// Rows per INSERT statement for `enqueue --ndjson`.
pub const BATCH: usize = 5000;

/// Read and check every line; blank lines are skipped.
pub fn read(input: impl BufRead) -> Result<Vec<NewJob>, Error> {
    let mut jobs = Vec::new();
    for (i, line) in input.lines().enumerate() {
        let line = line.map_err(|source| Error::Io {
            context: "reading stdin".into(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let mut job: NewJob = serde_json::from_str(&line)
            .map_err(|e| Error::Config(format!("stdin line {}: {e}", i + 1)))?;
        if let Some(at) = &job.run_at {
            let at = super::timestamp::parse(at)
                .map_err(|e| Error::Config(format!("stdin line {}: run_at {e}", i + 1)))?;
            job.run_at = Some(super::timestamp::format(at));
        }
        job.validate()
            .map_err(|e| e.at(format_args!("stdin line {}", i + 1)))?;
        jobs.push(job);
    }
    Ok(jobs)
}
