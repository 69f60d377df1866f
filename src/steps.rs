//! Durable steps (issue 37, item 3): a handler wraps each piece of a long
//! job in [`JobContext::step`](crate::JobContext::step); the output of a
//! step that finished is recorded (`pgwake.job_steps`, migration 0040),
//! and when the job runs again — a retry, a crash, a lost lease, a deploy
//! — a recorded step returns its stored output without running. Only the
//! job reruns: nothing is replayed, and the handler's code need not be
//! deterministic beyond naming its steps.
//!
//! ```text
//! step(name, fut) ─ recorded? ── yes ─▶ its stored output (fut never polled)
//!                        └─ no ─▶ fut ─▶ Ok(output) ─▶ record ─▶ output
//!                                   └──▶ Err(e) ─▶ StepError::Failed (nothing recorded)
//! record:  lease mode  INSERT on the pool, fenced by the run's lease token, before step returns
//!          tx mode     INSERT through the claim transaction, then its savepoint moves after it
//! ```
//!
//! In tx mode a failed attempt is rolled back only to its last finished
//! step: the job's savepoint is taken again after each step is recorded,
//! so the steps it finished, and what they wrote through the claim
//! transaction, commit with the retry (docs/src/steps.md says why).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use crate::db::sql::{Db, HANDLER_INPUTS, STEPS_OF_JOB, STEP_RECORD_LEASE, STEP_RECORD_TX};

/// [`crate::BoxError`], spelt out: this file is used by `handler.rs` and
/// must not use it back (tests/repository/layout.rs: no import cycles).
type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Longest step name, in characters (100); a name is made of ASCII letters,
/// digits and `_ . : -`.
pub const STEP_NAME_MAX: usize = 100;

/// Largest step output, in bytes of its compact JSON text (64 KiB).
pub const STEP_OUTPUT_MAX: usize = 64 * 1024;

/// Most steps one job records over all its runs (1,000).
pub const STEPS_PER_JOB_MAX: usize = 1_000;

/// Why a [`JobContext::step`](crate::JobContext::step) returned no output.
/// Returned by `?` from a handler, it is a failed attempt: the job is
/// retried, and its recorded steps are kept.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The step's name is empty, longer than [`STEP_NAME_MAX`], or has a
    /// character other than ASCII letters, digits and `_ . : -`.
    #[error("a step name {name:?} that is not 1-{max} characters of A-Z a-z 0-9 _ . : - (pgwake::STEP_NAME_MAX): name steps like \"charge-card\" or \"rows:1000\"")]
    BadName {
        /// The name (cut to 120 characters).
        name: String,
        /// The bound.
        max: usize,
    },
    /// This run already called a step of this name: two steps of one job
    /// must have two names, or the second would return the first's output.
    #[error("step {0:?} called twice in one run: give each step of a job its own name (e.g. \"send:{{i}}\" in a loop)")]
    Duplicate(String),
    /// The job has [`STEPS_PER_JOB_MAX`] recorded steps already.
    #[error("job has {max} recorded steps, the bound (pgwake::STEPS_PER_JOB_MAX): make each step do more (a batch of rows, not one row)")]
    TooMany {
        /// The bound.
        max: usize,
    },
    /// The step's output, as JSON, is larger than [`STEP_OUTPUT_MAX`]:
    /// nothing was recorded (the step ran).
    #[error("step {name:?} output {bytes} bytes of JSON, over the bound of {max} (pgwake::STEP_OUTPUT_MAX): return a reference (an id, a path), not the data")]
    TooLarge {
        /// The step.
        name: String,
        /// Its output's size.
        bytes: usize,
        /// The bound.
        max: usize,
    },
    /// The output could not be written as JSON, or a recorded output could
    /// not be read back as the type asked for (the step's output type
    /// changed between deploys).
    #[error("step {name:?}: {error}")]
    Json {
        /// The step.
        name: String,
        /// What serde said.
        error: String,
    },
    /// The step's future returned an error: nothing was recorded, and the
    /// step runs again on the job's next run.
    #[error("step {name:?} failed: {error}")]
    Failed {
        /// The step.
        name: String,
        /// Its error.
        #[source]
        error: BoxError,
    },
    /// An `exec` command or a persistent process sent a step the job has
    /// recorded already (it ran a step that an earlier run finished): the
    /// recorded output is kept. The command should read the recorded steps
    /// it is given (`PGWAKE_STEPS`, the job message's `steps`) and skip
    /// those.
    #[error("step {0:?} is recorded already (by an earlier run of the job): its recorded output is kept; read the recorded steps the command is given (PGWAKE_STEPS, or the job message's \"steps\") and skip those")]
    AlreadyRecorded(String),
    /// The step ran but its output could not be recorded: this lease-mode
    /// run no longer holds the job's lease (another run may hold it), so
    /// the run must stop. The step runs again on the job's next run.
    #[error("step {0:?} ran but was not recorded: this run lost the job's lease")]
    LostLease(String),
    /// Reading or recording steps failed (the connection, the claim
    /// transaction aborted by an earlier statement).
    #[error("step {name:?}: {error}")]
    Database {
        /// The step.
        name: String,
        /// The error.
        #[source]
        error: tokio_postgres::Error,
    },
}

