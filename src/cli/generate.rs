//! `onebit-pipe generate` and `onebit-pipe chat`: run a verified pack on the host CPU, streaming
//! tokens to the terminal and reporting time to first token and tokens/s.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use onebit_runtime::generate::{Prompt, Request, generate};
use onebit_runtime::sample::SamplerConfig;
use onebit_runtime::text::{IMAGE_SLOT, Message, Text};
use onebit_runtime::{Model, Pack};

use onebit_kernels::kv::CacheType;

use super::Global;
use super::source::{ImportOptions, ImportSource};

/// Where the pack comes from: an imported repository (imported now if needed) or a pack folder.
#[derive(Args, Debug, Clone)]
pub struct PackSource {
    /// A repository imported (fetch → … → repack) before running.
    #[command(flatten)]
    pub import: ImportSource,
    /// Rebuild what verification finds broken by a known converter defect before running (see
    /// `run --repair`).
    #[arg(long)]
    pub repair: bool,
    /// A verified pack folder (the repack stage's output).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["repo", "path", "repair"])]
    pub pack: Option<PathBuf>,
    /// Run a pack whose verification did not pass.
    #[arg(long)]
    pub allow_unverified: bool,
    /// Candidates per token whose logits are recomputed from the exact (bf16) head when the head
    /// is 4-bit tiles of a tied embedding; 0 keeps the tiled logits [default: 128].
    #[arg(long, value_name = "N")]
    pub head_rescore: Option<usize>,
    /// Read special-token text in prompts and chat messages (`<eos>`, `<start_of_turn>`) as
    /// special tokens; by default it is plain text, as transformers and llama.cpp read it.
    #[arg(long)]
    pub parse_special: bool,
    /// The KV cache's element type: f32, f16, bf16 or q8_0 (llama.cpp's names). f16 holds half
    /// of f32's bytes at a perplexity within 0.1 % of it; q8_0 about a quarter (docs/runtime.md).
    #[arg(long, value_name = "TYPE", default_value_t = CacheType::F16)]
    pub cache_type: CacheType,
}

impl PackSource {
    /// The pack folder: `--pack`, or the repack output of importing `--repo`/`--path`.
    pub fn resolve(&self, g: &Global) -> anyhow::Result<PathBuf> {
        if let Some(p) = &self.pack {
            return Ok(p.clone());
        }
        let opts = ImportOptions {
            repair: self.repair,
            ..ImportOptions::default()
        };
        let (report, name, _) = super::run::import(g, &self.import, &opts)?;
        report.artifact("repack", "pack").cloned().with_context(|| {
            format!("{name}: the import made no pack (it needs config.json and tokenizer.json)")
        })
    }

    /// Opens and loads the pack, refusing an unverified one unless allowed.
    pub fn load(&self, g: &Global) -> anyhow::Result<(Model, Text)> {
        let dir = self.resolve(g)?;
        load_pack(&dir, &self.load_options())
    }

    /// How the pack is loaded, beside where it is.
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            allow_unverified: self.allow_unverified,
            head_rescore: self.head_rescore,
            parse_special: self.parse_special,
            cache_type: self.cache_type,
        }
    }

    /// Whether the flags name a pack at all (`serve` without one serves the store's packs).
    pub fn names_one(&self) -> bool {
        self.pack.is_some() || self.import.repo.is_some() || self.import.path.is_some()
    }
}

/// How a pack folder is loaded: [`PackSource`]'s flags beside the folder.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Run a pack whose verification did not pass.
    pub allow_unverified: bool,
    /// `--head-rescore`.
    pub head_rescore: Option<usize>,
    /// `--parse-special`.
    pub parse_special: bool,
    /// `--cache-type`.
    pub cache_type: CacheType,
}

