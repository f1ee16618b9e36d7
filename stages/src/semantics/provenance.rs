//! Decisions with their source: every derived quantity prints as `name=value <- source [tag]`, so
//! the log, the tables and the test snapshots share one format (semantics.md §1.1).

use std::fmt;

use serde::{Deserialize, Serialize};

/// One derived decision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// What was decided (`qk_norm`, `rope_base[full]`, `layer_kind[5]`).
    pub name: String,
    /// The value, printed.
    pub value: String,
    /// Where it came from (`config:use_qk_norm`, `default (gemma3)`, `family:hunyuan_v1_dense`).
    pub source: String,
    /// The evidence tag of the rule (`seed #2218`, `hf`, `inferred`), when one applies.
    pub tag: Option<String>,
    /// A FLAG: two sources disagree, or a value needs attention; the decision still stands.
    pub flag: Option<String>,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={} <- {}", self.name, self.value, self.source)?;
        if let Some(t) = &self.tag {
            write!(f, " [{t}]")?;
        }
        if let Some(fl) = &self.flag {
            write!(f, " FLAG: {fl}")?;
        }
        Ok(())
    }
}

/// A refusal: the config asks for something we will not approximate. Names the key, its value and
/// the family.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("refuse: {message}")]
pub struct Refusal {
    /// The key (or tensor) at fault.
    pub key: String,
    /// Its value, printed.
    pub value: String,
    /// The family (`model_type`).
    pub family: String,
    /// The whole sentence.
    pub message: String,
}

impl Refusal {
    /// A refusal with a message naming key, value and family.
    pub fn new(
        family: &str,
        key: &str,
        value: impl fmt::Display,
        message: impl Into<String>,
    ) -> Refusal {
        Refusal {
            key: key.to_string(),
            value: value.to_string(),
            family: family.to_string(),
            message: message.into(),
        }
    }
}
