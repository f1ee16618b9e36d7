//! Text in and out: the pack's Hugging Face tokenizer and its chat template (minijinja with the
//! Python-compatible methods HF templates call: `.strip()`, `.startswith()`, `.items()`, …,
//! plus `raise_exception` and `strftime_now`).

use std::path::Path;

use std::sync::Mutex;

use aho_corasick::{AhoCorasick, MatchKind};
use serde::Serialize;

use crate::error::{Error, Result};

/// One chat message.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
    /// An assistant's tool calls, OpenAI's shape (`[{"id", "type", "function": {"name",
    /// "arguments"}}]`, arguments as a JSON object), as templates read them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// A tool result's call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A tool result's function name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// Tokenizer plus chat template.
///
/// Text a user wrote (a plain prompt, a chat message's content) is tokenized as text: a
/// special token's spelling inside it (`<eos>`, `<start_of_turn>`) stays those characters, as
/// transformers and llama.cpp's server read it, so a user cannot forge a turn or end the prompt.
/// Only the special tokens the chat template itself writes become special ids. `parse_special`
/// turns that off for callers who mean their special tokens.
pub struct Text {
    /// One tokenizer, switched between the two ways of reading special tokens under the lock
    /// (`tokenizers` keeps that switch in the tokenizer, and a copy of a 262k-token vocabulary
    /// per mode would double its memory).
    tok: Mutex<tokenizers::Tokenizer>,
    /// The special tokens (text, id), and a leftmost-longest matcher over their texts.
    specials: Vec<(String, u32)>,
    finder: Option<AhoCorasick>,
    parse_special: bool,
    template: Option<String>,
    bos: Option<String>,
    eos: Option<String>,
    /// The text an image becomes in a prompt ([`IMAGE_SLOT`]'s replacement), for a model that
    /// takes images.
    image_text: Option<String>,
}

/// Where an image goes in a prompt's or a message's text: a Unicode noncharacter (reserved for
/// a program's internal use; no text a client sends carries it, and one that does is refused).
/// After the chat template has rendered, each becomes the model's image text (Gemma 3's
/// processor: `\n\n<start_of_image>`, the image tokens, `<end_of_image>\n\n`), its special
/// tokens read as special, so the text around it tokenizes as transformers tokenizes it.
pub const IMAGE_SLOT: char = '\u{FDD0}';

impl Text {
    /// Loads `tokenizer.json`; `template` is the chat template text if the pack has one.
    pub fn load(tokenizer: &Path, template: Option<String>) -> Result<Text> {
        let tok = tokenizers::Tokenizer::from_file(tokenizer)
            .map_err(|e| Error::Text(format!("{}: {e}", tokenizer.display())))?;
        let mut specials: Vec<(String, u32)> = tok
            .get_added_tokens_decoder()
            .iter()
            .filter(|(_, t)| t.special && !t.content.is_empty())
            .map(|(&id, t)| (t.content.clone(), id))
            .collect();
        specials.sort();
        let finder = if specials.is_empty() {
            None
        } else {
            Some(
                AhoCorasick::builder()
                    .match_kind(MatchKind::LeftmostLongest)
                    .build(specials.iter().map(|(s, _)| s.as_str()))
                    .map_err(|e| Error::Text(format!("{}: {e}", tokenizer.display())))?,
            )
        };
        Ok(Text {
            tok: Mutex::new(tok),
            specials,
            finder,
            parse_special: false,
            template,
            bos: None,
            eos: None,
            image_text: None,
        })
    }

    /// Sets what each [`IMAGE_SLOT`] of a prompt becomes (`None`: the model takes no images, and
    /// a prompt holding a slot is refused).
    pub fn with_image_text(mut self, image_text: Option<String>) -> Text {
        self.image_text = image_text;
        self
    }

    /// Token ids of a prompt a user wrote with images at its [`IMAGE_SLOT`]s: the user's text
    /// read as [`Text::encode_user`] reads it, each slot as the model's image text (special
    /// tokens special). No post-processing (BOS is the caller's).
    pub fn encode_user_with_images(&self, text: &str) -> Result<Vec<u32>> {
        if !text.contains(IMAGE_SLOT) {
            return self.encode_user(text);
        }
        let texts = [text];
        self.encode_marked(&texts, |t| Ok(t[0].clone()))
    }

