//! The generation loop: prompt → tokens → prefill → decode, streaming text pieces as they become
//! valid UTF-8, stopping on EOS, a stop string or the token budget, and timing each phase.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::model::{Model, Session};
use crate::sample::{Sampler, SamplerConfig};
use crate::text::{Message, Text};

/// What to complete.
#[derive(Clone, Debug)]
pub enum Prompt {
    /// Raw text; BOS is added when the model's tokenizer adds it.
    Text(String),
    /// Messages through the chat template.
    Chat(Vec<Message>),
}

/// One generation request.
#[derive(Clone, Debug)]
pub struct Request {
    /// The prompt.
    pub prompt: Prompt,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampling.
    pub sampler: SamplerConfig,
    /// Strings that end generation (not included in the text).
    pub stop: Vec<String>,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` reached (or the context is full).
    Length,
    /// The consumer asked to stop (client gone).
    Cancelled,
}

impl Finish {
    /// OpenAI's `finish_reason` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::Cancelled => "cancelled",
        }
    }
}

/// The outcome of one request.
#[derive(Clone, Debug)]
pub struct Generation {
    /// Generated text (stop string excluded).
    pub text: String,
    /// Generated token ids.
    pub tokens: Vec<u32>,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Why it ended.
    pub finish: Finish,
    /// Prompt processing time (to the first token).
    pub time_to_first_token: Duration,
    /// Time spent decoding after the first token.
    pub decode_time: Duration,
}

impl Generation {
    /// Prefill speed, tokens/s.
    pub fn prefill_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.time_to_first_token.as_secs_f64().max(1e-9)
    }
    /// Decode speed, tokens/s (tokens after the first over the time after the first).
    pub fn decode_tps(&self) -> f64 {
        self.tokens.len().saturating_sub(1) as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

/// Tokenizes a prompt as the model expects it.
pub fn prompt_ids(model: &Model, text: &Text, p: &Prompt) -> Result<Vec<u32>> {
    match p {
        Prompt::Text(s) => {
            let mut ids = text.encode(s, false)?;
            if model.spec.add_bos
                && let Some(b) = model.spec.bos
                && ids.first() != Some(&b)
            {
                ids.insert(0, b);
            }
            Ok(ids)
        }
        Prompt::Chat(m) => text.encode(&text.render_chat(m)?, false),
    }
}

/// Length of the longest suffix of `s` that is a proper prefix of some stop string (text that
/// must be held back until we know it is not a stop).
fn held_back(s: &str, stops: &[String]) -> usize {
    let mut best = 0;
    for st in stops {
        for (i, _) in st.char_indices().skip(1) {
            if s.ends_with(&st[..i]) {
                best = best.max(i);
            }
        }
    }
    best
}

/// Runs `req` in `session` (which is reset), calling `on_text` with each new piece of text;
/// `on_text` returns `false` to cancel.
pub fn generate(
    model: &Model,
    text: &Text,
    session: &mut Session,
    req: &Request,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<Generation> {
    let ids = prompt_ids(model, text, &req.prompt)?;
    if ids.is_empty() {
        return Err(Error::Request {
            field: "prompt",
            reason: "the prompt is empty".into(),
        });
    }
    if ids.len() >= session.capacity {
        return Err(Error::Request {
            field: "prompt",
            reason: format!(
                "{} prompt tokens do not fit the {}-token context",
                ids.len(),
                session.capacity
            ),
        });
    }
    session.truncate(0);
    let mut sampler = Sampler::new(req.sampler.clone());
    let t0 = Instant::now();
    let mut logits = model.forward(session, &ids, false)?;
    let mut seen = ids.clone();
    let mut out: Vec<u32> = Vec::new();
    let mut emitted = 0usize;
    let mut ttft = Duration::ZERO;
    let mut t_first = t0;
    let mut finish = Finish::Length;
    let mut full = String::new();
    while out.len() < req.max_tokens {
        let next = sampler.pick(&mut logits, &seen);
        if out.is_empty() {
            ttft = t0.elapsed();
            t_first = Instant::now();
        }
        if model.spec.eos.contains(&next) {
            finish = Finish::Stop;
            break;
        }
        out.push(next);
        seen.push(next);
        full = text.decode(&out)?;
        if let Some(at) = req.stop.iter().filter_map(|s| full.find(s.as_str())).min() {
            full.truncate(at);
            if full.len() > emitted && !on_text(&full[emitted..]) {
                finish = Finish::Cancelled;
                break;
            }
            emitted = full.len();
            finish = Finish::Stop;
            break;
        }
        // Emit what is complete: no trailing U+FFFD of a partial byte sequence, no possible
        // stop-string prefix.
        let mut safe = full.len() - held_back(&full, &req.stop);
        while safe > emitted && !full.is_char_boundary(safe) {
            safe -= 1;
        }
        let piece = &full[emitted.min(safe)..safe];
        if !piece.is_empty() && !piece.ends_with('\u{FFFD}') {
            if !on_text(piece) {
                finish = Finish::Cancelled;
                break;
            }
            emitted = safe;
        }
        if out.len() >= req.max_tokens || session.pos + 1 >= session.capacity {
            finish = Finish::Length;
            break;
        }
        logits = model.forward(session, &[next], false)?;
    }
    if ttft.is_zero() {
        ttft = t0.elapsed();
    }
    if finish != Finish::Cancelled && full.len() > emitted {
        on_text(&full[emitted..]);
    }
    Ok(Generation {
        text: full,
        tokens: out,
        prompt_tokens: ids.len(),
        finish,
        time_to_first_token: ttft,
        decode_time: t_first.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::held_back;

    #[test]
    fn stop_prefixes_are_held_back() {
        let stops = vec!["\nUser:".to_string()];
        assert_eq!(held_back("Paris.\nUs", &stops), 3);
        assert_eq!(held_back("Paris.", &stops), 0);
    }
}

/// Teacher-forced evaluation of a token sequence, as llama.cpp's `perplexity` tool scores it:
/// the tokens are cut into chunks of `ctx`, each chunk's first token replaced by BOS, and the
/// negative log-likelihood summed over the second half of each chunk.
#[derive(Clone, Debug, Default)]
pub struct Evaluation {
    /// Tokens scored.
    pub scored: usize,
    /// Σ −log p(token) over the scored tokens.
    pub nll: f64,
    /// The model's top-1 after every position of every chunk (teacher-forced).
    pub argmax: Vec<u32>,
    /// Whether that top-1 equals the next token, over the scored positions.
    pub top1_hits: usize,
}

impl Evaluation {
    /// exp(mean NLL).
    pub fn perplexity(&self) -> f64 {
        (self.nll / self.scored.max(1) as f64).exp()
    }
}

/// Evaluates `ids` in chunks of `ctx` tokens (see [`Evaluation`]).
pub fn evaluate(model: &Model, ids: &[u32], ctx: usize) -> Result<Evaluation> {
    let mut ev = Evaluation::default();
    let mut session = model.session(ctx);
    for chunk in ids.chunks(ctx).filter(|c| c.len() == ctx) {
        let mut toks = chunk.to_vec();
        if let Some(b) = model.spec.bos {
            toks[0] = b;
        }
        session.truncate(0);
        let logits = model.forward(&mut session, &toks, true)?;
        let v = model.spec.vocab;
        for i in 0..ctx - 1 {
            let row = &logits[i * v..(i + 1) * v];
            let best = crate::sample::argmax(row);
            ev.argmax.push(best);
            if i >= ctx / 2 {
                let max = row[best as usize] as f64;
                let z: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
                let target = chunk[i + 1] as usize;
                ev.nll += z.ln() + max - row[target] as f64;
                ev.scored += 1;
                if best as usize == target {
                    ev.top1_hits += 1;
                }
            }
        }
    }
    Ok(ev)
}
