//! `onebit-pipe serve`: binds first (so `/health` answers 503 while loading), imports and loads
//! the pack on a background thread, then serves the OpenAI-compatible API until Ctrl-C.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use onebit_runtime::device::{DeviceChoice, find_npus};
use onebit_serve::{DEFAULT_CTX, Engine, Limits, Options, Server};

use super::Global;
use super::generate::PackSource;

/// Arguments of `serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// The pack.
    #[command(flatten)]
    pub source: PackSource,
    /// Address to bind (loopback unless you say otherwise).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port (0 picks a free one; the address is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Where to run: auto (NPU when usable, else the host, saying so), host, npu.
    #[arg(long, default_value = "auto")]
    pub device: DeviceChoice,
    /// The model id clients use [default: --repo, else the pack's source]. Serving the store's
    /// packs (no pack named): ALIAS=MODEL, repeatable, a further name for MODEL.
    #[arg(long, value_name = "ALIAS|ALIAS=MODEL")]
    pub alias: Vec<String>,
    /// Serving the store's packs: most models loaded at once; loading another unloads the least
    /// recently used idle one.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub models_max: usize,
    /// Serving the store's packs: MiB of pack files loaded models may map together; loading one
    /// that does not fit unloads idle ones first, and gets 503 when busy ones leave no room
    /// [default: 90 % of the memory available at start].
    #[arg(long, value_name = "MIB")]
    pub models_memory: Option<u64>,
    /// Serving the store's packs: how long a model stays loaded after its last request
    /// (`30s`, `5m`, `1h`, seconds; `0` unloads at once, `-1` never).
    #[arg(long, default_value = "5m", value_parser = keep_alive)]
    pub keep_alive: KeepAlive,
    /// Require `Authorization: Bearer KEY`.
    #[arg(long, env = "ONEBIT_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Context per sequence in tokens [default: min(model context, 4096)].
    #[arg(long)]
    pub ctx_size: Option<usize>,
    /// Sequences generated at once (each with a KV cache of up to --ctx-size tokens, allocated
    /// in blocks as it fills).
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Requests waiting for a slot before new ones get 503.
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// Rows per forward batch (decode rows plus prompt chunks).
    #[arg(long, default_value_t = 256)]
    pub batch: usize,
    /// Recompute every prompt in full: no request starts from the cached prefix of an earlier
    /// one (for measuring; answers are the same either way).
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// MiB all KV caches together may hold; a request whose cache would need more gets 503
    /// [default: 90 % of the memory available when the model is ready].
    #[arg(long, value_name = "MIB")]
    pub cache_budget: Option<usize>,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 2 << 20)]
    pub max_body: usize,
    /// NPU kernel artifacts (`*.xclbin`) for `--device npu|auto`: one xclbin must provide every
    /// shape of the pack's kernel set.
    #[arg(long, value_name = "DIR", env = "ONEBIT_KERNEL_DIR")]
    pub kernel_dir: Option<PathBuf>,
    /// Ignore request fields this server does not read (named in a `Warning` header and the
    /// log) instead of answering 400.
    #[arg(long)]
    pub lenient: bool,
    /// A browser origin allowed to call the API (`http://localhost:3000`, or `*` for any);
    /// repeatable. None by default: pages of other origins cannot read the answers.
    #[arg(long = "cors-origin", value_name = "ORIGIN", value_parser = cors_origin)]
    pub cors_origins: Vec<String>,
    /// Where a thinking model's reasoning goes: `deepseek` returns the text between `<think>`
    /// and `</think>` as `reasoning_content`, `none` keeps it inline in `content`.
    #[arg(long, value_enum, default_value_t = Reasoning::Deepseek)]
    pub reasoning_format: Reasoning,
    /// How `/v1/embeddings` pools a text's final hidden states into one vector: `mean` over
    /// its tokens, the `last` token's, or the first (`cls`); always L2-normalized.
    #[arg(long, default_value_t = onebit_runtime::embed::Pooling::Mean)]
    pub pooling: onebit_runtime::embed::Pooling,
    /// Serve no chat page at `/` (the API routes are the same either way).
    #[arg(long)]
    pub no_webui: bool,
    /// Worker threads for the model [default: all cores].
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
}

