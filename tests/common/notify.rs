//! Notifications seen from outside the worker: a LISTEN session that counts
//! what the insert trigger sends, and a stand-in waiting worker that makes
//! the trigger send.

use std::time::Duration;

use super::db::TestDb;

/// A LISTEN session on `pgwake` (and a marker channel) that collects
/// payloads, for counting notifications exactly.
pub struct Notifications {
    pub client: tokio_postgres::Client,
    rx: tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
}

/// Register a stand-in idle worker for every queue, so the insert trigger
/// NOTIFYs (tests that LISTEN by hand).
pub async fn register_waiter(db: &TestDb) {
    db.client()
        .await
        .batch_execute("INSERT INTO pgwake.waiting_workers (worker_id, queues, expires_at) VALUES ('test', NULL, 'infinity')")
        .await
        .unwrap();
}

/// The marker channel: a producer NOTIFYs it after its inserts commit; since
/// notifications arrive in commit order, everything before the marker is
/// everything the inserts sent.
pub const MARKER: &str = "pgwake_test_marker";

impl Notifications {
    pub async fn listen(db: &TestDb) -> Notifications {
        use futures::StreamExt;
        let (client, mut conn) = db.config().connect(tokio_postgres::NoTls).await.unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut s = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
            while let Some(Ok(m)) = s.next().await {
                if let tokio_postgres::AsyncMessage::Notification(n) = m {
                    let _ = tx.send((n.channel().to_string(), n.payload().to_string()));
                }
            }
        });
        client
            .batch_execute(&format!("LISTEN pgwake; LISTEN {MARKER}"))
            .await
            .unwrap();
        Notifications { client, rx }
    }

    /// Payloads on `pgwake` received before the marker `mark` arrives.
    pub async fn until_marker(&mut self, mark: &str) -> Vec<String> {
        let mut got = Vec::new();
        loop {
            let (channel, payload) = tokio::time::timeout(Duration::from_secs(30), self.rx.recv())
                .await
                .expect("marker arrives")
                .expect("listener alive");
            if channel == MARKER && payload == mark {
                return got;
            }
            if channel == "pgwake" {
                got.push(payload);
            }
        }
    }
}
