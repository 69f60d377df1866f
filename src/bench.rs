//! `pgwake bench` (being built).

use crate::error::{Error, Result};

/// `pgwake bench` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Benchmark this database instead of a throwaway cluster.
    #[arg(long)]
    pub database_url: Option<String>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Run the benchmark.
pub async fn run(_args: BenchArgs) -> Result<()> {
    Err(Error::Config("bench is not built yet".into()))
}
