//! The metric catalogue: every name pgwake exports is defined and described
//! here, and nowhere else. Histograms are real Prometheus histograms with
//! the explicit buckets below.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Histogram: ready-to-claim delay, label `queue`.
pub(crate) const PICKUP_LATENCY: &str = "pgwake_job_pickup_latency_seconds";
/// Histogram: handler run time, labels `queue`, `task`, `outcome`.
pub(crate) const JOB_DURATION: &str = "pgwake_job_duration_seconds";
/// Counter: resolved jobs, labels `queue`, `task`, `outcome`.
pub(crate) const JOBS: &str = "pgwake_jobs_total";
/// Counter: running jobs this worker stopped on a cancel request, label
/// `queue`.
pub(crate) const JOBS_CANCELLED: &str = "pgwake_jobs_cancelled_total";
/// Gauge: live persistent handler processes, label `handler` (the
/// command).
pub(crate) const PERSISTENT_PROCESSES: &str = "pgwake_persistent_processes";
/// Gauge: jobs in flight on persistent handler processes, label `handler`.
pub(crate) const PERSISTENT_IN_FLIGHT: &str = "pgwake_persistent_in_flight";
/// Counter: persistent handler processes replaced, labels `handler`,
/// `cause` (exited, killed, unresponsive, protocol_error, cancel_grace,
/// recycled, start_failed).
pub(crate) const PERSISTENT_RESTARTS: &str = "pgwake_persistent_restarts_total";
/// Counter: protocol errors of persistent handler processes, labels
/// `handler`, `kind` (fatal: the process was replaced; stale_token: a
/// late reply, ignored).
pub(crate) const PERSISTENT_PROTOCOL_ERRORS: &str = "pgwake_persistent_protocol_errors_total";
/// Gauge: jobs this worker is running, label `queue`.
pub(crate) const JOBS_IN_FLIGHT: &str = "pgwake_jobs_in_flight";
/// Counter: statements the progress writer sent (writes and clears).
pub(crate) const PROGRESS_FLUSHES: &str = "pgwake_progress_statements_total";
/// Counter: progress rows written (one per job per flush, whatever the
/// number of reports it coalesced).
pub(crate) const PROGRESS_WRITES: &str = "pgwake_progress_writes_total";
/// Counter: progress reports of exec and persistent handlers refused (over
/// a bound, or not JSON), label `handler` (`exec` or `persistent`).
pub(crate) const PROGRESS_REFUSED: &str = "pgwake_progress_refused_total";
/// Counter: claim queries, labels `trigger`, `result`.
pub(crate) const CLAIMS: &str = "pgwake_claims_total";
/// Counter: notifications received.
pub(crate) const NOTIFICATIONS: &str = "pgwake_notifications_total";
/// Gauge: 1 while LISTEN is up.
pub(crate) const LISTENER_CONNECTED: &str = "pgwake_listener_connected";
/// Counter: listener reconnects.
pub(crate) const LISTENER_RECONNECTS: &str = "pgwake_listener_reconnects_total";
/// Gauge: waiting jobs, labels `queue`, `state`.
pub(crate) const QUEUE_DEPTH: &str = "pgwake_queue_depth";
/// Gauge: 1 while a queue is paused (`pgwake queue pause`), 0 once resumed,
/// label `queue`.
pub(crate) const QUEUE_PAUSED: &str = "pgwake_queue_paused";
/// Gauge: 1 while the governor keeps a queue paused under critical
/// pressure (`--shed-under-pressure`), 0 once resumed, label `queue`.
pub(crate) const QUEUE_SHED: &str = "pgwake_queue_shed";
/// Gauge: a queue's `--max-running` limit (`pgwake queue set`), 0 once the
/// limit is removed, label `queue`.
pub(crate) const QUEUE_MAX_RUNNING: &str = "pgwake_queue_max_running";
/// Gauge: a queue's `--max-running-per-key` limit, 0 once removed, label
/// `queue`.
pub(crate) const QUEUE_MAX_RUNNING_PER_KEY: &str = "pgwake_queue_max_running_per_key";
/// Gauge: a queue's `--rate` limit in admissions per second (`pgwake queue
/// set`), 0 once the limit is removed, label `queue`.
pub(crate) const QUEUE_RATE_LIMIT: &str = "pgwake_queue_rate_limit";
/// Gauge: a queue's `--rate-per-key` limit in admissions per second of one
/// limit key, 0 once removed, label `queue`.
pub(crate) const QUEUE_RATE_PER_KEY_LIMIT: &str = "pgwake_queue_rate_per_key_limit";
/// Gauge: 1 while a queue's claims rotate between limit keys
/// (`--fair-keys`), 0 once off, label `queue`.
pub(crate) const QUEUE_FAIR_KEYS: &str = "pgwake_queue_fair_keys";
/// Counter: claims of a rate-limited queue that found more ready jobs than
/// free admissions (the queue is running at its rate), label `queue`.
pub(crate) const RATE_THROTTLED: &str = "pgwake_rate_throttled_total";
/// Counter: claims of a queue with a per-key rate that found a key with
/// more ready jobs than free admissions (the key is running at its rate),
/// label `queue` (never the key: keys are unbounded).
pub(crate) const KEY_RATE_THROTTLED: &str = "pgwake_key_rate_throttled_total";
/// Gauge: ready jobs no live worker can run (no live worker works their
/// queue with a handler for their task), labels `queue`, `task`; counted
/// at the heads of the queues (`services::fleet`).
pub(crate) const JOBS_UNSERVED: &str = "pgwake_jobs_unserved";
/// Gauge: waiting jobs by what they wait for, labels `queue`, `reason`
/// (`snoozed`, `sleeping`, `signal`, `parents`; sampled).
pub(crate) const JOBS_WAITING: &str = "pgwake_jobs_waiting";
/// Histogram: from a flow child's release (its last parent ended) to its
/// claim, label `queue`.
pub(crate) const FLOW_RELEASE_LATENCY: &str = "pgwake_flow_release_latency_seconds";
/// Gauge: age of the oldest ready job, label `queue`.
pub(crate) const QUEUE_OLDEST_READY_AGE: &str = "pgwake_queue_oldest_ready_age_seconds";
/// Gauge: rows in `dead_jobs`, label `queue`.
pub(crate) const DEAD_JOBS: &str = "pgwake_dead_jobs";
/// Gauge: sessions idle in transaction, label `application`.
pub(crate) const IDLE_IN_TX_SESSIONS: &str = "pgwake_idle_in_transaction_sessions";
/// Gauge: the oldest idle-in-transaction session's transaction age.
pub(crate) const IDLE_IN_TX_MAX_AGE: &str = "pgwake_idle_in_transaction_max_age_seconds";
/// Gauge: the oldest open transaction's age.
pub(crate) const OLDEST_TX_AGE: &str = "pgwake_oldest_transaction_age_seconds";
/// Gauge: `pg_notification_queue_usage()`.
pub(crate) const NOTIFY_QUEUE_USAGE: &str = "pgwake_notification_queue_usage_ratio";
/// Gauge: dead tuples of `pgwake.jobs`.
pub(crate) const QUEUE_TABLE_DEAD_TUPLES: &str = "pgwake_queue_table_dead_tuples";
/// Gauge: malformed trace contexts producers gave, ignored, since the
/// schema was created (`pgwake.trace_context_rejected`, functions/traces.sql).
pub(crate) const TRACE_CONTEXT_REJECTED: &str = "pgwake_trace_context_rejected";
/// Counter: spans this worker's OTLP exporter delivered to the collector
/// (feature `otel`, `crate::otel`).
pub(crate) const TRACE_SPANS_EXPORTED: &str = "pgwake_trace_spans_exported_total";
/// Counter: spans dropped, label `reason`: `queue_full` (the bounded export
/// queue was full: the collector is slower than the worker, or away) or
/// `export_failed` (the collector refused them, or could not be reached in
/// time).
pub(crate) const TRACE_SPANS_DROPPED: &str = "pgwake_trace_spans_dropped_total";
/// Gauge: the governor's level (`pgwake.pressure()`): 0 ok, 1 elevated,
/// 2 critical.
pub(crate) const PRESSURE_LEVEL: &str = "pgwake_pressure_level";
/// Gauge: the level each driving measure holds on its own (0, 1, 2), label
/// `kind` (`horizon`, `dead_tuples`, `notify_queue`).
pub(crate) const PRESSURE_CAUSE: &str = "pgwake_pressure_cause_level";
/// The measures that drive the governor's level (label values of
/// [`PRESSURE_CAUSE`]).
pub(crate) const PRESSURE_KINDS: &[&str] = &["horizon", "dead_tuples", "notify_queue"];
/// Gauge: claim pool connections, label `state`.
pub(crate) const POOL_CONNECTIONS: &str = "pgwake_pool_connections";
/// Counter: failed sampling queries.
pub(crate) const SAMPLER_ERRORS: &str = "pgwake_sampler_errors_total";
/// Gauge: duration of the last sampling query.
pub(crate) const SAMPLER_DURATION: &str = "pgwake_sampler_duration_seconds";
/// Gauge: 1 when the database and (unless `--no-listen`) the listener are up.
pub(crate) const READY: &str = "pgwake_ready";
/// Gauge: always 1, label `version`.
pub(crate) const BUILD_INFO: &str = "pgwake_build_info";
/// Counter: expired leases moved back to the queue, label `queue`.
pub(crate) const LEASES_RESCUED: &str = "pgwake_leases_rescued_total";
/// Counter: expired leases the rescuer could not move.
pub(crate) const RESCUE_FAILURES: &str = "pgwake_rescue_failures_total";
/// Counter: schedule ticks, labels `schedule` (bounded, see
/// `scheduler::SCHEDULE_LABELS_MAX`) and `result` (`enqueued`, `missed`,
/// `waiting`).
pub(crate) const SCHEDULE_TICKS: &str = "pgwake_schedule_ticks_total";
/// Histogram: delay from a tick to its enqueue.
pub(crate) const SCHEDULE_TICK_DELAY: &str = "pgwake_schedule_tick_delay_seconds";
/// Gauge: schedules, label `state` (`active`, `invalid`).
pub(crate) const SCHEDULES: &str = "pgwake_schedules";
/// Gauge: how long the earliest unserved tick has been due.
pub(crate) const SCHEDULE_OVERDUE: &str = "pgwake_schedule_overdue_seconds";
/// Counter: failed scheduler rounds and schedules that could not be served.
pub(crate) const SCHEDULER_ERRORS: &str = "pgwake_scheduler_errors_total";
/// Counter: finished jobs this worker completed or buried while history
/// was on, label `outcome` (`done`, `dead`).
pub(crate) const HISTORY_ROWS: &str = "pgwake_history_rows_total";
/// Counter: expired history partitions dropped.
pub(crate) const HISTORY_PARTITIONS_DROPPED: &str = "pgwake_history_partitions_dropped_total";
/// Counter: history rows removed by retention (dropped partitions' rows).
pub(crate) const HISTORY_ROWS_DROPPED: &str = "pgwake_history_rows_dropped_total";
/// Counter: history partitions that could not be created or dropped.
pub(crate) const HISTORY_MAINTENANCE_FAILURES: &str = "pgwake_history_maintenance_failures_total";

