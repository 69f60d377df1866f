//! Every runtime SQL statement of the library — the text (one file in
//! `src/db/sql/`) and its parameter types — and the one way they are sent
//! ([`Db`]), so that no call site can create a named prepared statement
//! where the connection cannot keep one.
//!
//! ```text
//!   call site ── Db::query(&sql::CLAIM_TX_QUEUE, params)
//!                  │
//!                  ├─ claim path, PreparedStatements::Cached (default):
//!                  │    prepare once per connection (named, cached), then Bind/Execute
//!                  └─ claim path, PreparedStatements::Unnamed, and everything else:
//!                       Parse/Bind/Execute of the unnamed statement in one round trip,
//!                       parameter types from this catalogue
//! ```
//!
//! Why two ways: a named statement lives in one server session. PgBouncer
//! 1.18 in transaction mode hands a client a different server connection
//! for each transaction, so a cached statement is missing there ("prepared
//! statement … does not exist") or collides with another client's
//! ("… already exists"). The unnamed statement lives only until the next
//! Parse, inside one round trip, so it works through any pooler; it is
//! planned on every call. Only the claim path runs often enough for the
//! cached plan to matter (docs/src/performance.md has the figure); the other
//! services run a statement every few seconds, and the commands once, so
//! they always send unnamed statements (one round trip, where a prepare
//! costs two, plus a Close). The statements that find leases by claim
//! token are planned on every call in every mode ([`Plan::EachCall`]).
//!
//! Each statement's parameter types are written here, next to its file
//! name, and `tests/connecting/pgbouncer.rs` checks them against what the server
//! infers for every statement ([`ALL`]): a new statement with a wrong list
//! fails that test, not a worker in production.

use deadpool_postgres::{ClientWrapper, StatementCache};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

use crate::config::PreparedStatements;

/// One statement: where it comes from, its text and its parameter types.
#[derive(Debug)]
pub struct Sql {
    /// The file's name in `src/db/sql/`, without `.sql`.
    pub name: &'static str,
    /// The statement.
    pub text: &'static str,
    /// The type of each `$n`, in order, as the server infers it.
    pub params: &'static [Type],
    /// When the server plans it.
    pub plan: Plan,
}

/// When the server plans a statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Once per connection, where the connection caches statements (the
    /// claim path in [`PreparedStatements::Cached`] mode); else on every call.
    Cached,
    /// On every call, with its parameters and the table's current size,
    /// whatever the mode: the statements that find leases in
    /// `pgwake.leased_jobs` by claim token. That table holds only the jobs
    /// running now, so it is often empty when it is analyzed, and it fills
    /// with dead rows whenever the vacuum horizon is held. A plan the
    /// server caches while it is small scans it whole (every dead row) on
    /// every later call; one made with its current size walks the token
    /// index. The cost: one plan per outcome flush (a flush holds many
    /// jobs), in the same round trip.
    EachCall,
}

macro_rules! statements {
    (@plan) => { Plan::Cached };
    (@plan each_call) => { Plan::EachCall };
    ($($konst:ident = $file:literal [$($ty:ident),*] $($plan:ident)?;)*) => {
        $(
            #[doc = concat!("`src/db/sql/", $file, ".sql`.")]
            pub const $konst: Sql = Sql {
                name: $file,
                text: include_str!(concat!("sql/", $file, ".sql")),
                params: &[$(Type::$ty),*],
                plan: statements!(@plan $($plan)?),
            };
        )*
        /// Every statement above (the type check in `tests/connecting/pgbouncer.rs`).
        pub const ALL: &[&Sql] = &[$(&$konst),*];
    };
}

