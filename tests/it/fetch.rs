//! The fetch stage end to end, through the binary, against a loopback server that speaks the hub's
//! protocol (tests/hub_server): branches and commits, 404/401, retries, resume after a dropped
//! connection, integrity, hostile names, redirects, offline mode, zero re-transfer, and
//! compatibility with the real `huggingface_hub` client both ways.

use crate::hub_server;
use crate::support::RunOk;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::Ordering;

use hub_server::HubServer;
use serde_json::Value;

const REPO: &str = "FastFlowLM/Tiny-Llama-NPU2";

fn fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/q4nx")
        .join(case)
}

fn repo_files() -> BTreeMap<String, Vec<u8>> {
    let dir = fixture("llama-q41");
    let mut m = BTreeMap::new();
    for f in ["config.json", "model.q4nx", "tokenizer.json"] {
        m.insert(f.to_string(), std::fs::read(dir.join(f)).expect("fixture"));
    }
    m.insert("README.md".into(), b"# Tiny llama pack\n".to_vec());
    m.insert("docs/notes.txt".into(), b"nested file\n".to_vec());
    m
}

struct Env {
    home: tempfile::TempDir,
    hf: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            home: tempfile::tempdir().expect("tmp"),
            hf: tempfile::tempdir().expect("tmp"),
        }
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_onebit-pipe"));
        c.env("ONEBIT_HOME", self.home.path())
            .env("HF_HOME", self.hf.path())
            .env("ONEBIT_HUB_RETRY_MS", "10")
            .env_remove("HF_HUB_CACHE")
            .env_remove("HF_ENDPOINT")
            .env_remove("HF_TOKEN")
            .env_remove("HF_HUB_OFFLINE");
        c
    }

    fn run(&self, server: &HubServer, extra: &[&str]) -> Output {
        self.cmd()
            .args(["--json", "run", "--repo", REPO, "--endpoint", &server.url])
            .args(extra)
            .output()
            .expect("spawn")
    }

    fn repo_cache(&self) -> PathBuf {
        self.hf
            .path()
            .join("hub")
            .join(format!("models--{}", REPO.replace('/', "--")))
    }
}