/// Most distinct values each of the `queue`, `task` and `application`
/// labels takes in this process. Queue and task names are data anyone who can insert a job
/// chooses; without a cap, a flood of distinct names would grow the metric
/// series (and Prometheus) without bound. Values configured on the worker
/// (`--queues`, `--lease-queues`, handler task names) take their places
/// first; other values get a place while there is room, in the order they
/// are first seen, and keep it; the rest are reported as `other`.
pub const LABEL_VALUES_MAX: usize = 200;
/// The label value standing for every queue or task beyond the cap.
pub(crate) const OTHER_LABEL: &str = "other";

/// The values of one label that have a series of their own.
struct LabelValues(OnceLock<Mutex<HashSet<String>>>);

impl LabelValues {
    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.0
            .get_or_init(|| Mutex::new(HashSet::new()))
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn label(&self, value: &str) -> String {
        let mut set = self.set();
        if set.contains(value) {
            return value.to_string();
        }
        if set.len() < LABEL_VALUES_MAX && value != OTHER_LABEL {
            set.insert(value.to_string());
            return value.to_string();
        }
        OTHER_LABEL.to_string()
    }

    fn reserve(&self, values: &[String]) {
        let mut set = self.set();
        for v in values {
            if set.len() < LABEL_VALUES_MAX {
                set.insert(v.clone());
            }
        }
    }
}

