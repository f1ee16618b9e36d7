//! A thinking model's answer split in two, as llama-server's `--reasoning-format deepseek` and
//! vLLM's reasoning parsers return it: the text between `<think>` and `</think>` (the reasoning),
//! and the rest (the content). Templates of Qwen 3, Qwen 3.5, Hunyuan and DeepSeek-R1 teach these
//! tags; some open the block in the prompt itself (the generation prompt ends with `<think>`),
//! so the answer starts inside it.
//!
//! The split works on text as it streams: a tag cut between two pieces is held back until it is
//! complete, so no piece of a tag ever reaches either side. Whitespace around the reasoning, and
//! between `</think>` and the answer, is dropped.

/// The tag that opens a reasoning block.
pub const OPEN: &str = "<think>";
/// The tag that closes it.
pub const CLOSE: &str = "</think>";

/// Whether `template` teaches reasoning blocks.
pub fn template_thinks(template: &str) -> bool {
    template.contains(OPEN) && template.contains(CLOSE)
}

/// Whether a prompt whose text ends in `tail` leaves a reasoning block open, so the answer starts
/// inside it.
pub fn prompt_opens(tail: &str) -> bool {
    tail.trim_end().ends_with(OPEN)
}

/// Text split into its two sides.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parts {
    /// Reasoning text.
    pub reasoning: String,
    /// Answer text.
    pub content: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing seen yet: the answer may open a block.
    Start,
    /// Inside a block; `fresh` until its first non-blank character.
    Thinking { fresh: bool },
    /// After a block, before the answer's first non-blank character.
    AfterBlock,
    /// The answer.
    Answer,
}

/// The split of one answer, fed piece by piece.
#[derive(Clone, Debug)]
pub struct Split {
    state: State,
    /// Text not classified yet: a possible tag's start, or blanks that may end the reasoning.
    held: String,
}

impl Split {
    /// A split for an answer that starts inside a reasoning block (`opened`, the prompt opened
    /// it) or may open one.
    pub fn new(opened: bool) -> Split {
        Split {
            state: if opened {
                State::Thinking { fresh: true }
            } else {
                State::Start
            },
            held: String::new(),
        }
    }

    /// Adds `piece`; returns what can go out on each side now.
    pub fn push(&mut self, piece: &str) -> Parts {
        self.held.push_str(piece);
        let mut out = Parts::default();
        loop {
            match self.state {
                State::Start => {
                    let t = self.held.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.held = rest.to_string();
                        self.state = State::Thinking { fresh: true };
                    } else if t.is_empty() || OPEN.starts_with(t) {
                        return out;
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Thinking { fresh } => {
                    if fresh {
                        let t = self.held.trim_start();
                        if t.is_empty() {
                            self.held.clear();
                            return out;
                        }
                        self.held = t.to_string();
                        self.state = State::Thinking { fresh: false };
                    }
                    if let Some(j) = self.held.find(CLOSE) {
                        out.reasoning.push_str(self.held[..j].trim_end());
                        self.held = self.held[j + CLOSE.len()..].to_string();
                        self.state = State::AfterBlock;
                        continue;
                    }
                    // Hold a possible tag's start, and trailing blanks (they may end the block).
                    let partial = onebit_runtime::generate::held_back(&self.held, &[CLOSE]);
                    let body = &self.held[..self.held.len() - partial];
                    let keep = body.len() - body.trim_end().len() + partial;
                    let at = self.held.len() - keep;
                    out.reasoning.push_str(&self.held[..at]);
                    self.held.drain(..at);
                    return out;
                }
                State::AfterBlock => {
                    let t = self.held.trim_start();
                    if t.is_empty() {
                        self.held.clear();
                        return out;
                    }
                    self.held = t.to_string();
                    self.state = State::Answer;
                }
                State::Answer => {
                    out.content.push_str(&self.held);
                    self.held.clear();
                    return out;
                }
            }
        }
    }

    /// At the end: what was held back. A block never closed (the budget ran out inside it) is
    /// reasoning; a possible tag's start that never completed is content.
    pub fn finish(&mut self) -> Parts {
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Thinking { .. } => Parts {
                reasoning: held.trim_end().to_string(),
                content: String::new(),
            },
            State::AfterBlock => Parts::default(),
            State::Start | State::Answer => Parts {
                reasoning: String::new(),
                content: held,
            },
        }
    }

    /// `text`, a whole answer, split.
    pub fn whole(opened: bool, text: &str) -> Parts {
        let mut s = Split::new(opened);
        let mut p = s.push(text);
        let end = s.finish();
        p.reasoning.push_str(&end.reasoning);
        p.content.push_str(&end.content);
        p
    }
}

#[cfg(test)]
#[path = "think_tests.rs"]
mod tests;
