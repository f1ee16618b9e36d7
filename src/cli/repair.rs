//! `onebit-pipe repair --out DIR`: imports a repository with the repair stage and writes a fixed
//! NPU2 repository folder, identical to the original except the repaired tensors' bytes, for
//! dropping into a FastFlowLM model folder.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use super::source::{ImportOptions, ImportSource};
use super::{Global, Refused};

/// Arguments of `repair`.
#[derive(Args, Debug)]
pub struct RepairArgs {
    /// The repository to repair; --reference is the source of every broken tensor that is not
    /// a tied head.
    #[command(flatten)]
    pub source: ImportSource,
    /// The fixed repository folder to write (must not exist, or be empty).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

/// Runs the import with `--repair` and writes the fixed folder when the repaired pack verifies.
pub fn exec(g: &Global, a: RepairArgs) -> anyhow::Result<ExitCode> {
    if a.out.exists() && std::fs::read_dir(&a.out)?.next().is_some() {
        anyhow::bail!(Refused(format!(
            "{}: exists and is not empty; choose a new --out",
            a.out.display()
        )));
    }
    let opts = ImportOptions {
        repair: true,
        ..ImportOptions::default()
    };
    let (report, name, dir) = super::run::import(g, &a.source, &opts)?;
    let dir = dir.context("the import read no repository folder")?;
    let artifact = |output: &str| {
        report
            .artifact("repair", output)
            .cloned()
            .with_context(|| format!("{name}: the repair stage wrote no {output}"))
    };
    let verdict: onebit_stages::verify::PackVerdict = serde_json::from_slice(&std::fs::read(
        artifact("verification")?.join("verdict.json"),
    )?)?;
    if verdict.repaired.is_empty() {
        eprintln!(
            "{name}: nothing to repair ({}); nothing written",
            verdict.summary
        );
        return Ok(ExitCode::SUCCESS);
    }
    if !verdict.failing.is_empty() {
        eprintln!("{name}: {}", verdict.summary);
        for f in &verdict.failing {
            eprintln!("  FAIL {f}");
        }
        anyhow::bail!(Refused(format!(
            "{name}: the repaired pack does not verify; nothing written"
        )));
    }
    write_fixed(&dir, &artifact("model.q4nx")?, &a.out)?;
    eprintln!("{name}: {}", verdict.summary);
    for r in &verdict.repaired {
        eprintln!("  REPAIRED {r}");
    }
    println!("{}", a.out.display());
    Ok(ExitCode::SUCCESS)
}

/// Copies every file of `src` into `out` (symlinks followed: a fetched snapshot links into the
/// blob store), `model.q4nx` from `model`, through a staging folder renamed into place.
fn write_fixed(src: &Path, model: &Path, out: &Path) -> anyhow::Result<()> {
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).with_context(|| format!("create {}", parent.display()))?;
    let staging = tempfile::Builder::new()
        .prefix(".repair-")
        .tempdir_in(&parent)
        .with_context(|| format!("staging folder in {}", parent.display()))?;
    copy_tree(src, staging.path(), Some(model))?;
    let staged = staging.keep();
    if out.exists() {
        std::fs::remove_dir(out).with_context(|| format!("remove empty {}", out.display()))?;
    }
    std::fs::rename(&staged, out).with_context(|| format!("rename into {}", out.display()))?;
    Ok(())
}

/// Copies `src` into `dst`; `model` replaces `src/model.q4nx` (top level only).
fn copy_tree(src: &Path, dst: &Path, model: Option<&Path>) -> anyhow::Result<()> {
    for e in std::fs::read_dir(src).with_context(|| format!("read {}", src.display()))? {
        let e = e?;
        let from = e.path();
        let to = dst.join(e.file_name());
        if from.is_dir() {
            std::fs::create_dir_all(&to)?;
            copy_tree(&from, &to, None)?;
        } else if let Some(m) = model.filter(|_| e.file_name() == "model.q4nx") {
            std::fs::copy(m, &to).with_context(|| format!("copy {}", m.display()))?;
        } else {
            std::fs::copy(&from, &to).with_context(|| format!("copy {}", from.display()))?;
        }
    }
    Ok(())
}
