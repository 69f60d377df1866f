//! The delivery-mode dimension of the bench (docs/src/delivery.md). Everything that
//! differs between modes is decided here: the worker configuration and the
//! statement (with its parameters) the raw-ceiling loop runs. Adding a mode
//! is adding a variant and its arms below; every phase and the report
//! iterate over [`Mode`]s.

use tokio_postgres::types::ToSql;

use super::database::QUEUE;
use pgwake::config::WorkerConfig;

/// The textbook claim (the raw ceiling of both modes: what a bare loop of
/// `DELETE … SKIP LOCKED RETURNING` drains).
const CLAIM_RAW: &str = include_str!("sql/raw_claim.sql");
/// The worker's own lease-mode claim statement (autocommit, as the worker
/// runs it): the lease ceiling, printed beside the raw one.
const CLAIM_LEASE: &str = include_str!("../../src/db/sql/claim_lease_queue.sql");
/// Lease length the raw lease claims record (the worker's default).
const RAW_LEASE_S: f64 = 30.0;

/// A delivery mode the bench measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// The claim transaction stays open while the handler runs.
    Tx,
    /// The claim moves the job to `pgwake.leased_jobs` and commits; the
    /// handler runs outside any transaction.
    Lease,
}

/// The raw-ceiling statement of a mode, with its parameters bound.
pub(crate) struct RawClaim {
    /// The statement.
    pub sql: &'static str,
    params: Vec<Box<dyn ToSql + Sync + Send>>,
}

impl RawClaim {
    /// The parameters, in statement order.
    pub fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.params
            .iter()
            .map(|p| p.as_ref() as &(dyn ToSql + Sync))
            .collect()
    }
}

impl Mode {
    /// The name in the table, the JSON and `--mode`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Tx => "tx",
            Mode::Lease => "lease",
        }
    }

    /// `base` set up to claim the bench's jobs in this mode.
    pub(crate) fn worker_config(self, base: WorkerConfig) -> WorkerConfig {
        match self {
            // tx is what a worker does with its queues unless told otherwise.
            Mode::Tx => base,
            // Only the lease queues: a worker that also had tx queues would
            // alternate an empty tx claim with every lease claim.
            Mode::Lease => {
                let queues = base
                    .queues
                    .clone()
                    .unwrap_or_else(|| vec![QUEUE.to_string()]);
                WorkerConfig {
                    lease_queues: queues.clone(),
                    queues: Some(queues),
                    ..base
                }
            }
        }
    }

    /// The claim whose autocommit loop is this mode's raw ceiling, claiming
    /// `batch` jobs at a time, bound as the worker binds it.
    pub(crate) fn raw_claim(self, batch: i64) -> RawClaim {
        match self {
            Mode::Tx => RawClaim {
                sql: CLAIM_RAW,
                params: vec![Box::new(batch), Box::new(QUEUE.to_string())],
            },
            Mode::Lease => RawClaim {
                sql: CLAIM_LEASE,
                // $1 limit, $2 queue, $3/$4 task filters (none), $5 worker
                // id, $6 lease seconds, $7 jobs onto free slots (all).
                params: vec![
                    Box::new(batch),
                    Box::new(QUEUE.to_string()),
                    Box::new(None::<Vec<String>>),
                    Box::new(Vec::<String>::new()),
                    Box::new("pgwake-bench-raw".to_string()),
                    Box::new(RAW_LEASE_S),
                    Box::new(batch),
                ],
            },
        }
    }

    /// Batches the burn-down compares: 1 and B.
    pub(crate) fn batches(self, batch: usize) -> Vec<usize> {
        if batch > 1 {
            vec![1, batch]
        } else {
            vec![1]
        }
    }
}
