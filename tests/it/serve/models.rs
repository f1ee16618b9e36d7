//! `serve` with no pack: every pack of the store, each loaded on its first request and unloaded
//! for `--models-max`, for `--keep-alive` or on request; the short names, the refusals (unknown,
//! unverified, ambiguous), Ollama's API through its own Python client, `list`, `rm` and `ps`, and
//! answers equal to a one-model server's while four clients use two models at once.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Served, fixture, serve_repo};
use crate::support;

/// A ChatML template, so the chat routes have one.
const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}\
                      {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// A store under `home` holding `chat` (llama-q41 with the template), `llama-q40` and
/// `llama-q80` (whose verification fails: its converter broke it).
fn store(home: &Path) {
    let chat = home.join("repos/chat");
    std::fs::create_dir_all(&chat).expect("mkdir");
    for f in ["config.json", "model.q4nx", "tokenizer.json"] {
        std::fs::copy(fixture("llama-q41").join(f), chat.join(f)).expect("copy");
    }
    std::fs::write(chat.join("chat_template.jinja"), CHATML).expect("template");
    let store = home.join("home");
    let gguf = |c: &str| fixture(c).join("model.gguf");
    for (repo, reference) in [
        (chat.clone(), gguf("llama-q41")),
        (fixture("llama-q40"), gguf("llama-q40")),
        (fixture("llama-q80"), gguf("llama-q80")),
    ] {
        let out = support::run_in(
            &store,
            &[
                "-q",
                "run",
                "--path",
                &repo.to_string_lossy(),
                "--reference",
                &reference.to_string_lossy(),
            ],
        );
        // llama-q80 is refused (exit 1) and still listed.
        assert!(
            out.status.code().is_some_and(|c| c <= 1),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `serve` with no pack over the store at `home/home`, with `extra`.
fn serve_store(home: tempfile::TempDir, extra: &[&str]) -> Served {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_onebit-pipe"));
    cmd.env("ONEBIT_HOME", home.path().join("home"))
        .args(["serve", "--port", "0"])
        .args(extra);
    let (child, addr) = support::spawn_server(cmd);
    Served {
        child,
        addr,
        _home: home,
    }
}

impl Served {
    /// Each model's id and `status.value` from `/v1/models`.
    fn states(&self) -> Vec<(String, String)> {
        let (st, b) = self.get("/v1/models");
        assert_eq!(st, 200);
        let v: Value = serde_json::from_slice(&b).expect("json");
        v["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|m| {
                (
                    m["id"].as_str().unwrap_or_default().to_string(),
                    m["status"]["value"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
            .collect()
    }

    fn state(&self, id: &str) -> String {
        self.states()
            .into_iter()
            .find(|(i, _)| i == id)
            .map(|(_, s)| s)
            .unwrap_or_default()
    }
}

fn greedy(model: &str) -> Value {
    json!({"model": model, "prompt": "hello", "max_tokens": 8, "temperature": 0})
}

#[test]
fn the_stores_packs_load_on_demand_and_unload_for_room_idleness_or_request() {
    let home = tempfile::tempdir().expect("tmp");
    store(home.path());
    let s = serve_store(home, &["--models-max", "1", "--keep-alive", "2s"]);
    let listed = s.states();
    assert_eq!(
        listed,
        [
            ("local/chat".to_string(), "unloaded".to_string()),
            ("local/llama-q40".into(), "unloaded".into()),
            ("local/llama-q80".into(), "unloaded".into()),
        ]
    );
    let (_, b) = s.get("/v1/models");
    let v: Value = serde_json::from_slice(&b).expect("json");
    let q80 = &v["data"][2];
    assert_eq!(q80["verification"]["verified"], false, "{q80}");
    assert_eq!(q80["short_name"], "llama-q80");
    assert!(q80["size"].as_u64().is_some_and(|b| b > 500_000), "{q80}");

    // By short name, then by id: the first is unloaded for the second (--models-max 1).
    let a = s.post_ok("/v1/completions", &greedy("chat"));
    assert_eq!(a["model"], "local/chat");
    let b = s.post_ok("/v1/completions", &greedy("local/llama-q40"));
    assert_eq!(b["model"], "local/llama-q40");
    assert_eq!(s.state("local/chat"), "unloaded");
    assert_eq!(s.state("local/llama-q40"), "loaded");
    // Ollama's `:latest` tag and case do not matter.
    s.post_ok("/v1/completions", &greedy("LLAMA-Q40:latest"));

    // The refusals: unverified, unknown (listing what exists), no model among several.
    let (st, e) = s.post("/v1/completions", &greedy("llama-q80"));
    assert_eq!(st, 403, "{e}");
    assert_eq!(e["error"]["code"], "model_unverified");
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("--allow-unverified"))
    );
    let (st, e) = s.post("/v1/completions", &greedy("nope"));
    assert_eq!(st, 404, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("local/llama-q40") && m.contains("local/chat")),
        "{e}"
    );
    let (st, e) = s.post(
        "/v1/completions",
        &json!({"prompt": "hello", "max_tokens": 2}),
    );
    assert_eq!(st, 400, "{e}");
    assert_eq!(e["error"]["param"], "model");

    // Idle past --keep-alive: unloaded.
    let t0 = Instant::now();
    while s.state("local/llama-q40") != "unloaded" {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "not unloaded when idle"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        s.metric("onebit_model_unloads_total{model=\"local/chat\",reason=\"models-max\"}") >= 1.0
    );
    assert!(
        s.metric("onebit_model_unloads_total{model=\"local/llama-q40\",reason=\"idle\"}") >= 1.0
    );
    assert_eq!(s.metric("onebit_models_loaded"), 0.0);

    // The explicit routes.
    let l = s.post_ok("/models/load", &json!({"model": "chat"}));
    assert_eq!(l["model"], "local/chat");
    assert_eq!(s.state("local/chat"), "loaded");
    let u = s.post_ok("/models/unload", &json!({"model": "chat"}));
    assert_eq!(u["was_loaded"], true);
    assert_eq!(s.state("local/chat"), "unloaded");
    let (h, body) = s.get("/health");
    assert_eq!(h, 200);
    let health: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(health["models"], 3);
}

#[test]
fn an_unverified_pack_is_served_with_allow_unverified_and_short_name_collisions_name_both() {
    let home = tempfile::tempdir().expect("tmp");
    store(home.path());
    // A second ref whose short name collides with llama-q40's.
    let other = home.path().join("repos/LLAMA-Q40");
    std::fs::create_dir_all(&other).expect("mkdir");
    for f in ["config.json", "model.q4nx", "tokenizer.json"] {
        std::fs::copy(fixture("llama-q40").join(f), other.join(f)).expect("copy");
    }
    let out = support::run_in(
        &home.path().join("home"),
        &[
            "-q",
            "run",
            "--path",
            &other.to_string_lossy(),
            "--reference",
            &fixture("llama-q40").join("model.gguf").to_string_lossy(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = serve_store(home, &["--allow-unverified"]);
    s.post_ok("/v1/completions", &greedy("llama-q80"));
    let (st, e) = s.post("/v1/completions", &greedy("llama-q40"));
    assert_eq!(st, 404, "{e}");
    let m = e["error"]["message"].as_str().unwrap_or_default();
    assert!(
        m.contains("several") && m.contains("local/llama-q40") && m.contains("local/LLAMA-Q40"),
        "{m}"
    );
    // Full ids still work.
    s.post_ok("/v1/completions", &greedy("local/LLAMA-Q40"));
}

#[test]
fn four_clients_on_two_models_get_the_answers_of_one_model_servers() {
    let home = tempfile::tempdir().expect("tmp");
    store(home.path());
    let many = serve_store(home, &["--models-max", "2"]);
    let sampled = |model: &str, seed: u64| {
        json!({"model": model, "prompt": "hello there", "max_tokens": 12,
               "temperature": 0.9, "seed": seed})
    };
    // Four clients at once, two on each model, each with its own seed.
    let jobs: Vec<(&str, u64)> = vec![
        ("local/chat", 1),
        ("local/llama-q40", 2),
        ("local/chat", 3),
        ("local/llama-q40", 4),
    ];
    let answers: Vec<String> = std::thread::scope(|sc| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|(m, seed)| {
                let body = sampled(m, *seed);
                let many = &many;
                sc.spawn(move || {
                    many.post_ok("/v1/completions", &body)["choices"][0]["text"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client"))
            .collect()
    });
    // The same requests to a server of each pack alone.
    for (model, case) in [
        ("local/chat", "llama-q41"),
        ("local/llama-q40", "llama-q40"),
    ] {
        let one_home = tempfile::tempdir().expect("tmp");
        let repo = one_home.path().join("repo");
        std::fs::create_dir_all(&repo).expect("mkdir");
        for f in ["config.json", "model.q4nx", "tokenizer.json"] {
            std::fs::copy(fixture(case).join(f), repo.join(f)).expect("copy");
        }
        if case == "llama-q41" {
            std::fs::write(repo.join("chat_template.jinja"), CHATML).expect("template");
        }
        let one = serve_repo(one_home, &repo, &fixture(case).join("model.gguf"), &[]);
        for ((m, seed), answer) in jobs.iter().zip(&answers) {
            if *m != model {
                continue;
            }
            let alone = one.post_ok(
                "/v1/completions",
                &sampled("", *seed)
                    .as_object()
                    .map(|o| {
                        let mut o = o.clone();
                        o.remove("model");
                        Value::Object(o)
                    })
                    .unwrap_or_default(),
            )["choices"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            assert_eq!(
                &alone, answer,
                "{m} seed {seed}: alone against beside another model"
            );
        }
    }
}

#[test]
#[ignore = "needs the ollama Python client (scripts/test.sh installs it)"]
fn ollamas_python_client_chats_generates_embeds_and_lists() {
    let home = tempfile::tempdir().expect("tmp");
    store(home.path());
    let s = serve_store(home, &["--models-max", "3"]);
    let url = format!("http://{}", s.addr);
    let v = support::python_json("ollama_e2e.py", &[url.as_str(), "chat", "local/llama-q40"]);
    assert_eq!(
        v["list"],
        json!(["local/chat", "local/llama-q40", "local/llama-q80"])
    );
    // Whole and streamed give the same greedy text; the stream ends with one done line.
    assert_eq!(v["chat"]["done_reason"], "length", "{v}");
    assert_eq!(v["chat"]["eval_count"], 6);
    assert_eq!(v["chat"]["model"], "local/chat");
    assert_eq!(v["chat"]["content"], v["chat_stream"]["content"], "{v}");
    assert_eq!(v["chat_stream"]["last_done"], true);
    assert_eq!(v["chat_stream"]["others_done"], false);
    // The same answer through OpenAI's route.
    let openai = s.post_ok(
        "/v1/chat/completions",
        &json!({"model": "chat", "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 6, "temperature": 0}),
    );
    assert_eq!(
        openai["choices"][0]["message"]["content"],
        v["chat"]["content"]
    );
    let raw = s.post_ok(
        "/v1/completions",
        &json!({"model": "local/llama-q40", "prompt": "hello", "max_tokens": 5, "temperature": 0}),
    );
    assert_eq!(raw["choices"][0]["text"], v["generate"]["response"], "{v}");
    assert_eq!(v["embed"]["n"], 2);
    assert!(
        (v["embed"]["norm"].as_f64().unwrap_or(0.0) - 1.0).abs() < 1e-3,
        "{v}"
    );
    assert_eq!(v["ps"], json!(["local/chat", "local/llama-q40"]));
    assert!(v["show"]["template"].as_bool().unwrap_or(false), "{v}");
    let parsed: Result<Value, _> = serde_json::from_str(v["json_format"].as_str().unwrap_or(""));
    assert!(
        parsed.is_ok()
            || v["json_format"]
                .as_str()
                .is_some_and(|t| t.starts_with('{')),
        "format json: {v}"
    );
    assert_eq!(v["errors"]["unknown_model"]["status"], 404, "{v}");
    assert_eq!(v["errors"]["unknown_option"]["status"], 400, "{v}");
    assert!(
        v["errors"]["unknown_option"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("mirostat")),
        "{v}"
    );
    // `onebit-pipe ps` through the API, while the server runs.
    let ps = Command::new(env!("CARGO_BIN_EXE_onebit-pipe"))
        .args(["--json", "ps", "--url", &format!("http://{}", s.addr)])
        .output()
        .expect("ps");
    assert!(
        ps.status.success(),
        "{}",
        String::from_utf8_lossy(&ps.stderr)
    );
    let loaded: Vec<Value> = String::from_utf8_lossy(&ps.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert_eq!(loaded.len(), 2, "{loaded:?}");
}

#[test]
fn list_and_rm_show_and_drop_packs_by_name_and_refuse_what_matches_nothing() {
    let home = tempfile::tempdir().expect("tmp");
    store(home.path());
    let store = home.path().join("home");
    let out = support::run_in(&store, &["--json", "list"]);
    assert!(out.status.success());
    let rows: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[2]["name"], "local/llama-q80");
    assert_eq!(rows[2]["verified"], false);
    assert_eq!(rows[0]["family"], "llama");
    let table = support::run_in(&store, &["list"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("local/llama-q80") && text.contains("refused"),
        "{text}"
    );
    let none = support::run_in(&store, &["rm", "nothing-here"]);
    assert_eq!(none.status.code(), Some(1));
    let err = String::from_utf8_lossy(&none.stderr);
    assert!(
        err.contains("nothing-here") && err.contains("local/chat"),
        "{err}"
    );
    let rm = support::run_in(&store, &["rm", "llama-q40"]);
    assert!(
        rm.status.success(),
        "{}",
        String::from_utf8_lossy(&rm.stderr)
    );
    let after = support::run_in(&store, &["--json", "list"]);
    assert_eq!(String::from_utf8_lossy(&after.stdout).lines().count(), 2);
    let gc = support::run_in(&store, &["gc"]);
    assert!(
        gc.status.success(),
        "{}",
        String::from_utf8_lossy(&gc.stderr)
    );
}

#[test]
#[ignore = "needs Chromium and Playwright for Python (scripts/test.sh installs them)"]
fn the_chat_page_picks_among_the_stores_packs_and_shows_a_load() {
    let home = tempfile::tempdir().expect("tmp");
    store(home.path());
    let s = serve_store(home, &[]);
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("webui-models.png");
    let seen = support::python_json(
        "webui_models.py",
        &[
            std::ffi::OsString::from(format!("http://{}", s.addr)),
            support::chromium().into(),
            "local/chat".into(),
            shot.into(),
        ],
    );
    let options: Vec<&str> = seen["options"]
        .as_array()
        .expect("options")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(options.len(), 3, "{seen}");
    assert!(
        options
            .iter()
            .any(|o| o.starts_with("local/llama-q80") && o.contains("not verified")),
        "{seen}"
    );
    assert!(
        seen["headers"].as_array().is_some_and(|h| h
            .iter()
            .any(|t| t.as_str().is_some_and(|t| t.contains("loading local/chat")))),
        "the load was not shown: {seen}"
    );
    assert!(
        seen["after"]
            .as_str()
            .is_some_and(|t| t.contains("tokens of context")),
        "{seen}"
    );
    assert_eq!(seen["after_reload"], "local/chat");
}
