//! A real S3-compatible server for the shared-store tests: `s3s-fs` (crates.io, installed by
//! scripts/test.sh) on 127.0.0.1 with its data in a temporary folder, and a TCP proxy in front of
//! it that can hold the request publishing an entry's manifest, so a test can kill an importer or
//! restart the server at exactly that point.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The access key the server accepts.
pub const ACCESS_KEY: &str = "onebit-test-access";
/// The secret key the server accepts.
pub const SECRET_KEY: &str = "onebit-test-secret-0123456789";
/// The bucket every test uses.
pub const BUCKET: &str = "team";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn s3s_fs() -> PathBuf {
    if let Some(p) = std::env::var_os("ONEBIT_S3S_FS") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    if let Some(p) = home.map(|h| h.join("bin/s3s-fs")).filter(|p| p.is_file()) {
        return p;
    }
    PathBuf::from("s3s-fs")
}

fn wait_listening(port: u16) {
    let t0 = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "s3s-fs did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A running `s3s-fs`.
pub struct S3Server {
    child: Option<Child>,
    /// Its port.
    pub port: u16,
    /// Its data folder (one folder per bucket).
    pub root: tempfile::TempDir,
}

impl S3Server {
    /// Starts a server with one bucket, [`BUCKET`].
    pub fn start() -> S3Server {
        let root = tempfile::tempdir().expect("tmp");
        std::fs::create_dir_all(root.path().join(BUCKET)).expect("bucket dir");
        let mut s = S3Server {
            child: None,
            port: free_port(),
            root,
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let bin = s3s_fs();
        let child = Command::new(&bin)
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(self.root.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} ({e}): install it with `cargo install s3s-fs --version 0.14.1 \
                     --features binary --locked` (scripts/test.sh does)",
                    bin.display()
                )
            });
        self.child = Some(child);
        wait_listening(self.port);
    }

    /// Kills the server and starts it again on the same port and data.
    pub fn restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.spawn();
    }

    /// The endpoint URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every object key under `prefix` (the server keeps objects as files under the bucket).
    pub fn objects(&self, prefix: &str) -> Vec<String> {
        let base = self.root.path().join(BUCKET);
        let mut out = Vec::new();
        let mut stack = vec![base.join(prefix)];
        while let Some(d) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in rd.flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if let Ok(rel) = p.strip_prefix(&base) {
                    out.push(rel.to_string_lossy().replace('\\', "/"));
                }
            }
        }
        out.sort();
        out
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Sets the environment a process needs to reach `endpoint` with the test's keys (or `secret`).
pub fn aws_env(cmd: &mut Command, endpoint: &str, secret: &str) {
    for v in [
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_ENDPOINT",
        "AWS_ENDPOINT_URL_S3",
        "AWS_DEFAULT_REGION",
    ] {
        cmd.env_remove(v);
    }
    cmd.env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .env("AWS_ENDPOINT_URL", endpoint)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        .env("AWS_CONFIG_FILE", "/nonexistent");
}

/// Whether `window` holds the request line of a PUT of an entry's manifest
/// (`PUT /<bucket>/…/entries/<64 hex>/manifest.json HTTP/1.1`).
fn is_manifest_put(window: &[u8]) -> bool {
    let text = String::from_utf8_lossy(window);
    // A request line may follow the previous request's body without a line break.
    text.match_indices("PUT /").any(|(i, _)| {
        let rest = &text[i + 4..];
        let Some(path) = rest.split(' ').next() else {
            return false;
        };
        let parts: Vec<&str> = path.split('/').collect();
        parts.len() >= 3
            && parts[parts.len() - 1] == "manifest.json"
            && parts[parts.len() - 3] == "entries"
            && parts[parts.len() - 2].len() == 64
    })
}

/// A TCP proxy in front of a server that can hold the first request publishing a manifest.
pub struct Proxy {
    /// Its port.
    pub port: u16,
    armed: Arc<AtomicBool>,
    stalled: Arc<AtomicBool>,
    held: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    /// Listens on a free port, forwarding to `upstream` (connected per client connection, so a
    /// restarted server is reached by the next connection).
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let armed = Arc::new(AtomicBool::new(false));
        let stalled = Arc::new(AtomicBool::new(false));
        let held = Arc::new(Mutex::new(Vec::new()));
        let (a, s, h) = (armed.clone(), stalled.clone(), held.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let (a, s, h) = (a.clone(), s.clone(), h.clone());
                let (Ok(mut c_read), Ok(mut s_write)) = (client.try_clone(), server.try_clone())
                else {
                    continue;
                };
                let (mut s_read, mut c_write) = (server, client);
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut s_read, &mut c_write);
                    let _ = c_write.shutdown(Shutdown::Write);
                });
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 << 10];
                    let mut tail: Vec<u8> = Vec::new();
                    loop {
                        let n = match c_read.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let mut window = std::mem::take(&mut tail);
                        window.extend_from_slice(&buf[..n]);
                        if a.load(Ordering::SeqCst) && is_manifest_put(&window) {
                            a.store(false, Ordering::SeqCst);
                            if let (Ok(c), Ok(sv)) = (c_read.try_clone(), s_write.try_clone()) {
                                let mut held = h.lock().unwrap_or_else(|p| p.into_inner());
                                held.push(c);
                                held.push(sv);
                            }
                            s.store(true, Ordering::SeqCst);
                            return; // nothing more goes through: the request hangs
                        }
                        if s_write.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        let keep = window.len().min(512);
                        tail = window[window.len() - keep..].to_vec();
                    }
                    let _ = s_write.shutdown(Shutdown::Write);
                });
            }
        });
        Proxy {
            port,
            armed,
            stalled,
            held,
        }
    }

    /// The endpoint URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Holds the next manifest PUT.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Waits until a manifest PUT is held.
    pub fn wait_stalled(&self, within: Duration) {
        let t0 = Instant::now();
        while !self.stalled.load(Ordering::SeqCst) {
            assert!(
                t0.elapsed() < within,
                "no manifest PUT came through the proxy"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Cuts the held connections (the client sees its request fail mid-way).
    pub fn release(&self) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        for s in held.drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// Files of the server's bucket under `prefix` that are entry manifests, by key.
pub fn manifest_keys(server: &S3Server, prefix: &str) -> Vec<String> {
    server
        .objects(prefix)
        .iter()
        .filter_map(|o| {
            let parts: Vec<&str> = o.split('/').collect();
            (parts.len() >= 3
                && parts[parts.len() - 1] == "manifest.json"
                && parts[parts.len() - 3] == "entries")
                .then(|| parts[parts.len() - 2].to_string())
        })
        .collect()
}
