//! One choice's answer on its way to the client: its reasoning split from its content
//! ([`crate::think`]), tool calls read from the content ([`crate::tool_calls`]), and the
//! log-probabilities not sent yet. A stream feeds it piece by piece; a whole reply feeds it once.

use crate::think::Split;
use crate::tool_calls::{Call, Format, Tool, call_start, parse_calls};
use onebit_runtime::logprobs::TokenLogprob;

/// What can go out of an answer now, on each side.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Out {
    /// Reasoning text (`reasoning_content`).
    pub reasoning: String,
    /// Answer text (`content`).
    pub content: String,
}

/// One choice's answer so far.
pub(super) struct Answer {
    split: Option<Split>,
    calls: Option<(Format, Vec<Tool>)>,
    held: Held,
    lps: Pending,
}

impl Answer {
    /// An answer split when `think` is `Some(opened)` (`opened`: the prompt opened a reasoning
    /// block), read for calls in `calls`' format.
    pub fn new(think: Option<bool>, calls: Option<(Format, Vec<Tool>)>) -> Answer {
        Answer {
            split: think.map(Split::new),
            calls,
            held: Held::default(),
            lps: Pending::default(),
        }
    }

    /// Adds `piece`; returns what can go out now.
    pub fn push(&mut self, piece: &str) -> Out {
        let (reasoning, content) = match &mut self.split {
            Some(s) => {
                let p = s.push(piece);
                (p.reasoning, p.content)
            }
            None => (String::new(), piece.to_string()),
        };
        let content = match &self.calls {
            Some((format, _)) if !content.is_empty() => self.held.push(*format, &content),
            _ => content,
        };
        Out { reasoning, content }
    }

    /// At the end: what was held back, and the calls the content holds.
    pub fn finish(&mut self) -> (Out, Vec<Call>) {
        let (reasoning, tail) = match &mut self.split {
            Some(s) => {
                let p = s.finish();
                (p.reasoning, p.content)
            }
            None => (String::new(), String::new()),
        };
        match &self.calls {
            Some((format, tools)) => {
                let mut content = self.held.push(*format, &tail);
                let (rest, calls) = self.held.finish(*format, tools);
                content.push_str(&rest);
                (Out { reasoning, content }, calls)
            }
            None => (
                Out {
                    reasoning,
                    content: tail,
                },
                Vec::new(),
            ),
        }
    }

    /// A whole answer read at once: its reasoning, its content (without the calls) and calls.
    pub fn whole(mut self, text: &str) -> (Out, Vec<Call>) {
        let first = self.push(text);
        let (last, calls) = self.finish();
        let mut content = first.content + &last.content;
        if !calls.is_empty() {
            content = content.trim().to_string();
        }
        let out = Out {
            reasoning: first.reasoning + &last.reasoning,
            content,
        };
        (out, calls)
    }

    /// Keeps a token's log-probability until the text it adds goes out.
    pub fn logprob(&mut self, l: TokenLogprob) {
        self.lps.entries.push(l);
    }

    /// The log-probabilities to send with the next chunk, and where their text starts in the
    /// answer.
    pub fn take_logprobs(&mut self) -> (Vec<TokenLogprob>, usize) {
        let p = &mut self.lps;
        let at = p.sent_bytes;
        p.sent_bytes += p.entries.iter().map(|e| e.piece.len()).sum::<usize>();
        (std::mem::take(&mut p.entries), at)
    }
}

/// Log-probabilities of a stream not sent yet, and the answer's bytes they follow.
#[derive(Default)]
struct Pending {
    entries: Vec<TokenLogprob>,
    sent_bytes: usize,
}

/// A tool request's content so far, and how much of it went out.
#[derive(Default)]
struct Held {
    all: String,
    sent: usize,
}

impl Held {
    /// Adds `piece`; returns the content that can go out now, everything before where a call
    /// may begin.
    fn push(&mut self, format: Format, piece: &str) -> String {
        self.all.push_str(piece);
        let safe = call_start(format, &self.all)
            .unwrap_or(self.all.len())
            .max(self.sent);
        let out = self.all[self.sent..safe].to_string();
        self.sent = safe;
        out
    }

    /// At the end: the content not sent yet, and the calls the answer holds. A generic answer
    /// without calls is its `response` text.
    fn finish(&self, format: Format, tools: &[Tool]) -> (String, Vec<Call>) {
        let out = parse_calls(format, &self.all, tools);
        if out.calls.is_empty() {
            if format == Format::Generic {
                return (out.content, Vec::new());
            }
            return (self.all[self.sent..].to_string(), Vec::new());
        }
        let at = call_start(format, &self.all)
            .unwrap_or(self.sent)
            .max(self.sent);
        (self.all[self.sent..at].trim_end().to_string(), out.calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hermes() -> Option<(Format, Vec<Tool>)> {
        Some((
            Format::Hermes,
            vec![Tool {
                name: "f".into(),
                parameters: serde_json::json!({"type": "object"}),
            }],
        ))
    }

    #[test]
    fn reasoning_content_and_calls_come_apart_streamed_or_whole() {
        let text = "<think>\nneed f\n</think>\n\nCalling.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
        let (whole, calls) = Answer::new(Some(false), hermes()).whole(text);
        assert_eq!(whole.reasoning, "need f");
        assert_eq!(whole.content, "Calling.");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].arguments, "{\"a\":1}");
        let mut a = Answer::new(Some(false), hermes());
        let mut streamed = Out::default();
        for c in text.chars() {
            let o = a.push(&c.to_string());
            streamed.reasoning.push_str(&o.reasoning);
            streamed.content.push_str(&o.content);
        }
        let (o, calls2) = a.finish();
        streamed.reasoning.push_str(&o.reasoning);
        streamed.content.push_str(&o.content);
        assert_eq!(streamed.reasoning, whole.reasoning);
        assert_eq!(streamed.content.trim(), whole.content);
        assert_eq!(calls2, calls);
    }

    #[test]
    fn a_generic_answer_is_its_response_or_its_calls() {
        let generic = Some((Format::Generic, Vec::new()));
        let (o, calls) = Answer::new(None, generic.clone()).whole(r#"{"response": "Hi."}"#);
        assert_eq!((o.content.as_str(), calls.len()), ("Hi.", 0));
        let mut a = Answer::new(None, generic);
        assert_eq!(a.push(r#"{"tool_calls": [{"name": "f", "#), Out::default());
        assert_eq!(a.push(r#""arguments": {}}]}"#), Out::default());
        let (o, calls) = a.finish();
        assert_eq!((o.content.as_str(), calls.len()), ("", 1));
    }
}
