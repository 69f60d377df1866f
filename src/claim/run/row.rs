//! The reader of claim rows. Every claim statement returns the same
//! columns first (`COMMON` of them: id, queue, task, payload::text,
//! priority, run_at, attempts (including this run in lease mode),
//! max_attempts, last_error, created_at, timeout seconds, seconds ready
//! before the claim), then its delivery mode's own, at offsets that differ
//! by mode; and last `release_s`, read by name. Every column is read here,
//! by name; the offsets are in [`Mode`]'s methods and nowhere else.
//!
//! ```text
//!  lease (claim_lease_*):  token | ordering_key unique_key ordering_at limit_key | suspect |
//!                          buffered (all, queue) or the repair report (limited)
//!  tx    (claim_tx_*):     xid | backend_pid | ordering_key unique_key ordering_at limit_key |
//!                          holds_slot holds_key_slot (limited, one) | the repair report (limited)
//! ```

use std::time::Duration;

use tokio_postgres::Row;

use crate::claim::run::claimed::{Claimed, Keys};
use crate::job::{decode_payload, Job};
use crate::metrics;

/// The columns every claim statement returns first.
const COMMON: usize = 12;

/// Which delivery mode's claim statement returned a row: where its own
/// columns are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `claim_lease_*`.
    Lease,
    /// `claim_tx_*` and `claim_tx_one`.
    Tx,
}

impl Mode {
    /// The first of the four keys: ordering_key, unique_key,
    /// coalesce(ordering_at, run_at), limit_key.
    const fn keys(self) -> usize {
        match self {
            // After the token.
            Mode::Lease => COMMON + 1,
            // After xid and backend pid.
            Mode::Tx => COMMON + 2,
        }
    }

    /// The limit key, the last of the four keys.
    const fn limit_key(self) -> usize {
        self.keys() + 3
    }

    /// A limited claim's report of keys to repair (rows whose id is NULL),
    /// with the key where its walk between keys stopped in the column
    /// after it.
    const fn repair_report(self) -> usize {
        match self {
            // After the keys and the suspect flag.
            Mode::Lease => COMMON + 6,
            // After the keys, the queue slot and the key slot columns.
            Mode::Tx => COMMON + 8,
        }
    }
}

/// One row a claim statement returned, read by column name.
#[derive(Clone, Copy)]
pub(crate) struct ClaimRow<'r> {
    row: &'r Row,
    mode: Mode,
}

impl<'r> ClaimRow<'r> {
    /// `row`, as the claim statement of `mode` returned it.
    pub(crate) fn read(row: &'r Row, mode: Mode) -> Self {
        ClaimRow { row, mode }
    }

    /// The job's id; `None` on a limited claim's report row.
    fn id_or_report(&self) -> Option<i64> {
        self.row.get(0)
    }

    /// Whether the row is a limited claim's report of keys to repair, not
    /// a job.
    pub(crate) fn is_report(&self) -> bool {
        self.id_or_report().is_none()
    }

    /// A report row's key to repair.
    pub(crate) fn key_to_repair(&self) -> Option<String> {
        self.row.get(self.mode.repair_report())
    }

    /// A report row's key where the claim's walk between keys stopped at
    /// its bound.
    pub(crate) fn walk_stopped_at(&self) -> Option<String> {
        self.row.get(self.mode.repair_report() + 1)
    }

    /// The job's id.
    pub(crate) fn id(&self) -> i64 {
        self.row.get(0)
    }

    /// Its place in the claim order: priority, run_at, id.
    pub(crate) fn order(&self) -> (i32, chrono::DateTime<chrono::Utc>, i64) {
        (self.row.get(4), self.row.get(5), self.row.get(0))
    }

    /// Its ordering and unique keys, ordering position and limit key.
    pub(crate) fn keys(&self) -> Keys {
        let first = self.mode.keys();
        Keys {
            ordering_key: self.row.get(first),
            unique_key: self.row.get(first + 1),
            ordering_at: self.row.get(first + 2),
            limit_key: self.row.get(first + 3),
        }
    }

