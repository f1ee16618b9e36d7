//! The chat page at `/`: its headers (a strict Content-Security-Policy, `nosniff`, caching by
//! content hash), `--no-webui`, and the page itself in a real browser
//! (`tests/support/webui_browser.py`: Playwright driving Debian's Chromium).

use std::path::Path;

use super::{exchange, serve};
use crate::support::chromium;

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

#[test]
fn the_page_and_its_files_come_with_a_strict_policy_and_hashed_names() {
    let s = serve(&["--api-key", "k"]);
    // The page is static: no key needed to load it (its API calls need one).
    let (st, head, body) = exchange(s.addr, "GET / HTTP/1.1\r\n", b"");
    assert_eq!(st, 200);
    let page = String::from_utf8(body).expect("utf-8");
    let csp = header(&head, "content-security-policy").expect("CSP");
    for part in [
        "default-src 'none'",
        "script-src 'self'",
        "connect-src 'self'",
    ] {
        assert!(csp.contains(part), "{csp}");
    }
    assert!(
        !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
        "{csp}"
    );
    assert_eq!(header(&head, "x-content-type-options"), Some("nosniff"));
    assert_eq!(header(&head, "cache-control"), Some("no-cache"));
    assert!(!page.contains("<script>"), "no inline script");
    // Every file the page names is served, cached for good, with its type.
    let mut files = 0;
    for name in page
        .split("/assets/")
        .skip(1)
        .filter_map(|r| r.split('"').next())
    {
        let (st, head, body) = exchange(s.addr, &format!("GET /assets/{name} HTTP/1.1\r\n"), b"");
        assert_eq!(st, 200, "{name}");
        assert!(!body.is_empty(), "{name}");
        assert_eq!(
            header(&head, "cache-control"),
            Some("public, max-age=31536000, immutable"),
            "{name}"
        );
        let ty = header(&head, "content-type").unwrap_or_default();
        let want = match name.rsplit('.').next() {
            Some("js") => "text/javascript",
            Some("css") => "text/css",
            _ => "text/plain",
        };
        assert!(ty.starts_with(want), "{name}: {ty}");
        files += 1;
    }
    assert!(files >= 3, "script, style, licences: {page}");
    let (st, _) = s.get("/assets/nope.js");
    assert_eq!(st, 404);
    // The API is unchanged, and still needs the key.
    let (st, _) = s.get("/v1/models");
    assert_eq!(st, 401);
    // Off: `/` is an unknown route like any other.
    let off = serve(&["--no-webui"]);
    assert_eq!(off.get("/").0, 404);
    assert_eq!(off.get("/v1/models").0, 200);
}

#[test]
#[ignore = "needs Chromium and Playwright for Python (scripts/test.sh installs them)"]
fn the_chat_page_works_in_a_real_browser() {
    let s = serve(&["--api-key", "browser-key"]);
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("webui-screenshots");
    let seen = crate::support::python_json(
        "webui_browser.py",
        &[
            std::ffi::OsString::from(format!("http://{}", s.addr)),
            "browser-key".into(),
            chromium().into(),
            shots.clone().into(),
        ],
    );
    eprintln!("{seen}");
    assert_eq!(
        seen["screenshots"].as_array().map(Vec::len),
        Some(4),
        "{seen}"
    );
    for name in ["webui-1280.png", "webui-360.png"] {
        let png = std::fs::read(shots.join(name)).expect("screenshot");
        assert!(png.starts_with(b"\x89PNG"), "{name}");
    }
}