static QUEUE_LABELS: LabelValues = LabelValues(OnceLock::new());
static TASK_LABELS: LabelValues = LabelValues(OnceLock::new());
static APPLICATION_LABELS: LabelValues = LabelValues(OnceLock::new());

/// The `queue` label value for `queue`: itself, or [`OTHER_LABEL`] beyond
/// the cap ([`LABEL_VALUES_MAX`]).
pub(crate) fn queue_label(queue: &str) -> String {
    QUEUE_LABELS.label(queue)
}

/// The `task` label value for `task`: itself, or [`OTHER_LABEL`] beyond the
/// cap ([`LABEL_VALUES_MAX`]).
pub(crate) fn task_label(task: &str) -> String {
    TASK_LABELS.label(task)
}

/// The `application` label value for an `application_name` (which any
/// client sets as it likes): itself, or [`OTHER_LABEL`] beyond the cap
/// ([`LABEL_VALUES_MAX`]).
pub(crate) fn application_label(application: &str) -> String {
    APPLICATION_LABELS.label(application)
}

/// What [`init_known`] creates series for.
pub(crate) struct Known<'a> {
    /// The worker's queues (`--queues`, or `default` when it works every
    /// queue).
    pub queues: &'a [String],
    /// `--lease-queues` and `--tx-queues`.
    pub forced_queues: &'a [String],
    /// The handlers' task names (`*` left out).
    pub tasks: &'a [String],
    /// The worker's `application_name`.
    pub application: &'a str,
    /// Whether this worker runs the scheduler.
    pub scheduler: bool,
    /// The delivery modes it claims in (`tx`, `lease`).
    pub modes: &'a [&'static str],
}

