//! What runs beside the claim path in every worker, each a task the
//! worker's supervisor starts and joins: the [`listener`] (LISTEN, wake-ups),
//! the fallback [`poller`], the [`waiting`] registration, the [`rescuer`]
//! (expired leases), the [`sampler`] (queue and database-pressure gauges),
//! the [`scheduler`] (cron ticks), the [`fleet`] registry (this worker's
//! row in `pgwake.workers`, and the jobs no live worker can run) and the
//! [`rollup`] (the per-minute counts of outcomes). Services use `claim/`;
//! the claim path never uses them, but for the rollup's tally, which it
//! counts into.

pub(crate) mod cancel_watcher;
pub(crate) mod fleet;
pub(crate) mod history;
pub(crate) mod listener;
pub(crate) mod poller;
pub mod rescuer;
pub(crate) mod rollup;
pub mod sampler;
pub(crate) mod scheduler;
pub(crate) mod waiting;
