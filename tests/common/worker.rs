//! An in-process worker for a test: its configuration and a handle to wait
//! on its listener, its registration and its events, and to stop it.

use std::sync::Arc;
use std::time::Duration;

use pgwake::{JobEvent, Worker, WorkerConfig};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::db::TestDb;
use super::wait::eventually;

/// A config for tests: fast retries and reconnects, a long poll interval
/// unless the test is about polling.
pub fn test_config() -> WorkerConfig {
    WorkerConfig {
        concurrency: 4,
        batch: 10,
        poll_interval: Duration::from_secs(60),
        retry_base: Duration::from_millis(20),
        retry_max: Duration::from_millis(100),
        reconnect_min: Duration::from_millis(20),
        reconnect_max: Duration::from_millis(500),
        grace_period: Duration::from_secs(10),
        sample_interval: None,
        ..WorkerConfig::default()
    }
}

/// A worker running on a background task.
pub struct Running {
    pub stop: CancellationToken,
    pub abort: CancellationToken,
    pub events: broadcast::Receiver<JobEvent>,
    pub health: Arc<pgwake::Health>,
    pub join: tokio::task::JoinHandle<pgwake::Result<()>>,
}

impl Running {
    /// Start `worker`.
    pub fn start(worker: Worker) -> Running {
        let stop = CancellationToken::new();
        let abort = CancellationToken::new();
        let events = worker.subscribe();
        let health = worker.health();
        let join = tokio::spawn(worker.run(stop.clone(), abort.clone()));
        Running {
            stop,
            abort,
            events,
            health,
            join,
        }
    }

    /// Wait until the listener is up (and the tasks have been woken once).
    pub async fn until_listening(&self) {
        let h = self.health.clone();
        eventually("listener connected", Duration::from_secs(30), move || {
            let h = h.clone();
            async move { h.listener_ok() }
        })
        .await;
    }

    /// Wait until the listener is up and the worker has registered as
    /// waiting (from then on an insert NOTIFYs it).
    pub async fn until_waiting(&self, db: &TestDb) {
        self.until_listening().await;
        eventually(
            "worker registered as waiting",
            Duration::from_secs(30),
            || async {
                let n: i64 = db
                    .scalar("SELECT count(*) FROM pgwake.waiting_workers WHERE expires_at > now()")
                    .await;
                n > 0
            },
        )
        .await;
    }

    /// Wait for the next `n` events that satisfy `pred`, returning them.
    pub async fn next_events(
        &mut self,
        n: usize,
        timeout: Duration,
        pred: impl Fn(&JobEvent) -> bool,
    ) -> Vec<JobEvent> {
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + timeout;
        while got.len() < n {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Ok(ev)) => {
                    if pred(&ev) {
                        got.push(ev);
                    }
                }
                Ok(Err(broadcast::error::RecvError::Lagged(k))) => {
                    panic!("event receiver lagged by {k}; raise the channel size")
                }
                Ok(Err(e)) => panic!("event channel closed: {e}"),
                Err(_) => panic!(
                    "timed out after {timeout:?} with {} of {n} events: {got:?}",
                    got.len()
                ),
            }
        }
        got
    }

    /// Stop gracefully and wait for the worker to return.
    pub async fn shutdown(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(60), self.join)
            .await
            .expect("worker stops within 60 s")
            .expect("worker task did not panic")
            .expect("worker returned Ok");
    }
}