/// Give the worker's known queues and tasks their label places first, and
/// create every series the dashboard and the alert rules read at 0 (the
/// gauges the sampler and the scheduler set later, the counters, and empty
/// histograms), so a fresh install shows zeros from the first scrape
/// instead of "No data" until the first event, and `rate()`/`increase()`
/// have a starting point. `tests/observability.rs` checks every name.
pub(crate) fn init_known(known: Known<'_>) {
    let (queues, lease_queues, tasks) = (known.queues, known.forced_queues, known.tasks);
    let tasks: Vec<String> = tasks.iter().filter(|t| *t != "*").cloned().collect();
    let mut all_queues: Vec<String> = queues.to_vec();
    all_queues.extend(lease_queues.iter().cloned());
    QUEUE_LABELS.reserve(&all_queues);
    TASK_LABELS.reserve(&tasks);
    for q in &all_queues {
        let queue = queue_label(q);
        metrics::counter!(LEASES_RESCUED, "queue" => queue.clone()).increment(0);
        metrics::counter!(JOBS_CANCELLED, "queue" => queue.clone()).increment(0);
        metrics::counter!(RATE_THROTTLED, "queue" => queue.clone()).increment(0);
        metrics::counter!(KEY_RATE_THROTTLED, "queue" => queue.clone()).increment(0);
        metrics::gauge!(JOBS_IN_FLIGHT, "queue" => queue.clone()).increment(0.0);
        for state in ["ready", "scheduled"] {
            metrics::gauge!(QUEUE_DEPTH, "queue" => queue.clone(), "state" => state).increment(0.0);
        }
        for gauge in [
            QUEUE_OLDEST_READY_AGE,
            DEAD_JOBS,
            QUEUE_PAUSED,
            QUEUE_SHED,
            QUEUE_MAX_RUNNING,
            QUEUE_MAX_RUNNING_PER_KEY,
            QUEUE_RATE_LIMIT,
            QUEUE_RATE_PER_KEY_LIMIT,
            QUEUE_FAIR_KEYS,
        ] {
            metrics::gauge!(gauge, "queue" => queue.clone()).increment(0.0);
        }
        let _ = metrics::histogram!(PICKUP_LATENCY, "queue" => queue.clone());
        let _ = metrics::histogram!(FLOW_RELEASE_LATENCY, "queue" => queue.clone());
        for reason in crate::admin::gauges::WAITING_REASONS {
            metrics::gauge!(JOBS_WAITING, "queue" => queue.clone(), "reason" => *reason)
                .increment(0.0);
        }
        for t in &tasks {
            for outcome in ["done", "retry", "dead", "returned", "lost", "cancelled"] {
                metrics::counter!(JOBS, "queue" => queue.clone(), "task" => task_label(t), "outcome" => outcome)
                    .increment(0);
            }
            let _ = metrics::histogram!(JOB_DURATION, "queue" => queue.clone(), "task" => task_label(t), "outcome" => "done");
            metrics::gauge!(JOBS_UNSERVED, "queue" => queue.clone(), "task" => task_label(t))
                .increment(0.0);
        }
    }
    for outcome in ["done", "dead"] {
        metrics::counter!(HISTORY_ROWS, "outcome" => outcome).increment(0);
    }
    for trigger in ["notify", "poll", "drain", "reconnect"] {
        for result in ["hit", "empty"] {
            for mode in known.modes {
                metrics::counter!(CLAIMS, "trigger" => trigger, "result" => result, "mode" => *mode)
                    .increment(0);
            }
        }
    }
    for gauge in [
        IDLE_IN_TX_MAX_AGE,
        OLDEST_TX_AGE,
        NOTIFY_QUEUE_USAGE,
        QUEUE_TABLE_DEAD_TUPLES,
        TRACE_CONTEXT_REJECTED,
        SAMPLER_DURATION,
        PRESSURE_LEVEL,
    ] {
        metrics::gauge!(gauge).increment(0.0);
    }
    for kind in PRESSURE_KINDS {
        metrics::gauge!(PRESSURE_CAUSE, "kind" => *kind).increment(0.0);
    }
    metrics::gauge!(IDLE_IN_TX_SESSIONS, "application" => application_label(known.application))
        .increment(0.0);
    if known.scheduler {
        for state in ["active", "invalid"] {
            metrics::gauge!(SCHEDULES, "state" => state).increment(0.0);
        }
        metrics::gauge!(SCHEDULE_OVERDUE).increment(0.0);
        for result in ["enqueued", "missed", "waiting"] {
            metrics::counter!(SCHEDULE_TICKS, "result" => result).increment(0);
        }
        let _ = metrics::histogram!(SCHEDULE_TICK_DELAY);
    }
}