fn fetched(out: &Output) -> Option<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["event"] == "fetched")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_normal_repo_lands_in_the_hub_cache_layout_and_imports() {
    let (server, commit) = HubServer::start(REPO, repo_files());
    let env = Env::new();
    let out = env.run(&server, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let f = fetched(&out).expect("fetched event");
    assert_eq!(f["commit"], commit.as_str());
    assert_eq!(f["downloaded"].as_array().map(Vec::len), Some(5));
    let cache = env.repo_cache();
    assert_eq!(
        std::fs::read_to_string(cache.join("refs/main")).expect("ref"),
        commit
    );
    let snap = cache.join("snapshots").join(&commit);
    for (name, bytes) in repo_files() {
        assert_eq!(
            std::fs::read(snap.join(&name)).expect("file"),
            bytes,
            "{name}"
        );
        assert!(
            std::fs::symlink_metadata(snap.join(&name))
                .expect("stat")
                .file_type()
                .is_symlink(),
            "{name}"
        );
    }
    // LFS blobs are named by their sha256, as huggingface_hub names them.
    let sha = {
        use sha2::Digest;
        let d = sha2::Sha256::digest(std::fs::read(fixture("llama-q41/model.q4nx")).expect("read"));
        d.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    assert!(cache.join("blobs").join(&sha).is_file());
    assert!(
        !std::fs::read_dir(cache.join("blobs"))
            .expect("blobs")
            .any(|e| e
                .expect("e")
                .path()
                .to_string_lossy()
                .ends_with(".incomplete"))
    );
    // The whole import ran under the repo's name, fetch stage included.
    let status = env.cmd().args(["status"]).output().expect("status");
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains(&format!("{REPO} (fresh;")), "{text}");
    assert!(text.contains("fetch"), "{text}");

    // Re-fetching the unchanged repo transfers no file bytes.
    let before = server.body_bytes.load(Ordering::SeqCst);
    let again = env.run(&server, &[]);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(
        server.body_bytes.load(Ordering::SeqCst),
        before,
        "no file bytes on a re-fetch"
    );
    assert_eq!(fetched(&again).expect("fetched")["bytes_transferred"], 0);
}

#[test]
fn a_revision_can_be_a_branch_or_a_commit() {
    let (server, commit) = HubServer::start(REPO, repo_files());
    let env = Env::new();
    let out = env.run(&server, &["--revision", &commit]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(fetched(&out).expect("fetched")["commit"], commit.as_str());
    assert!(
        env.repo_cache()
            .join("snapshots")
            .join(&commit)
            .join("model.q4nx")
            .is_file()
    );
    assert!(
        !env.repo_cache().join("refs").join(&commit).exists(),
        "a commit is not written as a ref"
    );
}

#[test]
fn not_found_and_unauthorized_say_what_to_do() {
    let (server, _) = HubServer::start(REPO, repo_files());
    let env = Env::new();
    let out = env
        .cmd()
        .args([
            "run",
            "--repo",
            "FastFlowLM/Nope-NPU2",
            "--revision",
            "dev",
            "--endpoint",
            &server.url,
        ])
        .output()
        .expect("spawn");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("HTTP 404: repository FastFlowLM/Nope-NPU2 at revision dev not found on http://127.0.0.1"), "{}", stderr(&out));

    server
        .state
        .lock()
        .expect("lock")
        .faults
        .private
        .insert(REPO.into());
    let out = env.run(&server, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(&format!(
            "HTTP 401: {REPO} is gated or private; set HF_TOKEN to a token with access"
        )),
        "{}",
        stderr(&out)
    );
    let ok = env
        .cmd()
        .env("HF_TOKEN", "good-token")
        .args(["run", "--repo", REPO, "--endpoint", &server.url])
        .output()
        .expect("spawn");
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
}

#[test]
fn a_503_is_retried_and_a_relative_redirect_followed() {
    let (server, _) = HubServer::start(REPO, repo_files());
    {
        let mut st = server.state.lock().expect("lock");
        st.faults.fail_503_once.insert("config.json".into());
        st.faults.relative_redirect.insert("README.md".into());
    }
    let env = Env::new();
    let out = env.run(&server, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let st = server.state.lock().expect("lock");
    assert_eq!(st.hits.get("config.json"), Some(&2), "one 503, one success");
    let snap = env.repo_cache().join("snapshots");
    let readme = std::fs::read_dir(&snap)
        .expect("snap")
        .next()
        .expect("commit")
        .expect("e")
        .path()
        .join("README.md");
    assert_eq!(
        std::fs::read(readme).expect("readme"),
        b"# Tiny llama pack\n"
    );
}

#[test]
fn a_connection_dropped_mid_body_is_resumed_with_range_by_the_next_run() {
    let (server, _) = HubServer::start(REPO, repo_files());
    server
        .state
        .lock()
        .expect("lock")
        .faults
        .drop_mid_body_once
        .insert("model.q4nx".into());
    let env = Env::new();
    let size = std::fs::metadata(fixture("llama-q41/model.q4nx"))
        .expect("stat")
        .len();
    let first = env
        .cmd()
        .env("ONEBIT_HUB_ATTEMPTS", "1")
        .args(["run", "--repo", REPO, "--endpoint", &server.url])
        .output()
        .expect("spawn");
    assert_eq!(
        first.status.code(),
        Some(2),
        "the dropped body fails this run: {}",
        stderr(&first)
    );
    // A partial blob stays, named as huggingface_hub names it.
    let partial: Vec<PathBuf> = std::fs::read_dir(env.repo_cache().join("blobs"))
        .expect("blobs")
        .map(|e| e.expect("e").path())
        .filter(|p| p.to_string_lossy().ends_with(".incomplete"))
        .collect();
    assert_eq!(partial.len(), 1);
    let have = std::fs::metadata(&partial[0]).expect("stat").len();
    assert_eq!(have, size / 2);
    let before = server.body_bytes.load(Ordering::SeqCst);
    let second = env.run(&server, &[]);
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
    let st = server.state.lock().expect("lock");
    assert!(
        st.ranges.contains(&("model.q4nx".to_string(), have)),
        "resumed with Range: bytes={have}-: {:?}",
        st.ranges
    );
    let model_bytes = server.body_bytes.load(Ordering::SeqCst) - before;
    assert!(
        model_bytes < size,
        "only the rest of model.q4nx was sent again ({model_bytes} of {size})"
    );
}

#[test]
fn a_wrong_sha256_is_refused_and_nothing_is_cached() {
    let (server, commit) = HubServer::start(REPO, repo_files());
    server
        .state
        .lock()
        .expect("lock")
        .faults
        .wrong_sha
        .insert("model.q4nx".into());
    let env = Env::new();
    let out = env.run(&server, &["--downloads", "1"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("{REPO}: model.q4nx: sha256 ")),
        "{err}"
    );
    assert!(
        err.contains("where the listing says")
            && err.contains("the download was deleted, nothing was cached"),
        "{err}"
    );
    let cache = env.repo_cache();
    assert!(
        !cache
            .join("snapshots")
            .join(&commit)
            .join("model.q4nx")
            .exists()
    );
    let leftovers: Vec<_> = std::fs::read_dir(cache.join("blobs"))
        .expect("blobs")
        .map(|e| e.expect("e").file_name())
        .collect();
    assert!(
        leftovers
            .iter()
            .all(|n| !n.to_string_lossy().ends_with(".incomplete")),
        "{leftovers:?}"
    );
}

#[test]
fn a_file_name_that_escapes_the_snapshot_is_refused() {
    let (server, _) = HubServer::start(REPO, repo_files());
    server
        .state
        .lock()
        .expect("lock")
        .faults
        .extra_names
        .push("../../evil".into());
    let env = Env::new();
    let out = env.run(&server, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out)
            .contains("refused: file name \"../../evil\" has an empty, '.' or '..' component"),
        "{}",
        stderr(&out)
    );
    assert!(!env.hf.path().join("evil").exists() && !env.hf.path().join("hub/evil").exists());
}

#[test]
fn offline_mode_uses_the_cache_or_says_it_cannot() {
    let (server, _) = HubServer::start(REPO, repo_files());
    let env = Env::new();
    let missing = env
        .cmd()
        .env("HF_HUB_OFFLINE", "1")
        .args(["run", "--repo", REPO, "--endpoint", &server.url])
        .output()
        .expect("spawn");
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).contains(&format!(
            "HF_HUB_OFFLINE is set and {REPO} at revision main is not in the cache"
        )),
        "{}",
        stderr(&missing)
    );
    assert_eq!(env.run(&server, &[]).status.code(), Some(0));
    let hits_before: u64 = server.state.lock().expect("lock").hits.values().sum();
    let offline = env
        .cmd()
        .env("HF_HUB_OFFLINE", "1")
        .args(["--json", "run", "--repo", REPO, "--endpoint", &server.url])
        .output()
        .expect("spawn");
    assert_eq!(offline.status.code(), Some(0), "{}", stderr(&offline));
    let hits_after: u64 = server.state.lock().expect("lock").hits.values().sum();
    assert_eq!(hits_before, hits_after, "offline makes no request");
}