/// `--reasoning-format`'s values (llama-server's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Reasoning {
    /// Reasoning apart, as `reasoning_content`.
    Deepseek,
    /// Reasoning inline in `content`.
    None,
}

/// `--keep-alive`'s value: `None` keeps a model until another needs the room.
#[derive(Clone, Copy, Debug)]
pub struct KeepAlive(pub Option<std::time::Duration>);

fn keep_alive(s: &str) -> Result<KeepAlive, String> {
    onebit_serve::models::parse_keep_alive(&serde_json::Value::String(s.into())).map(KeepAlive)
}

fn cors_origin(s: &str) -> Result<String, String> {
    onebit_serve::check_origin(s).map(|()| s.to_string())
}

/// Runs the server until Ctrl-C; exit 1 when the pack is refused, 2 on other failures. The
/// steps: choose the device, bind, start the loader thread (with a pack named) or list the
/// store's packs (without), serve until Ctrl-C or a failed load.
pub fn exec(g: &Global, a: ServeArgs) -> anyhow::Result<ExitCode> {
    let npu = device(a.device)?;
    if a.parallel == 0 || a.batch == 0 {
        return Err(anyhow::Error::new(super::Refused(
            "--parallel and --batch must be at least 1".into(),
        )));
    }
    if let Some(t) = a.threads {
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build_global();
    }
    let one = a.source.names_one();
    if one && (a.alias.len() > 1 || a.alias.iter().any(|x| x.contains('='))) {
        return Err(anyhow::Error::new(super::Refused(
            "--alias ALIAS=MODEL names a model of the store's packs; serving one pack, give one --alias".into(),
        )));
    }
    let store_server = if one {
        None
    } else {
        Some(store_server(g, &a, npu)?)
    };
    let addr = SocketAddr::new(a.host, a.port);
    let std_listener =
        std::net::TcpListener::bind(addr).with_context(|| format!("cannot bind {addr}"))?;
    std_listener.set_nonblocking(true)?;
    let bound = std_listener.local_addr()?;
    if !a.host.is_loopback() && a.api_key.is_none() {
        eprintln!(
            "warning: serving on {bound} without --api-key: anyone who can reach this address can use the model"
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (fail_tx, fail_rx) = tokio::sync::oneshot::channel::<anyhow::Error>();
    let (server, loader) = match store_server {
        Some(server) => {
            eprintln!(
                "listening on http://{bound} (OpenAI API under /v1, Ollama's under /api; each of \
                 the store's packs loads on its first request)"
            );
            drop(fail_tx);
            (server, None)
        }
        None => {
            let server = Server::new(options(g, &a));
            eprintln!(
                "listening on http://{bound} (OpenAI API under /v1, Ollama's under /api; /health \
                 says when the model is ready)"
            );
            let (s, g, a) = (server.clone(), g.clone(), a.clone());
            let loader = std::thread::spawn(move || load(&g, &a, npu, &s, fail_tx));
            (server, Some(loader))
        }
    };
    let result: anyhow::Result<()> = rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(std_listener)?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(onebit_serve::serve(listener, server, async move {
            let _ = stop_rx.await;
        }));
        let outcome = tokio::select! {
            _ = tokio::signal::ctrl_c() => Ok(()),
            e = fail_rx => match e {
                Ok(e) => Err(e),
                // The loader finished without failing (or there is none): wait for Ctrl-C.
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                    Ok(())
                }
            },
        };
        let _ = stop_tx.send(());
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), serving).await;
        outcome
    });
    drop(loader);
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    result.map(|()| ExitCode::SUCCESS)
}

