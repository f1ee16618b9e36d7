//! A loopback HTTP server that speaks the parts of the Hugging Face hub protocol the clients use
//! (`/api/models/{repo}/revision/{rev}`, `/{repo}/resolve/{rev}/{path}` with LFS redirects,
//! `Range`, ETag / X-Linked-Etag / X-Linked-Size / X-Repo-Commit), with injectable faults and a
//! count of the file bytes it served. Started on 127.0.0.1:0 by each test.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sha2::Digest;

/// One commit's files.
#[derive(Clone, Default)]
pub struct Commit {
    /// Path → content.
    pub files: BTreeMap<String, Vec<u8>>,
}

/// Faults to inject.
#[derive(Default)]
pub struct Faults {
    /// Resolve paths answered 503 once.
    pub fail_503_once: BTreeSet<String>,
    /// Resolve paths whose body is cut after half, once.
    pub drop_mid_body_once: BTreeSet<String>,
    /// Files whose listed sha256 is wrong.
    pub wrong_sha: BTreeSet<String>,
    /// Repos that need `Authorization: Bearer good-token`.
    pub private: BTreeSet<String>,
    /// Extra names put into every listing (e.g. `../../evil`).
    pub extra_names: Vec<String>,
    /// Non-LFS files redirected (relative Location) to /raw/...
    pub relative_redirect: BTreeSet<String>,
}

/// The server state.
#[derive(Default)]
pub struct State {
    /// repo → branch → commit.
    pub branches: BTreeMap<String, BTreeMap<String, String>>,
    /// commit → files.
    pub commits: BTreeMap<String, Commit>,
    /// Faults.
    pub faults: Faults,
    /// Range headers seen (path, start).
    pub ranges: Vec<(String, u64)>,
    /// Resolve requests seen per path.
    pub hits: BTreeMap<String, u64>,
}

/// A running server.
pub struct HubServer {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Shared state.
    pub state: Arc<Mutex<State>>,
    /// File body bytes served (listings excluded).
    pub body_bytes: Arc<AtomicU64>,
}

fn sha256_hex(b: &[u8]) -> String {
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn git_blob_id(b: &[u8]) -> String {
    // Not git's sha1, but a stable id of the content, which is all a client may rely on.
    blake3::hash(b).to_hex()[..40].to_string()
}

/// Whether a file is served as LFS (as the hub does for large or binary files).
pub fn is_lfs(path: &str, b: &[u8]) -> bool {
    b.len() > 4096 || path.ends_with(".q4nx") || path.ends_with(".gguf")
}

impl HubServer {
    /// Starts a server with `repo` at branch `main` holding `files`; returns it and the commit.
    pub fn start(repo: &str, files: BTreeMap<String, Vec<u8>>) -> (HubServer, String) {
        let commit = format!(
            "{:040x}",
            u128::from_le_bytes(
                blake3::hash(repo.as_bytes()).as_bytes()[..16]
                    .try_into()
                    .expect("16")
            )
        );
        let mut st = State::default();
        st.branches
            .entry(repo.into())
            .or_default()
            .insert("main".into(), commit.clone());
        st.commits.insert(commit.clone(), Commit { files });
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let state = Arc::new(Mutex::new(st));
        let body_bytes = Arc::new(AtomicU64::new(0));
        let (s2, b2, u2) = (state.clone(), body_bytes.clone(), url.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (s, b, u) = (s2.clone(), b2.clone(), u2.clone());
                std::thread::spawn(move || {
                    let _ = handle(conn, &s, &b, &u);
                });
            }
        });
        (
            HubServer {
                url,
                state,
                body_bytes,
            },
            commit,
        )
    }

    /// Adds another repo at branch main.
    pub fn add_repo(&self, repo: &str, commit: &str, files: BTreeMap<String, Vec<u8>>) {
        let mut st = self.state.lock().expect("lock");
        st.branches
            .entry(repo.into())
            .or_default()
            .insert("main".into(), commit.into());
        st.commits.insert(commit.into(), Commit { files });
    }
}

