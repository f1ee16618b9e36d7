//! The generation loop: prompt → tokens → prefill → decode, streaming text pieces as they become
//! valid UTF-8, stopping on EOS, a stop string or the token budget, and timing each phase.

use std::time::{Duration, Instant};

use crate::error::{ContextExceeded, Error, Result};
use crate::grammar::Constraint;
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
    /// Messages through the chat template, with tools and template variables.
    ChatWith(Vec<Message>, crate::text::ChatExtras),
    /// Token ids as given (no BOS added).
    Tokens(Vec<u32>),
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
    /// A grammar the answer must follow (structured outputs, forced tool calls): it masks the
    /// logits before each token is sampled and ends the answer when its text is complete.
    pub constraint: Option<Constraint>,
    /// Keep special tokens in the text (a tool call's tags may be special tokens).
    pub keep_special: bool,
    /// Report each generated token's log-probability and this many alternatives (`None`: off).
    /// The logits are then read whole (no scan-head shortcut).
    pub logprobs: Option<usize>,
    /// The prompt's images, in the order of its image slots ([`crate::text::IMAGE_SLOT`]),
    /// encoded by the model's vision tower.
    pub images: Vec<std::sync::Arc<crate::image_input::ImageEmbeds>>,
}

impl Request {
    /// A request that reads `prompt` and generates nothing (an embedding's): no tokens, the
    /// default sampler, no stops, no grammar.
    pub fn read_only(prompt: Prompt) -> Request {
        Request {
            prompt,
            max_tokens: 0,
            sampler: SamplerConfig::default(),
            stop: Vec::new(),
            constraint: None,
            keep_special: false,
            logprobs: None,
            images: Vec::new(),
        }
    }

    /// How many of each row's best logits this request reads (see
    /// [`SamplerConfig::reads_top`]); 0 (all) when it reports log-probabilities.
    pub fn reads_top(&self) -> usize {
        if self.logprobs.is_some() {
            0
        } else {
            self.sampler.reads_top()
        }
    }
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
            let mut ids = text.encode_user_with_images(s)?;
            if model.spec.add_bos
                && let Some(b) = model.spec.bos
                && ids.first() != Some(&b)
            {
                ids.insert(0, b);
            }
            Ok(ids)
        }
        Prompt::Chat(m) => text.encode_chat(m),
        Prompt::ChatWith(m, extras) => text.encode_chat_with(m, extras),
        Prompt::Tokens(ids) => match ids.iter().find(|&&t| t as usize >= model.spec.vocab) {
            Some(t) => Err(Error::Request {
                field: "prompt",
                reason: format!(
                    "token id {t} is outside the {}-token vocabulary",
                    model.spec.vocab
                ),
            }),
            None => Ok(ids.clone()),
        },
    }
}

/// Where the text not yet sent starts in `full`, the answer decoded whole, when `emitted` bytes
/// of an earlier decoding were sent and `safe` may be sent now: `emitted`, moved to the next
/// character boundary where decoding the longer answer changed the bytes before it (byte-fallback
/// tokens that were replacement characters completing a character), never past `safe`.
fn unsent(full: &str, emitted: usize, safe: usize) -> usize {
    let mut at = emitted.min(safe);
    while at < safe && !full.is_char_boundary(at) {
        at += 1;
    }
    at
}

/// Length of the longest suffix of `s` that is a proper prefix of some stop string (text that
/// must be held back until we know it is not a stop).
pub fn held_back<S: AsRef<str>>(s: &str, stops: &[S]) -> usize {
    let mut best = 0;
    for st in stops {
        let st = st.as_ref();
        for (i, _) in st.char_indices().skip(1) {
            if s.ends_with(&st[..i]) {
                best = best.max(i);
            }
        }
    }
    best
}

/// Where the first stop string begins in `full`, looking only at settled text: while more tokens
/// may follow (`last` false), trailing U+FFFD characters are the decoder's stand-ins for a
/// multi-byte character whose bytes have not all arrived, and text that will change must not
/// end an answer. On the last token they are final and count.
fn stop_at(full: &str, stops: &[String], last: bool) -> Option<usize> {
    let settled = if last {
        full
    } else {
        full.trim_end_matches('\u{FFFD}')
    };
    stops.iter().filter_map(|s| settled.find(s.as_str())).min()
}

