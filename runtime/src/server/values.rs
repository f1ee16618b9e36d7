//! Typed reads of one request field, each refusal naming the field.

use serde_json::Value;

use super::error::ApiError;

pub(super) fn int(b: &serde_json::Map<String, Value>, f: &str) -> Result<Option<i64>, ApiError> {
    match b.get(f) {
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

pub(super) fn flag(b: &serde_json::Map<String, Value>, f: &str) -> Result<bool, ApiError> {
    match b.get(f) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(x)) => Ok(*x),
        Some(v) => Err(ApiError::bad(
            f,
            format!("'{f}' must be a boolean, got {v}"),
        )),
    }
}
