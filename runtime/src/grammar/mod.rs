//! Constrained decoding: a grammar compiled from a JSON schema (structured outputs) or from a
//! tool-call format masks, before each token is sampled, every token that cannot continue a text
//! the grammar accepts; the model's end-of-sequence tokens are allowed only once the text is
//! complete. The grammar engine is `llguidance`, the one llama.cpp and vLLM use: it computes a
//! mask over a 262k-token vocabulary in tens of microseconds from a token trie, so the mask costs
//! a small fraction of a decode step (measured in `docs/benchmarks.md`).
//!
//! [`Grammars`] builds the engine's view of the vocabulary once, on the first constrained request
//! (a request without a grammar never pays for it); [`Constraint`] is one request's matcher.

mod numbers;
mod objects;
mod vocab;
mod walk;

pub use vocab::token_pieces;

use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::text::Text;
use onebit_kernels::head::forbid_outside;

/// What a constrained answer must be.
#[derive(Clone, Debug, PartialEq)]
pub enum Spec {
    /// A JSON value matching this JSON schema.
    JsonSchema(Value),
    /// Text matching this Lark grammar (`%json{…}` embeds a schema).
    Lark(String),
}

impl Spec {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    pub fn json_object() -> Spec {
        Spec::JsonSchema(json!({"type": "object"}))
    }

    fn grammar(&self) -> TopLevelGrammar {
        match self {
            Spec::JsonSchema(schema) => TopLevelGrammar::from_json_schema(engine_schema(schema)),
            Spec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        }
    }
}

/// `schema` as the grammar engine gets it: numbers of bounded length ([`numbers`]), objects that
/// list their properties closed to others ([`objects`]), and compact
/// JSON with one space after ',' and ':' unless the schema says otherwise (free whitespace lets a
/// small model pad an answer with newlines until its budget runs out).
pub fn engine_schema(schema: &Value) -> Value {
    let mut schema = schema.clone();
    numbers::bound_numbers(&mut schema);
    objects::close_objects(&mut schema);
    if let Value::Object(o) = &mut schema
        && !o.contains_key("x-guidance")
    {
        o.insert("x-guidance".into(), json_layout());
    }
    schema
}

/// The JSON layout every schema and tool call is generated in (`llguidance`'s compile options).
pub fn json_layout() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// The grammar engine over one model's vocabulary, built on first use.
pub struct Grammars {
    vocab: usize,
    eos: Vec<u32>,
    factory: OnceLock<std::result::Result<Arc<ParserFactory>, String>>,
}

impl Grammars {
    /// For a model with `vocab` logit rows whose end-of-sequence ids are `eos`.
    pub fn new(vocab: usize, eos: &[u32]) -> Grammars {
        Grammars {
            vocab,
            eos: eos.to_vec(),
            factory: OnceLock::new(),
        }
    }

    fn factory(&self, text: &Text) -> Result<Arc<ParserFactory>> {
        self.factory
            .get_or_init(|| {
                let t0 = std::time::Instant::now();
                let env = text
                    .with_tokenizer(|tok| vocab::tok_env(tok, self.vocab, &self.eos))
                    .map_err(|e| e.to_string())?;
                let mut f = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
                f.quiet();
                tracing::info!(
                    ms = t0.elapsed().as_millis() as u64,
                    tokens = self.vocab,
                    "grammar engine ready"
                );
                Ok(Arc::new(f))
            })
            .clone()
            .map_err(|e| Error::Text(format!("cannot build the grammar engine: {e}")))
    }

    /// Compiles `spec` into a fresh matcher. `field` names the request field the spec came from:
    /// a schema the engine cannot compile (an unsupported keyword, a `$ref` outside the schema)
    /// is refused under that name, with the engine's reason.
    pub fn compile(&self, text: &Text, spec: &Spec, field: &'static str) -> Result<Constraint> {
        let factory = self.factory(text)?;
        let parser = factory
            .create_parser(spec.grammar())
            .map_err(|e| Error::Request {
                field,
                reason: format!("cannot be enforced: {e}"),
            })?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(Error::Request {
                field,
                reason: format!("cannot be enforced: {e}"),
            });
        }
        Ok(Constraint {
            matcher,
            spec: spec.clone(),
            allowed: None,
            eos: self.eos.clone(),
        })
    }
}

/// One request's grammar state: which tokens may come next.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    spec: Spec,
    /// The tokens allowed next, once computed for the current state.
    allowed: Option<Arc<[u32]>>,
    /// The model's end-of-sequence ids.
    eos: Vec<u32>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl Constraint {
    /// Sets every logit the grammar forbids next to −∞ (rows past the vocabulary the grammar
    /// knows are forbidden too).
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        let allowed = self.allowed()?;
        forbid_outside(&allowed, logits);
        Ok(())
    }

    /// The tokens the grammar allows next, a bit per token id (32 a word). Computed once per
    /// state: the model's head reads it to rank only allowed tokens, then [`Constraint::mask`]
    /// applies it to the logits.
    pub fn allowed(&mut self) -> Result<Arc<[u32]>> {
        if let Some(a) = &self.allowed {
            return Ok(a.clone());
        }
        let mask = self.matcher.compute_mask().map_err(|e| self.failed(e))?;
        let mut words = mask.as_slice().to_vec();
        // The end of the answer only where the grammar's text is complete: the engine's mask
        // can let an end-of-sequence token through inside an open lexeme (a bare string).
        if !self.matcher.is_accepting().map_err(|e| self.failed(e))? {
            for &e in &self.eos {
                if let Some(w) = words.get_mut(e as usize / 32) {
                    *w &= !(1 << (e % 32));
                }
            }
        }
        let a: Arc<[u32]> = words.into();
        self.allowed = Some(a.clone());
        Ok(a)
    }

    /// Advances past the sampled `token`.
    pub fn accept(&mut self, token: u32) -> Result<()> {
        self.allowed = None;
        self.matcher
            .consume_token(token)
            .map_err(|e| self.failed(e))
    }

    /// Whether the grammar can take no further token (its text is complete and nothing may
    /// follow), so generation ends here.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// The engine's error, if it stopped on one.
    pub fn error(&self) -> Option<String> {
        self.matcher.get_error()
    }

    fn failed(&self, e: impl std::fmt::Display) -> Error {
        Error::Internal(format!("the grammar engine failed on {:?}: {e}", self.spec))
    }
}