/// What one sampled token produced.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Step {
    /// The token sampled (absent when the budget was already spent).
    pub token: Option<u32>,
    /// Text that is final now (complete UTF-8, not a possible stop-string prefix); on the last
    /// step, everything not emitted yet.
    pub piece: String,
    /// Set when this step ends the request.
    pub finish: Option<Finish>,
    /// The sampled token's log-probability, when the request asked (not for an end-of-sequence
    /// token, which is not part of the answer).
    pub logprob: Option<crate::logprobs::TokenLogprob>,
}

/// One request's decoding state, independent of where its logits come from: sampling, EOS, the
/// token budget, stop strings and UTF-8-safe streaming. [`generate`] drives it one sequence at a
/// time; the server's scheduler drives many in one batch.
pub struct Decoder {
    sampler: Sampler,
    seen: Vec<u32>,
    prompt: usize,
    out: Vec<u32>,
    full: String,
    emitted: usize,
    max_tokens: usize,
    stop: Vec<String>,
    constraint: Option<Constraint>,
    keep_special: bool,
    logprobs: Option<usize>,
    temperature: f32,
}

impl Decoder {
    /// A decoder for `req` after the prompt `ids` (the repetition penalty sees the prompt).
    pub fn new(ids: &[u32], req: &Request) -> Decoder {
        Decoder {
            sampler: Sampler::new(req.sampler.clone()),
            seen: ids.to_vec(),
            prompt: ids.len(),
            out: Vec::new(),
            full: String::new(),
            emitted: 0,
            max_tokens: req.max_tokens,
            stop: req.stop.clone(),
            constraint: req.constraint.clone(),
            keep_special: req.keep_special,
            logprobs: req.logprobs,
            temperature: req.sampler.temperature,
        }
    }

    /// The tokens its grammar allows next (`None` without a grammar), for the head to rank only
    /// those ([`Session::allow_only`]).
    pub fn allowed(&mut self) -> Result<Option<std::sync::Arc<[u32]>>> {
        self.constraint
            .as_mut()
            .map(Constraint::allowed)
            .transpose()
    }

    /// Tokens generated so far.
    pub fn tokens(&self) -> &[u32] {
        &self.out
    }

    /// The text so far (stop string excluded once found).
    pub fn text(&self) -> &str {
        &self.full
    }

