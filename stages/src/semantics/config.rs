//! The shared readers every family reads its config with: key lookup with a record of what was
//! read (so unread keys can be listed), the decision log, and the number format of the log.

use std::cell::RefCell;
use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::provenance::Decision;

/// The parsed config with a record of the keys read, so unread keys can be listed.
pub(crate) struct Cfg<'a> {
    pub(crate) top: &'a Map<String, Value>,
    pub(crate) text: Option<&'a Map<String, Value>>,
    pub(crate) read: RefCell<BTreeSet<String>>,
}

impl<'a> Cfg<'a> {
    /// A reader over `top`, looking into its `text_config` for keys the top level lacks.
    pub(crate) fn new(top: &'a Map<String, Value>) -> Self {
        Cfg {
            top,
            text: top.get("text_config").and_then(Value::as_object),
            read: RefCell::default(),
        }
    }

    /// Looks a text key up at the top level, then in `text_config`; JSON null is absent.
    pub(crate) fn get(&self, key: &str) -> Option<(&'a Value, String)> {
        self.read.borrow_mut().insert(key.to_string());
        if let Some(v) = self.top.get(key).filter(|v| !v.is_null()) {
            return Some((v, format!("config:{key}")));
        }
        self.text
            .and_then(|t| t.get(key))
            .filter(|v| !v.is_null())
            .map(|v| (v, format!("config:text_config.{key}")))
    }

    /// A non-negative integer (an integral float counts), with its source.
    pub(crate) fn u64(&self, key: &str) -> Option<(u64, String)> {
        let (v, s) = self.get(key)?;
        v.as_u64()
            .or_else(|| {
                v.as_f64()
                    .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                    .map(|f| f as u64)
            })
            .map(|n| (n, s))
    }

    /// A number, with its source.
    pub(crate) fn f64(&self, key: &str) -> Option<(f64, String)> {
        let (v, s) = self.get(key)?;
        v.as_f64().map(|n| (n, s))
    }

    /// A boolean, with its source.
    pub(crate) fn bool(&self, key: &str) -> Option<(bool, String)> {
        let (v, s) = self.get(key)?;
        v.as_bool().map(|b| (b, s))
    }

    /// A string, with its source.
    pub(crate) fn str(&self, key: &str) -> Option<(&'a str, String)> {
        let (v, s) = self.get(key)?;
        v.as_str().map(|b| (b, s))
    }
}

/// Accumulates decisions, in the order the log prints them.
pub(crate) struct Log {
    pub(crate) decisions: Vec<Decision>,
}

impl Log {
    /// Records `name=value <- source [tag]`.
    pub(crate) fn add(
        &mut self,
        name: &str,
        value: impl ToString,
        source: impl Into<String>,
        tag: Option<&str>,
    ) {
        self.decisions.push(Decision {
            name: name.to_string(),
            value: value.to_string(),
            source: source.into(),
            tag: tag.map(str::to_string),
            flag: None,
        });
    }

    /// FLAGs the last decision.
    pub(crate) fn flag(&mut self, flag: impl Into<String>) {
        if let Some(d) = self.decisions.last_mut() {
            d.flag = Some(flag.into());
        }
    }
}

/// What a family's rules are handed: the config reader, the decision log, and the `model_type`
/// read (every source string names it).
pub(crate) struct Cx<'c, 'a> {
    /// The config.
    pub(crate) cfg: &'c Cfg<'a>,
    /// The decisions so far.
    pub(crate) log: &'c mut Log,
    /// The `model_type` read, after unwrapping multimodal wrappers.
    pub(crate) mt: &'c str,
}

impl Cx<'_, '_> {
    /// The source of a family default: `default (MT): config omits KEY`.
    pub(crate) fn omits(&self, key: &str) -> String {
        format!("default ({}): config omits {key}", self.mt)
    }
}

/// A number as the log prints it: integers without a point, others to six places, trimmed.
pub(crate) fn fmt_f(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        let s = format!("{v:.6}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}
