//! `onebit-pipe run`: build the graph for a source and run it against the store.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use onebit_pipeline::{RunOptions, run_graph};
use serde_json::{Value, json};

use super::Global;
use super::source::{ImportOptions, ImportSource};

/// Arguments of `run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The repository to import.
    #[command(flatten)]
    pub source: ImportSource,
    /// Parallel downloads.
    #[arg(long, default_value_t = 4)]
    pub downloads: usize,
    /// Rebuild the tensors verification finds broken by a known converter defect (a tied head
    /// from the pack's own embedding, any tensor from the --reference GGUF), in the tile kind the
    /// pack used for them, and pack the repaired bytes.
    #[arg(long)]
    pub repair: bool,
    /// Stages to run at once [default: number of CPUs].
    #[arg(long, short)]
    pub jobs: Option<usize>,
    /// Re-hash every cached file instead of comparing sizes and mtimes.
    #[arg(long)]
    pub deep: bool,
    /// Also write the pack's verification report (HTML) and print its path.
    #[arg(long)]
    pub report: bool,
    /// The engine's own demo graph (hidden from help: it exercises the engine, not an import).
    #[command(flatten)]
    pub demo: DemoArgs,
}

/// `run --demo`: the engine's ten-stage demo graph instead of an import.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Run the engine's ten-stage demo graph instead of an import.
    #[arg(
        id = "demo",
        long = "demo",
        hide = true,
        conflicts_with_all = ["repo", "path", "reference", "repair", "report"]
    )]
    pub on: bool,
    /// Demo: bytes written by the whole graph.
    #[arg(long, default_value_t = 64 << 20, requires = "demo", hide = true)]
    pub demo_bytes: u64,
    /// Demo: the version of every stage (bump it to see every stage re-run).
    #[arg(long, default_value_t = 1, requires = "demo", hide = true)]
    pub demo_version: u32,
    /// Demo: sleep this long halfway through each stage's write.
    #[arg(long, default_value_t = 0, requires = "demo", hide = true)]
    pub demo_delay_ms: u64,
}

impl RunArgs {
    /// How the import runs.
    pub fn options(&self) -> ImportOptions {
        ImportOptions {
            downloads: self.downloads,
            jobs: self.jobs,
            deep: self.deep,
            repair: self.repair,
        }
    }
}

/// A `--reference`: a local GGUF path, or `ORG/NAME[@REV]:FILE` from the Hugging Face cache,
/// fetched from the hub into it when missing.
fn resolve_reference(
    g: &Global,
    r: &std::path::Path,
    endpoint: Option<&str>,
) -> anyhow::Result<PathBuf> {
    if r.exists() {
        return r
            .canonicalize()
            .with_context(|| format!("GGUF reference {}", r.display()));
    }
    let text = r.to_string_lossy();
    let Some(rf) = onebit_stages::hub::hf_cache::RepoFile::parse(&text) else {
        anyhow::bail!(
            "GGUF reference {text}: no such file, and not of the form ORG/NAME[@REV]:FILE"
        );
    };
    super::fetch::fetch_file(g, &rf, endpoint).with_context(|| format!("GGUF reference {text}"))
}

/// The `run` arguments that rebuild a ref, from its recorded source.
pub fn describe_source(source: &Value) -> String {
    source
        .get("args")
        .and_then(Value::as_str)
        .unwrap_or("(unknown source)")
        .to_string()
}

/// Builds the graph, runs it, prints the outcome.
pub fn exec(g: &Global, a: RunArgs) -> anyhow::Result<ExitCode> {
    let (report, ref_name, _) = if a.demo.on {
        run_demo(g, &a)?
    } else {
        import(g, &a.source, &a.options())?
    };
    let code = report_verdict(g, &report, &ref_name)?;
    if a.report {
        let path =
            super::report::write(g, &ref_name, super::report::ReportFormat::Html, None, &[])?;
        if g.json {
            println!(
                "{}",
                json!({"event": "report", "pack": ref_name, "path": path})
            );
        } else {
            eprintln!("report: {}", path.display());
        }
    }
    Ok(code)
}

/// What a run returns: the run report, the pack's ref name, and the repository folder imported
/// (none for the demo).
pub type Imported = (onebit_pipeline::RunReport, String, Option<PathBuf>);

