//! Images through the OpenAI API on the tiny Gemma 3 with its vision tower
//! (`tests/fixtures/towers/gemma3`): `image_url` parts as `data:` URLs in every format the server
//! decodes, the same image reused from the prefix cache and a different one recomputed from its
//! start, a remote URL refused, and a text-only model refusing images by name.

use base64::Engine as _;
use serde_json::{Value, json};

use super::{serve, serve_repo};

fn towers() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/towers/gemma3")
}

fn data_url(file: &std::path::Path, mime: &str) -> String {
    let bytes = std::fs::read(file).expect("image");
    format!(
        "data:{mime};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// The tiny Gemma 3's language model and tower converted into a repository, served with both
/// verified.
fn serve_vlm() -> super::Served {
    let home = tempfile::tempdir().expect("tmp");
    let repo = home.path().join("vlm");
    let gguf = towers().join("model-q4_0.gguf");
    let mmproj = towers().join("mmproj-f16.gguf");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_onebit-pipe"))
        .env("ONEBIT_HOME", home.path().join("home"))
        .arg("convert")
        .arg("--gguf")
        .arg(&gguf)
        .arg("--mmproj")
        .arg(&mmproj)
        .arg("--out")
        .arg(&repo)
        .output()
        .expect("convert");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mmproj = mmproj.to_str().expect("utf8").to_string();
    serve_repo(home, &repo, &gguf, &["--mmproj", &mmproj])
}

fn chat(url: &str, text: &str) -> Value {
    json!({
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": text}
        ]}],
        "max_tokens": 4,
        "temperature": 0
    })
}

#[test]
fn images_in_every_format_answer_and_the_same_image_comes_from_the_prefix_cache() {
    let s = serve_vlm();
    let (_, props) = s.get("/props");
    let props: Value = serde_json::from_slice(&props).expect("props");
    assert_eq!(props["modalities"]["image"], true, "{props}");

    let png = data_url(&towers().join("image.png"), "image/png");
    let text_only = s.post_ok(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Describe it"}], "max_tokens": 4, "temperature": 0}),
    );
    let first = s.post_ok("/v1/chat/completions", &chat(&png, "Describe it"));
    let prompt = |v: &Value| v["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
    assert!(
        prompt(&first) >= prompt(&text_only) + 6,
        "start, 4 image tokens and end more than the text: {first} vs {text_only}"
    );
    // The same image again: its encoding and its positions in the cache are reused.
    let again = s.post_ok("/v1/chat/completions", &chat(&png, "Describe it"));
    assert_eq!(
        again["choices"][0]["message"]["content"],
        first["choices"][0]["message"]["content"]
    );
    let cached = |v: &Value| {
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0)
    };
    assert_eq!(cached(&again), prompt(&first) - 1, "{again}");
    // Another image at the same place: the same tokens, but the cache is reused only up to it.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/images");
    for (file, mime) in [
        ("image.jpg", "image/jpeg"),
        ("image-lossy.webp", "image/webp"),
        ("image-lossless.webp", "image/webp"),
        ("image.gif", "image/gif"),
    ] {
        let v = s.post_ok(
            "/v1/chat/completions",
            &chat(&data_url(&dir.join(file), mime), "Describe it"),
        );
        assert_eq!(prompt(&v), prompt(&first), "{file}");
        assert!(
            cached(&v) < prompt(&first) - 6,
            "{file}: a different image is not reused from the cache: {v}"
        );
    }
}

#[test]
fn remote_image_urls_and_images_for_a_text_only_model_are_refused_by_name() {
    let s = serve_vlm();
    let (status, v) = s.post(
        "/v1/chat/completions",
        &chat("http://169.254.169.254/latest/meta-data", "Describe it"),
    );
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "messages[0].content[0].image_url.url");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("remote image URLs are refused")),
        "{v}"
    );
    let (status, v) = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "a \u{FDD0} slot"}], "max_tokens": 1}),
    );
    assert_eq!(status, 400, "{v}");

    let text = serve(&[]);
    let png = data_url(&towers().join("image.png"), "image/png");
    let (status, v) = text.post("/v1/chat/completions", &chat(&png, "Describe it"));
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "image");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("this model takes text only")),
        "{v}"
    );
}

#[test]
#[ignore = "needs Chromium and Playwright for Python (scripts/test.sh installs them)"]
fn the_chat_page_attaches_drops_sends_and_shows_images_in_a_real_browser() {
    let s = serve_vlm();
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("webui-images");
    let seen = crate::support::python_json(
        "webui_images.py",
        &[
            std::ffi::OsString::from(format!("http://{}", s.addr)),
            crate::support::chromium().into(),
            towers().join("image.png").into(),
            shots.clone().into(),
        ],
    );
    assert_eq!(seen["parts"], json!(["image_url", "text"]), "{seen}");
    let png = std::fs::read(shots.join("webui-image.png")).expect("screenshot");
    assert!(png.starts_with(b"\x89PNG"));
}
