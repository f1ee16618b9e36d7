//! A request body's fields, read once for every route: the body parsed as a JSON object, the
//! fields the route does not read refused by name (or dropped with `--lenient`), then typed reads
//! that name the field in every refusal.

use axum::http::StatusCode;
use serde_json::{Map, Value};

use super::error::ApiError;

/// The fields a route reads, and how it words the refusal of another.
pub(crate) struct Route {
    /// Its fields, in lists (the completion routes share one).
    pub fields: &'static [&'static [&'static str]],
    /// The refusal's wording.
    pub unknown: Unknown,
}

/// How a route words the refusal of a field it does not read.
pub(crate) enum Unknown {
    /// The completion routes: ignoring the field would change the answer.
    ChangesAnswer,
    /// The small routes: the refusal lists what the route reads.
    ListsFields,
}

impl Route {
    fn reads(&self, field: &str) -> bool {
        self.fields.iter().any(|l| l.contains(&field))
    }

    fn refuse(&self, k: &str) -> ApiError {
        let reason = match self.unknown {
            Unknown::ChangesAnswer => format!(
                "unknown field '{k}': this server does not read it, and ignoring it would change the answer you asked for"
            ),
            Unknown::ListsFields => format!(
                "unknown field '{k}' (this route reads {})",
                self.fields.concat().join(", ")
            ),
        };
        ApiError::bad(k.to_string(), reason)
    }
}

/// Parses a body as JSON, saying where it broke.
pub fn json_body(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("the body is not valid JSON: {e}"),
        )
        .with_code("invalid_json")
    })?;
    match v {
        Value::Object(m) => Ok(m),
        _ => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "the body must be a JSON object",
        )
        .with_code("invalid_json")),
    }
}

/// A request's fields, every one of them read by its route.
#[derive(Clone, Debug)]
pub(crate) struct Fields {
    map: Map<String, Value>,
}

impl Fields {
    /// The body `bytes` as `route`'s fields; with `lenient`, the fields it does not read are
    /// dropped and returned instead of refused.
    pub fn read(
        bytes: &[u8],
        route: &Route,
        lenient: bool,
    ) -> Result<(Fields, Vec<String>), ApiError> {
        Fields::checked(json_body(bytes)?, route, lenient)
    }

    /// [`Fields::read`] on a parsed body.
    pub fn checked(
        mut map: Map<String, Value>,
        route: &Route,
        lenient: bool,
    ) -> Result<(Fields, Vec<String>), ApiError> {
        let unknown: Vec<String> = map.keys().filter(|k| !route.reads(k)).cloned().collect();
        if !lenient && let Some(k) = unknown.first() {
            return Err(route.refuse(k));
        }
        for k in &unknown {
            map.remove(k);
        }
        Ok((Fields { map }, unknown))
    }

    /// The raw value of `f`, `null` included.
    pub fn get(&self, f: &str) -> Option<&Value> {
        self.map.get(f)
    }

    /// An integer field (`None`: absent or null); integers past `i64` saturate.
    pub fn int(&self, f: &str) -> Result<Option<i64>, ApiError> {
        match self.get(f) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => Ok(Some(i)),
                (None, Some(u)) => Ok(Some(i64::try_from(u).unwrap_or(i64::MAX))),
                _ => Err(ApiError::bad(
                    f,
                    format!("'{f}' must be an integer, got {n}"),
                )),
            },
            Some(v) => Err(ApiError::bad(
                f,
                format!("'{f}' must be an integer, got {v}"),
            )),
        }
    }

    /// A number field (`None`: absent or null).
    pub fn num(&self, f: &str) -> Result<Option<f64>, ApiError> {
        match self.get(f) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(v) => Err(ApiError::bad(f, format!("'{f}' must be a number, got {v}"))),
        }
    }

    /// A boolean field, `default` when absent or null.
    pub fn flag(&self, f: &str, default: bool) -> Result<bool, ApiError> {
        match self.get(f) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(x)) => Ok(*x),
            Some(v) => Err(ApiError::bad(
                f,
                format!("'{f}' must be a boolean, got {v}"),
            )),
        }
    }

    /// Refuses `f` when it is set to a value `ok` rejects: a field read only for the one value
    /// this server can honour.
    pub fn only_if(&self, f: &str, ok: impl Fn(&Value) -> bool) -> Result<(), ApiError> {
        match self.get(f) {
            Some(v) if !v.is_null() && !ok(v) => Err(ApiError::bad(
                f,
                format!("'{f}' = {v} is not supported by this server"),
            )),
            _ => Ok(()),
        }
    }
}