/// Builds and runs the import graph for `source` with `opts`.
pub fn import(g: &Global, source: &ImportSource, opts: &ImportOptions) -> anyhow::Result<Imported> {
    let reference = || -> anyhow::Result<Option<PathBuf>> {
        match &source.reference {
            Some(r) => Ok(Some(resolve_reference(g, r, source.endpoint.as_deref())?)),
            None => Ok(None),
        }
    };
    let mmproj = match &source.mmproj {
        Some(r) => Some(resolve_reference(g, r, source.endpoint.as_deref())?),
        None => None,
    };
    // A repository's pack is named by the repository, wherever its files came from (a mirror
    // directory gives a plain folder); a folder's by the folder.
    let (mut import, ref_name, mut args) = if let Some(path) = &source.path {
        let dir = path
            .canonicalize()
            .with_context(|| format!("repository folder {}", path.display()))?;
        let import = onebit_stages::ImportSource {
            dir: dir.clone(),
            reference: reference()?,
            mmproj: None,
            fetch: None,
            repair: opts.repair,
        };
        let name = import.ref_name();
        (import, name, format!("--path {}", dir.display()))
    } else if let Some(repo) = &source.repo {
        let mut import = super::fetch::prepare(
            g,
            repo,
            &source.revision,
            source.endpoint.as_deref(),
            opts.downloads,
            reference()?,
        )?;
        import.repair = opts.repair;
        let mut args = format!("--repo {repo} --revision {}", source.revision);
        if let Some(e) = &source.endpoint {
            args.push_str(&format!(" --endpoint {e}"));
        }
        (import, repo.clone(), args)
    } else {
        anyhow::bail!("nothing to run: give --repo ORG/NAME, --path DIR or --demo");
    };
    import.mmproj = mmproj;
    if let Some(r) = &import.reference {
        args.push_str(&format!(" --reference {}", r.display()));
    }
    if let Some(r) = &import.mmproj {
        args.push_str(&format!(" --mmproj {}", r.display()));
    }
    if opts.repair {
        args.push_str(" --repair");
    }
    let graph = onebit_stages::import_graph(&import, Arc::new(onebit_runtime::HostKernels))?;
    let dir = import.dir.clone();
    let report = execute(g, &graph, ref_name.clone(), args, Some(&dir), opts)?;
    Ok((report, ref_name, Some(dir)))
}

/// Runs the engine's demo graph (`run --demo`).
fn run_demo(g: &Global, a: &RunArgs) -> anyhow::Result<Imported> {
    let d = &a.demo;
    let graph = onebit_pipeline::demo::demo_graph(
        d.demo_bytes,
        d.demo_version,
        Duration::from_millis(d.demo_delay_ms),
    )?;
    let args = format!(
        "--demo --demo-bytes {} --demo-version {}",
        d.demo_bytes, d.demo_version
    );
    let report = execute(g, &graph, "demo".into(), args, None, &a.options())?;
    Ok((report, "demo".into(), None))
}

/// Runs `graph` on the store under `ref_name`, recording `args` as the source that rebuilds it.
fn execute(
    g: &Global,
    graph: &onebit_pipeline::Graph,
    ref_name: String,
    args: String,
    dir: Option<&PathBuf>,
    opts: &ImportOptions,
) -> anyhow::Result<onebit_pipeline::RunReport> {
    let store = g.store()?;
    let reporter = super::progress::reporter(g);
    let jobs = opts
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let run = RunOptions {
        jobs,
        ref_name: Some(ref_name),
        source: json!({ "args": args, "dir": dir.map(|d| d.display().to_string()) }),
        deep_check: opts.deep,
    };
    // A stage that refused its input says so through the error chain: exit code 1.
    let report = run_graph(&store, graph, &run, reporter.as_ref())?;
    for (stage, outs) in &report.artifacts {
        for (name, path) in outs {
            tracing::info!(stage, output = name, path = %path.display(), "artifact");
        }
    }
    Ok(report)
}

/// Failing tensors listed by default after a refused verdict (`-v` lists every one).
const FAILS_SHOWN: usize = 10;

/// Prints the verification verdict of a run; exit 1 when a tensor failed.
fn report_verdict(
    g: &Global,
    report: &onebit_pipeline::RunReport,
    ref_name: &str,
) -> anyhow::Result<ExitCode> {
    // A repaired import's verdict is the repair stage's (the repaired bytes verified again).
    let Some(dir) = report
        .artifact("repair", "verification")
        .or_else(|| report.artifact("verify", "verification"))
    else {
        return Ok(ExitCode::SUCCESS);
    };
    let verdict: onebit_stages::verify::PackVerdict =
        serde_json::from_slice(&std::fs::read(dir.join("verdict.json"))?)?;
    if !g.json {
        eprintln!("{ref_name}: {}", verdict.summary);
        // The summary names the failing tensors; the first few are listed with their reasons,
        // every one with -v (and in the verification table: `onebit-pipe sql`).
        let shown = if g.verbose > 0 {
            verdict.failing.len()
        } else {
            FAILS_SHOWN
        };
        for f in verdict.failing.iter().take(shown) {
            eprintln!("  FAIL {f}");
        }
        if verdict.failing.len() > shown {
            eprintln!(
                "  … and {} more failing tensors (-v lists every one; `onebit-pipe sql \"SELECT * FROM verification\"` has them all)",
                verdict.failing.len() - shown
            );
        }
        for r in &verdict.repaired {
            eprintln!("  REPAIRED {r}");
        }
    } else {
        println!(
            "{}",
            serde_json::json!({"event": "verdict", "verdict": verdict})
        );
    }
    if !verdict.failing.is_empty() {
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
