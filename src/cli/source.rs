//! The one flag group that names a repository to import, flattened into every command that
//! imports one (`run`, `generate`, `chat`, `eval`, `serve`, `kernels`, `repair`, `report`), so the
//! flags and their rules are stated once.

use std::path::PathBuf;

use clap::Args;

/// Where a repository comes from, and what to verify it against.
#[derive(Args, Debug, Clone)]
pub struct ImportSource {
    /// A Hugging Face repository, e.g. FastFlowLM/Gemma3-270M-NPU2.
    #[arg(long, value_name = "ORG/NAME", conflicts_with = "path")]
    pub repo: Option<String>,
    /// Branch, tag or commit of --repo.
    #[arg(long, default_value = "main", requires = "repo")]
    pub revision: String,
    /// The hub to fetch --repo from: a URL [default: $HF_ENDPOINT, else https://huggingface.co],
    /// or a directory laid out as ORG/NAME/<files> (an offline mirror).
    #[arg(long, value_name = "URL|DIR", requires = "repo")]
    pub endpoint: Option<String>,
    /// A local repository folder (config.json, model.q4nx, tokenizer files).
    #[arg(long, value_name = "DIR")]
    pub path: Option<PathBuf>,
    /// A GGUF of the same model (any quantization), the independent reference for verification: a
    /// path, or ORG/NAME[@REV]:FILE from the local Hugging Face cache.
    #[arg(long, value_name = "GGUF|ORG/NAME:FILE")]
    pub reference: Option<PathBuf>,
    /// llama.cpp's mmproj GGUF of the same model (its vision or audio tower, any float type), the
    /// reference the repository's tower files (vision_weight.q4nx, …) are verified against: a
    /// path, or ORG/NAME[@REV]:FILE from the local Hugging Face cache.
    #[arg(long, value_name = "GGUF|ORG/NAME:FILE")]
    pub mmproj: Option<PathBuf>,
}

/// How an import runs, beside where its repository comes from.
#[derive(Clone, Copy, Debug)]
pub struct ImportOptions {
    /// Parallel downloads of a fetch.
    pub downloads: usize,
    /// Stages at once (`None`: one per CPU).
    pub jobs: Option<usize>,
    /// Re-hash every cached file instead of comparing sizes and mtimes.
    pub deep: bool,
    /// Rebuild what verification finds broken by a known converter defect, and pack that.
    pub repair: bool,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            downloads: 4,
            jobs: None,
            deep: false,
            repair: false,
        }
    }
}