    /// Samples from `logits` and says what to emit. `room` is whether the context can take one
    /// more token after this one.
    pub fn step(
        &mut self,
        model: &Model,
        text: &Text,
        logits: &mut [f32],
        room: bool,
    ) -> Result<Step> {
        if self.out.len() >= self.max_tokens {
            return Ok(self.finish(None, Finish::Length));
        }
        // The model's own distribution, before the grammar and the sampler change the row.
        let raw = self.logprobs.map(|_| logits.to_vec());
        if let Some(c) = &mut self.constraint {
            c.mask(logits)?;
        }
        let next = self.sampler.pick(logits, &self.seen, self.prompt);
        if model.spec.eos.contains(&next) {
            return Ok(self.finish(Some(next), Finish::Stop));
        }
        let logprob = match (raw, self.logprobs) {
            (Some(row), Some(k)) => {
                let (lp, top) = crate::logprobs::log_softmax_at(&row, self.temperature, next, k);
                let ids: Vec<u32> = std::iter::once(next)
                    .chain(top.iter().map(|e| e.0))
                    .collect();
                let mut pieces = text
                    .with_tokenizer(|t| crate::grammar::token_pieces(t, &ids))
                    .into_iter()
                    .map(Option::unwrap_or_default);
                Some(crate::logprobs::TokenLogprob {
                    id: next,
                    piece: pieces.next().unwrap_or_default(),
                    logprob: lp,
                    top: top
                        .into_iter()
                        .zip(pieces)
                        .map(|((id, l), p)| (id, p, l))
                        .collect(),
                })
            }
            _ => None,
        };
        let complete = match &mut self.constraint {
            Some(c) => {
                c.accept(next)?;
                c.is_finished()
            }
            None => false,
        };
        self.out.push(next);
        self.seen.push(next);
        self.full = if self.keep_special {
            text.decode_keeping_special(&self.out)?
        } else {
            text.decode(&self.out)?
        };
        if complete {
            return Ok(Step {
                logprob,
                ..self.finish(Some(next), Finish::Stop)
            });
        }
        let last = self.out.len() >= self.max_tokens || !room;
        if let Some(at) = stop_at(&self.full, &self.stop, last) {
            self.full.truncate(at);
            return Ok(Step {
                logprob,
                ..self.finish(Some(next), Finish::Stop)
            });
        }
        if last {
            return Ok(Step {
                logprob,
                ..self.finish(Some(next), Finish::Length)
            });
        }
        if let Some(c) = &mut self.constraint {
            // The next mask now, while sequences are stepped in parallel.
            c.allowed()?;
        }
        // Emit what is complete: no trailing U+FFFD of a partial byte sequence, no possible
        // stop-string prefix.
        let mut safe = self.full.len() - held_back(&self.full, &self.stop);
        while safe > self.emitted && !self.full.is_char_boundary(safe) {
            safe -= 1;
        }
        let piece = &self.full[unsent(&self.full, self.emitted, safe)..safe];
        let mut step = Step {
            token: Some(next),
            logprob,
            ..Step::default()
        };
        if !piece.is_empty() && !piece.ends_with('\u{FFFD}') {
            step.piece = piece.to_string();
            self.emitted = safe;
        }
        Ok(step)
    }

    fn finish(&mut self, token: Option<u32>, finish: Finish) -> Step {
        let piece = self
            .full
            .get(self.emitted..)
            .unwrap_or_default()
            .to_string();
        self.emitted = self.full.len();
        Step {
            token,
            piece,
            finish: Some(finish),
            logprob: None,
        }
    }
}

/// Tokenizes `prompt` and checks it fits a `capacity`-token context with room for one
/// generated token.
pub fn checked_prompt(
    model: &Model,
    text: &Text,
    prompt: &Prompt,
    capacity: usize,
) -> Result<Vec<u32>> {
    let ids = prompt_ids(model, text, prompt)?;
    if ids.is_empty() {
        return Err(Error::Request {
            field: "prompt",
            reason: "the prompt is empty".into(),
        });
    }
    if ids.len() >= capacity {
        return Err(Error::ContextExceeded(ContextExceeded {
            tokens: ids.len(),
            capacity,
        }));
    }
    Ok(ids)
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
    let ids = checked_prompt(model, text, &req.prompt, session.capacity)?;
    session.truncate(0);
    place_images(model, session, &ids, &req.images)?;
    session.read_top(req.reads_top());
    let mut dec = Decoder::new(&ids, req);
    let t0 = Instant::now();
    let mut logits = model.forward(session, &ids, false)?;
    let mut ttft = None;
    let mut t_first = t0;
    let finish = loop {
        let room = session.pos + 1 < session.capacity;
        let st = dec.step(model, text, &mut logits, room)?;
        if ttft.is_none() {
            ttft = Some(t0.elapsed());
            t_first = Instant::now();
        }
        if !st.piece.is_empty() && !on_text(&st.piece) {
            break Finish::Cancelled;
        }
        match (st.finish, st.token) {
            (Some(f), _) => break f,
            (None, Some(t)) => logits = model.forward(session, &[t], false)?,
            (None, None) => break Finish::Length,
        }
    };
    Ok(Generation {
        text: dec.full,
        tokens: dec.out,
        prompt_tokens: ids.len(),
        finish,
        time_to_first_token: ttft.unwrap_or_else(|| t0.elapsed()),
        decode_time: t_first.elapsed(),
    })
}

