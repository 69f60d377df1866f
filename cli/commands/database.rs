//! The database every command works on (`--database-url`, else the libpq
//! environment).

use clap::Args;
use pgwake::error::Error;

/// The database to work on.
#[derive(Args, Clone)]
pub struct Db {
    /// PostgreSQL URL or key=value string, e.g. postgres://user:pass@host:5432/db?sslmode=verify-full;
    /// without it, the libpq variables PGHOST, PGUSER, PGDATABASE, … (docs/src/connecting.md).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
}

impl Db {
    /// Parsed connection settings (the URL, else the libpq environment), or
    /// a message saying how to give them.
    pub fn config(&self) -> Result<pgwake::connect::DbConfig, Error> {
        pgwake::connect::resolve(self.database_url.as_deref())
    }
}