statements! {
    ACTIVITY_FINISHED = "activity_finished" [FLOAT8];
    ACTIVITY_HORIZON = "activity_horizon" [INT8];
    ACTIVITY_KEYS = "activity_keys" [TEXT_ARRAY, TEXT_ARRAY];
    ACTIVITY_QUEUES = "activity_queues" [INT8];
    ACTIVITY_TABLES = "activity_tables" [];
    ADOPT_STALE = "adopt_stale" [];
    BACKEND_PID = "backend_pid" [];
    BATCH_CLEAR = "batch_clear" [INT8];
    BATCH_MARK = "batch_mark" [TEXT, INT8_ARRAY, TEXT, TEXT_ARRAY, TEXT_ARRAY, TEXT_ARRAY];
    BATCH_MARK_BY_JOB = "batch_mark_by_job" [TEXT, INT8_ARRAY, TEXT, TEXT_ARRAY, TEXT_ARRAY,
        TEXT_ARRAY];
    BATCH_MARK_DURABLE = "batch_mark_durable" [INT8];
    BURY = "bury" [INT8_ARRAY, TEXT_ARRAY, TEXT_ARRAY, TEXT_ARRAY, INT4_ARRAY, TIMESTAMPTZ_ARRAY,
        INT4_ARRAY, INT4_ARRAY, TEXT_ARRAY, TIMESTAMPTZ_ARRAY, FLOAT8_ARRAY, TEXT, TEXT_ARRAY,
        TEXT_ARRAY, TIMESTAMPTZ_ARRAY, TEXT_ARRAY];
    CANCEL = "cancel" [INT8];
    CANCEL_BACKEND = "cancel_backend" [INT4];
    CANCEL_POLL = "cancel_poll" [INT8_ARRAY];
    CANCEL_SWEEP = "cancel_sweep" [];
    CHARGE = "charge" [INT8];
    CLAIM_LEASE_ALL = "claim_lease_all" [INT8, TEXT_ARRAY, TEXT_ARRAY, TEXT_ARRAY, TEXT, FLOAT8,
        INT8];
    CLAIM_LEASE_ALL_AFTER = "claim_lease_all_after" [INT8, TEXT_ARRAY, TEXT_ARRAY, TEXT_ARRAY, TEXT,
        FLOAT8, INT8, INT4, TIMESTAMPTZ, INT8];
    CLAIM_LEASE_LIMITED = "claim_lease_limited" [INT8, TEXT, TEXT_ARRAY, TEXT_ARRAY, TEXT, FLOAT8,
        INT8, TEXT, TEXT_ARRAY];
    CLAIM_LEASE_QUEUE = "claim_lease_queue" [INT8, TEXT, TEXT_ARRAY, TEXT_ARRAY, TEXT, FLOAT8,
        INT8];
    CLAIM_LEASE_QUEUE_AFTER = "claim_lease_queue_after" [INT8, TEXT, TEXT_ARRAY, TEXT_ARRAY, TEXT,
        FLOAT8, INT8, INT4, TIMESTAMPTZ, INT8];
    CLAIM_TX_ALL = "claim_tx_all" [INT8, TEXT_ARRAY, TEXT_ARRAY, TEXT_ARRAY];
    CLAIM_TX_ALL_AFTER = "claim_tx_all_after" [INT8, TEXT_ARRAY, TEXT_ARRAY, TEXT_ARRAY, INT4,
        TIMESTAMPTZ, INT8];
    CLAIM_TX_LIMITED = "claim_tx_limited" [INT8, TEXT, TEXT_ARRAY, TEXT_ARRAY, INT8, TEXT,
        TEXT_ARRAY];
    CLAIM_TX_ONE = "claim_tx_one" [INT8, BOOL, BOOL];
    CLAIM_TX_QUEUE = "claim_tx_queue" [INT8, TEXT, TEXT_ARRAY, TEXT_ARRAY];
    CLAIM_TX_QUEUE_AFTER = "claim_tx_queue_after" [INT8, TEXT, TEXT_ARRAY, TEXT_ARRAY, INT4,
        TIMESTAMPTZ, INT8];
    CLEANUP_ATTEMPTS = "cleanup_attempts" [];
    CLEAR_ATTEMPTS = "clear_attempts" [INT8_ARRAY];
    DEAD_CANCELLED = "dead_cancelled" [INT8_ARRAY, TEXT];
    DEAD_LIST = "dead_list" [TEXT, INT8];
    DEAD_MISSING = "dead_missing" [INT8_ARRAY, TEXT];
    DEAD_PURGE = "dead_purge" [INT8_ARRAY, TEXT, FLOAT8];
    DEAD_RETRY = "dead_retry" [INT8_ARRAY, TEXT, BOOL];
    DOCTOR_APPLICATIONS = "doctor_applications" [INT8];
    DOCTOR_INDEXES = "doctor_indexes" [INT8];
    DOCTOR_LISTENERS = "doctor_listeners" [INT8];
    DOCTOR_PREPARED = "doctor_prepared" [INT8];
    DOCTOR_SERVER = "doctor_server" [];
    DOCTOR_SESSIONS = "doctor_sessions" [INT8];
    DOCTOR_SLOTS = "doctor_slots" [INT8];
    DOCTOR_TABLES = "doctor_tables" [INT8];
    DOCTOR_TIMEOUTS = "doctor_timeouts" [TEXT_ARRAY];
    DOCTOR_WORKER_ROLES = "doctor_worker_roles" [];
    ERRORS_EXPIRE = "errors_expire" [];
    EXPLAIN = "explain" [INT8];
    JOB_ERRORS = "job_errors" [INT8];
    JOB_HISTORY = "job_history" [INT8];
    JOB_PAYLOAD = "job_payload" [INT8];
    JOB_PROGRESS = "job_progress" [INT8_ARRAY];
    JOB_RELATIVES = "job_relatives" [INT8, INT8];
    JOB_SNOOZES = "job_snoozes" [INT8];
    JOB_TRACE = "job_trace" [INT8];
    JOB_TRACES = "job_traces" [INT8_ARRAY];
    LIST_FINISHED = "list_finished" [INT8, TEXT, TEXT, TEXT, TEXT, INT4, TIMESTAMPTZ];
    LIST_JOBS = "list_jobs" [TEXT, TEXT, TEXT, TEXT, TEXT, TEXT, INT8, INT4, TIMESTAMPTZ];
    ENQUEUE = "enqueue" [TEXT_ARRAY, JSONB_ARRAY, TEXT_ARRAY, TEXT_ARRAY, INT4_ARRAY, INT4_ARRAY,
        FLOAT8_ARRAY, FLOAT8_ARRAY, TEXT_ARRAY, TEXT_ARRAY, BOOL_ARRAY, TEXT_ARRAY, TEXT_ARRAY,
        TEXT_ARRAY, JSONB_ARRAY, TEXT_ARRAY, INT8_ARRAY];
    EDGE_RESULTS = "edge_results" [INT8_ARRAY, TEXT_ARRAY];
    HISTORY_DONE = "history_done" [INT8_ARRAY, TEXT_ARRAY, TEXT_ARRAY, TEXT_ARRAY, INT4_ARRAY,
        TIMESTAMPTZ_ARRAY, TEXT_ARRAY, TEXT, TEXT_ARRAY, TEXT_ARRAY, TEXT_ARRAY];
    HISTORY_LIST = "history_list" [TEXT, TEXT, TEXT, INT8, FLOAT8, TIMESTAMPTZ, TIMESTAMPTZ,
        INT8];
    HISTORY_LOCK = "history_lock" [];
    HISTORY_MAINTAIN = "history_maintain" [FLOAT8, INT4, FLOAT8];
    HISTORY_SETTINGS_GET = "history_settings_get" [];
    HISTORY_SETTINGS_SET = "history_settings_set" [FLOAT8];
    LEASE_BURY = "lease_bury" [INT8_ARRAY, TEXT_ARRAY] each_call;
    LEASE_DONE = "lease_done" [INT8_ARRAY] each_call;
    LEASE_DONE_HISTORY = "lease_done_history" [INT8_ARRAY, TEXT_ARRAY] each_call;
    LEASE_DONE_RESULTS = "lease_done_results" [INT8_ARRAY, TEXT_ARRAY] each_call;
    PARENT_RESULTS = "parent_results" [INT8];
    HANDLER_INPUTS = "handler_inputs" [INT8_ARRAY];
    BATCH_OPEN = "batch_open" [TEXT, TEXT, TEXT, FLOAT8];
    BATCH_CLOSE = "batch_close" [INT8];
    BATCH_STATUS = "batch_status" [INT8];
    LEASE_HEARTBEAT = "lease_heartbeat" [INT8_ARRAY, FLOAT8] each_call;
    LEASE_REQUEUE = "lease_requeue" [INT8_ARRAY, INT4_ARRAY, TEXT_ARRAY, FLOAT8_ARRAY] each_call;
    LEASE_SNOOZE = "lease_snooze" [INT8_ARRAY, INT4_ARRAY, FLOAT8_ARRAY] each_call;
    LEASE_SLEEP = "lease_sleep" [INT8_ARRAY, INT4_ARRAY, FLOAT8_ARRAY] each_call;
    LEASE_WAIT = "lease_wait" [INT8_ARRAY, INT4_ARRAY, FLOAT8_ARRAY, TEXT_ARRAY] each_call;
    LEASE_STARTED = "lease_started" [INT8_ARRAY] each_call;
    NEXT_RUN_AT_ALL = "next_run_at_all" [];
    OLDEST_TRANSACTION_AGE = "oldest_transaction_age" [];
    NEXT_RUN_AT_QUEUES = "next_run_at_queues" [TEXT_ARRAY];
    REQUEUE = "requeue" [INT8_ARRAY, TEXT_ARRAY, TEXT_ARRAY, TEXT_ARRAY, INT4_ARRAY,
        TIMESTAMPTZ_ARRAY, FLOAT8_ARRAY, INT4_ARRAY, INT4_ARRAY, TEXT_ARRAY, TIMESTAMPTZ_ARRAY,
        FLOAT8_ARRAY, TEXT_ARRAY, TEXT_ARRAY, TIMESTAMPTZ_ARRAY, TEXT_ARRAY];
    RELEASE_KEYS = "release_keys" [TEXT, INT8];
    RELEASE_FLOWS = "release_flows" [INT8, INT8];
    REPAIR_KEY_SLOTS = "repair_key_slots" [TEXT, TEXT_ARRAY];
    RESCUE = "rescue" [INT8];
    SAMPLE_PRESSURE = "sample_pressure" [];
    PRESSURE = "pressure" [];
    PRESSURE_LOG = "pressure_log" [FLOAT8, INT8];
    PRESSURE_SET_THRESHOLDS = "pressure_set_thresholds" [FLOAT8, FLOAT8, INT8, INT8, FLOAT8,
        FLOAT8, FLOAT8];
    PRESSURE_STATE = "pressure_state" [];
    PRESSURE_THRESHOLDS = "pressure_thresholds" [];
    SWEEP_KEY_SLOTS = "sweep_key_slots" [TEXT, TEXT, INT8];
    LIMITED_QUEUES = "limited_queues" [];
    QUEUE_LIST = "queue_list" [];
    QUEUE_PAUSE = "queue_pause" [TEXT];
    QUEUE_PRESSURE = "queue_pressure" [TEXT, INT4];
    QUEUE_RESUME = "queue_resume" [TEXT];
    QUEUE_SET_MAX_RUNNING = "queue_set_max_running" [TEXT, INT4];
    QUEUE_SET_RATE = "queue_set_rate" [TEXT, INT4, FLOAT8];
    QUEUE_SET_RATE_PER_KEY = "queue_set_rate_per_key" [TEXT, INT4, FLOAT8];
    QUEUE_SET_FAIR_KEYS = "queue_set_fair_keys" [TEXT, BOOL];
    QUEUE_SET_SHED = "queue_set_shed" [TEXT, BOOL];
    QUEUE_SET_KEY_MAX_RUNNING = "queue_set_key_max_running" [TEXT, TEXT, INT4];
    QUEUE_SET_MAX_RUNNING_PER_KEY = "queue_set_max_running_per_key" [TEXT, INT4];
    QUEUE_SET_LIMIT_KEY_PATH = "queue_set_limit_key_path" [TEXT, TEXT];
    KEY_RATE_RELEASE = "key_rate_release" [TEXT, TEXT_ARRAY, INT4_ARRAY, TIMESTAMPTZ];
    KEY_RATE_RESERVE = "key_rate_reserve" [TEXT, TEXT, INT8, TEXT_ARRAY, TEXT_ARRAY, INT8];
    RATE_RELEASE = "rate_release" [TEXT, INT4_ARRAY, TIMESTAMPTZ];
    RATE_RESERVE = "rate_reserve" [TEXT, INT8, INT8];
    PROGRESS_CLEAR = "progress_clear" [INT8_ARRAY, INT8_ARRAY, TEXT_ARRAY];
    PROGRESS_EXPIRE = "progress_expire" [];
    PROGRESS_FLUSH = "progress_flush" [INT8_ARRAY, INT8_ARRAY, TEXT_ARRAY, TEXT_ARRAY, TEXT_ARRAY];
    READY_QUEUES = "ready_queues" [TEXT_ARRAY, INT8];
    ROLLUP_DEPTH = "rollup_depth" [TEXT_ARRAY, INT8_ARRAY, INT8_ARRAY];
    ROLLUP_DEPTH_SERIES = "rollup_depth_series" [FLOAT8, TEXT];
    ROLLUP_FLUSH = "rollup_flush" [INT8_ARRAY, TEXT_ARRAY, TEXT_ARRAY, TEXT_ARRAY, INT8_ARRAY,
        FLOAT8_ARRAY, FLOAT8_ARRAY];
    ROLLUP_NOW = "rollup_now" [];
    ROLLUP_PRUNE = "rollup_prune" [FLOAT8];
    ROLLUP_SERIES = "rollup_series" [FLOAT8, TEXT];
    ROLLUP_TOTALS = "rollup_totals" [FLOAT8];
    SAMPLE_QUEUE_SETTINGS = "sample_queue_settings" [];
    SAMPLE_WAITING = "sample_waiting" [INT8];
    SAMPLE_QUEUES = "sample_queues" [INT8, INT8];
    SCHEDULE_ADD = "schedule_add" [TEXT, TEXT, TEXT, JSONB, TEXT, INT4, TEXT, TEXT, BOOL];
    SCHEDULE_ADVANCE = "schedule_advance" [TEXT_ARRAY, TIMESTAMPTZ_ARRAY, TIMESTAMPTZ_ARRAY,
        INT8_ARRAY, INT8_ARRAY, INT8_ARRAY, INT8_ARRAY];
    SCHEDULE_CLAIM = "schedule_claim" [INT8];
    SCHEDULE_COUNTS = "schedule_counts" [];
    SCHEDULE_ENQUEUE = "schedule_enqueue" [TEXT_ARRAY, JSONB_ARRAY, TEXT_ARRAY, INT4_ARRAY,
        TIMESTAMPTZ_ARRAY];
    SCHEDULE_INVALID = "schedule_invalid" [TEXT_ARRAY, TEXT_ARRAY];
    SCHEDULE_LIST = "schedule_list" [];
    SCHEDULE_NEXT = "schedule_next" [];
    SCHEDULE_PAGE = "schedule_page" [INT8, INT8];
    SCHEDULE_NOW = "schedule_now" [];
    SCHEDULE_PREVIOUS_WAITING = "schedule_previous_waiting" [INT8_ARRAY];
    SCHEDULE_REMOVE = "schedule_remove" [TEXT];
    SCHEDULE_SET_ENABLED = "schedule_set_enabled" [TEXT, BOOL];
    SCHEDULE_RUN_NOW = "schedule_run_now" [TEXT];
    SET_LIMITS = "set_limits" [TEXT];
    SLEEP = "sleep" [INT8_ARRAY, TEXT_ARRAY, TEXT_ARRAY, TEXT_ARRAY, INT4_ARRAY,
        TIMESTAMPTZ_ARRAY, FLOAT8_ARRAY, INT4_ARRAY, INT4_ARRAY, TEXT_ARRAY, TIMESTAMPTZ_ARRAY,
        FLOAT8_ARRAY, TEXT_ARRAY, TEXT_ARRAY, TIMESTAMPTZ_ARRAY, TEXT_ARRAY];
    SNOOZE = "snooze" [INT8_ARRAY, TEXT_ARRAY, TEXT_ARRAY, TEXT_ARRAY, INT4_ARRAY,
        TIMESTAMPTZ_ARRAY, FLOAT8_ARRAY, INT4_ARRAY, INT4_ARRAY, TEXT_ARRAY, TIMESTAMPTZ_ARRAY,
        FLOAT8_ARRAY, TEXT_ARRAY, TEXT_ARRAY, TIMESTAMPTZ_ARRAY, TEXT_ARRAY];
    SNOOZES_EXPIRE = "snoozes_expire" [];
    STATS_LEASED = "stats_leased" [];
    STATS_SNOOZED = "stats_snoozed" [];
    STATS_PARENTS = "stats_parents" [];
    STEP_RECORD_LEASE = "step_record_lease" [INT8, TEXT, TEXT, INT4, INT8] each_call;
    STEP_RECORD_TX = "step_record_tx" [INT8, TEXT, TEXT, INT4];
    STEP_SWEEP = "step_sweep" [INT8];
    SIGNAL = "signal" [TEXT, TEXT, FLOAT8];
    SIGNAL_OF_JOB = "signal_of_job" [INT8];
    SIGNAL_TAKE = "signal_take" [TEXT_ARRAY];
    SIGNALS_EXPIRE = "signals_expire" [];
    SIGNALS_SWEEP = "signals_sweep" [];
    STATS_WAITS = "stats_waits" [];
    STEPS_OF_JOB = "steps_of_job" [INT8];
    SUSPECTS = "suspects" [];
    TRACE_SETTINGS = "trace_settings" [TEXT, TEXT];
    TRACE_SWEEP = "trace_sweep" [INT8];
    WAIT = "wait" [INT8_ARRAY, TEXT_ARRAY, TEXT_ARRAY, TEXT_ARRAY, INT4_ARRAY,
        TIMESTAMPTZ_ARRAY, FLOAT8_ARRAY, INT4_ARRAY, INT4_ARRAY, TEXT_ARRAY, TIMESTAMPTZ_ARRAY,
        FLOAT8_ARRAY, TEXT_ARRAY, TEXT_ARRAY, TIMESTAMPTZ_ARRAY, TEXT_ARRAY, TEXT_ARRAY];
    WAITS_EXPIRE = "waits_expire" [];
    WAITING_REGISTER = "waiting_register" [TEXT, TEXT_ARRAY, FLOAT8];
    WAITING_SETTLED = "waiting_settled" [TEXT];
    WAITING_SNAPSHOT = "waiting_snapshot" [];
    WAITING_UNREGISTER = "waiting_unregister" [TEXT];
    WORKER_REGISTER = "worker_register" [TEXT, TEXT, INT4, TEXT, TEXT, TEXT_ARRAY, TEXT_ARRAY,
        TEXT, INT4, INT4, FLOAT8, TEXT];
    WORKER_UNREGISTER = "worker_unregister" [TEXT];
    WORKERS_GONE = "workers_gone" [INT8];
    WORKERS_LIST = "workers_list" [];
    WORKERS_PAGE = "workers_page" [INT8, INT8];
    UNSERVED_JOBS = "unserved_jobs" [INT4, INT4];
}