/// Places `images` over the image tokens of `ids` (the prompt `session` runs next); refuses
/// images for a model without a served vision tower, and a prompt whose image places are not one
/// per image.
pub fn place_images(
    model: &Model,
    session: &mut Session,
    ids: &[u32],
    images: &[std::sync::Arc<crate::image_input::ImageEmbeds>],
) -> Result<()> {
    if images.is_empty() && model.images().is_none() {
        return Ok(());
    }
    let enc = model.image_encoder()?;
    session.place_images(&enc.places(ids, images)?)
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

/// Evaluates `ids` in chunks of `ctx` tokens (see [`Evaluation`]). With `argmax_only` only the
/// top-1 is taken, as greedy decoding reads it (the model may then rank with the pack's scan
/// head; see [`Session::read_top`]), and nothing is scored. With `bos_per_chunk` each chunk's
/// first token is replaced by BOS (llama.cpp `perplexity`'s rule for a text cut into chunks);
/// without it the ids are scored exactly as given.
pub fn evaluate(
    model: &Model,
    ids: &[u32],
    ctx: usize,
    argmax_only: bool,
    bos_per_chunk: bool,
) -> Result<Evaluation> {
    if ctx < 2 {
        return Err(Error::Request {
            field: "ctx",
            reason: format!("chunks of {ctx} tokens score nothing (at least 2)"),
        });
    }
    let mut ev = Evaluation::default();
    let mut session = model.session(ctx);
    session.read_top(usize::from(argmax_only));
    for chunk in ids.chunks(ctx).filter(|c| c.len() == ctx) {
        let mut toks = chunk.to_vec();
        if let Some(b) = model.spec.bos.filter(|_| bos_per_chunk) {
            toks[0] = b;
        }
        session.truncate(0);
        let logits = model.forward(&mut session, &toks, true)?;
        let v = model.spec.vocab;
        for i in 0..ctx - 1 {
            let row = &logits[i * v..(i + 1) * v];
            let best = crate::sample::argmax(row);
            ev.argmax.push(best);
            if i >= ctx / 2 && !argmax_only {
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

#[cfg(test)]
mod tests {
    use super::{held_back, stop_at, unsent};

    #[test]
    fn text_already_sent_that_a_longer_decoding_rewrote_never_splits_a_character() {
        // "a", "中" (bytes 1..4), "€" (4..7), "x": 5 bytes were sent of an earlier decoding
        // whose stand-ins were shorter, so byte 5 now falls inside "€"; what is sent next starts
        // after it.
        let full = "a\u{4E2D}\u{20AC}x";
        assert_eq!(unsent(full, 7, full.len()), 7);
        assert_eq!(unsent(full, 5, full.len()), 7);
        assert!(full.is_char_boundary(unsent(full, 6, full.len())));
        // Never past what may be sent now.
        assert_eq!(unsent(full, 5, 4), 4);
        assert_eq!(unsent("abc", 2, 3), 2);
    }

    #[test]
    fn stop_prefixes_are_held_back() {
        let stops = vec!["\nUser:".to_string()];
        assert_eq!(held_back("Paris.\nUs", &stops), 3);
        assert_eq!(held_back("Paris.", &stops), 0);
    }

    #[test]
    fn a_stop_string_never_matches_a_character_still_arriving() {
        let stops = vec!["\u{FFFD}".to_string(), "b\u{FFFD}".to_string()];
        // "€" is three bytes; after two of them the decoder shows U+FFFD stand-ins.
        assert_eq!(stop_at("ab\u{FFFD}\u{FFFD}", &stops, false), None);
        assert_eq!(stop_at("ab\u{20AC}", &stops, false), None);
        // A U+FFFD that later text follows is final (the bytes were invalid), and so is one on
        // the last token.
        assert_eq!(stop_at("ab\u{FFFD}c", &stops, false), Some(1));
        assert_eq!(stop_at("ab\u{FFFD}", &stops, true), Some(1));
        let plain = vec!["User:".to_string()];
        assert_eq!(stop_at("Hi.\nUser: x", &plain, false), Some(4));
    }
}
