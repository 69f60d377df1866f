//! Traces out (issue 39): the `pgwake` binary exports its jobs' spans to a
//! real OTLP receiver (otlp.rs: the wire format decoded, over gRPC and over
//! HTTP/protobuf), parented on the producer's context however it came (a
//! plain `SET LOCAL` in SQL, the Rust client inside a span), through
//! retries; `exec` sees `TRACEPARENT`; `sql` functions read the context and
//! the jobs they enqueue join it; log lines carry the trace id; a dead
//! collector changes nothing but a counter.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use crate::otlp::{Receiver, Span};

const DEADLINE: Duration = Duration::from_secs(120);

/// A producer's context, as an OpenTelemetry propagator writes it.
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

fn traceparent() -> String {
    format!("00-{TRACE}-{PARENT}-01")
}

/// Insert a job of `task` in a transaction that set `traceparent`.
async fn insert_traced(db: &TestDb, task: &str, traceparent: &str) -> i64 {
    let mut c = db.client().await;
    let tx = c.transaction().await.unwrap();
    tx.execute(
        "SELECT set_config('pgwake.traceparent', $1, true)",
        &[&traceparent],
    )
    .await
    .unwrap();
    let id: i64 = tx
        .query_one(
            "INSERT INTO pgwake.jobs (task, payload) VALUES ($1, '{}') RETURNING id",
            &[&task],
        )
        .await
        .unwrap()
        .get(0);
    tx.commit().await.unwrap();
    id
}

/// The spans of job `id` named `name`, once there are `n`.
async fn spans_of(receiver: &Receiver, id: i64, name: &str, n: usize) -> Vec<Span> {
    let mut found = Vec::new();
    wait_for_every(
        &format!("{n} {name} span(s) of job {id} at the receiver"),
        DEADLINE,
        Duration::from_millis(50),
        async || {
            found = receiver
                .spans()
                .into_iter()
                .filter(|s| s.name == name && s.attr("job.id") == id.to_string())
                .collect();
            if found.len() >= n {
                Ok(())
            } else {
                Err(format!("{} so far: {:?}", found.len(), receiver.spans()))
            }
        },
    )
    .await;
    found
}

/// Children of `parent` named `name`.
async fn children(receiver: &Receiver, parent: &Span, name: &str) -> Vec<Span> {
    let mut found = Vec::new();
    wait_for_every(
        &format!("a {name} span under {}", parent.span_id),
        DEADLINE,
        Duration::from_millis(50),
        async || {
            found = receiver
                .spans()
                .into_iter()
                .filter(|s| s.name == name && s.parent_span_id == parent.span_id)
                .collect();
            if found.is_empty() {
                Err("none yet".into())
            } else {
                Ok(())
            }
        },
    )
    .await;
    found
}

async fn finished_result(db: &TestDb, id: i64) -> String {
    let c = db.client().await;
    let mut result = String::new();
    wait_for_every(
        &format!("job {id} in the history"),
        DEADLINE,
        Duration::from_millis(50),
        async || {
            let row = c
                .query_opt(
                    "SELECT result #>> '{}' FROM pgwake.finished_jobs WHERE id = $1",
                    &[&id],
                )
                .await
                .map_err(|e| e.to_string())?;
            match row {
                Some(r) => {
                    result = r.get::<_, Option<String>>(0).unwrap_or_default();
                    Ok(())
                }
                None => Err("not finished".into()),
            }
        },
    )
    .await;
    result
}

#[tokio::test]
async fn a_plain_insert_with_set_local_gives_grpc_spans_under_the_producer_and_exec_its_traceparent(
) {
    let db = migrated_db().await;
    let receiver = Receiver::start().await;
    let id = insert_traced(&db, "echo", &traceparent()).await;
    let endpoint = format!("http://{}", receiver.grpc);
    let _worker = KillOnDrop::new(spawn_pgwake_run(
        &db.url,
        &[
            "--otlp-endpoint",
            &endpoint,
            "--otlp-protocol",
            "grpc",
            "--keep-finished",
            "1d",
            "--handler",
            r#"echo=exec:sh -c 'printf "\"%s\"" "$TRACEPARENT"'"#,
        ],
    ));

    let job = spans_of(&receiver, id, "pgwake.job", 1).await.remove(0);
    assert_eq!(job.via, "grpc");
    assert_eq!(job.service, "pgwake");
    // Teeth: without the parent set from the stored context, the job span
    // starts a trace of its own.
    assert_eq!(job.trace_id, TRACE, "{job:?}");
    assert_eq!(job.parent_span_id, PARENT, "{job:?}");
    assert_eq!(job.attr("pgwake.task"), "echo");
    assert_eq!(job.attr("pgwake.queue"), "default");
    assert_eq!(job.attr("pgwake.attempt"), "1");
    assert_eq!(job.attr("pgwake.outcome"), "done");
    let run = children(&receiver, &job, "pgwake.run").await.remove(0);
    assert_eq!(run.trace_id, TRACE);
    children(&receiver, &job, "pgwake.claim").await;
    children(&receiver, &job, "pgwake.outcome").await;

    // The command saw the run span's context: the producer's trace, the
    // run span as parent, so its own spans nest under the run.
    let seen = finished_result(&db, id).await;
    assert_eq!(seen, format!("00-{TRACE}-{}-01", run.span_id));
}