type Params<'p> = [&'p (dyn ToSql + Sync)];

/// A connection and how statements go over it: named and cached (a pooled
/// connection of the claim path in [`PreparedStatements::Cached`] mode), or
/// unnamed (everything else).
#[derive(Clone, Copy)]
pub struct Db<'a> {
    client: &'a Client,
    cache: Option<&'a StatementCache>,
}

impl<'a> Db<'a> {
    /// Unnamed statements only: safe through any pooler, one round trip.
    pub fn unnamed(client: &'a Client) -> Db<'a> {
        Db {
            client,
            cache: None,
        }
    }

    /// A pooled connection of the worker's claim path, in `mode`.
    pub fn pooled(conn: &'a ClientWrapper, mode: PreparedStatements) -> Db<'a> {
        Db {
            client: conn,
            cache: match mode {
                PreparedStatements::Cached | PreparedStatements::Auto => {
                    Some(&conn.statement_cache)
                }
                PreparedStatements::Unnamed => None,
            },
        }
    }

    /// The connection, for what is not a catalogued statement (`BEGIN`,
    /// savepoints, …: the simple query protocol, which never prepares).
    pub fn client(&self) -> &'a Client {
        self.client
    }

    /// The statement cache to prepare `sql` in, if any.
    fn cache_for(&self, sql: &Sql) -> Option<&'a StatementCache> {
        self.cache.filter(|_| sql.plan == Plan::Cached)
    }

