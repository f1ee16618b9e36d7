//! The chat page at `GET /`: static files built into the binary (serve/webui/, its built
//! `dist/` committed), served with a strict Content-Security-Policy (only this server's own
//! scripts, styles and API; no inline script), `nosniff`, and caching by content hash: the page
//! itself is revalidated on every load, and the files it names carry their hash in their names,
//! so browsers keep them for good. `serve --no-webui` leaves `/` unrouted.

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

include!(concat!(env!("OUT_DIR"), "/webui_assets.rs"));

/// The page's policy: its own files and API only, nothing inline, no frames, no forms posted.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

fn file(name: &str) -> Option<&'static [u8]> {
    WEBUI.iter().find(|(n, _)| *n == name).map(|(_, b)| *b)
}

fn content_type(name: &str) -> &'static str {
    match name.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("txt") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

fn respond(name: &str, bytes: &'static [u8], cache: &'static str) -> Response {
    let mut r = bytes.into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(content_type(name)),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

/// `GET /`: the page, revalidated on each load (it names the current files).
pub(super) async fn page() -> Response {
    match file("index.html") {
        Some(b) => respond("index.html", b, "no-cache"),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// `GET /assets/{name}`: a built file, named by its content's hash, cached for good.
pub(super) async fn asset(Path(name): Path<String>) -> Response {
    match file(&name).filter(|_| name != "index.html") {
        Some(b) => respond(&name, b, "public, max-age=31536000, immutable"),
        None => (StatusCode::NOT_FOUND, "no such file").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_names_files_that_are_built_in_and_stays_small() {
        let page = std::str::from_utf8(file("index.html").expect("index.html")).expect("utf-8");
        let mut named = 0;
        for (name, bytes) in WEBUI.iter().filter(|(n, _)| *n != "index.html") {
            assert!(
                page.contains(&format!("/assets/{name}")),
                "{name} is linked"
            );
            assert!(!bytes.is_empty(), "{name}");
            named += 1;
        }
        assert!(named >= 3, "script, style and licences");
        assert!(!page.contains("<script>"), "no inline script");
        let total: usize = WEBUI.iter().map(|(_, b)| b.len()).sum();
        assert!(total < 300 * 1024, "{total} bytes before compression");
    }
}