/// Buckets of the pickup latency: sub-millisecond wake-ups up to jobs that
/// waited minutes in a backlog.
pub(crate) const PICKUP_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0, 900.0, 3600.0,
];

/// Buckets of the handler duration: no-op handlers to hour-long lease jobs.
pub(crate) const DURATION_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0, 900.0, 3600.0,
];

/// Describe every metric (HELP text, unit).
pub(crate) fn describe() {
    describe_histogram!(
        PICKUP_LATENCY,
        Unit::Seconds,
        "Delay from when a job became ready (later of created_at and run_at) to its claim"
    );
    describe_histogram!(
        JOB_DURATION,
        Unit::Seconds,
        "Handler run time by queue, task and outcome (done, retry, dead, returned, lost, cancelled)"
    );
    describe_counter!(
        JOBS,
        "Jobs resolved by this worker, by queue, task and outcome (done, retry, dead, returned, lost, cancelled)"
    );
    describe_counter!(
        JOBS_CANCELLED,
        "Running jobs this worker stopped because of a cancel request (pgwake cancel), by queue; cancels of waiting jobs need no worker and show in pgwake_dead_jobs"
    );
    describe_gauge!(JOBS_IN_FLIGHT, "Jobs this worker is running now, by queue");
    describe_counter!(
        PROGRESS_FLUSHES,
        "Statements the progress writer sent: one per --progress-interval at most for every job that reported, one more to clear the rows of runs that ended"
    );
    describe_counter!(
        PROGRESS_WRITES,
        "Progress rows written: one per job per write, whatever the number of reports it coalesced"
    );
    describe_counter!(
        PROGRESS_REFUSED,
        "Progress reports of exec and persistent handlers refused (over a bound, or not JSON), by handler kind; the job goes on"
    );
    describe_gauge!(
        PERSISTENT_PROCESSES,
        "Live persistent handler processes (their hello done), by handler command"
    );
    describe_gauge!(
        PERSISTENT_IN_FLIGHT,
        "Jobs in flight on persistent handler processes, by handler command"
    );
    describe_counter!(
        PERSISTENT_RESTARTS,
        "Persistent handler processes replaced, by handler command and cause (exited, killed, unresponsive, protocol_error, cancel_grace, recycled, start_failed)"
    );
    describe_counter!(
        PERSISTENT_PROTOCOL_ERRORS,
        "Protocol errors of persistent handler processes, by handler command and kind (fatal: the process was replaced; stale_token: a late reply, ignored)"
    );
    describe_counter!(
        CLAIMS,
        "Claim queries by what woke them (notify, poll, drain, reconnect) and result (hit, empty)"
    );
    describe_counter!(
        NOTIFICATIONS,
        "NOTIFY messages received by the listener (wake-ups and cancel requests)"
    );
    describe_gauge!(LISTENER_CONNECTED, "1 while the LISTEN connection is up");
    describe_counter!(
        LISTENER_RECONNECTS,
        "Times the listener connected again after a loss"
    );
    describe_gauge!(
        QUEUE_DEPTH,
        "Jobs waiting in pgwake.jobs by queue and state (ready, scheduled); running jobs excluded"
    );
    describe_gauge!(
        QUEUE_OLDEST_READY_AGE,
        Unit::Seconds,
        "Time the longest-waiting ready job has been ready (since the later of created_at and run_at), by queue; 0 when none is ready"
    );
    describe_gauge!(DEAD_JOBS, "Rows in pgwake.dead_jobs by queue");
    describe_gauge!(
        JOBS_WAITING,
        "Waiting jobs by queue and what they wait for (reason: snoozed, sleeping, signal, parents), sampled; each reason counted over at most 10,000 rows of its own table"
    );
    describe_histogram!(
        FLOW_RELEASE_LATENCY,
        Unit::Seconds,
        "Time from a flow child's release (the end of its last parent, or its run_at if later) to its claim, by queue"
    );
    describe_gauge!(
        JOBS_UNSERVED,
        "Ready jobs that no live worker can run (none works their queue with a handler for their task), by queue and task; counted among the first 10 ready jobs of each queue and priority, so a lower bound"
    );
    describe_gauge!(
        QUEUE_PAUSED,
        "1 while the queue is paused (pgwake queue pause): no worker starts its jobs; 0 once resumed"
    );
    describe_gauge!(
        QUEUE_SHED,
        "1 while the governor keeps the queue paused under critical database pressure (--shed-under-pressure, pgwake.pressure()); 0 once resumed"
    );
    describe_gauge!(
        QUEUE_MAX_RUNNING,
        "The queue's max_running limit (pgwake queue set --max-running): at most this many of its jobs run at once across every worker; 0 once the limit is removed (no limit)"
    );
    describe_gauge!(
        QUEUE_MAX_RUNNING_PER_KEY,
        "The queue's per-key running limit (pgwake queue set --max-running-per-key): at most this many jobs of any one limit key run at once across every worker (a key's own limit may differ); 0 once the limit is removed"
    );
    describe_gauge!(
        QUEUE_RATE_LIMIT,
        "The queue's rate limit (pgwake queue set --rate) in jobs started per second across every worker; 0 once the limit is removed (no limit)"
    );
    describe_gauge!(
        QUEUE_RATE_PER_KEY_LIMIT,
        "The queue's per-key rate limit (pgwake queue set --rate-per-key) in jobs of any one limit key started per second across every worker; 0 once the limit is removed (no limit)"
    );
    describe_gauge!(
        QUEUE_FAIR_KEYS,
        "1 while the queue's claims take its ready jobs in rotation between limit keys (pgwake queue set --fair-keys); 0 once off"
    );
    describe_counter!(
        RATE_THROTTLED,
        "Claims of a rate-limited queue that found more ready jobs than free admissions: the queue ran at its rate limit"
    );
    describe_counter!(
        KEY_RATE_THROTTLED,
        "Claims of a queue with a per-key rate (pgwake queue set --rate-per-key) that found a limit key with more ready jobs than free admissions: that key ran at its rate"
    );
    describe_gauge!(
        IDLE_IN_TX_SESSIONS,
        "Sessions of this database idle in transaction, by application_name"
    );
    describe_gauge!(
        IDLE_IN_TX_MAX_AGE,
        Unit::Seconds,
        "Transaction age of the oldest session idle in transaction"
    );
    describe_gauge!(
        OLDEST_TX_AGE,
        Unit::Seconds,
        "Age of the oldest open transaction on the server (it pins the vacuum horizon)"
    );
    describe_gauge!(
        NOTIFY_QUEUE_USAGE,
        "Fraction of the server's NOTIFY queue in use (pg_notification_queue_usage)"
    );
    describe_gauge!(
        QUEUE_TABLE_DEAD_TUPLES,
        "Dead tuples of pgwake.jobs (pg_stat_user_tables)"
    );
    describe_counter!(
        TRACE_SPANS_EXPORTED,
        "Spans this worker exported over OTLP and the collector accepted"
    );
    describe_counter!(
        TRACE_SPANS_DROPPED,
        "Spans this worker dropped instead of exporting, by reason: queue_full (the bounded export queue was full), export_failed (the collector refused them or was unreachable)"
    );
    describe_gauge!(
        TRACE_CONTEXT_REJECTED,
        "Malformed trace contexts (traceparent, tracestate) producers gave and the database ignored, in all, across every producer (a count in the database, sampled)"
    );
    describe_gauge!(
        PRESSURE_LEVEL,
        "The governor's level, pgwake.pressure(): 0 ok, 1 elevated, 2 critical (shed queues paused)"
    );
    describe_gauge!(
        PRESSURE_CAUSE,
        "Level each pressure measure holds on its own (0 ok, 1 elevated, 2 critical), by kind: horizon, dead_tuples, notify_queue"
    );
    describe_gauge!(
        POOL_CONNECTIONS,
        "Claim pool connections by state (in_use, idle)"
    );
    describe_counter!(SAMPLER_ERRORS, "Database sampling queries that failed");
    describe_gauge!(
        SAMPLER_DURATION,
        Unit::Seconds,
        "Duration of the last database sampling query"
    );
    describe_gauge!(
        READY,
        "1 when the database and the listener (unless --no-listen) are up"
    );
    describe_gauge!(
        BUILD_INFO,
        "Always 1; the version label names the pgwake version"
    );
    describe_counter!(
        LEASES_RESCUED,
        "Expired lease-mode jobs moved back to pgwake.jobs"
    );
    describe_counter!(
        RESCUE_FAILURES,
        "Expired leases the rescuer could not move (each logged at error level; they stay leased and are tried again)"
    );
    describe_counter!(
        SCHEDULE_TICKS,
        "Schedule ticks served by this worker, by schedule (the first 50 this process serves; the rest as _other) and result (enqueued; missed: dropped by the catch-up policy; waiting: skipped because the previous job had not started)"
    );
    describe_histogram!(
        SCHEDULE_TICK_DELAY,
        Unit::Seconds,
        "Delay from a schedule tick to the enqueue of its job, on the database clock (catch-up ticks count their full lateness)"
    );
    describe_gauge!(
        SCHEDULES,
        "Schedules in pgwake.schedules by state (active; invalid: a worker cannot evaluate its expression or zone)"
    );
    describe_gauge!(
        SCHEDULE_OVERDUE,
        Unit::Seconds,
        "How long the earliest unserved schedule tick has been due (database clock); 0 when none is due"
    );
    describe_counter!(
        SCHEDULER_ERRORS,
        "Scheduler rounds that failed, and schedules that could not be served (retried)"
    );
    describe_counter!(
        HISTORY_ROWS,
        "Finished jobs this worker completed or buried while history was on, by outcome (done, dead); rows the dead_jobs trigger writes for other paths (rescuer, pgwake.cancel) are not counted"
    );
    describe_counter!(
        HISTORY_PARTITIONS_DROPPED,
        "Expired daily partitions of pgwake.finished_jobs dropped by retention"
    );
    describe_counter!(
        HISTORY_ROWS_DROPPED,
        "Rows of pgwake.finished_jobs removed by retention (from the dropped partitions' statistics)"
    );
    describe_counter!(
        HISTORY_MAINTENANCE_FAILURES,
        "History partitions that could not be created or dropped (lock not obtained in time; retried next round)"
    );
}

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Install the Prometheus recorder (once per process; later calls return the
/// same handle) and describe the catalogue.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(PICKUP_LATENCY.into()), PICKUP_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(JOB_DURATION.into()), DURATION_BUCKETS)
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(SCHEDULE_TICK_DELAY.into()),
                        PICKUP_BUCKETS,
                    )
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(FLOW_RELEASE_LATENCY.into()),
                        PICKUP_BUCKETS,
                    )
                })
                .expect("bucket lists are non-empty constants");
            let handle = match builder.install_recorder() {
                Ok(h) => h,
                // Another recorder is installed (an embedding application's):
                // keep a private one so /metrics still renders.
                Err(_) => PrometheusBuilder::new().build_recorder().handle(),
            };
            describe();
            metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
            for name in [LISTENER_CONNECTED, READY] {
                metrics::gauge!(name).set(0.0);
            }
            for name in [
                NOTIFICATIONS,
                LISTENER_RECONNECTS,
                SAMPLER_ERRORS,
                SCHEDULER_ERRORS,
                RESCUE_FAILURES,
            ] {
                metrics::counter!(name).increment(0);
            }
            // The catch-all series exist from the start too.
            metrics::counter!(LEASES_RESCUED, "queue" => OTHER_LABEL).increment(0);
            metrics::counter!(JOBS_CANCELLED, "queue" => OTHER_LABEL).increment(0);
            handle
        })
        .clone()
}