    /// Run `sql`; its rows.
    pub async fn query(
        self,
        sql: &Sql,
        params: &Params<'_>,
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        match self.cache_for(sql) {
            Some(cache) => {
                let stmt = cache.prepare(self.client, sql.text).await?;
                self.client.query(&stmt, params).await.map_err(lost_named)
            }
            None => {
                self.client
                    .query_typed(sql.text, &typed(sql.name, sql.params, params))
                    .await
            }
        }
    }

    /// Run `sql`, which returns exactly one row.
    pub async fn query_one(
        self,
        sql: &Sql,
        params: &Params<'_>,
    ) -> Result<Row, tokio_postgres::Error> {
        match self.cache_for(sql) {
            Some(cache) => {
                let stmt = cache.prepare(self.client, sql.text).await?;
                self.client
                    .query_one(&stmt, params)
                    .await
                    .map_err(lost_named)
            }
            None => {
                self.client
                    .query_typed_one(sql.text, &typed(sql.name, sql.params, params))
                    .await
            }
        }
    }

    /// Run `sql`; the number of rows it changed.
    pub async fn execute(
        self,
        sql: &Sql,
        params: &Params<'_>,
    ) -> Result<u64, tokio_postgres::Error> {
        match self.cache_for(sql) {
            Some(cache) => {
                let stmt = cache.prepare(self.client, sql.text).await?;
                self.client.execute(&stmt, params).await.map_err(lost_named)
            }
            None => {
                self.client
                    .execute_typed(sql.text, &typed(sql.name, sql.params, params))
                    .await
            }
        }
    }