fn respond(
    w: &mut TcpStream,
    status: &str,
    headers: &[(String, String)],
    body: &[u8],
    head_only: bool,
) -> std::io::Result<()> {
    let mut out = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    let has_len = headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-length"));
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    if !has_len {
        out.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    out.push_str("\r\n");
    w.write_all(out.as_bytes())?;
    if !head_only {
        w.write_all(body)?;
    }
    w.flush()
}

/// One request as the fake hub reads it.
struct Req {
    path: String,
    headers: BTreeMap<String, String>,
    /// A HEAD request.
    head: bool,
    /// Sent the one good token.
    authorized: bool,
}

/// The request line and headers of the request on `reader`.
fn read_request(reader: &mut BufReader<TcpStream>) -> std::io::Result<Req> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let authorized = headers
        .get("authorization")
        .is_some_and(|a| a == "Bearer good-token");
    Ok(Req {
        path: target.split('?').next().unwrap_or("").to_string(),
        headers,
        head: method == "HEAD",
        authorized,
    })
}

/// A JSON body with its content type.
fn json(v: serde_json::Value) -> (Vec<(String, String)>, Vec<u8>) {
    (
        vec![("Content-Type".to_string(), "application/json".to_string())],
        v.to_string().into_bytes(),
    )
}

fn handle(
    mut conn: TcpStream,
    state: &Mutex<State>,
    body_bytes: &AtomicU64,
    base: &str,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let req = read_request(&mut reader)?;
    let conn = &mut conn;
    let path = req.path.as_str();
    // /api/models/{org}/{name}/revision/{rev} and /api/models/{org}/{name}/tree/{rev}[/{path}]
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let segs: Vec<&str> = rest.splitn(4, '/').collect();
        if segs.len() == 4 && segs[2] == "revision" {
            return revision(conn, &req, state, &segs);
        }
        if segs.len() == 4 && segs[2] == "tree" {
            return tree(conn, &req, state, &segs);
        }
    }
    if let Some(sha) = path.strip_prefix("/lfs-store/") {
        return lfs_store(conn, &req, state, body_bytes, sha);
    }
    if let Some(rest) = path.strip_prefix("/raw/") {
        return raw(conn, &req, state, body_bytes, rest);
    }
    let segs: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    if segs.len() == 5 && segs[2] == "resolve" {
        return resolve(conn, &req, state, body_bytes, base, &segs);
    }
    let mut sink = Vec::new();
    let _ = reader.take(0).read_to_end(&mut sink);
    respond(conn, "404 Not Found", &[], b"", req.head)
}

/// `/api/models/{org}/{name}/revision/{rev}`: the repository's files at a revision.
fn revision(
    conn: &mut TcpStream,
    req: &Req,
    state: &Mutex<State>,
    segs: &[&str],
) -> std::io::Result<()> {
    let (head, authorized) = (req.head, req.authorized);
    let repo = format!("{}/{}", segs[0], segs[1]);
    let rev = segs[3].to_string();
    let st = state.lock().expect("lock");
    if st.faults.private.contains(&repo) && !authorized {
        return respond(
            conn,
            "401 Unauthorized",
            &[],
            b"{\"error\":\"gated\"}",
            head,
        );
    }
    let commit = st
        .branches
        .get(&repo)
        .and_then(|b| b.get(&rev).cloned())
        .or_else(|| {
            st.branches
                .contains_key(&repo)
                .then(|| rev.clone())
                .filter(|c| st.commits.contains_key(c))
        });
    let Some(commit) = commit else {
        return respond(
            conn,
            "404 Not Found",
            &[],
            b"{\"error\":\"Repository not found\"}",
            head,
        );
    };
    let files = &st.commits[&commit].files;
    let mut siblings: Vec<serde_json::Value> = files
        .iter()
        .map(|(p, b)| {
            let mut s =
                serde_json::json!({"rfilename": p, "size": b.len(), "blobId": git_blob_id(b)});
            if is_lfs(p, b) {
                let sha = if st.faults.wrong_sha.contains(p) {
                    sha256_hex(b"not this")
                } else {
                    sha256_hex(b)
                };
                s["lfs"] = serde_json::json!({"sha256": sha, "size": b.len(), "pointerSize": 134});
            }
            s
        })
        .collect();
    for extra in &st.faults.extra_names {
        siblings.push(serde_json::json!({"rfilename": extra, "size": 4}));
    }
    let (h, b) = json(serde_json::json!({
        "id": repo, "modelId": repo, "sha": commit, "private": st.faults.private.contains(&repo),
        "lastModified": "2026-01-01T00:00:00.000Z", "siblings": siblings, "tags": [], "downloads": 0, "likes": 0,
    }));
    respond(conn, "200 OK", &h, &b, head)
}