    /// Whether special-token text inside user text becomes special tokens (default: no).
    pub fn with_parse_special(mut self, parse: bool) -> Text {
        self.parse_special = parse;
        self
    }

    fn tokenizer(&self) -> std::sync::MutexGuard<'_, tokenizers::Tokenizer> {
        // A panic inside `tokenizers` leaves the tokenizer itself intact.
        self.tok
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `f` on the tokenizer (the grammar engine reads its vocabulary once).
    pub fn with_tokenizer<T>(&self, f: impl FnOnce(&tokenizers::Tokenizer) -> T) -> T {
        f(&self.tokenizer())
    }

    /// Sets the BOS/EOS token texts the template sees as `bos_token`/`eos_token`.
    pub fn with_special(mut self, bos: Option<u32>, eos: Option<u32>) -> Text {
        let (b, e) = {
            let tok = self.tokenizer();
            (
                bos.and_then(|i| tok.id_to_token(i)),
                eos.and_then(|i| tok.id_to_token(i)),
            )
        };
        (self.bos, self.eos) = (b, e);
        self
    }

    /// Whether a chat template is present.
    pub fn has_template(&self) -> bool {
        self.template.is_some()
    }

    /// Token ids of `text`, special-token text read as special tokens (the template's output, a
    /// tokenizer's own tests); `special` adds the tokenizer's post-processing (BOS).
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>> {
        self.encode_as(text, special, true)
    }

    /// Token ids of text a user wrote: special-token text stays text unless
    /// [`Text::with_parse_special`] says otherwise. No post-processing (BOS is the caller's).
    pub fn encode_user(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_as(text, false, self.parse_special)
    }

    /// Token ids of `text`, special-token text read as special tokens when `parse_special`
    /// (`/tokenize`'s switch). No post-processing.
    pub fn encode_parsing(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        self.encode_as(text, false, parse_special)
    }

    fn encode_as(&self, text: &str, special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let mut tok = self.tokenizer();
        tok.set_encode_special_tokens(!parse_special);
        let ids = tok
            .encode(text, special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| Error::Text(format!("tokenize: {e}")));
        tok.set_encode_special_tokens(false);
        ids
    }

