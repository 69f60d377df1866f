//! A tx batch's crash mark as the handlers see it: committed
//! asynchronously by `ledger::mark_batch`, made durable before a handler
//! first reaches the database. Its own module so that `handler.rs` can hold
//! one without importing the claim path.

use crate::db::sql::{Db, BATCH_MARK_DURABLE};

/// A batch's mark in `pgwake.tx_batches`, committed asynchronously
/// (`synchronous_commit = off`: no WAL flush waited for) and made durable
/// before a handler of the batch first uses the database.
///
/// Why that is enough: the mark must outlive the claim transaction when the
/// batch crashes. A worker crash (kill -9, OOM, abort) leaves the server
/// running: an asynchronous commit is as visible and as lasting as a
/// synchronous one unless the server itself crashes before the WAL writer
/// flushes it (`wal_writer_delay`, 200 ms by default). A job can crash the
/// server only through the database, and a handler reaches the database
/// only through [`make_durable`](Mark::make_durable) first (the `sql`
/// handlers' calls, a Rust handler's `JobContext::transaction()`). A server
/// crash from elsewhere within that window loses the mark, and so the
/// charge of jobs that did not cause it. Handlers that never use the
/// database (most lease-free Rust handlers) save one WAL flush per batch.
///
/// A worker whose handlers do reach the database would pay that flush as a
/// round trip of its own on top of the old durable commit: so when the last
/// batch's handlers reached the database (`TxState::marks_durable`), the
/// next mark is committed durably at once, as before.
pub(crate) struct Mark {
    /// The mark's token (`batch_clear.sql` deletes it in the claim's commit).
    pub(crate) token: i64,
    durable: std::sync::atomic::AtomicBool,
    /// A handler of the batch asked for the database.
    reached: std::sync::atomic::AtomicBool,
    pool: deadpool_postgres::Pool,
}

impl Mark {
    /// Flush the WAL up to (and past) the mark's commit, once per batch.
    /// A connection that cannot be had for a reason other than the
    /// database's (the pool closing at shutdown) leaves the mark to the WAL
    /// writer, logged.
    pub(crate) async fn make_durable(&self) -> std::result::Result<(), tokio_postgres::Error> {
        use std::sync::atomic::Ordering;
        self.reached.store(true, Ordering::Release);
        if self.durable.load(Ordering::Acquire) {
            return Ok(());
        }
        let conn = match self.pool.get().await {
            Ok(conn) => conn,
            Err(deadpool_postgres::PoolError::Backend(e)) => return Err(e),
            Err(e) => {
                tracing::warn!(error = %e, "cannot make the batch mark durable; the WAL writer flushes it within wal_writer_delay");
                return Ok(());
            }
        };
        let r = Db::unnamed(&conn)
            .execute(&BATCH_MARK_DURABLE, &[&self.token])
            .await;
        if let Err(e) = &r {
            if crate::error::pg_is_connection_lost(e) {
                // Do not hand a broken connection back to the pool.
                let _ = deadpool_postgres::Object::take(conn);
            }
        }
        r?;
        self.durable.store(true, Ordering::Release);
        Ok(())
    }

    /// A mark committed as `durable` says (asynchronous: false).
    pub(crate) fn new(token: i64, durable: bool, pool: deadpool_postgres::Pool) -> Mark {
        Mark {
            token,
            durable: durable.into(),
            reached: Default::default(),
            pool,
        }
    }

    /// Whether a handler of the batch asked for the database.
    pub(crate) fn reached(&self) -> bool {
        self.reached.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl crate::handler::DurableMark for Mark {
    fn make_durable(
        &self,
    ) -> futures::future::BoxFuture<'_, std::result::Result<(), tokio_postgres::Error>> {
        Box::pin(Mark::make_durable(self))
    }
}
