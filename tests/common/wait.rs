//! Waiting for a condition, never for a fixed time: every test that needs
//! something to happen polls for it here, with a timeout that fails the test
//! with what it was waiting for and the last state it saw.

use std::future::Future;
use std::time::Duration;

/// How often a wait checks its condition, unless told otherwise.
pub const POLL: Duration = Duration::from_millis(50);

/// Wait until `probe` returns `Ok(value)` and return the value, checking
/// every `every`. While the condition does not hold, `probe` returns
/// `Err(state)`; after `timeout` the test fails with `what` and the last
/// state. `probe` may also panic to fail at once (an invariant broken while
/// waiting).
pub async fn wait_for_every<T>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut probe: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match probe().await {
            Ok(value) => return value,
            Err(state) => {
                if tokio::time::Instant::now() >= deadline {
                    panic!("timed out after {timeout:?} waiting for {what}; last: {state}");
                }
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// [`wait_for_every`] at the usual pace, [`POLL`].
pub async fn wait_for<T>(
    what: &str,
    timeout: Duration,
    probe: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    wait_for_every(what, timeout, POLL, probe).await
}

/// Wait for `cond` to become true, checking every [`POLL`]; fails the test
/// with `what` after `timeout`.
pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_for(what, timeout, async || {
        if cond().await {
            Ok(())
        } else {
            Err("still false".into())
        }
    })
    .await
}
