//! `onebit-pipe report`: a pack's verification report, one self-contained HTML file (or its charts
//! as PNG files), from the catalog. The pack must be in the store (`onebit-pipe run` first).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, ValueEnum};
use onebit_catalog::Catalog;
use onebit_catalog::report::Options;

use super::Global;
use super::source::ImportSource;

/// What the report is written as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    /// One HTML file with every section, SVG charts inline; opens offline.
    Html,
    /// The charts as PNG files in a folder, for a terminal.
    Png,
}

/// Arguments of `report`.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["repo", "path", "pack"])))]
pub struct ReportArgs {
    /// The pack imported from this repository (--repo) or local folder (--path).
    #[command(flatten)]
    pub source: ImportSource,
    /// The pack by its name in the store (`SELECT name FROM packs`).
    #[arg(long, value_name = "NAME", conflicts_with_all = ["repo", "path"])]
    pub pack: Option<String>,
    /// Where to write: a file for html, a folder for png [default: $ONEBIT_HOME/reports/…].
    #[arg(long, value_name = "PATH")]
    pub out: Option<PathBuf>,
    /// html (one file) or png (the charts as files).
    #[arg(long, default_value = "html")]
    pub format: ReportFormat,
    /// Also draw the histogram of this tensor's decoded values (repeatable).
    #[arg(long = "tensor", value_name = "NAME")]
    pub tensors: Vec<String>,
}

/// The store name of the pack imported from the local folder `dir` (as `run --path` names it).
pub fn local_pack_name(dir: &Path) -> anyhow::Result<String> {
    let dir = dir
        .canonicalize()
        .map_err(|e| anyhow::anyhow!("repository folder {}: {e}", dir.display()))?;
    Ok(onebit_stages::ImportSource {
        dir,
        reference: None,
        mmproj: None,
        fetch: None,
        repair: false,
    }
    .ref_name())
}

/// A file-system-safe name for a pack's report.
fn file_stem(pack: &str) -> String {
    pack.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Builds the report of `pack` and writes it (atomically) to `out` or the default place under the
/// home; returns where.
pub fn write(
    g: &Global,
    pack: &str,
    format: ReportFormat,
    out: Option<&Path>,
    tensors: &[String],
) -> anyhow::Result<PathBuf> {
    let store = g.store()?;
    let catalog = Catalog::open(&store, &super::versions::current_versions())?;
    let mut opts = Options::new(pack);
    opts.histograms = tensors.to_vec();
    let reports = g
        .home
        .clone()
        .unwrap_or_else(onebit_pipeline::Store::default_home)
        .join("reports");
    match format {
        ReportFormat::Html => {
            let page = onebit_catalog::report::html(&catalog, &opts)?;
            let path = out
                .map(Path::to_path_buf)
                .unwrap_or_else(|| reports.join(format!("{}.html", file_stem(pack))));
            onebit_pipeline::store::write_atomic(&path, page.as_bytes())?;
            Ok(path)
        }
        ReportFormat::Png => {
            let files = onebit_catalog::report::png(&catalog, &opts)?;
            let dir = out
                .map(Path::to_path_buf)
                .unwrap_or_else(|| reports.join(file_stem(pack)));
            for (name, bytes) in &files {
                onebit_pipeline::store::write_atomic(&dir.join(name), bytes)?;
            }
            Ok(dir)
        }
    }
}

/// Writes the report and prints its path.
pub fn exec(g: &Global, a: ReportArgs) -> anyhow::Result<ExitCode> {
    let pack = match (&a.source.repo, &a.source.path, &a.pack) {
        (Some(r), _, _) => r.clone(),
        (_, Some(p), _) => local_pack_name(p)?,
        (_, _, Some(n)) => n.clone(),
        _ => anyhow::bail!("give --repo, --path or --pack"),
    };
    let t0 = Instant::now();
    let path = write(g, &pack, a.format, a.out.as_deref(), &a.tensors)?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    if g.json {
        println!(
            "{}",
            serde_json::json!({"event": "report", "pack": pack, "path": path, "ms": ms})
        );
    } else {
        println!("{}", path.display());
        if !g.quiet {
            eprintln!("report of {pack} written in {ms:.0} ms");
        }
    }
    Ok(ExitCode::SUCCESS)
}
