//! `onebit-pipe semantics PATH`: print what a repository's config means, every decision with its
//! source.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::Global;

/// Arguments of `semantics`.
#[derive(Args, Debug)]
pub struct SemanticsArgs {
    /// A repository folder holding config.json (and tokenizer_config.json, tokenizer.json,
    /// generation_config.json when present).
    pub path: PathBuf,
}

/// Derives and prints the semantics; a refusal exits 1.
pub fn exec(g: &Global, a: SemanticsArgs) -> anyhow::Result<ExitCode> {
    let s = onebit_stages::stage::semantics::semantics_of_dir(&a.path)?;
    if g.json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        print!("{}", s.log());
    }
    Ok(ExitCode::SUCCESS)
}