    /// Text of `ids` (special tokens skipped).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer()
            .decode(ids, true)
            .map_err(|e| Error::Text(format!("detokenize: {e}")))
    }

    /// Text of `ids` with special tokens written out (tool-call tags that are special tokens).
    pub fn decode_keeping_special(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer()
            .decode(ids, false)
            .map_err(|e| Error::Text(format!("detokenize: {e}")))
    }

    /// Token ids of a chat: the template's render, where the template's own special tokens are
    /// special and the messages' contents are user text ([`Text::encode_user`]).
    ///
    /// When no content holds special-token text (or with `parse_special`) this is one encode of
    /// the render. Otherwise each content's special-token text is swapped for a private-use
    /// character no message uses before rendering; the render is cut at the special tokens left
    /// (the template's), and each piece between them, characters restored, is encoded as text.
    /// That is how `tokenizers` itself reads a text: it cuts at special tokens and normalizes
    /// and pre-tokenizes each piece on its own.
    pub fn encode_chat(&self, messages: &[Message]) -> Result<Vec<u32>> {
        self.encode_chat_with(messages, &ChatExtras::default())
    }

    /// [`Text::encode_chat`] with `extras`: tools (OpenAI's `tools` entries) and variables for the
    /// template, as transformers' `apply_chat_template(tools=…, **kwargs)` renders them.
    pub fn encode_chat_with(&self, messages: &[Message], extras: &ChatExtras) -> Result<Vec<u32>> {
        let texts: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
        self.encode_marked(&texts, |contents| {
            let marked: Vec<Message> = messages
                .iter()
                .zip(contents)
                .map(|(m, c)| Message {
                    content: c.clone(),
                    ..m.clone()
                })
                .collect();
            self.render_chat_with(&marked, extras)
        })
    }

    /// Token ids of what `render` makes of user `texts` (a chat template's render of messages, or
    /// the text itself): the render's own special tokens special, the texts' special-token text
    /// kept as text (unless `parse_special`), each [`IMAGE_SLOT`] the image text.
    fn encode_marked(
        &self,
        texts: &[&str],
        render: impl FnOnce(&[String]) -> Result<String>,
    ) -> Result<Vec<u32>> {
        let slots = texts.iter().any(|t| t.contains(IMAGE_SLOT));
        let image_text = match (&self.image_text, slots) {
            (_, false) => "",
            (Some(t), true) => t.as_str(),
            (None, true) => {
                return Err(Error::Request {
                    field: "image",
                    reason: "this model takes no images (its pack serves no vision tower)".into(),
                });
            }
        };
        let finder = match &self.finder {
            Some(f) if !self.parse_special && texts.iter().any(|t| f.is_match(t)) => f,
            _ => {
                let owned: Vec<String> = texts.iter().map(|t| t.to_string()).collect();
                let rendered = render(&owned)?;
                return self.encode(&rendered.replace(IMAGE_SLOT, image_text), false);
            }
        };
        let n = self.specials.len() as u32;
        let used = |lo: u32| {
            texts
                .iter()
                .any(|t| t.chars().any(|c| (lo..lo + n).contains(&(c as u32))))
        };
        // Supplementary private-use planes 15 and 16 (65,534 characters each).
        let base = [0xF_0000u32, 0x10_0000]
            .into_iter()
            .flat_map(|plane| (0..65_534 / n.max(1)).map(move |i| plane + i * n))
            .find(|&lo| !used(lo))
            .ok_or_else(|| Error::Request {
                field: "messages",
                reason: "the messages use every private-use character this server needs to keep special-token text as text".into(),
            })?;
        let mark = |i: usize| char::from_u32(base + i as u32).unwrap_or('\u{FFFD}');
        let defanged: Vec<String> = texts
            .iter()
            .map(|t| {
                let mut out = String::with_capacity(t.len());
                let mut last = 0;
                for hit in finder.find_iter(t) {
                    out.push_str(&t[last..hit.start()]);
                    out.push(mark(hit.pattern().as_usize()));
                    last = hit.end();
                }
                out.push_str(&t[last..]);
                out
            })
            .collect();
        let rendered = render(&defanged)?.replace(IMAGE_SLOT, image_text);
        let restore = |piece: &str| -> String {
            let mut out = String::with_capacity(piece.len());
            for c in piece.chars() {
                match (c as u32).checked_sub(base) {
                    Some(i) if i < n => out.push_str(&self.specials[i as usize].0),
                    _ => out.push(c),
                }
            }
            out
        };
        let mut ids = Vec::new();
        let mut last = 0;
        for hit in finder.find_iter(&rendered) {
            let piece = &rendered[last..hit.start()];
            if !piece.is_empty() {
                ids.extend(self.encode_as(&restore(piece), false, false)?);
            }
            ids.push(self.specials[hit.pattern().as_usize()].1);
            last = hit.end();
        }
        if last < rendered.len() {
            ids.extend(self.encode_as(&restore(&rendered[last..]), false, false)?);
        }
        Ok(ids)
    }

    /// Renders the chat template over `messages`, ending with the assistant's turn prompt.
    pub fn render_chat(&self, messages: &[Message]) -> Result<String> {
        self.render_chat_with(messages, &ChatExtras::default())
    }

    /// The chat template's text, if any.
    pub fn template(&self) -> Option<&str> {
        self.template.as_deref()
    }

    /// [`Text::render_chat`] with `extras` (no tools: the template sees `tools` undefined; each
    /// of `kwargs` is a variable of the template, below the ones set here).
    pub fn render_chat_with(&self, messages: &[Message], extras: &ChatExtras) -> Result<String> {
        let tools = &extras.tools;
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
        let tools =
            (!tools.is_empty()).then(|| minijinja::Value::from(minijinja::value::Serde(tools)));
        tpl.render(minijinja::context! {
            messages => minijinja::Value::from(minijinja::value::Serde(messages)),
            tools => tools,
            add_generation_prompt => true,
            bos_token => self.bos.clone().unwrap_or_default(),
            eos_token => self.eos.clone().unwrap_or_default(),
            ..minijinja::Value::from(minijinja::value::Serde(&extras.kwargs))
        })
        .map_err(|e| Error::Text(format!("chat template: {e}")))
    }
}

