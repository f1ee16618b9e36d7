//! `onebit-pipe run`: build the graph for a source and run it against the store.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use onebit_pipeline::{RunOptions, run_graph};
use serde_json::{Value, json};

use super::Global;

/// Arguments of `run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// A Hugging Face repository, e.g. FastFlowLM/Gemma3-270M-NPU2.
    #[arg(long, value_name = "ORG/NAME", conflicts_with_all = ["path", "demo"])]
    pub repo: Option<String>,
    /// Branch, tag or commit of --repo.
    #[arg(long, default_value = "main", requires = "repo")]
    pub revision: String,
    /// The hub to fetch --repo from: a URL [default: $HF_ENDPOINT, else https://huggingface.co],
    /// or a directory laid out as ORG/NAME/<files> (an offline mirror).
    #[arg(long, value_name = "URL|DIR", requires = "repo")]
    pub endpoint: Option<String>,
    /// Parallel downloads.
    #[arg(long, default_value_t = 4)]
    pub downloads: usize,
    /// A local repository folder (config.json, model.q4nx, tokenizer files).
    #[arg(long, value_name = "DIR", conflicts_with = "demo")]
    pub path: Option<PathBuf>,
    /// A GGUF of the same model (any quantization), the independent reference for verification: a
    /// path, or ORG/NAME[@REV]:FILE from the local Hugging Face cache.
    #[arg(long, value_name = "GGUF|ORG/NAME:FILE", conflicts_with = "demo")]
    pub reference: Option<PathBuf>,
    /// Rebuild the tensors verification finds broken by a known converter defect (a tied head
    /// from the pack's own embedding, any tensor from the --reference GGUF), in the tile kind the
    /// pack used for them, and pack the repaired bytes.
    #[arg(long, conflicts_with = "demo")]
    pub repair: bool,
    /// Run the engine's ten-stage demo graph instead of an import.
    #[arg(long)]
    pub demo: bool,
    /// Demo: bytes written by the whole graph.
    #[arg(long, default_value_t = 64 << 20, requires = "demo")]
    pub demo_bytes: u64,
    /// Demo: the version of every stage (bump it to see every stage re-run).
    #[arg(long, default_value_t = 1, requires = "demo")]
    pub demo_version: u32,
    /// Demo: sleep this long halfway through each stage's write.
    #[arg(long, default_value_t = 0, requires = "demo")]
    pub demo_delay_ms: u64,
    /// Stages to run at once [default: number of CPUs].
    #[arg(long, short)]
    pub jobs: Option<usize>,
    /// Re-hash every cached file instead of comparing sizes and mtimes.
    #[arg(long)]
    pub deep: bool,
    /// Also write the pack's verification report (HTML) and print its path.
    #[arg(long, conflicts_with = "demo")]
    pub report: bool,
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
    let (report, ref_name, _) = import(g, &a)?;
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

/// Builds and runs the graph for `a`'s source; returns the run report, the pack's ref name and
/// the repository folder imported (none for the demo).
pub fn import(
    g: &Global,
    a: &RunArgs,
) -> anyhow::Result<(onebit_pipeline::RunReport, String, Option<PathBuf>)> {
    let store = g.store()?;
    let reporter = super::progress::reporter(g);
    let jobs = a
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let mut dir_for_ref: Option<PathBuf> = None;
    let (graph, ref_name, args) = if a.demo {
        let graph = onebit_pipeline::demo::demo_graph(
            a.demo_bytes,
            a.demo_version,
            Duration::from_millis(a.demo_delay_ms),
        )?;
        let args = format!(
            "--demo --demo-bytes {} --demo-version {}",
            a.demo_bytes, a.demo_version
        );
        (graph, "demo".to_string(), args)
    } else if let Some(path) = &a.path {
        let dir = path
            .canonicalize()
            .with_context(|| format!("repository folder {}", path.display()))?;
        let reference = match &a.reference {
            Some(r) => Some(resolve_reference(g, r, a.endpoint.as_deref())?),
            None => None,
        };
        let import = onebit_stages::ImportSource {
            dir: dir.clone(),
            reference: reference.clone(),
            fetch: None,
            repair: a.repair,
        };
        let graph = onebit_stages::import_graph(&import)
            .map_err(|e| anyhow::Error::new(super::Refused(e.to_string())))?;
        dir_for_ref = Some(import.dir.clone());
        let mut args = format!("--path {}", dir.display());
        if let Some(r) = &reference {
            args.push_str(&format!(" --reference {}", r.display()));
        }
        if a.repair {
            args.push_str(" --repair");
        }
        (graph, import.ref_name(), args)
    } else if let Some(repo) = &a.repo {
        let reference = match &a.reference {
            Some(r) => Some(resolve_reference(g, r, a.endpoint.as_deref())?),
            None => None,
        };
        let mut import = super::fetch::prepare(
            g,
            repo,
            &a.revision,
            a.endpoint.as_deref(),
            a.downloads,
            reference.clone(),
        )?;
        import.repair = a.repair;
        let graph = onebit_stages::import_graph(&import)
            .map_err(|e| anyhow::Error::new(super::Refused(e.to_string())))?;
        dir_for_ref = Some(import.dir.clone());
        let mut args = format!("--repo {repo} --revision {}", a.revision);
        if let Some(e) = &a.endpoint {
            args.push_str(&format!(" --endpoint {e}"));
        }
        if let Some(r) = &reference {
            args.push_str(&format!(" --reference {}", r.display()));
        }
        if a.repair {
            args.push_str(" --repair");
        }
        (graph, repo.clone(), args)
    } else {
        anyhow::bail!("nothing to run: give --repo ORG/NAME, --path DIR or --demo");
    };
    let opts = RunOptions {
        jobs,
        ref_name: Some(ref_name),
        source: json!({ "args": args, "dir": dir_for_ref.as_ref().map(|d| d.display().to_string()) }),
        deep_check: a.deep,
    };
    let report = run_graph(&store, &graph, &opts, reporter.as_ref()).map_err(|e| match e {
        // A stage that refused its input is the input's fault: exit code 1.
        onebit_pipeline::Error::StageFailed { ref source, .. }
            if source
                .downcast_ref::<onebit_stages::Error>()
                .is_some_and(|s| {
                    matches!(
                        s,
                        onebit_stages::Error::Refused { .. } | onebit_stages::Error::Corrupt { .. }
                    )
                }) =>
        {
            anyhow::Error::new(super::Refused(e.to_string()))
        }
        other => anyhow::Error::new(other),
    })?;
    for (stage, outs) in &report.artifacts {
        for (name, path) in outs {
            tracing::info!(stage, output = name, path = %path.display(), "artifact");
        }
    }
    Ok((report, opts.ref_name.unwrap_or_default(), dir_for_ref))
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
