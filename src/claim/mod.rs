//! One job's way from claim to outcome: claim tasks wait for a wake-up and
//! claim ([`claimer`], [`plan`], [`fair`], [`rate`], [`key_rotation`]), each delivery mode runs
//! what it claimed ([`tx`], [`lease`], both through [`executor`]) and the
//! outcome is written ([`tx`] in the claim transaction, [`completer`] for
//! leases). Imports nothing from `services/` or `admin/`.

pub(crate) mod cancels;
pub(crate) mod claimed;
pub(crate) mod claimer;
pub(crate) mod completer;
pub(crate) mod context;
pub(crate) mod cursor;
pub(crate) mod executor;
pub(crate) mod fair;
pub(crate) mod idle;
pub(crate) mod key_rate;
pub(crate) mod key_repair;
pub(crate) mod key_rotation;
pub(crate) mod lease;
pub(crate) mod leases;
pub(crate) mod next_due;
pub(crate) mod outcome;
pub(crate) mod plan;
pub(crate) mod prefetch;
pub(crate) mod progress;
pub(crate) mod rate;
pub(crate) mod results;
pub(crate) mod starts;
pub(crate) mod tally;
pub(crate) mod targets;
pub(crate) mod trace;
pub(crate) mod turn;
pub(crate) mod tx;
pub(crate) mod wake;