#[tokio::test]
async fn a_retried_job_from_the_rust_client_inside_a_span_gives_http_spans_under_it_and_its_log_lines_the_trace_id(
) {
    use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::layer::SubscriberExt;

    let db = migrated_db().await;
    let receiver = Receiver::start().await;

    // The producer: a service with an OpenTelemetry layer, enqueueing inside
    // its request's span; the client takes the span's context by itself.
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("producer")));
    let (id, trace_id, span_id) = {
        use tracing::Instrument;
        let _default = tracing::subscriber::set_default(subscriber);
        let request = tracing::info_span!("place_order");
        let sc = request.context().span().span_context().clone();
        let c = db.client().await;
        let job = pgwake::client::NewJob::new("flaky", serde_json::json!({}));
        // Teeth: outside the span, the job has no context.
        let id = pgwake::client::enqueue(&c, &job)
            .instrument(request)
            .await
            .unwrap();
        (id, sc.trace_id().to_string(), sc.span_id().to_string())
    };
    let stored: String = db
        .scalar(&format!(
            "SELECT traceparent FROM pgwake.job_traces WHERE job_id = {id}"
        ))
        .await;
    assert_eq!(stored, format!("00-{trace_id}-{span_id}-01"));

    let endpoint = format!("http://{}", receiver.http);
    let mut worker = KillOnDrop::new(spawn_pgwake_run(
        &db.url,
        &[
            "--otlp-endpoint",
            &endpoint,
            "--retry-base",
            "10ms",
            "--handler",
            r#"flaky=exec:sh -c '[ "$PGWAKE_ATTEMPT" != 1 ]'"#,
        ],
    ));
    let log = tail_stderr(worker.child());

    let jobs = spans_of(&receiver, id, "pgwake.job", 2).await;
    for job in &jobs {
        assert_eq!(job.via, "http");
        assert_eq!(
            (job.trace_id.as_str(), job.parent_span_id.as_str()),
            (trace_id.as_str(), span_id.as_str()),
            "{job:?}"
        );
    }
    let mut outcomes: Vec<(String, String)> = jobs
        .iter()
        .map(|j| {
            (
                j.attr("pgwake.attempt").to_string(),
                j.attr("pgwake.outcome").to_string(),
            )
        })
        .collect();
    outcomes.sort();
    assert_eq!(
        outcomes,
        [
            ("1".to_string(), "retry".to_string()),
            ("2".to_string(), "done".to_string())
        ]
    );

    // The failed attempt's log line carries the trace id.
    let log: Arc<Mutex<String>> = log;
    let line = log
        .lock()
        .unwrap()
        .lines()
        .find(|l| l.contains("job failed, will retry"))
        .map(str::to_string)
        .unwrap_or_default();
    assert!(
        line.contains(&format!("trace_id=\"{trace_id}\"")),
        "{line:?}"
    );
}

