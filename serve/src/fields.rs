//! The sampling and chat fields beyond the basics, read for [`super::api`]: `logit_bias`,
//! log-probability counts, `reasoning_effort`, and `--lenient`'s dropping of unknown fields.

use serde_json::{Value, json};

use super::error::ApiError;
use super::values::Fields;
use onebit_runtime::generate::Prompt;
use onebit_runtime::sample::SamplerConfig;
use onebit_runtime::text::ChatExtras;

/// `logit_bias`: an object from token ids (as strings, OpenAI's shape) to a bias in [-100, 100].
/// Whether each id is inside the vocabulary is checked where the model is known
/// ([`check_logit_bias`]).
pub(super) fn logit_bias(b: &Fields) -> Result<Vec<(u32, f32)>, ApiError> {
    let m = match b.get("logit_bias") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(m)) => m,
        Some(v) => {
            return Err(ApiError::bad(
                "logit_bias",
                format!("'logit_bias' must be an object from token ids to biases, got {v}"),
            ));
        }
    };
    let mut out: Vec<(u32, f32)> = Vec::with_capacity(m.len());
    // One look-up per entry: a body may name many thousands of tokens.
    let mut named = std::collections::HashSet::with_capacity(m.len());
    for (k, v) in m {
        let field = format!("logit_bias.{k}");
        let id: u32 = k.trim().parse().map_err(|_| {
            ApiError::bad(
                field.clone(),
                format!("'{k}' is not a token id (a non-negative integer in a string)"),
            )
        })?;
        let bias = match v.as_f64() {
            Some(x) if (-100.0..=100.0).contains(&x) => x as f32,
            _ => {
                return Err(ApiError::bad(
                    field,
                    format!("a bias must be a number between -100 and 100, got {v}"),
                ));
            }
        };
        if !named.insert(id) {
            return Err(ApiError::bad(field, format!("token {id} is named twice")));
        }
        out.push((id, bias));
    }
    out.sort_unstable_by_key(|&(t, _)| t);
    Ok(out)
}

/// Refuses a `logit_bias` naming a token outside a vocabulary of `vocab` tokens.
pub fn check_logit_bias(s: &SamplerConfig, vocab: usize) -> Result<(), ApiError> {
    match s.logit_bias.iter().find(|&&(t, _)| t as usize >= vocab) {
        Some(&(t, _)) => Err(ApiError::bad(
            format!("logit_bias.{t}"),
            format!("token id {t} is outside the {vocab}-token vocabulary"),
        )),
        None => Ok(()),
    }
}

/// The values of `reasoning_effort` (OpenAI's, and `none`).
pub const REASONING_EFFORTS: &[&str] = &["none", "minimal", "low", "medium", "high"];

/// A chat `prompt` with `reasoning_effort` in its template variables where the template has a
/// switch for it: a template that reads `reasoning_effort` gets it as is; one that reads
/// `enable_thinking` (Qwen3, Hunyuan) thinks unless the effort is `none` or `minimal`. A template
/// with neither, or a prompt that is not a chat, is refused by name: the effort would be ignored.
pub fn with_reasoning_effort(
    prompt: Prompt,
    template: Option<&str>,
    effort: &str,
) -> Result<Prompt, ApiError> {
    let t = template.unwrap_or_default();
    let (key, value) = if t.contains("reasoning_effort") {
        ("reasoning_effort", json!(effort))
    } else if t.contains("enable_thinking") {
        (
            "enable_thinking",
            json!(!matches!(effort, "none" | "minimal")),
        )
    } else {
        return Err(ApiError::bad(
            "reasoning_effort",
            "this model's chat template has no switch for reasoning (neither 'reasoning_effort' nor 'enable_thinking')",
        ));
    };
    let (m, mut extras) = match prompt {
        Prompt::Chat(m) => (m, ChatExtras::default()),
        Prompt::ChatWith(m, e) => (m, e),
        _ => {
            return Err(ApiError::bad(
                "reasoning_effort",
                "only a chat has a template",
            ));
        }
    };
    // A variable the client set itself wins.
    extras.kwargs.entry(key).or_insert(value);
    Ok(Prompt::ChatWith(m, extras))
}

/// Most alternatives reported per token (OpenAI's `top_logprobs` limit).
pub(super) const MAX_LOGPROBS: i64 = 20;

/// Chat's `logprobs` (a boolean) and `top_logprobs` (0–20, only with `logprobs: true`).
pub(super) fn chat_logprobs(b: &Fields) -> Result<Option<usize>, ApiError> {
    let on = b.flag("logprobs", false)?;
    match b.int("top_logprobs")? {
        None => Ok(on.then_some(0)),
        Some(n @ 0..=MAX_LOGPROBS) if on => Ok(Some(n as usize)),
        Some(0) => Ok(None),
        Some(n @ 0..=MAX_LOGPROBS) => Err(ApiError::bad(
            "top_logprobs",
            format!("'top_logprobs' = {n} needs 'logprobs': true"),
        )),
        Some(n) => Err(ApiError::bad(
            "top_logprobs",
            format!("'top_logprobs' must be between 0 and {MAX_LOGPROBS}, got {n}"),
        )),
    }
}
