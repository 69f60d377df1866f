//! `pgwake enqueue`: one job from flags, or many from NDJSON on stdin, in
//! one transaction.

use pgwake::client::{enqueue_many_detailed, NewJob};
use pgwake::error::Error;
use pgwake::{admin::schema, connect};

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
    job.ordering_key = args.ordering_key;
    job.unique_key = args.unique_key;
    job.unique_running = args.unique_running.then_some(true);
    job.limit_key = args.limit_key;
    job.traceparent = args.traceparent;
    job.tracestate = args.tracestate;
    if !args.after.is_empty() {
        job.after = Some(args.after);
    }
    job.on_parent_failure = args.on_parent_failure;
    job.batch = args.batch;
    job.max_attempts = args.max_attempts;
    if let Some(t) = args.timeout {
        job = job.timeout(t.into());
    }
    Ok(job)
}

/// Enqueue and print the id (or the id range). A duplicate of a waiting
/// job (same `unique_key`) prints that job's id, and a line on stderr.
pub async fn enqueue(args: EnqueueArgs) -> Result<(), Error> {
    let db = args.db.clone();
    let jobs = if args.ndjson {
        let mut jobs = ndjson::read(std::io::stdin().lock())?;
        // A line without a trace context of its own takes the command's.
        if args.traceparent.is_some() {
            for job in jobs.iter_mut().filter(|j| j.traceparent.is_none()) {
                job.traceparent.clone_from(&args.traceparent);
                job.tracestate.clone_from(&args.tracestate);
            }
        }
        jobs
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
        let chunk_ids = enqueue_many_detailed(&tx, chunk)
            .await
            .map_err(|e| e.at(format_args!("jobs {first}–{}", first + chunk.len() - 1)))?;
        ids.extend(chunk_ids);
    }
    tx.commit().await.map_err(Error::db("enqueue: commit"))?;
    let duplicates = ids.iter().filter(|e| e.duplicate).count();
    if ids.len() == 1 {
        println!("{}", ids[0].id);
        if ids[0].duplicate {
            eprintln!(
                "duplicate: job {} already waits with this unique key; nothing enqueued",
                ids[0].id
            );
        }
        return Ok(());
    }
    for (line, e) in jobs.iter().zip(&ids).filter(|(_, e)| e.duplicate) {
        let key = line.unique_key.as_deref().unwrap_or_default();
        eprintln!(
            "duplicate: job {} already waits with unique key {key:?}",
            e.id
        );
    }
    let new: Vec<i64> = ids.iter().filter(|e| !e.duplicate).map(|e| e.id).collect();
    match (new.iter().min(), new.iter().max()) {
        (Some(first), Some(last)) => println!(
            "enqueued {} jobs (ids {first}–{last}){}",
            new.len(),
            match duplicates {
                0 => String::new(),
                d => format!("; {d} duplicates not enqueued"),
            }
        ),
        _ => println!("enqueued 0 jobs; {duplicates} duplicates not enqueued"),
    }
    Ok(())
}
