//! Command-line definitions and dispatch. Each subcommand lives in its own module.

pub mod convert;
pub mod fetch;
pub mod gc;
pub mod generate;
pub mod kernels;
pub mod models;
pub mod packs;
pub mod progress;
pub mod repair;
pub mod report;
pub mod run;
pub mod semantics;
pub mod serve;
pub mod source;
pub mod sql;
pub mod status;
pub mod versions;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// A refusal the command line itself decides (a flag combination, a missing device): exit code
/// 1. The libraries' errors say for themselves whether they are refusals ([`exit_code_of`]).
#[derive(Debug)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// The exit code for an error: 1 when some cause in its chain is a refusal of the input, as the
/// cause's own type says (`is_refusal`), else 2.
pub fn exit_code_of(e: &anyhow::Error) -> u8 {
    if e.chain().any(is_refusal) { 1 } else { 2 }
}

/// Whether one cause of an error chain is a refusal, by its type.
fn is_refusal(cause: &(dyn std::error::Error + 'static)) -> bool {
    use onebit_stages::hub::{client::HubError, fetch::FetchError};
    if cause.is::<Refused>() {
        return true;
    }
    if let Some(e) = cause.downcast_ref::<onebit_stages::Error>() {
        return e.is_refusal();
    }
    if let Some(e) = cause.downcast_ref::<onebit_runtime::Error>() {
        return e.is_refusal();
    }
    if let Some(e) = cause.downcast_ref::<onebit_catalog::Error>() {
        return e.is_refusal();
    }
    if let Some(e) = cause.downcast_ref::<onebit_pipeline::Error>() {
        return e.is_refusal();
    }
    if let Some(e) = cause.downcast_ref::<FetchError>() {
        return e.is_refusal();
    }
    cause
        .downcast_ref::<HubError>()
        .is_some_and(HubError::is_refusal)
}

/// The error's message and its causes, `: `-separated as `{:#}` writes them, leaving out a cause
/// whose text the message before it already holds (an error that prints its source).
pub fn render(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.is_empty() {
            out = text;
        } else if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
    }
    out
}

/// onebit-pipe: turn FastFlowLM NPU2 repositories into verified packs, query them, serve them.
#[derive(Parser, Debug)]
#[command(
    name = "onebit-pipe",
    version,
    after_help = "Exit codes: 0 done; 1 input refused or verification failed; 2 any other error."
)]
pub struct Cli {
    /// Options for every subcommand.
    #[command(flatten)]
    pub global: Global,
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// Options shared by every subcommand.
#[derive(Args, Debug, Clone)]
pub struct Global {
    /// Store and cache root [default: $ONEBIT_HOME, else ~/.cache/onebit-pipe].
    #[arg(long, global = true, value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// A shared store on S3-compatible object storage (`s3://bucket/prefix`), with the local store
    /// under --home as its cache; credentials as the AWS SDKs read them (docs/objstore.md).
    #[arg(long, global = true, env = "ONEBIT_STORE", value_name = "URL")]
    pub store: Option<String>,
    /// No progress output.
    #[arg(long, short, global = true)]
    pub quiet: bool,
    /// Progress as one JSON object per event on stdout (logs stay on stderr).
    #[arg(long, global = true)]
    pub json: bool,
    /// More logging (-v info, -vv debug); RUST_LOG overrides.
    #[arg(long, short, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Log lines as JSON objects, one per line, with every field (for log collectors).
    #[arg(long, global = true)]
    pub log_json: bool,
}

impl Global {
    /// The store: the shared one `--store` names, cached under `--home` (or the default home),
    /// else the local one there.
    pub fn store(&self) -> anyhow::Result<onebit_pipeline::Store> {
        let home = self
            .home
            .clone()
            .unwrap_or_else(onebit_pipeline::Store::default_home);
        Ok(onebit_pipeline::Store::open_url(
            &home,
            self.store.as_deref(),
        )?)
    }
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Import a repository into a pack: run every stage, reusing the cache.
    Run(run::RunArgs),
    /// Print what a repository's config.json means, with the source of every decision.
    Semantics(semantics::SemanticsArgs),
    /// Show each pack's stages: fresh, stale after an upgrade, missing or damaged.
    Status(status::StatusArgs),
    /// Remove store entries that no pack references; report bytes freed.
    Gc(gc::GcArgs),
    /// List the packs in the store: name, family, size, verdict, when imported.
    List(models::ListArgs),
    /// Drop a pack from the store (its ref; `gc` then frees the bytes nothing else uses).
    Rm(models::RmArgs),
    /// Show the models a running server has loaded.
    Ps(models::PsArgs),
    /// Query tensor statistics, verification results and run history with SQL.
    Sql(sql::SqlArgs),
    /// Write a pack's verification report: one self-contained HTML file, or its charts as PNG.
    Report(report::ReportArgs),
    /// Complete a prompt with a verified pack on the host CPU.
    Generate(generate::GenerateArgs),
    /// Chat with a verified pack on the host CPU.
    Chat(generate::ChatArgs),
    /// Perplexity and teacher-forced top-1 of a pack on a text (llama.cpp `perplexity` chunking).
    Eval(generate::EvalArgs),
    /// Convert a GGUF into a FastFlowLM NPU2 repository folder.
    Convert(convert::ConvertArgs),
    /// The kernel set of a pack: GEMM/GEMV shapes, host variant and self-check, NPU providers.
    Kernels(kernels::KernelsArgs),
    /// Serve verified packs over an OpenAI-compatible HTTP API.
    Serve(serve::ServeArgs),
    /// Rebuild what a converter broke and write a fixed NPU2 repository folder.
    Repair(repair::RepairArgs),
}

/// Runs the subcommand.
pub fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(a) => run::exec(&cli.global, a),
        Command::Semantics(a) => semantics::exec(&cli.global, a),
        Command::Status(a) => status::exec(&cli.global, a),
        Command::Gc(a) => gc::exec(&cli.global, a),
        Command::List(a) => models::list(&cli.global, a),
        Command::Rm(a) => models::rm(&cli.global, a),
        Command::Ps(a) => models::ps(&cli.global, a),
        Command::Sql(a) => sql::exec(&cli.global, a),
        Command::Report(a) => report::exec(&cli.global, a),
        Command::Generate(a) => generate::exec(&cli.global, a),
        Command::Chat(a) => generate::chat(&cli.global, a),
        Command::Eval(a) => generate::eval(&cli.global, a),
        Command::Convert(a) => convert::exec(&cli.global, a),
        Command::Kernels(a) => kernels::exec(&cli.global, a),
        Command::Serve(a) => serve::exec(&cli.global, a),
        Command::Repair(a) => repair::exec(&cli.global, a),
    }
}

/// Sends `tracing` to stderr at the level `-v` asks for, unless RUST_LOG says otherwise; a server
/// logs each request (`info` for its own targets) even without `-v`.
pub fn init_logging(g: &Global, server: bool) {
    let level = match (g.verbose, server) {
        (0, false) => "warn",
        (0, true) => "warn,onebit::serve=info,onebit_serve=info",
        (1, _) => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if g.log_json {
        fmt.json().try_init()
    } else {
        fmt.try_init()
    };
}
