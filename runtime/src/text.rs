//! Text in and out: the pack's Hugging Face tokenizer and its chat template (minijinja with the
//! Python-compatible methods HF templates call: `.strip()`, `.startswith()`, `.items()`, …,
//! plus `raise_exception` and `strftime_now`).

use std::path::Path;

use serde::Serialize;

use crate::error::{Error, Result};

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

/// Tokenizer plus chat template.
pub struct Text {
    tok: tokenizers::Tokenizer,
    template: Option<String>,
    bos: Option<String>,
    eos: Option<String>,
}

impl Text {
    /// Loads `tokenizer.json`; `template` is the chat template text if the pack has one.
    pub fn load(tokenizer: &Path, template: Option<String>) -> Result<Text> {
        let tok = tokenizers::Tokenizer::from_file(tokenizer)
            .map_err(|e| Error::Text(format!("{}: {e}", tokenizer.display())))?;
        Ok(Text {
            tok,
            template,
            bos: None,
            eos: None,
        })
    }

    /// Sets the BOS/EOS token texts the template sees as `bos_token`/`eos_token`.
    pub fn with_special(mut self, bos: Option<u32>, eos: Option<u32>) -> Text {
        self.bos = bos.and_then(|i| self.tok.id_to_token(i));
        self.eos = eos.and_then(|i| self.tok.id_to_token(i));
        self
    }

    /// Whether a chat template is present.
    pub fn has_template(&self) -> bool {
        self.template.is_some()
    }

    /// Token ids of `text`; `special` adds the tokenizer's post-processing (BOS).
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>> {
        self.tok
            .encode(text, special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| Error::Text(format!("tokenize: {e}")))
    }

    /// Text of `ids` (special tokens skipped).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tok
            .decode(ids, true)
            .map_err(|e| Error::Text(format!("detokenize: {e}")))
    }

    /// The text of one token as the vocabulary spells it.
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.tok.id_to_token(id)
    }

    /// Renders the chat template over `messages`, ending with the assistant's turn prompt.
    pub fn render_chat(&self, messages: &[Message]) -> Result<String> {
        let t = self.template.as_deref().ok_or_else(|| {
            Error::Text("this pack has no chat template; use a plain prompt".into())
        })?;
        let mut env = minijinja::Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_function("strftime_now", |_fmt: String| -> String {
            // Templates use it for "today's date" in system prompts; a fixed date keeps renders
            // reproducible.
            "01 Jan 2026".to_string()
        });
        env.add_template("chat", t)
            .map_err(|e| Error::Text(format!("chat template: {e}")))?;
        let tpl = env
            .get_template("chat")
            .map_err(|e| Error::Text(format!("chat template: {e}")))?;
        tpl.render(minijinja::context! {
            messages => minijinja::Value::from(
                messages
                    .iter()
                    .map(|m| {
                        minijinja::Value::from(std::collections::BTreeMap::from([
                            ("role".to_string(), minijinja::Value::from(m.role.clone())),
                            ("content".to_string(), minijinja::Value::from(m.content.clone())),
                        ]))
                    })
                    .collect::<Vec<_>>(),
            ),
            add_generation_prompt => true,
            bos_token => self.bos.clone().unwrap_or_default(),
            eos_token => self.eos.clone().unwrap_or_default(),
        })
        .map_err(|e| Error::Text(format!("chat template: {e}")))
    }
}