    /// Its limit key.
    pub(crate) fn limit_key(&self) -> Option<&'r str> {
        self.row.get(self.mode.limit_key())
    }

    /// lease mode: the claim token that fences every write.
    pub(crate) fn token(&self) -> i64 {
        debug_assert_eq!(self.mode, Mode::Lease);
        self.row.get(COMMON)
    }

    /// lease mode: its attempt was refunded before, buffered when its
    /// worker died (`jobs.suspect`).
    pub(crate) fn suspect(&self) -> bool {
        debug_assert_eq!(self.mode, Mode::Lease);
        self.row.get(COMMON + 5)
    }

    /// lease mode, claims over all queues or one plain queue: the claim put
    /// it in the prefetch buffer, not on a free slot.
    pub(crate) fn buffered(&self) -> bool {
        debug_assert_eq!(self.mode, Mode::Lease);
        self.row.get(COMMON + 6)
    }

    /// tx mode: the claim transaction's id (`xid8` as text).
    pub(crate) fn xid(&self) -> String {
        debug_assert_eq!(self.mode, Mode::Tx);
        self.row.get(COMMON)
    }

    /// tx mode: the claim connection's server process.
    pub(crate) fn backend_pid(&self) -> i32 {
        debug_assert_eq!(self.mode, Mode::Tx);
        self.row.get(COMMON + 1)
    }

    /// tx mode, limited and one-job claims: the job took a queue slot.
    pub(crate) fn holds_slot(&self) -> bool {
        debug_assert_eq!(self.mode, Mode::Tx);
        self.row.get(COMMON + 6)
    }

    /// tx mode, limited and one-job claims: the job took a key slot.
    pub(crate) fn holds_key_slot(&self) -> bool {
        debug_assert_eq!(self.mode, Mode::Tx);
        self.row.get(COMMON + 7)
    }

    /// The row as a job, with its keys (and in lease mode its token),
    /// recording its pickup latency.
    pub(crate) fn claimed(&self) -> Claimed {
        let mut claimed = claimed_from_row(self.row);
        claimed.keys = self.keys();
        if self.mode == Mode::Lease {
            claimed.token = self.token();
        }
        claimed
    }
}

/// A claimed row's common columns as a job (recording its pickup latency).
fn claimed_from_row(row: &Row) -> Claimed {
    let payload_text: String = row.get(3);
    let (payload, undecodable) = match decode_payload(&payload_text) {
        Ok(v) => (v, None),
        Err(why) => (serde_json::Value::Null, Some(why)),
    };
    let timeout: Option<f64> = row.get(10);
    let ready_for: f64 = row.get(11);
    let job = Job {
        id: row.get(0),
        queue: row.get(1),
        task: row.get(2),
        payload,
        payload_text,
        priority: row.get(4),
        run_at: row.get(5),
        attempt: row.get(6),
        max_attempts: row.get(7),
        timeout: timeout.map(|s| Duration::from_secs_f64(s.clamp(0.001, 1e9))),
        created_at: row.get(9),
    };
    ::metrics::histogram!(metrics::PICKUP_LATENCY, "queue" => metrics::queue_label(&job.queue))
        .record(ready_for.max(0.0));
    // A flow's child that its parents released (migration 0045): every
    // claim returns `release_s`, NULL for any other job.
    if let Ok(Some(released_for)) = row.try_get::<_, Option<f64>>("release_s") {
        ::metrics::histogram!(metrics::FLOW_RELEASE_LATENCY, "queue" => metrics::queue_label(&job.queue))
            .record(released_for.max(0.0));
    }
    Claimed {
        job,
        undecodable,
        last_error: row.get(8),
        token: 0,
        keys: Keys::default(),
        admitted_at: None,
        buffered: false,
        suspect: false,
        ready_for: ready_for.max(0.0),
        trace: None,
        inputs: None,
    }
}