/// Opens and loads the pack folder `dir` (the kernel self-check included), refusing an
/// unverified one unless allowed.
pub fn load_pack(dir: &std::path::Path, o: &LoadOptions) -> anyhow::Result<(Model, Text)> {
    let pack = Pack::open(dir, o.allow_unverified)?;
    let template = pack.manifest.chat_template.clone();
    let tok = pack.tokenizer_path();
    let mut model = Model::load(pack)?;
    model
        .set_cache_type(o.cache_type)
        .map_err(|e| anyhow::Error::new(super::Refused(format!("--cache-type {e}"))))?;
    // A context the machine cannot hold fails by name when it fills, not by the kernel's
    // OOM killer (`serve` sets its own budget, --cache-budget).
    if let Some(avail) = onebit_kernels::kv::available_memory() {
        model.cache_memory().set_limit(avail / 10 * 9);
    }
    if let Some(k) = o.head_rescore {
        model.set_head_rescore(k);
    }
    if model.head_rescore() > 0 {
        tracing::info!(
            candidates = model.head_rescore(),
            "head re-scored against the bf16 embedding <- tied head stored as tiles"
        );
    }
    let check = model.self_check()?;
    tracing::info!(
        path = check.path,
        matrices = check.matrices,
        max_rel = check.max_rel,
        "kernel self-check passed"
    );
    let text = Text::load(&tok, template)?
        .with_special(model.spec.bos, model.spec.eos.first().copied())
        .with_parse_special(o.parse_special)
        .with_image_text(model.images().map(|i| i.image_text()));
    Ok((model, text))
}

/// Sampling options shared by `generate` and `chat`.
#[derive(Args, Debug, Clone)]
pub struct SampleArgs {
    /// Most tokens to generate.
    #[arg(long, short = 'n', default_value_t = 128)]
    pub max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling threshold.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Keep the tokens at least this fraction as likely as the most likely one (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Locally typical sampling mass (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub typical_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every token the answer already holds (OpenAI's).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time the answer holds it (OpenAI's).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Tokens the penalties look back over (-1 = the whole context, 0 = penalties off).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub repeat_last_n: i64,
    /// RNG seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop strings (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Context size in tokens [default: min(model context, 4096)].
    #[arg(long)]
    pub ctx_size: Option<usize>,
    /// Worker threads [default: all cores].
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
}

impl SampleArgs {
    fn sampler(&self) -> anyhow::Result<SamplerConfig> {
        let s = SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            typical_p: self.typical_p,
            repetition_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repeat_last_n: match self.repeat_last_n {
                -1 => usize::MAX,
                n => usize::try_from(n).map_err(|_| {
                    anyhow::anyhow!("--repeat-last-n must be -1, 0 or more, got {n}")
                })?,
            },
            logit_bias: Vec::new(),
            seed: self.seed,
        };
        s.check()?;
        Ok(s)
    }

    fn apply_threads(&self) {
        if let Some(t) = self.threads {
            // Fails only if the pool is already built, in which case it keeps its size.
            let _ = rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build_global();
        }
    }

    fn ctx(&self, model: &Model) -> anyhow::Result<usize> {
        Ok(model.checked_context(self.ctx_size.unwrap_or(model.spec.context.min(4096)))?)
    }
}

/// Arguments of `generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// The pack.
    #[command(flatten)]
    pub source: PackSource,
    /// The prompt.
    #[arg(long, short, required_unless_present = "ids", conflicts_with = "ids")]
    pub prompt: Option<String>,
    /// The prompt as token ids (a JSON list), fed exactly as given: benchmarks that must match
    /// another runtime's prompt length token for token.
    #[arg(long, value_name = "JSON", conflicts_with = "chat")]
    pub ids: Option<String>,
    /// Send the prompt as one user message through the chat template.
    #[arg(long)]
    pub chat: bool,
    /// A system message (with --chat).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// An image file (PNG, JPEG, WebP, or a GIF's first frame) for a model whose pack serves a
    /// vision tower; repeat for several. Each goes where the prompt writes the model's image
    /// marker (Gemma 3: `<start_of_image>`), in order, or before the prompt's text when it
    /// writes none.
    #[arg(long, value_name = "FILE", conflicts_with = "ids")]
    pub image: Vec<PathBuf>,
    /// Sampling.
    #[command(flatten)]
    pub sample: SampleArgs,
}

