//! What the claim context holds for tx mode alone.

use std::sync::atomic::AtomicBool;

/// Tx mode's part of the claim context.
pub(crate) struct TxState {
    /// `BEGIN` plus the claim transaction's `SET LOCAL`s.
    pub begin_sql: String,
    /// Whether the last tx batch's handlers reached the database: the next
    /// batch's mark is then committed durably at once rather than flushed
    /// when a handler first reaches it (`claim::tx::mark::Mark`), which
    /// costs that handler a round trip for nothing.
    pub marks_durable: AtomicBool,
}