/// A server of every pack in the store, each loaded on its first request (no pack named).
fn store_server(
    g: &Global,
    a: &ServeArgs,
    npu: Option<bool>,
) -> anyhow::Result<std::sync::Arc<Server>> {
    let store = g.store()?;
    let packs = super::packs::store_packs(&store)?;
    if packs.is_empty() {
        return Err(anyhow::Error::new(super::Refused(format!(
            "no packs in the store at {}: import one with `onebit-pipe run --repo ORG/NAME`, or name one with --repo, --path or --pack",
            store.root().display()
        ))));
    }
    let mut listings: Vec<onebit_serve::models::Listing> =
        packs.iter().map(|p| p.listing()).collect();
    for alias in &a.alias {
        let Some((name, model)) = alias.split_once('=') else {
            return Err(anyhow::Error::new(super::Refused(format!(
                "--alias {alias}: serving the store's packs, write ALIAS=MODEL"
            ))));
        };
        let Some(l) = listings.iter_mut().find(|l| l.id == model) else {
            return Err(anyhow::Error::new(super::Refused(format!(
                "--alias {alias}: no pack '{model}' in the store (it has {})",
                packs
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))));
        };
        l.aliases.push(name.to_string());
    }
    let available = onebit_kernels::kv::available_memory().unwrap_or(usize::MAX) as u64;
    let policy = onebit_serve::models::Policy {
        models_max: a.models_max.max(1),
        memory: a
            .models_memory
            .map_or(available / 10 * 9, |m| m.saturating_mul(1 << 20)),
        keep_alive: a.keep_alive.0,
        allow_unverified: a.source.allow_unverified,
    };
    for l in &listings {
        tracing::info!(model = %l.id, verified = l.verified, mib = l.bytes >> 20, "listed");
    }
    let opts = a.source.load_options();
    let (kernel_dir, batch) = (a.kernel_dir.clone(), a.batch);
    let loader: onebit_serve::models::Loader = std::sync::Arc::new(move |l| {
        let p = packs
            .iter()
            .find(|p| p.name == l.id)
            .ok_or_else(|| format!("{} is not in the store", l.id))?;
        let dir = super::packs::local_dir(&store, p).map_err(|e| format!("{e:#}"))?;
        let (mut model, text) =
            super::generate::load_pack(&dir, &opts).map_err(|e| format!("{e:#}"))?;
        if let Some(required) = npu {
            match attach_npu(&mut model, kernel_dir.as_deref(), batch) {
                Ok(_) => {}
                Err(e) if required => return Err(format!("{e:#}")),
                Err(e) => {
                    tracing::warn!(model = %l.id, error = %e, "the NPU is not usable; on the host CPU")
                }
            }
        }
        Ok(Engine::new(model, text))
    });
    let mut o = options(g, a);
    o.alias = None;
    o.report = None;
    Ok(Server::with_models(o, listings, loader, policy))
}

/// Whether the model's products go to the NPU (`--device`); `Some(true)` when that is required,
/// `Some(false)` when it is tried with the host as the fallback.
fn device(choice: DeviceChoice) -> anyhow::Result<Option<bool>> {
    Ok(match choice {
        DeviceChoice::Host => None,
        DeviceChoice::Npu => {
            let npus = find_npus().map_err(|why| {
                anyhow::Error::new(super::Refused(format!("no XDNA NPU found: {why}")))
            })?;
            if !cfg!(feature = "npu") {
                return Err(anyhow::Error::new(super::Refused(format!(
                    "an XDNA NPU was found ({}), but this build has no NPU backend (build with --features npu); use --device host",
                    npus[0].node.display()
                ))));
            }
            Some(true)
        }
        DeviceChoice::Auto => match find_npus() {
            Err(why) => {
                eprintln!("no XDNA NPU found ({why}); serving on the host CPU");
                None
            }
            Ok(n) if !cfg!(feature = "npu") => {
                eprintln!(
                    "an XDNA NPU was found ({}), but this build has no NPU backend; serving on the host CPU",
                    n[0].node.display()
                );
                None
            }
            Ok(_) => Some(false),
        },
    })
}