/// `/api/models/{org}/{name}/tree/{rev}[/{path}]?recursive=true` (huggingface_hub's listing).
fn tree(
    conn: &mut TcpStream,
    req: &Req,
    state: &Mutex<State>,
    segs: &[&str],
) -> std::io::Result<()> {
    let (head, authorized) = (req.head, req.authorized);
    let repo = format!("{}/{}", segs[0], segs[1]);
    let rev = segs[3].split('/').next().unwrap_or("").to_string();
    let st = state.lock().expect("lock");
    if st.faults.private.contains(&repo) && !authorized {
        return respond(conn, "401 Unauthorized", &[], b"", head);
    }
    let commit = st
        .branches
        .get(&repo)
        .and_then(|b| b.get(&rev).cloned())
        .unwrap_or(rev);
    let Some(c) = st.commits.get(&commit) else {
        return respond(conn, "404 Not Found", &[], b"", head);
    };
    let mut entries = Vec::new();
    let mut dirs = BTreeSet::new();
    for (p, b) in &c.files {
        let mut parent = std::path::Path::new(p).parent();
        while let Some(d) = parent.filter(|d| !d.as_os_str().is_empty()) {
            dirs.insert(d.to_string_lossy().into_owned());
            parent = d.parent();
        }
        let mut e =
            serde_json::json!({"type": "file", "oid": git_blob_id(b), "size": b.len(), "path": p});
        if is_lfs(p, b) {
            e["lfs"] =
                serde_json::json!({"oid": sha256_hex(b), "size": b.len(), "pointerSize": 134});
        }
        entries.push(e);
    }
    for d in dirs {
        entries.push(
            serde_json::json!({"type": "directory", "oid": "0".repeat(40), "size": 0, "path": d}),
        );
    }
    let (h, b) = json(serde_json::Value::Array(entries));
    respond(conn, "200 OK", &h, &b, head)
}

/// A file's bytes, whole or from a `Range` start, with the faults set for it (a body cut in the
/// middle once).
fn serve_bytes(
    conn: &mut TcpStream,
    req: &Req,
    body_bytes: &AtomicU64,
    st: &mut State,
    key: &str,
    bytes: &[u8],
    extra: Vec<(String, String)>,
) -> std::io::Result<()> {
    let (head, headers) = (req.head, &req.headers);
    let mut h = extra;
    let len = bytes.len() as u64;
    let start = headers
        .get("range")
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split('-').next())
        .and_then(|s| s.parse::<u64>().ok());
    if let Some(s) = start {
        st.ranges.push((key.to_string(), s));
    }
    let drop_now = !head && st.faults.drop_mid_body_once.remove(key);
    let (status, body) = match start {
        Some(s) if s >= len => {
            h.push(("Content-Range".into(), format!("bytes */{len}")));
            ("416 Range Not Satisfiable", &bytes[..0])
        }
        Some(s) => {
            h.push((
                "Content-Range".into(),
                format!("bytes {s}-{}/{len}", len - 1),
            ));
            ("206 Partial Content", &bytes[s as usize..])
        }
        None => ("200 OK", bytes),
    };
    if drop_now {
        h.push(("Content-Length".into(), body.len().to_string()));
        let mut out = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
        for (k, v) in &h {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str("\r\n");
        conn.write_all(out.as_bytes())?;
        let half = &body[..body.len() / 2];
        conn.write_all(half)?;
        body_bytes.fetch_add(half.len() as u64, Ordering::SeqCst);
        conn.flush()?;
        return conn.shutdown(std::net::Shutdown::Both);
    }
    if !head {
        body_bytes.fetch_add(body.len() as u64, Ordering::SeqCst);
    }
    respond(conn, status, &h, body, head)
}

