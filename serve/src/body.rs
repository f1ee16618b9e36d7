//! Reading a request body within `--max-body`: an oversized body is drained (up to a cap) so the
//! client reads the 413 instead of a reset connection.

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use futures::StreamExt;

use super::api::ApiError;

/// Beyond this many bytes an oversized body is no longer drained before the 413 (the connection
/// is closed instead).
const DRAIN_CAP: u64 = 64 << 20;

pub(super) async fn read_body(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
) -> Result<Vec<u8>, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_big = |n: u64| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!(
                "the request body is {n} bytes; this server takes at most {limit} (--max-body)"
            ),
        )
        .with_code("request_too_large")
    };
    if let Some(n) = declared
        && n > DRAIN_CAP
    {
        return Err(too_big(n));
    }
    let mut data = body.into_data_stream();
    let mut buf = Vec::new();
    let mut seen = 0u64;
    while let Some(chunk) = data.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                format!("cannot read the request body: {e}"),
            )
        })?;
        seen += chunk.len() as u64;
        if seen <= limit as u64 {
            buf.extend_from_slice(&chunk);
        } else if seen > DRAIN_CAP {
            break;
        }
    }
    if seen > limit as u64 {
        return Err(too_big(declared.unwrap_or(seen)));
    }
    Ok(buf)
}