/// The server's options from the command line (`ctx` 0: decided from the model once loaded).
fn options(g: &Global, a: &ServeArgs) -> Options {
    let limits = Limits {
        slots: a.parallel,
        queue: a.queue,
        batch: a.batch,
        ctx: a.ctx_size.unwrap_or(0),
        prefix_cache: !a.no_prefix_cache,
        cache_budget: a.cache_budget.map(|m| m.saturating_mul(1 << 20)),
    };
    Options {
        // The id clients send: --alias, else the repository asked for, else the pack's source.
        alias: a
            .alias
            .first()
            .cloned()
            .or_else(|| a.source.import.repo.clone()),
        api_key: a.api_key.clone(),
        max_body: a.max_body,
        limits,
        report: report_source(g, &a.source),
        lenient: a.lenient,
        cors_origins: a.cors_origins.clone(),
        reasoning: match a.reasoning_format {
            Reasoning::Deepseek => onebit_serve::ReasoningFormat::Deepseek,
            Reasoning::None => onebit_serve::ReasoningFormat::None,
        },
        pooling: a.pooling,
        webui: !a.no_webui,
    }
}

/// The loader thread: loads the pack (onto the NPU when `npu` says so), makes the server ready
/// and prints the ready line; a failure goes to `server` (for `/health`) and to `fail`.
fn load(
    g: &Global,
    a: &ServeArgs,
    npu: Option<bool>,
    server: &Server,
    fail: tokio::sync::oneshot::Sender<anyhow::Error>,
) {
    let loaded = a.source.load(g).and_then(|(mut model, text)| {
        let mut on = "the host CPU".to_string();
        if let Some(required) = npu {
            match attach_npu(&mut model, a.kernel_dir.as_deref(), a.batch) {
                Ok(what) => on = what,
                Err(e) if required => return Err(e),
                Err(e) => {
                    eprintln!("the NPU is not usable ({e:#}); serving on the host CPU")
                }
            }
        }
        Ok((model, text, on))
    });
    let (model, text, on) = match loaded {
        Ok(l) => l,
        Err(e) => {
            server.failed(format!("{e:#}"));
            let _ = fail.send(e);
            return;
        }
    };
    let source = model.pack.manifest.provenance.source.clone();
    let context = model.spec.context;
    let (ty, memory) = (model.cache_type(), model.cache_memory().clone());
    // Bytes per sequence grow linearly with its context (KV rows; fixed state).
    let (fixed, per_token) = (
        model.session_bytes(0),
        model.session_bytes(1) - model.session_bytes(0),
    );
    match server.ready(Engine::new(model, text)) {
        Ok(l) => eprintln!(
            "ready: {source} on {on}; {} sequences × {} tokens of context ({}; \
             the model's context is {context}); KV cache {ty}: {} MiB now, {} MiB \
             at most so far, {} MiB with every sequence full{}",
            l.slots,
            l.ctx,
            if a.ctx_size.is_some() {
                "--ctx-size".to_string()
            } else {
                format!("default: the model's context, at most {DEFAULT_CTX}")
            },
            memory.used() >> 20,
            memory.peak() >> 20,
            l.slots
                .saturating_mul(fixed + per_token.saturating_mul(l.ctx))
                >> 20,
            if memory.limit() == usize::MAX {
                String::new()
            } else {
                format!(" (budget {} MiB)", memory.limit() >> 20)
            },
        ),
        Err(why) => {
            let _ = fail.send(anyhow::Error::new(super::Refused(format!(
                "cannot serve {source}: {why}"
            ))));
        }
    }
}