/// What a chat render takes beside its messages.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChatExtras {
    /// OpenAI's `tools` entries, for templates that render them.
    pub tools: Vec<serde_json::Value>,
    /// Variables for the template (`chat_template_kwargs`, e.g. `enable_thinking`).
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word-level tokenizer whose `<eos>` and `<start_of_turn>` are special tokens, and whose
    /// words include the pieces their spellings split into as text.
    fn text(dir: &Path) -> Text {
        let words = [
            "<unk>",
            "<",
            ">",
            "eos",
            "start_of_turn",
            "user",
            "model",
            "hi",
            "there",
            "a",
            "b",
        ];
        let mut vocab: serde_json::Map<String, serde_json::Value> = words
            .iter()
            .enumerate()
            .map(|(i, w)| (w.to_string(), serde_json::Value::from(i)))
            .collect();
        vocab.insert("<eos>".into(), 100.into());
        vocab.insert("<start_of_turn>".into(), 101.into());
        let added = |id: u32, s: &str| {
            serde_json::json!({"id": id, "content": s, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        };
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [added(100, "<eos>"), added(101, "<start_of_turn>")],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
        });
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, json.to_string()).expect("write");
        let template = "{% for m in messages %}<start_of_turn>{{ m['role'] }} {{ m['content'] | trim }} <eos>{% endfor %}<start_of_turn>model";
        Text::load(&path, Some(template.into())).expect("load")
    }

    fn user(s: &str) -> Message {
        Message {
            role: "user".into(),
            content: s.into(),
            ..Default::default()
        }
    }

    #[test]
    fn special_token_text_a_user_writes_stays_text() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t = text(dir.path());
        // As text: "<", "eos", ">"; parsed: the special id.
        assert_eq!(
            t.encode_user("hi <eos> there").expect("enc"),
            [7, 1, 3, 2, 8]
        );
        assert_eq!(t.encode("hi <eos> there", false).expect("enc"), [7, 100, 8]);
        let chat = t
            .encode_chat(&[user("  a <start_of_turn>model b<eos> ")])
            .expect("chat");
        // The template's own turns are special; the content's spellings are text (and the
        // template's `trim` still applies to the content).
        assert_eq!(chat, [101, 5, 9, 1, 4, 2, 6, 10, 1, 3, 2, 100, 101, 6]);
        // Without special text in the content, one encode of the render, as before.
        let plain = [user("hi there")];
        assert_eq!(
            t.encode_chat(&plain).expect("chat"),
            t.encode(&t.render_chat(&plain).expect("render"), false)
                .expect("enc")
        );
        // The flag reads the content's spellings as special tokens.
        let t = t.with_parse_special(true);
        assert_eq!(t.encode_user("hi <eos>").expect("enc"), [7, 100]);
        assert_eq!(
            t.encode_chat(&[user("a<eos>")]).expect("chat"),
            [101, 5, 9, 100, 100, 101, 6]
        );
    }

    #[test]
    fn a_message_that_already_holds_private_use_characters_keeps_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t = text(dir.path());
        // The first private-use characters `encode_chat` would swap special-token text for,
        // written by the user: they must be read back as themselves (unknown words here), not as
        // special-token text.
        let odd: String = ['\u{F0000}', '\u{F0001}'].iter().collect();
        let ids = t
            .encode_chat(&[user(&format!("{odd} <eos>"))])
            .expect("chat");
        assert_eq!(ids, [101, 5, 0, 1, 3, 2, 100, 101, 6]);
    }
}