/// Whether `name` is a valid step name.
pub(crate) fn check_name(name: &str) -> Result<(), StepError> {
    let ok = !name.is_empty()
        && name.len() <= STEP_NAME_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(StepError::BadName {
            name: name.chars().take(120).collect(),
            max: STEP_NAME_MAX,
        })
    }
}

/// A step's output as compact JSON text, within [`STEP_OUTPUT_MAX`].
pub(crate) fn output_text<T: serde::Serialize>(
    name: &str,
    output: &T,
) -> Result<String, StepError> {
    let text = serde_json::to_string(output).map_err(|e| StepError::Json {
        name: name.to_string(),
        error: e.to_string(),
    })?;
    if text.len() > STEP_OUTPUT_MAX {
        return Err(StepError::TooLarge {
            name: name.to_string(),
            bytes: text.len(),
            max: STEP_OUTPUT_MAX,
        });
    }
    Ok(text)
}

/// One run's steps: what was recorded before it (read on its first step)
/// and the names it has called. Held by its [`JobContext`](crate::JobContext).
pub(crate) struct Steps {
    pub(crate) job: i64,
    pub(crate) attempt: i32,
    /// Lease mode: the run's claim token, which fences every record.
    pub(crate) lease_token: Option<i64>,
    /// Recorded outputs by name (JSON text), read once per run.
    recorded: tokio::sync::OnceCell<Mutex<HashMap<String, String>>>,
    /// Names this run has called.
    called: Mutex<HashSet<String>>,
}

impl Steps {
    pub(crate) fn new(job: i64, attempt: i32, lease_token: Option<i64>) -> Steps {
        Steps {
            job,
            attempt,
            lease_token,
            recorded: Default::default(),
            called: Default::default(),
        }
    }

    /// Take the recorded outputs as read with the run's inputs
    /// ([`inputs`]: a JSON object by name, `None` when none), so that the
    /// first step does not read them again.
    pub(crate) fn prime(&self, recorded: Option<&str>) {
        let map = recorded
            .and_then(|text| {
                serde_json::from_str::<HashMap<String, Box<serde_json::value::RawValue>>>(text).ok()
            })
            .map(|m| {
                m.into_iter()
                    .map(|(k, v)| (k, v.get().to_string()))
                    .collect()
            })
            .unwrap_or_default();
        let _ = self.recorded.set(Mutex::new(map));
    }

    /// The recorded outputs, read on first use through `client`.
    async fn recorded(
        &self,
        client: &tokio_postgres::Client,
    ) -> Result<&Mutex<HashMap<String, String>>, tokio_postgres::Error> {
        self.recorded
            .get_or_try_init(|| async {
                let rows = Db::unnamed(client)
                    .query(&STEPS_OF_JOB, &[&self.job])
                    .await?;
                Ok(Mutex::new(
                    rows.iter().map(|r| (r.get(0), r.get(1))).collect(),
                ))
            })
            .await
    }

    /// Begin step `name`: its recorded output, if any; otherwise `None`,
    /// and the step may run (the bounds allow one more).
    pub(crate) async fn begin(
        &self,
        client: &tokio_postgres::Client,
        name: &str,
    ) -> Result<Option<String>, StepError> {
        check_name(name)?;
        if !self
            .called
            .lock()
            .expect("steps lock")
            .insert(name.to_string())
        {
            return Err(StepError::Duplicate(name.to_string()));
        }
        let recorded = self
            .recorded(client)
            .await
            .map_err(|error| StepError::Database {
                name: name.to_string(),
                error,
            })?
            .lock()
            .expect("steps lock");
        if let Some(output) = recorded.get(name) {
            return Ok(Some(output.clone()));
        }
        if recorded.len() >= STEPS_PER_JOB_MAX {
            return Err(StepError::TooMany {
                max: STEPS_PER_JOB_MAX,
            });
        }
        Ok(None)
    }