/// Puts the model's tiled products on the NPU: the kernel set of the pack (shapes at `batch`,
/// from its manifest: the model is already loaded and self-checked) must be provided by one
/// xclbin of `kernel_dir`, loaded once for the model. Returns where the model now runs, for the
/// ready line.
#[cfg(feature = "npu")]
fn attach_npu(
    model: &mut onebit_runtime::Model,
    kernel_dir: Option<&std::path::Path>,
    batch: usize,
) -> anyhow::Result<String> {
    use onebit_runtime::npu::backend::NpuBackend;
    use onebit_stages::format::axlf;
    use onebit_stages::kernel_set::{match_artifacts, missing_refusal, shapes};
    use onebit_xrt::XrtRunner;
    let dir = kernel_dir.ok_or_else(|| {
        anyhow::Error::new(super::Refused(
            "the NPU needs its kernels: --kernel-dir DIR or ONEBIT_KERNEL_DIR".into(),
        ))
    })?;
    let artifacts = axlf::scan(dir)?;
    let (name, mut shapes) = shapes(&model.pack.manifest, batch as u64)?;
    match_artifacts(&mut shapes, &artifacts);
    if let Some(why) = missing_refusal(dir, &name, &shapes) {
        anyhow::bail!(super::Refused(why));
    }
    // Providers are `file name:kernel`.
    let providers: std::collections::BTreeSet<&str> = shapes
        .iter()
        .filter_map(|s| s.npu_provider.as_deref()?.split(':').next())
        .collect();
    let [file] = providers.into_iter().collect::<Vec<_>>()[..] else {
        anyhow::bail!(super::Refused(format!(
            "the shapes of {name} come from several xclbins; the NPU backend loads one per model"
        )));
    };
    let xclbin = artifacts
        .iter()
        .map(|x| &x.file)
        .find(|f| f.file_name().is_some_and(|n| n.to_string_lossy() == file))
        .ok_or_else(|| anyhow::anyhow!("{file} vanished from {}", dir.display()))?;
    let engine = XrtRunner::open(xclbin)?;
    model.set_backend(std::sync::Arc::new(NpuBackend::new(engine, batch)));
    Ok(format!("the NPU ({name}, {})", xclbin.display()))
}

/// Without feature `npu` there is no NPU backend to attach.
#[cfg(not(feature = "npu"))]
fn attach_npu(
    _model: &mut onebit_runtime::Model,
    _kernel_dir: Option<&std::path::Path>,
    _batch: usize,
) -> anyhow::Result<String> {
    anyhow::bail!(super::Refused(
        "this build has no NPU backend (build with --features npu)".into()
    ))
}

/// The store name of the served pack: the repository, the local folder's name, or the ref whose
/// repack output holds the `--pack` folder; `None` when no ref of the store holds it.
fn store_pack_name(g: &Global, source: &PackSource) -> Option<String> {
    if let Some(repo) = &source.import.repo {
        return Some(repo.clone());
    }
    if let Some(path) = &source.import.path {
        return super::report::local_pack_name(path).ok();
    }
    let dir = source.pack.as_ref()?.canonicalize().ok()?;
    let store = g.store().ok()?;
    onebit_pipeline::refs::list_refs(&store)
        .ok()?
        .into_iter()
        .find(|r| {
            r.stage("repack").is_some_and(|s| {
                store
                    .entry_dir(&s.key)
                    .canonicalize()
                    .is_ok_and(|e| dir.starts_with(e))
            })
        })
        .map(|r| r.name)
}

/// `/report/<model>`: the served pack's report, built from the store's catalog at each request.
fn report_source(g: &Global, source: &PackSource) -> Option<onebit_serve::ReportSource> {
    let name = store_pack_name(g, source)?;
    let g = g.clone();
    Some(onebit_serve::ReportSource(std::sync::Arc::new(move || {
        let store = g.store().map_err(|e| format!("{e:#}"))?;
        let catalog = onebit_catalog::Catalog::open(&store, &super::versions::current_versions())
            .map_err(|e| e.to_string())?;
        onebit_catalog::report::html(&catalog, &onebit_catalog::report::Options::new(&name))
            .map_err(|e| e.to_string())
    })))
}
