//! Subcommands whose stages are not built yet. They exit non-zero and say what is missing: never a
//! fake success.

use std::process::ExitCode;

use clap::Args;

use super::Global;

/// Arguments of `sql`.
#[derive(Args, Debug)]
pub struct SqlArgs {
    /// The query; without one, an interactive prompt.
    pub query: Option<String>,
}

/// Arguments of `serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Everything `serve` will take (`--repo`, `--pack`, `--port`, ...).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub rest: Vec<String>,
}

/// `sql`: the query engine is not built into this version.
pub fn sql(_g: &Global, _a: SqlArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!(
        "`onebit-pipe sql` is not available in this build: the DataFusion catalog is not built yet. \
         The tables it will query are already written: run records as Parquet under <home>/store-v1/runs/, \
         stage tables as Parquet inside each store entry"
    )
}

/// `serve`: the runtime is not built into this version.
pub fn serve(_g: &Global, _a: ServeArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!(
        "`onebit-pipe serve` is not available in this build: the runtime (re-pack stage, host forward \
         pass) and the HTTP server are not built yet"
    )
}