    /// Run a statement that is not in the catalogue (a `sql` handler's
    /// call, built from a validated function name) as an unnamed statement
    /// with the given parameter types; its rows.
    pub async fn query_text(
        self,
        text: &str,
        types: &[Type],
        params: &Params<'_>,
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        self.client
            .query_typed(text, &typed(text, types, params))
            .await
    }
}

/// A cached (named) statement the server does not have, or a name taken
/// by another client's: the connection goes through a transaction-mode
/// pooler the start-up check did not see (`connect::check_pooling`). Say
/// once what to set; the error itself goes on to the caller (the claim
/// rolls back, nothing is lost).
fn lost_named(e: tokio_postgres::Error) -> tokio_postgres::Error {
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio_postgres::error::SqlState;
    static SAID: AtomicBool = AtomicBool::new(false);
    let lost = matches!(
        e.code(),
        Some(c) if *c == SqlState::INVALID_SQL_STATEMENT_NAME || *c == SqlState::DUPLICATE_PSTATEMENT
    );
    if lost && !SAID.swap(true, Ordering::Relaxed) {
        tracing::error!(
            error = %crate::error::PgDisplay(&e),
            "a prepared statement was lost between transactions: --database-url goes through a transaction-mode pooler; set --prepared-statements unnamed (PGWAKE_PREPARED_STATEMENTS=unnamed)"
        );
    }
    e
}

/// Pair each parameter with its declared type. A count that differs is a
/// programming error in this file, caught by any test that runs it.
fn typed<'p>(
    name: &str,
    types: &[Type],
    params: &Params<'p>,
) -> Vec<(&'p (dyn ToSql + Sync), Type)> {
    assert_eq!(
        types.len(),
        params.len(),
        "statement {name}: {} parameter types declared, {} values given",
        types.len(),
        params.len()
    );
    params.iter().copied().zip(types.iter().cloned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_is_listed_once_and_numbers_its_parameters_as_declared() {
        let mut names: Vec<&str> = ALL.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ALL.len(), "a statement is listed twice");
        for sql in ALL {
            // The highest `$n` in the text is the number of parameters.
            let highest = (1..=40)
                .filter(|n| {
                    let p = format!("${n}");
                    sql.text.match_indices(&p).any(|(i, _)| {
                        !sql.text[i + p.len()..].starts_with(|c: char| c.is_ascii_digit())
                    })
                })
                .max()
                .unwrap_or(0);
            assert_eq!(highest, sql.params.len(), "statement {}", sql.name);
        }
    }
}