#[tokio::test]
async fn a_dead_collector_changes_nothing_but_a_counter() {
    let db = migrated_db().await;
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let ids = {
        let mut ids = Vec::new();
        for _ in 0..20 {
            ids.push(insert_traced(&db, "noop", &traceparent()).await);
        }
        ids
    };
    let endpoint = format!("http://{closed}");
    let mut worker = KillOnDrop::new(
        pgwake_cmd()
            .env("DATABASE_URL", &db.url)
            .env("OTEL_EXPORTER_OTLP_TIMEOUT", "500")
            .args([
                "run",
                "--metrics-addr",
                "127.0.0.1:0",
                "--otlp-endpoint",
                &endpoint,
                "--otlp-protocol",
                "grpc",
                "--handler",
                "noop=exec:true",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let log = tail_stderr(worker.child());
    wait_for_every(
        "every job done",
        DEADLINE,
        Duration::from_millis(50),
        async || match remaining(&db).await {
            0 => Ok(()),
            n => Err(format!("{n} left")),
        },
    )
    .await;
    assert_eq!(ids.len(), 20);
    let addr = metrics_addr(&log).await;
    wait_for_every(
        "dropped spans counted",
        DEADLINE,
        Duration::from_millis(100),
        async || {
            let text = reqwest_free_get(&addr, "/metrics").await;
            let dropped: f64 = text
                .lines()
                .find(|l| {
                    l.starts_with("pgwake_trace_spans_dropped_total{reason=\"export_failed\"}")
                })
                .and_then(|l| l.rsplit(' ').next()?.parse().ok())
                .unwrap_or(0.0);
            if dropped > 0.0 {
                Ok(())
            } else {
                Err(text)
            }
        },
    )
    .await;
    let warned = log
        .lock()
        .unwrap()
        .lines()
        .filter(|l| l.contains("could not export spans"))
        .count();
    // Once a minute at most, not once per failed export.
    assert!((1..=2).contains(&warned), "{warned} warnings");
}

/// GET `path` from `addr` over plain HTTP/1.1.
async fn reqwest_free_get(addr: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return String::new();
    };
    let _ = s
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await;
    let mut out = String::new();
    let _ = s.read_to_string(&mut out).await;
    out
}

#[tokio::test]
async fn sql_functions_read_the_context_and_the_jobs_they_enqueue_join_it_in_both_modes() {
    for mode in ["--tx-queues", "--lease-queues"] {
        let db = migrated_db().await;
        let c = db.client().await;
        c.batch_execute(
            "CREATE TABLE seen (job text, traceparent text);
             CREATE FUNCTION public.seen(payload jsonb) RETURNS void LANGUAGE sql AS $$
                 INSERT INTO seen VALUES (payload->>'name', current_setting('pgwake.traceparent', true));
                 SELECT pgwake.enqueue('child', jsonb_build_object('of', payload->>'name'));
             $$;",
        )
        .await
        .unwrap();
        // Traced jobs and jobs without a context, alternating: tx batches
        // grow from 1 job, so some hold a traced job followed by another,
        // which must not see the first's context.
        let mut cl = db.client().await;
        for i in 0..24 {
            let traced = i % 2 == 0;
            let name = format!("{}-{i:02}", if traced { "traced" } else { "plain" });
            let tx = cl.transaction().await.unwrap();
            if traced {
                tx.execute(
                    "SELECT set_config('pgwake.traceparent', $1, true)",
                    &[&traceparent()],
                )
                .await
                .unwrap();
            }
            tx.execute(
                "INSERT INTO pgwake.jobs (task, payload, priority) VALUES ('seen', jsonb_build_object('name', $1::text), $2)",
                &[&name, &i],
            )
            .await
            .unwrap();
            tx.commit().await.unwrap();
        }
        let _worker = KillOnDrop::new(spawn_pgwake_run(
            &db.url,
            &[
                "--trace-jobs",
                mode,
                "default",
                "--handler",
                "seen=sql:public.seen",
            ],
        ));
        let mut rows: Vec<(String, String)> = Vec::new();
        wait_for_every(
            "every function ran",
            DEADLINE,
            Duration::from_millis(50),
            async || {
                rows = c
                    .query(
                        "SELECT job, coalesce(traceparent, '') FROM seen ORDER BY job",
                        &[],
                    )
                    .await
                    .map_err(|e| e.to_string())?
                    .iter()
                    .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
                    .collect();
                if rows.len() == 24 {
                    Ok(())
                } else {
                    Err(format!("{rows:?}"))
                }
            },
        )
        .await;
        // Without an exporter the function sees the producer's context.
        for (job, seen) in &rows {
            let wanted = if job.starts_with("traced") {
                traceparent()
            } else {
                String::new()
            };
            assert_eq!(seen, &wanted, "{mode}: {job}: {rows:?}");
        }
        let children: Vec<(String, Option<String>)> = c
            .query(
                "SELECT j.payload->>'of', t.traceparent FROM pgwake.jobs j
                 LEFT JOIN pgwake.job_traces t ON t.job_id = j.id
                 WHERE j.task = 'child' ORDER BY 1",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(children.len(), 24, "{mode}");
        for (of, tp) in &children {
            let wanted = of.starts_with("traced").then(traceparent);
            assert_eq!(tp, &wanted, "{mode}: the child of {of}");
        }
    }
}

#[test]
fn bad_otlp_settings_are_refused_naming_the_fix() {
    for (args, wanted) in [
        (
            vec![
                "--otlp-endpoint",
                "http://127.0.0.1:4318",
                "--otlp-protocol",
                "http/json",
            ],
            "grpc or http/protobuf",
        ),
        (
            vec!["--otlp-endpoint", "ftp://collector:4318"],
            "http:// or https://",
        ),
        (vec!["--otlp-protocol", "grpc"], "--otlp-endpoint"),
    ] {
        let mut full = vec!["run", "--handler", "t=exec:true"];
        full.extend(args.iter().copied());
        let o = pgwake_cmd()
            .env("DATABASE_URL", "postgres://127.0.0.1:1/nothing")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .args(&full)
            .output()
            .unwrap();
        let err = stderr_of(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(wanted), "{args:?}: {err}");
    }
    // The standard variable's bad protocol, too.
    let o = pgwake_cmd()
        .env("DATABASE_URL", "postgres://127.0.0.1:1/nothing")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        .args(["run", "--handler", "t=exec:true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr_of(&o));
    assert!(
        stderr_of(&o).contains("OTEL_EXPORTER_OTLP_PROTOCOL"),
        "{}",
        stderr_of(&o)
    );
}
