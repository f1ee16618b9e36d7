//! Subcommands whose stages are not built yet. They exit non-zero and say what is missing: never a
//! fake success.

use std::process::ExitCode;

use clap::Args;

use super::Global;

/// Arguments of `serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Everything `serve` will take (`--repo`, `--pack`, `--port`, ...).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub rest: Vec<String>,
}

/// `serve`: the runtime is not built into this version.
pub fn serve(_g: &Global, _a: ServeArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!(
        "`onebit-pipe serve` is not available in this build: the runtime (re-pack stage, host forward \
         pass) and the HTTP server are not built yet"
    )
}