#[test]
fn a_mirror_directory_serves_as_an_offline_endpoint() {
    let mirror = tempfile::tempdir().expect("tmp");
    let dir = mirror.path().join(REPO);
    std::fs::create_dir_all(&dir).expect("mkdir");
    for (name, bytes) in repo_files() {
        let p = dir.join(&name);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, bytes).expect("write");
    }
    let env = Env::new();
    let out = env
        .cmd()
        .args([
            "run",
            "--repo",
            REPO,
            "--endpoint",
            mirror.path().to_str().expect("utf8"),
        ])
        .output()
        .expect("spawn");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let status = env.cmd().args(["status"]).output().expect("status");
    assert!(String::from_utf8_lossy(&status.stdout).contains(&format!("{REPO} (fresh;")));
}

fn python_has_hf_hub() -> bool {
    Command::new("python3")
        .args(["-c", "import huggingface_hub"])
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
#[ignore = "needs python3 with huggingface_hub: run scripts/test.sh"]
fn huggingface_hub_and_onebit_pipe_share_one_cache_both_ways() {
    assert!(
        python_has_hf_hub(),
        "huggingface_hub is not installed: run scripts/test.sh (pip install huggingface_hub)"
    );
    let (server, commit) = HubServer::start(REPO, repo_files());
    // 1. huggingface_hub downloads; onebit-pipe then finds every file offline.
    let env = Env::new();
    Command::new("python3")
        .env("HF_HOME", env.hf.path())
        .env("HF_ENDPOINT", &server.url)
        .env_remove("HF_HUB_OFFLINE")
        .env("HF_HUB_DISABLE_XET", "1")
        .args(["-c", &format!("from huggingface_hub import snapshot_download; print(snapshot_download({REPO:?}, revision='main'))")])
        .run_ok();
    let out = env
        .cmd()
        .env("HF_HUB_OFFLINE", "1")
        .args(["--json", "run", "--repo", REPO])
        .output()
        .expect("spawn");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let snap = env.repo_cache().join("snapshots").join(&commit);
    for name in repo_files().keys() {
        assert!(snap.join(name).is_file(), "{name}");
    }

    // 2. onebit-pipe downloads; huggingface_hub then finds every file offline.
    let env2 = Env::new();
    assert_eq!(env2.run(&server, &[]).status.code(), Some(0));
    let py = Command::new("python3")
        .env("HF_HOME", env2.hf.path())
        .env("HF_HUB_OFFLINE", "1")
        .args(["-c", &format!(
            "import os\nfrom huggingface_hub import snapshot_download\np = snapshot_download({REPO:?}, revision='main', local_files_only=True)\nprint('\\n'.join(sorted(os.path.relpath(os.path.join(d, f), p) for d, _, fs in os.walk(p) for f in fs)))"
        )])
        .run_ok();
    let listed: Vec<String> = String::from_utf8_lossy(&py.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    let want: Vec<String> = repo_files().keys().cloned().collect();
    assert_eq!(listed, want);
}

#[test]
fn a_gguf_reference_is_fetched_from_the_hub_and_verifies_the_pack() {
    let mut files = repo_files();
    files.remove("README.md");
    let (server, _) = HubServer::start(REPO, files);
    let mut gguf = BTreeMap::new();
    gguf.insert(
        "tiny-Q4_1.gguf".to_string(),
        std::fs::read(fixture("llama-q41/model.gguf")).expect("gguf"),
    );
    server.add_repo("someone/Tiny-Llama-GGUF", &"ab".repeat(20), gguf);
    let env = Env::new();
    let out = env.run(
        &server,
        &["--reference", "someone/Tiny-Llama-GGUF:tiny-Q4_1.gguf"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let verdict = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["event"] == "verdict")
        .expect("verdict");
    assert_eq!(verdict["verdict"]["verified"], true, "{verdict}");
    let blob = env
        .hf
        .path()
        .join("hub/models--someone--Tiny-Llama-GGUF/snapshots")
        .join("ab".repeat(20))
        .join("tiny-Q4_1.gguf");
    assert!(blob.is_file());
}