/// `/lfs-store/{sha}`: an LFS file's bytes, the target of the hub's redirects.
fn lfs_store(
    conn: &mut TcpStream,
    req: &Req,
    state: &Mutex<State>,
    body_bytes: &AtomicU64,
    sha: &str,
) -> std::io::Result<()> {
    let head = req.head;
    let mut st = state.lock().expect("lock");
    let found = st
        .commits
        .iter()
        .flat_map(|(c, files)| files.files.iter().map(move |(p, b)| (c, p, b)))
        .find(|(_, _, b)| sha256_hex(b) == sha)
        .map(|(c, p, b)| (c.clone(), p.clone(), b.clone()));
    let Some((commit, p, b)) = found else {
        return respond(conn, "404 Not Found", &[], b"", head);
    };
    // A same-host redirect target: clients that follow it for HEAD read the hub headers here.
    let h = vec![
        ("ETag".into(), format!("\"{sha}\"")),
        ("X-Linked-Etag".into(), format!("\"{sha}\"")),
        ("X-Linked-Size".into(), b.len().to_string()),
        ("X-Repo-Commit".into(), commit),
    ];
    serve_bytes(conn, req, body_bytes, &mut st, &p, &b, h)
}

/// `/raw/{commit}/{path}`: a file's bytes at a commit (a relative redirect's target).
fn raw(
    conn: &mut TcpStream,
    req: &Req,
    state: &Mutex<State>,
    body_bytes: &AtomicU64,
    rest: &str,
) -> std::io::Result<()> {
    let head = req.head;
    let mut st = state.lock().expect("lock");
    let (commit, file) = rest.split_once('/').unwrap_or((rest, ""));
    let Some(b) = st
        .commits
        .get(commit)
        .and_then(|c| c.files.get(file))
        .cloned()
    else {
        return respond(conn, "404 Not Found", &[], b"", head);
    };
    let etag = git_blob_id(&b);
    serve_bytes(
        conn,
        req,
        body_bytes,
        &mut st,
        file,
        &b,
        vec![
            ("ETag".into(), format!("\"{etag}\"")),
            ("X-Repo-Commit".into(), commit.to_string()),
        ],
    )
}

/// `/{org}/{name}/resolve/{rev}/{path}`: a file, or a redirect to its LFS bytes.
fn resolve(
    conn: &mut TcpStream,
    req: &Req,
    state: &Mutex<State>,
    body_bytes: &AtomicU64,
    base: &str,
    segs: &[&str],
) -> std::io::Result<()> {
    let (head, authorized) = (req.head, req.authorized);
    let repo = format!("{}/{}", segs[0], segs[1]);
    let (rev, file) = (segs[3].to_string(), segs[4].to_string());
    let mut st = state.lock().expect("lock");
    *st.hits.entry(file.clone()).or_default() += 1;
    if st.faults.private.contains(&repo) && !authorized {
        return respond(conn, "401 Unauthorized", &[], b"", head);
    }
    if !head && st.faults.fail_503_once.remove(&file) {
        return respond(
            conn,
            "503 Service Unavailable",
            &[("Retry-After".into(), "0".into())],
            b"busy",
            head,
        );
    }
    let commit = st
        .branches
        .get(&repo)
        .and_then(|b| b.get(&rev).cloned())
        .unwrap_or(rev.clone());
    let Some(b) = st
        .commits
        .get(&commit)
        .and_then(|c| c.files.get(&file))
        .cloned()
    else {
        return respond(
            conn,
            "404 Not Found",
            &[("X-Error-Code".into(), "EntryNotFound".into())],
            b"",
            head,
        );
    };
    let common = vec![("X-Repo-Commit".to_string(), commit.clone())];
    if is_lfs(&file, &b) {
        let sha = sha256_hex(&b);
        let mut h = common;
        h.push(("X-Linked-Etag".into(), format!("\"{sha}\"")));
        h.push(("X-Linked-Size".into(), b.len().to_string()));
        h.push(("ETag".into(), format!("\"{}\"", git_blob_id(&b))));
        h.push(("Location".into(), format!("{base}/lfs-store/{sha}")));
        return respond(conn, "302 Found", &h, b"", head);
    }
    if st.faults.relative_redirect.contains(&file) {
        let mut h = common;
        h.push(("Location".into(), format!("/raw/{commit}/{file}")));
        return respond(conn, "307 Temporary Redirect", &h, b"", head);
    }
    let mut h = common;
    h.push(("ETag".into(), format!("\"{}\"", git_blob_id(&b))));
    serve_bytes(conn, req, body_bytes, &mut st, &file, &b, h)
}
