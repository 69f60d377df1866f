//! The `chaos_worker` example as a child process (killed with `kill -9` by
//! the crash tests) and the run ledger it writes into the database.

use std::time::Duration;

use super::db::TestDb;
use super::wait::wait_for;

/// The `chaos_worker` example binary. A plain `cargo test` builds the
/// examples; a run of single test files (`cargo test --test jobs crash::`) may not
/// have, so build them here once if they are missing.
pub fn chaos_worker_bin() -> std::path::PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test> → target/<profile>/examples/chaos_worker
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let bin = profile_dir.join("examples").join("chaos_worker");
    // Always ask cargo (a no-op when fresh): a binary left from an earlier
    // build would run stale code against a newer schema.
    BUILT.call_once(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = std::process::Command::new(cargo);
        cmd.args(["build", "--example", "chaos_worker", "--example", "soak"])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("run cargo build --examples");
        assert!(status.success(), "building the examples failed");
    });
    assert!(bin.exists(), "{} missing", bin.display());
    bin
}

/// Create the run ledger the chaos worker writes.
pub async fn create_run_ledger(db: &TestDb) {
    db.client()
        .await
        .batch_execute(
            "CREATE TABLE pgwake_runs (job_id bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL,
                                       overlap bool NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())",
        )
        .await
        .unwrap();
}

/// (job_id, attempt, pid, overlap) rows of the run ledger, in run order.
pub async fn ledger_runs(db: &TestDb) -> Vec<(i64, i32, i32, bool)> {
    db.client()
        .await
        .query(
            "SELECT job_id, attempt, pid, overlap FROM pgwake_runs ORDER BY at, job_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

/// A chaos worker child process; killed (SIGKILL) on drop if still running.
pub struct ChaosWorker {
    pub child: std::process::Child,
}

impl ChaosWorker {
    pub fn spawn(db: &TestDb, extra: &[&str]) -> ChaosWorker {
        let child = std::process::Command::new(chaos_worker_bin())
            .args(["--database-url", &db.url])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        ChaosWorker { child }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// `kill -9` and reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait for a clean exit.
    pub async fn terminate(mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child.
        unsafe {
            libc::kill(self.pid(), libc::SIGTERM);
        }
        wait_for(
            "the chaos worker to exit after SIGTERM",
            Duration::from_secs(60),
            async || self.child.try_wait().unwrap().ok_or("running".into()),
        )
        .await
    }
}

impl Drop for ChaosWorker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill9();
        }
    }
}

/// The gate `gated` chaos jobs wait for after their run is recorded: the
/// two-key advisory lock (0, 1) (`GATE` in examples/chaos_worker.rs), held
/// exclusively on this connection while closed.
pub struct Gate(tokio_postgres::Client);

impl Gate {
    /// A closed gate: `gated` runs stay alive until [`Gate::open`].
    pub async fn closed(db: &TestDb) -> Gate {
        let client = db.client().await;
        client
            .batch_execute("SELECT pg_advisory_lock(0, 1)")
            .await
            .unwrap();
        Gate(client)
    }

    /// Let every `gated` run go on.
    pub async fn open(self) {
        self.0
            .batch_execute("SELECT pg_advisory_unlock(0, 1)")
            .await
            .unwrap();
    }
}

/// Wait until the run ledger satisfies `cond`.
pub async fn until_runs(
    db: &TestDb,
    what: &str,
    timeout: Duration,
    cond: impl Fn(&[(i64, i32, i32, bool)]) -> bool,
) {
    wait_for(what, timeout, async || {
        let runs = ledger_runs(db).await;
        if cond(&runs) {
            Ok(())
        } else {
            Err(format!("runs so far: {runs:?}"))
        }
    })
    .await
}

/// Wait until no job is waiting or running (none in `pgwake.jobs` or
/// `pgwake.leased_jobs`).
pub async fn until_drained(db: &TestDb) {
    wait_for("every job to finish", Duration::from_secs(180), async || {
        let left: i64 = db
            .scalar("SELECT (SELECT count(*) FROM pgwake.jobs) + (SELECT count(*) FROM pgwake.leased_jobs)")
            .await;
        if left == 0 {
            Ok(())
        } else {
            Err(format!("{left} jobs left"))
        }
    })
    .await
}
