//! Statements sent ahead on the claim connection: queued at once, their
//! replies read later, so a savepoint and its release cost no round trip of
//! their own.
//!
//! ```text
//!  job 1: SAVEPOINT ─▶ its statements ─▶ job 2: RELEASE; SAVEPOINT ─▶ …   sent, not waited for
//!  end of batch: read every reply (settle) ─▶ outcomes, COMMIT (releases what is open)
//! ```
//!
//! Why it is safe: the connection runs requests in the order they were
//! queued, so a savepoint sent ahead precedes the handler's first statement
//! on the server exactly as an awaited one would. A reply read late can only
//! be an error that also aborted the transaction (any error inside a
//! transaction block does), and every reply is read before the claim sends
//! `COMMIT` ([`Ahead::settle`]): a batch whose savepoint or release failed
//! fails as a whole, as it did when each was awaited, instead of committing.
//! Its siblings after the failure may have run meanwhile; their claims are
//! rolled back with the batch, and the batch's mark sends its jobs to the
//! one-at-a-time path (ledger.rs).
//!
//! A savepoint is released with the next one's taking, in one message, or
//! by the COMMIT, so a job that uses the claim transaction costs the server
//! one message; the nesting stays at most two deep (a job's inside a
//! group's). The replies are read before any rollback to a savepoint: a job
//! whose `RELEASE; SAVEPOINT` failed (the transaction was aborted before
//! it) could otherwise roll back to its predecessor's savepoint, undoing the
//! work of a job already counted done. A transaction the batch's last
//! handler left aborted (its savepoint is never released on its own) fails
//! the outcome writes that precede every COMMIT (`write::finish`: the
//! batch mark's clearing at least), so it never commits either.
//!
//! A reply nobody reads yet stays in its request's channel (capacity two:
//! the server sends a reply of a few short messages in one write, which the
//! connection decodes as one or two items), so it never holds up the
//! replies queued behind it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio_postgres::Client;

/// The reply of a statement already sent.
pub(crate) type Reply<'c> =
    Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send + 'c>>;

/// Queue `sql` (one statement) on `client`'s connection now and return its
/// reply, to be read later.
pub(crate) fn send<'c>(client: &'c Client, sql: &'static str) -> Reply<'c> {
    let mut reply: Reply<'_> = Box::pin(client.batch_execute(sql));
    // The first poll encodes the statement and queues it on the connection
    // (tokio-postgres' `batch_execute` sends before its first await).
    match poll_now(&mut reply) {
        Poll::Ready(r) => Box::pin(std::future::ready(r)),
        Poll::Pending => reply,
    }
}

/// Defined beside the handler's context, which calls it.
pub(crate) use crate::handler::TakeSavepoint;

/// A job's savepoint, taken on its handler's first use of the claim
/// transaction. When the previous job's savepoint is still open (it is left
/// open after its job, see [`Ahead::job_savepoint_open`]), it is released in
/// the same message: one statement string, one reply, one server flush.
pub(crate) struct JobSavepoint<'c> {
    client: &'c Client,
    sql: &'static str,
    reply: std::sync::Mutex<Option<Reply<'c>>>,
}

impl<'c> JobSavepoint<'c> {
    /// A savepoint to be taken on `client`, releasing the previous job's
    /// first when `release_previous`.
    pub(crate) fn new(client: &'c Client, release_previous: bool) -> JobSavepoint<'c> {
        JobSavepoint {
            client,
            sql: if release_previous {
                "RELEASE SAVEPOINT pgwake_job; SAVEPOINT pgwake_job"
            } else {
                "SAVEPOINT pgwake_job"
            },
            reply: Default::default(),
        }
    }

    /// The reply, if the savepoint was taken.
    pub(crate) fn reply(self) -> Option<Reply<'c>> {
        self.reply.into_inner().expect("savepoint lock")
    }
}

impl TakeSavepoint for JobSavepoint<'_> {
    fn take(&self) {
        let mut reply = self.reply.lock().expect("savepoint lock");
        if reply.is_none() {
            *reply = Some(send(self.client, self.sql));
        }
    }
}

/// Poll once without a waker: whoever awaits the reply later registers one.
fn poll_now(reply: &mut Reply<'_>) -> Poll<Result<(), tokio_postgres::Error>> {
    reply
        .as_mut()
        .poll(&mut Context::from_waker(futures::task::noop_waker_ref()))
}

/// The replies of a batch's statements sent ahead, read before its commit.
#[derive(Default)]
pub(crate) struct Ahead<'c> {
    replies: Vec<Reply<'c>>,
    /// A job's savepoint is still open: after its job (kept or rolled back
    /// to), it is released with the next savepoint's taking, or by the
    /// batch's COMMIT, never on its own.
    pub(crate) job_savepoint_open: bool,
    /// A group's savepoint is still open (the same; a job's savepoint may
    /// be open inside it, never the reverse).
    pub(crate) group_savepoint_open: bool,
}

impl<'c> Ahead<'c> {
    /// A reply to read before the commit.
    pub(crate) fn push(&mut self, reply: Reply<'c>) {
        self.replies.push(reply);
    }

    /// Read the replies that have arrived, without waiting; the first error
    /// (in sending order) is returned.
    pub(crate) fn reap(&mut self) -> Result<(), tokio_postgres::Error> {
        let mut first_error = None;
        self.replies.retain_mut(|reply| match poll_now(reply) {
            Poll::Pending => true,
            Poll::Ready(Ok(())) => false,
            Poll::Ready(Err(e)) => {
                first_error.get_or_insert(e);
                false
            }
        });
        first_error.map_or(Ok(()), Err)
    }

    /// Wait for every reply; the first error (in sending order) is returned.
    pub(crate) async fn settle(&mut self) -> Result<(), tokio_postgres::Error> {
        let mut first_error = None;
        for reply in self.replies.drain(..) {
            if let Err(e) = reply.await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
