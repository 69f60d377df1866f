//! What the command line and operators call: migrate the schema, check the
//! database for what breaks queues (`doctor`), look at
//! and change queues, dead jobs, history, schedules, and cancel jobs. Each
//! function takes a connection; none needs a running worker.

pub mod activity;
pub mod bulk;
pub mod cancel;
pub mod cron;
pub mod dead;
pub mod doctor;
pub mod gauges;
pub mod history;
pub mod jobs;
pub mod pressure;
pub mod queue_pressure;
pub mod queues;
pub mod schedules;
pub mod schema;
pub mod stats;
pub mod workers;
