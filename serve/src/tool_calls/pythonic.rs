//! Python-style calls, `[get_weather(city="Paris", days=3), stop()]`, as LFM2 writes them: a
//! small recursive-descent reader of Python literals (strings, numbers, `True`/`False`/`None`,
//! lists, tuples, dicts; JSON's `true`/`false`/`null` too), written here because no maintained
//! crate reads Python literals without bringing a Python parser.

use serde_json::{Map, Number, Value};

use super::Call;

/// The calls of a Python list of calls (the brackets may be missing); `None` when it does not
/// read.
pub fn calls(s: &str) -> Option<Vec<Call>> {
    let mut r = Reader { s, i: 0 };
    r.ws();
    let bracketed = r.eat("[");
    let mut out = Vec::new();
    loop {
        r.ws();
        if r.done() || (bracketed && r.peek() == Some(']')) {
            break;
        }
        out.push(r.call()?);
        r.ws();
        if !r.eat(",") {
            break;
        }
    }
    r.ws();
    if bracketed && !r.eat("]") {
        return None;
    }
    r.ws();
    r.done().then_some(out)
}

struct Reader<'a> {
    s: &'a str,
    i: usize,
}

impl Reader<'_> {
    fn rest(&self) -> &str {
        &self.s[self.i..]
    }
    fn done(&self) -> bool {
        self.i >= self.s.len()
    }
    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }
    fn ws(&mut self) {
        let t = self.rest().len() - self.rest().trim_start().len();
        self.i += t;
    }
    fn eat(&mut self, tok: &str) -> bool {
        if self.rest().starts_with(tok) {
            self.i += tok.len();
            true
        } else {
            false
        }
    }
    fn ident(&mut self) -> Option<&str> {
        let start = self.i;
        let n = self
            .rest()
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.' || c == '-'))
            .unwrap_or(self.rest().len());
        self.i += n;
        (n > 0).then(|| &self.s[start..self.i])
    }

    /// Comma-separated `item`s up to `close` (a trailing comma allowed), the opening bracket
    /// already read: a call's arguments, a list's or tuple's values, a dict's entries.
    fn items(&mut self, close: &str, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        loop {
            self.ws();
            if self.eat(close) {
                return Some(());
            }
            item(self)?;
            self.ws();
            if !self.eat(",") {
                self.ws();
                return self.eat(close).then_some(());
            }
        }
    }

    fn call(&mut self) -> Option<Call> {
        let name = self.ident()?.to_string();
        self.ws();
        if !self.eat("(") {
            return None;
        }
        let mut args = Map::new();
        self.items(")", |r| {
            let key = r.ident()?.to_string();
            r.ws();
            if !r.eat("=") {
                return None;
            }
            args.insert(key, r.value()?);
            Some(())
        })?;
        Some(Call {
            name,
            arguments: Value::Object(args).to_string(),
        })
    }

    fn value(&mut self) -> Option<Value> {
        self.ws();
        match self.peek()? {
            '"' | '\'' => self.string().map(Value::String),
            '[' | '(' => {
                let close = if self.eat("[") {
                    "]"
                } else {
                    self.eat("(").then_some(")")?
                };
                let mut items = Vec::new();
                self.items(close, |r| {
                    items.push(r.value()?);
                    Some(())
                })?;
                Some(Value::Array(items))
            }
            '{' => {
                self.eat("{");
                let mut m = Map::new();
                self.items("}", |r| {
                    let k = match r.value()? {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    r.ws();
                    if !r.eat(":") {
                        return None;
                    }
                    m.insert(k, r.value()?);
                    Some(())
                })?;
                Some(Value::Object(m))
            }
            _ => {
                let word = self.ident()?;
                match word {
                    "True" | "true" => Some(Value::Bool(true)),
                    "False" | "false" => Some(Value::Bool(false)),
                    "None" | "null" => Some(Value::Null),
                    w => {
                        if let Ok(i) = w.parse::<i64>() {
                            Some(Value::Number(i.into()))
                        } else {
                            w.parse::<f64>()
                                .ok()
                                .and_then(Number::from_f64)
                                .map(Value::Number)
                        }
                    }
                }
            }
        }
    }

    /// A quoted string with Python's common escapes.
    fn string(&mut self) -> Option<String> {
        let q = self.peek()?;
        self.i += 1;
        let mut out = String::new();
        let mut chars = self.rest().char_indices();
        while let Some((k, c)) = chars.next() {
            match c {
                c if c == q => {
                    self.i += k + 1;
                    return Some(out);
                }
                '\\' => {
                    let (_, e) = chars.next()?;
                    out.push(match e {
                        'n' => '\n',
                        't' => '\t',
                        'r' => '\r',
                        '0' => '\0',
                        other => other,
                    });
                }
                c => out.push(c),
            }
        }
        None
    }
}