/// The prompt with an [`IMAGE_SLOT`] where each of `n` images goes: at each `marker` the prompt
/// writes, in order, or all before its text when it writes none. Refuses a count of markers other
/// than the images'.
fn with_image_slots(prompt: &str, marker: &str, n: usize) -> anyhow::Result<String> {
    let written = prompt.matches(marker).count();
    match written {
        0 => Ok(format!("{}{prompt}", IMAGE_SLOT.to_string().repeat(n))),
        w if w == n => Ok(prompt.replace(marker, &IMAGE_SLOT.to_string())),
        w => Err(anyhow::Error::new(super::Refused(format!(
            "the prompt writes {marker} {w} times for {n} --image file(s)"
        )))),
    }
}

/// The `--image` files' bytes, read before the model loads.
fn read_images(files: &[PathBuf]) -> anyhow::Result<Vec<(&PathBuf, Vec<u8>)>> {
    files
        .iter()
        .map(|f| {
            Ok((
                f,
                std::fs::read(f).with_context(|| format!("--image {}", f.display()))?,
            ))
        })
        .collect()
}

/// Encodes the `--image` files with the model's vision tower.
fn encode_images(
    model: &Model,
    files: &[(&PathBuf, Vec<u8>)],
) -> anyhow::Result<Vec<std::sync::Arc<onebit_runtime::ImageEmbeds>>> {
    if files.is_empty() {
        return Ok(Vec::new());
    }
    let enc = model
        .image_encoder()
        .map_err(|e| anyhow::Error::new(super::Refused(format!("--image: {e}"))))?;
    files
        .iter()
        .map(|(f, bytes)| {
            enc.encode(bytes)
                .with_context(|| format!("--image {}", f.display()))
        })
        .collect()
}

