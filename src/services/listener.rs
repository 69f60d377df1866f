//! The listener: one dedicated connection (never from the pool: pooled
//! connections drop notifications) that `LISTEN`s on channel `pgwake` and
//! turns notifications into claim-task wake-ups, and on the control channel
//! `pgwake_control`, whose cancel requests it hands to the cancel book
//! (`cancel.rs`).
//!
//! ```text
//!   connect ──ok──▶ LISTEN ──▶ wake every claim task (trigger=reconnect)
//!      ▲                          │
//!      │                          ▼
//!   backoff ◀──error── { notification → wake one task (trigger=notify)
//!   (capped,               ping every interval, timeout → error
//!    jittered)             connection closed → error }
//! ```
//!
//! Every claim task is woken once after each (re)connect, and the cancel
//! watcher polls once, because whatever was notified while the connection
//! was away is lost. The connection never
//! opens a transaction, and pings so that a half-open TCP connection (a
//! failover, a black-holed network) is noticed within ping interval +
//! timeout instead of never.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;

use crate::admin::cancel::CONTROL_CHANNEL;
use crate::claim::choose::wake::{Trigger, Wakeup};
use crate::claim::run::cancels::CancelBook;
use crate::error::PgDisplay;
use crate::health::Health;
use crate::metrics;

/// The NOTIFY channel of the insert trigger.
pub(crate) const CHANNEL: &str = "pgwake";

/// Listener settings.
#[derive(Debug, Clone)]
pub(crate) struct ListenerConfig {
    /// Connection settings (with the listener's `application_name`).
    pub db: crate::db::connect::DbConfig,
    /// Queues whose notifications wake tasks (`None`: all).
    pub queues: Option<HashSet<String>>,
    /// Ping interval.
    pub ping_interval: Duration,
    /// Ping timeout.
    pub ping_timeout: Duration,
    /// First reconnect delay.
    pub reconnect_min: Duration,
    /// Reconnect delay cap.
    pub reconnect_max: Duration,
}

/// The listener service.
pub(crate) struct Listener {
    config: ListenerConfig,
    wake: Arc<Wakeup>,
    health: Arc<Health>,
    cancels: Arc<CancelBook>,
}

/// How a listener session ended.
#[derive(Debug)]
enum SessionEnd {
    Shutdown,
    Lost(String),
}

impl Listener {
    /// A listener that wakes `wake`, reports into `health` and passes
    /// cancel requests to `cancels`.
    pub(crate) fn new(
        config: ListenerConfig,
        wake: Arc<Wakeup>,
        health: Arc<Health>,
        cancels: Arc<CancelBook>,
    ) -> Listener {
        Listener {
            config,
            wake,
            health,
            cancels,
        }
    }

    fn backoff(&self) -> impl Iterator<Item = Duration> {
        crate::config::reconnect_backoff(self.config.reconnect_min, self.config.reconnect_max)
    }

    /// Listen until `shutdown`, reconnecting for ever with capped backoff.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let mut backoff = self.backoff();
        let mut connected_before = false;
        loop {
            match self.run_once(&shutdown, connected_before).await {
                (SessionEnd::Shutdown, _) => break,
                (SessionEnd::Lost(why), was_connected) => {
                    self.health.set_listener(false);
                    if was_connected {
                        connected_before = true;
                        backoff = self.backoff();
                    }
                    let delay = backoff.next().unwrap_or(self.config.reconnect_max);
                    tracing::warn!(error = %why, retry_in = ?delay, "listener connection lost");
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        self.health.set_listener(false);
    }

    /// One connection's life: connect, LISTEN, wake everyone, then relay
    /// notifications and ping until the connection fails or `shutdown`.
    /// Returns how it ended and whether LISTEN was ever up.
    async fn run_once(&self, shutdown: &CancellationToken, reconnect: bool) -> (SessionEnd, bool) {
        let connect = self.config.db.open();
        let (client, mut connection) = tokio::select! {
            _ = shutdown.cancelled() => return (SessionEnd::Shutdown, false),
            r = connect => match r {
                Ok(c) => c,
                Err(e) => return (SessionEnd::Lost(e.to_string()), false),
            },
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut driver = tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(n)) => {
                        let control = n.channel() == CONTROL_CHANNEL;
                        let _ = tx.send((control, n.payload().to_string()));
                    }
                    Ok(_) => {}
                    Err(e) => return PgDisplay(&e).to_string(),
                }
            }
            "connection closed by the server".to_string()
        });
        let result = async {
            let listen = tokio::time::timeout(
                self.config.ping_timeout,
                client.batch_execute(&format!("LISTEN {CHANNEL}; LISTEN {CONTROL_CHANNEL}")),
            )
            .await;
            match listen {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return (SessionEnd::Lost(format!("LISTEN failed: {}", PgDisplay(&e))), false),
                Err(_) => return (SessionEnd::Lost("LISTEN timed out".into()), false),
            }
            self.health.set_listener(true);
            if reconnect {
                ::metrics::counter!(metrics::LISTENER_RECONNECTS).increment(1);
                tracing::info!("listener reconnected");
            } else {
                tracing::debug!("listener connected");
            }
            self.wake.wake_all(Trigger::Reconnect);
            self.cancels.poll_soon();
            let mut ping = tokio::time::interval(self.config.ping_interval);
            ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ping.tick().await;
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return (SessionEnd::Shutdown, true),
                    end = &mut driver => {
                        let why = end.unwrap_or_else(|e| format!("listener task failed: {e}"));
                        return (SessionEnd::Lost(why), true);
                    }
                    n = rx.recv() => match n {
                        Some((true, payload)) => {
                            ::metrics::counter!(metrics::NOTIFICATIONS).increment(1);
                            self.cancels.on_notification(&payload);
                        }
                        Some((false, queue)) => {
                            ::metrics::counter!(metrics::NOTIFICATIONS).increment(1);
                            let wanted = self.config.queues.as_ref().is_none_or(|q| q.contains(&queue));
                            if wanted {
                                self.wake.wake_one(Trigger::Notify);
                            }
                        }
                        None => return (SessionEnd::Lost("connection closed".into()), true),
                    },
                    _ = ping.tick() => {
                        match tokio::time::timeout(self.config.ping_timeout, client.simple_query("")).await {
                            Ok(Ok(_)) => {}
                            Ok(Err(e)) => return (SessionEnd::Lost(format!("ping failed: {}", PgDisplay(&e))), true),
                            Err(_) => return (SessionEnd::Lost(format!(
                                "ping got no answer within {:?} (half-open connection?)",
                                self.config.ping_timeout
                            )), true),
                        }
                    }
                }
            }
        }
        .await;
        driver.abort();
        result
    }
}
