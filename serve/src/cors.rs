//! Cross-origin requests (`serve --cors-origin`): which browser pages may call the API and read
//! its answers. Off by default, as a page of any origin could otherwise spend the model on a
//! visitor's behalf; `tower-http`'s layer answers the preflight (`OPTIONS`) before routing, so
//! it needs no API key, as browsers send none with a preflight.

use axum::http::{HeaderValue, Method, header};
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

/// Checks one `--cors-origin` value: `*`, or an origin as browsers send it
/// (`scheme://host[:port]`, no path, no trailing slash).
pub fn check_origin(s: &str) -> Result<(), String> {
    if s == "*" {
        return Ok(());
    }
    let rest = s
        .strip_prefix("http://")
        .or_else(|| s.strip_prefix("https://"))
        .ok_or_else(|| format!("'{s}' is not an origin: it must start with http:// or https://"))?;
    if rest.is_empty() || rest.contains('/') {
        return Err(format!(
            "'{s}' is not an origin: scheme://host[:port], without a path or a trailing slash"
        ));
    }
    HeaderValue::from_str(s).map_err(|_| format!("'{s}' is not a valid header value"))?;
    Ok(())
}

/// The layer for these origins; `None` when there are none. Origins that fail [`check_origin`]
/// are left out with a warning (the CLI refuses them before this).
pub fn layer(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let list: Vec<HeaderValue> = origins
            .iter()
            .filter_map(|o| match check_origin(o) {
                Ok(()) => HeaderValue::from_str(o).ok(),
                Err(why) => {
                    tracing::warn!(origin = %o, %why, "CORS origin left out");
                    None
                }
            })
            .collect();
        AllowOrigin::list(list)
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
            // Clients send headers of their own (the `openai` JS client's `x-stainless-*`):
            // whatever the preflight asks for is allowed, as the origin itself was.
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers([header::WARNING])
            .max_age(std::time::Duration::from_secs(600)),
    )
}
