//! `pgwake enqueue`: one job from flags, or many from NDJSON on stdin, in
//! one transaction.

use pgwake::client::{enqueue_many, NewJob};
use pgwake::error::Error;
use pgwake::{connect, schema};

use super::args::EnqueueArgs;
use super::{ndjson, timestamp};

/// The job the flags describe.
fn job_from_flags(args: EnqueueArgs) -> Result<NewJob, Error> {
    let payload: serde_json::Value = serde_json::from_str(&args.payload)
        .map_err(|e| Error::Config(format!("--payload is not valid JSON: {e}")))?;
    let mut job = NewJob::new(args.task.unwrap_or_default(), payload);
    job.queue = args.queue;
    // --delay counts from the database's now(), not this machine's clock.
    match (args.run_at, args.delay) {
        (Some(at), _) => job.run_at = Some(timestamp::format(at)),
        (None, Some(d)) => job.delay = Some(d.into()),
        (None, None) => {}
    }
    job.priority = args.priority;
    job.max_attempts = args.max_attempts;
    if let Some(t) = args.timeout {
        job = job.timeout(t.into());
    }
    Ok(job)
}

/// Enqueue and print the id (or the id range).
pub async fn enqueue(args: EnqueueArgs) -> Result<(), Error> {
    let db = args.db.clone();
    let jobs = if args.ndjson {
        ndjson::read(std::io::stdin().lock())?
    } else {
        vec![job_from_flags(args)?]
    };
    if jobs.is_empty() {
        return Err(Error::Config("no jobs on stdin".into()));
    }
    let mut client = connect::connect(&db.config()?).await?;
    schema::check(&client).await?;
    let tx = client
        .transaction()
        .await
        .map_err(Error::db("enqueue: begin"))?;
    let mut ids = Vec::with_capacity(jobs.len());
    for (n, chunk) in jobs.chunks(ndjson::BATCH).enumerate() {
        let first = n * ndjson::BATCH + 1;
        let chunk_ids = enqueue_many(&tx, chunk)
            .await
            .map_err(|e| e.at(format_args!("jobs {first}–{}", first + chunk.len() - 1)))?;
        ids.extend(chunk_ids);
    }
    tx.commit().await.map_err(Error::db("enqueue: commit"))?;
    if ids.len() == 1 {
        println!("{}", ids[0]);
    } else {
        println!(
            "enqueued {} jobs (ids {}–{})",
            ids.len(),
            ids[0],
            ids[ids.len() - 1]
        );
    }
    Ok(())
}
