//! Apply a sample migration that builds an index on `pgwake.jobs` through
//! pgwake's migration runner, the online way (a `-- pgwake:step
//! no-transaction` step with `CREATE INDEX CONCURRENTLY`) or the locking
//! way (a plain `CREATE INDEX` in the migration's transaction), and print
//! when it started and ended (epoch seconds) and how long it took.
//! `scripts/bench-online-migration.sh` runs it beside pgbench producers.
//!
//! ```sh
//! cargo run --example online_migration -- DATABASE_URL online|locking|undo
//! ```
//!
//! `undo` drops the sample index and forgets the sample migration, so the
//! next run builds it again.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use pgwake::admin::schema::{migrate_list, Migration, MIGRATIONS};

const ONLINE: &str = "-- A sample online migration: an index on the queue table.
-- pgwake:step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_bench_created ON pgwake.jobs (queue, priority DESC, run_at, id);
";
const LOCKING: &str = "-- The same index, the locking way.
CREATE INDEX IF NOT EXISTS jobs_bench_created ON pgwake.jobs (queue, priority DESC, run_at, id);
";

fn epoch() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(mode)) = (args.next(), args.next()) else {
        return Err("usage: online_migration DATABASE_URL online|locking|undo".into());
    };
    let mut client = pgwake::connect::connect(&pgwake::connect::parse_url(&url)?).await?;
    let sql = match mode.as_str() {
        "online" => ONLINE,
        "locking" => LOCKING,
        "undo" => {
            client
                .batch_execute(
                    "DROP INDEX IF EXISTS pgwake.jobs_bench_created;
                     DELETE FROM pgwake.schema_migrations WHERE version = 9001;",
                )
                .await?;
            return Ok(());
        }
        other => return Err(format!("unknown mode {other:?}").into()),
    };
    let mut list = MIGRATIONS.to_vec();
    list.push(Migration {
        version: 9001,
        name: "9001_bench_index.sql",
        sql,
    });
    let (start, t) = (epoch(), Instant::now());
    let report = migrate_list(&mut client, &Default::default(), &list).await?;
    let took = t.elapsed().as_secs_f64();
    assert_eq!(report.applied, vec![9001], "{report:?}");
    println!("{mode} {start:.6} {:.6} {took:.3}", epoch());
    Ok(())
}