/// Completes one prompt, streaming to stdout; statistics go to stderr (or JSON with --json).
pub fn exec(g: &Global, a: GenerateArgs) -> anyhow::Result<ExitCode> {
    // Flags are checked before the model loads.
    let sampler = a.sample.sampler()?;
    let ids: Option<Vec<u32>> = match &a.ids {
        Some(j) => {
            let ids: Vec<u32> = serde_json::from_str(j).context("--ids: a JSON list of ids")?;
            if ids.is_empty() {
                anyhow::bail!("--ids: give at least one id");
            }
            Some(ids)
        }
        None => None,
    };
    let text_prompt = a.prompt.clone().unwrap_or_default();
    let image_files = read_images(&a.image)?;
    a.sample.apply_threads();
    let (model, text) = a.source.load(g)?;
    let images = encode_images(&model, &image_files)?;
    let text_prompt = match model.images() {
        Some(enc) if !images.is_empty() => {
            with_image_slots(&text_prompt, &enc.spec().start_text, images.len())?
        }
        _ => text_prompt,
    };
    let prompt = if a.chat {
        let mut m = Vec::new();
        if let Some(s) = &a.system {
            m.push(Message {
                role: "system".into(),
                content: s.clone(),
                ..Default::default()
            });
        }
        m.push(Message {
            role: "user".into(),
            content: text_prompt,
            ..Default::default()
        });
        Prompt::Chat(m)
    } else if let Some(ids) = ids {
        Prompt::Tokens(ids)
    } else {
        Prompt::Text(text_prompt)
    };
    let req = Request {
        prompt,
        max_tokens: a.sample.max_tokens,
        sampler: sampler.clone(),
        stop: a.sample.stop.clone(),
        constraint: None,
        keep_special: false,
        logprobs: None,
        images,
    };
    let mut session = model.session(a.sample.ctx(&model)?);
    let stream = !g.json;
    let mut stdout = std::io::stdout();
    let out = generate(&model, &text, &mut session, &req, |piece| {
        if stream {
            let _ = write!(stdout, "{piece}");
            let _ = stdout.flush();
        }
        true
    })?;
    if g.json {
        println!(
            "{}",
            serde_json::json!({
                "text": out.text, "tokens": out.tokens, "prompt_tokens": out.prompt_tokens,
                "finish_reason": out.finish.as_str(),
                "time_to_first_token_ms": out.time_to_first_token.as_secs_f64() * 1e3,
                "prefill_tokens_per_s": out.prefill_tps(), "decode_tokens_per_s": out.decode_tps(),
                "kernel": model.kernel_path().name(),
                "threads": rayon::current_num_threads(),
                "decode_weight_bytes_per_token": model.decode_bytes(),
            })
        );
    } else {
        println!();
        if !g.quiet {
            eprintln!(
                "[{} prompt tokens, first token {:.0} ms ({:.1} tok/s prefill); {} tokens at {:.1} tok/s; finish: {}; kernel {}, {} threads]",
                out.prompt_tokens,
                out.time_to_first_token.as_secs_f64() * 1e3,
                out.prefill_tps(),
                out.tokens.len(),
                out.decode_tps(),
                out.finish.as_str(),
                model.kernel_path().name(),
                rayon::current_num_threads()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `chat`.
#[derive(Args, Debug)]
pub struct ChatArgs {
    /// The pack.
    #[command(flatten)]
    pub source: PackSource,
    /// A system message.
    #[arg(long)]
    pub system: Option<String>,
    /// Sampling.
    #[command(flatten)]
    pub sample: SampleArgs,
}

/// An interactive chat: each line is a user turn; the conversation goes through the template.
/// `/image FILE` attaches an image to the next turn (a model whose pack serves a vision tower);
/// `/exit` ends it.
pub fn chat(g: &Global, a: ChatArgs) -> anyhow::Result<ExitCode> {
    let sampler = a.sample.sampler()?;
    a.sample.apply_threads();
    let (model, text) = a.source.load(g)?;
    if !text.has_template() {
        anyhow::bail!("this pack has no chat template; use `onebit-pipe generate --prompt`");
    }
    let mut messages = Vec::new();
    if let Some(s) = &a.system {
        messages.push(Message {
            role: "system".into(),
            content: s.clone(),
            ..Default::default()
        });
    }
    let mut session = model.session(a.sample.ctx(&model)?);
    let mut rl = rustyline::DefaultEditor::new()?;
    // Every image of the conversation, in the order of their slots in the messages, and the
    // slots of the images attached to the next turn.
    let mut images = Vec::new();
    let mut pending = String::new();
    loop {
        let line = match rl.readline("> ") {
            Ok(l) => l,
            Err(rustyline::error::ReadlineError::Interrupted)
            | Err(rustyline::error::ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if line == "/exit" || line == "/quit" {
            break;
        }
        let _ = rl.add_history_entry(line);
        if let Some(file) = line.strip_prefix("/image ") {
            let file = PathBuf::from(file.trim());
            match read_images(std::slice::from_ref(&file)).and_then(|f| encode_images(&model, &f)) {
                Ok(mut im) => {
                    images.append(&mut im);
                    pending.push(IMAGE_SLOT);
                    eprintln!("[{} attached to your next message]", file.display());
                }
                Err(e) => eprintln!("error: {e:#}"),
            }
            continue;
        }
        messages.push(Message {
            role: "user".into(),
            content: format!("{pending}{line}"),
            ..Default::default()
        });
        pending.clear();
        let req = Request {
            prompt: Prompt::Chat(messages.clone()),
            max_tokens: a.sample.max_tokens,
            sampler: sampler.clone(),
            stop: a.sample.stop.clone(),
            constraint: None,
            keep_special: false,
            logprobs: None,
            images: images.clone(),
        };
        let mut stdout = std::io::stdout();
        let out = generate(&model, &text, &mut session, &req, |piece| {
            let _ = write!(stdout, "{piece}");
            let _ = stdout.flush();
            true
        })?;
        println!();
        if !g.quiet {
            eprintln!(
                "[first token {:.0} ms; {} tokens at {:.1} tok/s]",
                out.time_to_first_token.as_secs_f64() * 1e3,
                out.tokens.len(),
                out.decode_tps()
            );
        }
        messages.push(Message {
            role: "assistant".into(),
            content: out.text,
            ..Default::default()
        });
    }
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `eval`.
#[derive(Args, Debug)]
pub struct EvalArgs {
    /// The pack.
    #[command(flatten)]
    pub source: PackSource,
    /// A text file to score (tokenized whole, BOS per chunk).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["ids", "kl_divergence_base"])]
    pub file: Option<PathBuf>,
    /// Compare with llama.cpp instead: the log-probabilities `llama-perplexity -m GGUF -f TEXT
    /// -c CTX --kl-divergence-base FILE` saved, scored on its own tokens and chunks; prints the
    /// KL divergence, top-1 agreement and probability differences as `--kl-divergence` does.
    #[arg(long, value_name = "FILE", conflicts_with = "ids")]
    pub kl_divergence_base: Option<PathBuf>,
    /// With --kl-divergence-base: compare only the first N chunks.
    #[arg(long, value_name = "N", requires = "kl_divergence_base")]
    pub chunks: Option<usize>,
    /// Token ids as a JSON list, scored as one sequence exactly as given (no BOS replacement).
    #[arg(long, value_name = "JSON")]
    pub ids: Option<String>,
    /// Chunk length in tokens.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    /// Worker threads [default: all cores].
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Only the teacher-forced top-1, as greedy decoding reads it (ranked by the pack's scan
    /// head when it has one); no perplexity.
    #[arg(long)]
    pub argmax_only: bool,
}

/// Perplexity and teacher-forced top-1 (llama.cpp `perplexity` chunking), printed as one JSON
/// object with the per-position argmax for comparisons with other runtimes.
pub fn eval(g: &Global, a: EvalArgs) -> anyhow::Result<ExitCode> {
    if let Some(t) = a.threads {
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build_global();
    }
    let (model, text) = a.source.load(g)?;
    if let Some(path) = &a.kl_divergence_base {
        let base = onebit_runtime::kld::BaseLogits::open(path)?;
        let t0 = std::time::Instant::now();
        let report = onebit_runtime::kld::compare(&model, &base, a.chunks)?;
        let mut v = serde_json::to_value(&report)?;
        v["seconds"] = t0.elapsed().as_secs_f64().into();
        println!("{v}");
        return Ok(ExitCode::SUCCESS);
    }
    let (ids, ctx) = match (&a.file, &a.ids) {
        (Some(f), _) => {
            let s = std::fs::read_to_string(f).with_context(|| format!("read {}", f.display()))?;
            (text.encode_user(&s)?, a.ctx)
        }
        (None, Some(j)) => {
            let ids: Vec<u32> = serde_json::from_str(j).context("--ids: a JSON list of ids")?;
            let n = ids.len();
            if n < 2 {
                anyhow::bail!("--ids: {n} ids score nothing; give at least 2");
            }
            (ids, n)
        }
        (None, None) => anyhow::bail!("give --file FILE, --ids JSON or --kl-divergence-base FILE"),
    };
    let t0 = std::time::Instant::now();
    // A text is cut into chunks that each start with BOS (llama.cpp); ids are scored as given.
    let bos_per_chunk = a.file.is_some();
    let ev = onebit_runtime::generate::evaluate(&model, &ids, ctx, a.argmax_only, bos_per_chunk)?;
    let secs = t0.elapsed().as_secs_f64();
    // For --ids, numbers to compare with other runtimes: the first logits after the sequence,
    // each id's log-probability after the ones before it, and the most likely next token.
    let (logits_head, token_logprobs, next) = if a.ids.is_some() {
        let mut s = model.session(ids.len());
        let rows = model.forward(&mut s, &ids, true)?;
        let v = model.spec.vocab;
        let lps: Vec<f32> = (1..ids.len())
            .map(|i| {
                onebit_runtime::logprobs::log_softmax_at(&rows[(i - 1) * v..i * v], 1.0, ids[i], 0)
                    .0
            })
            .collect();
        let last = &rows[(ids.len() - 1) * v..ids.len() * v];
        let next = onebit_runtime::sample::argmax(last);
        (last.iter().take(16).copied().collect(), lps, Some(next))
    } else {
        (Vec::new(), Vec::new(), None)
    };
    println!(
        "{}",
        serde_json::json!({
            "tokens": ids.len(), "ctx": ctx, "chunks": ids.len() / ctx.max(1),
            "scored": ev.scored,
            "perplexity": (!a.argmax_only).then(|| ev.perplexity()),
            "top1_next_token": ev.top1_hits as f64 / ev.scored.max(1) as f64,
            "argmax": ev.argmax, "seconds": secs, "logits_last_head": logits_head,
            "token_logprobs": (!token_logprobs.is_empty()).then_some(token_logprobs),
            "next_argmax": next,
            "tokens_per_s": (ids.len() / ctx.max(1) * ctx) as f64 / secs,
        })
    );
    Ok(ExitCode::SUCCESS)
}