    /// Record step `name`'s output through `client`: the pool's connection
    /// (lease mode, fenced by the token) or the claim transaction (tx mode,
    /// after which the job's savepoint is taken again, so that a failure
    /// later in the run keeps this step and its effects).
    pub(crate) async fn record(
        &self,
        client: &tokio_postgres::Client,
        name: &str,
        output: String,
    ) -> Result<(), StepError> {
        let db = |error| StepError::Database {
            name: name.to_string(),
            error,
        };
        let rows = match self.lease_token {
            Some(token) => Db::unnamed(client)
                .query(
                    &STEP_RECORD_LEASE,
                    &[&self.job, &name, &output, &self.attempt, &token],
                )
                .await
                .map_err(db)?,
            None => {
                let rows = Db::unnamed(client)
                    .query(&STEP_RECORD_TX, &[&self.job, &name, &output, &self.attempt])
                    .await
                    .map_err(db)?;
                client
                    .batch_execute("RELEASE SAVEPOINT pgwake_job; SAVEPOINT pgwake_job")
                    .await
                    .map_err(db)?;
                rows
            }
        };
        if rows.is_empty() {
            // Lease mode: the fence refused it. Tx mode: the claim
            // transaction holds the job, so only this run could have
            // recorded the name.
            return Err(match self.lease_token {
                Some(_) => StepError::LostLease(name.to_string()),
                None => StepError::Duplicate(name.to_string()),
            });
        }
        if let Some(recorded) = self.recorded.get() {
            recorded
                .lock()
                .expect("steps lock")
                .insert(name.to_string(), output);
        }
        Ok(())
    }
}

/// What an `exec` command or a persistent process gets of a job besides
/// its payload: its recorded steps and its parents' results, each as JSON
/// text and `None` when it has none.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Inputs {
    /// The recorded steps: an object by step name.
    pub(crate) steps: Option<String>,
    /// `pgwake.parent_results(id)`: an object by parent id (only for a job
    /// that has parents).
    pub(crate) parents: Option<String>,
}

/// The [`Inputs`] of jobs `ids`, in one statement (`handler_inputs`).
pub(crate) async fn inputs(
    client: &tokio_postgres::Client,
    ids: &[i64],
) -> Result<HashMap<i64, Inputs>, tokio_postgres::Error> {
    inputs_with(Db::unnamed(client), ids).await
}

/// [`inputs`] through `db` (the claim's connection, its statements cached).
pub(crate) async fn inputs_with(
    db: Db<'_>,
    ids: &[i64],
) -> Result<HashMap<i64, Inputs>, tokio_postgres::Error> {
    let rows = db.query(&HANDLER_INPUTS, &[&ids]).await?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                r.get(0),
                Inputs {
                    steps: r.get(1),
                    parents: r.get(2),
                },
            )
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_bounded_and_plain() {
        assert!(check_name("charge-card").is_ok());
        assert!(check_name("rows:1000.a_b").is_ok());
        assert!(check_name(&"n".repeat(STEP_NAME_MAX)).is_ok());
        for bad in ["", "a b", "x\u{1b}[2J", "é", "<script>", "a/b"] {
            assert!(
                matches!(check_name(bad), Err(StepError::BadName { .. })),
                "{bad:?}"
            );
        }
        let long = "n".repeat(STEP_NAME_MAX + 1);
        let e = check_name(&long).unwrap_err();
        assert!(e.to_string().contains("STEP_NAME_MAX"), "{e}");
    }

    #[test]
    fn outputs_over_the_bound_are_refused() {
        assert!(output_text("a", &"x".repeat(STEP_OUTPUT_MAX - 2)).is_ok());
        let e = output_text("a", &"x".repeat(STEP_OUTPUT_MAX - 1)).unwrap_err();
        assert!(
            matches!(e, StepError::TooLarge { bytes, .. } if bytes == STEP_OUTPUT_MAX + 1),
            "{e}"
        );
        assert!(e.to_string().contains("STEP_OUTPUT_MAX"), "{e}");
    }
}
