//! The workspace's layering, read from its sources: in no crate do two files import each other
//! (directly or round a longer loop), and the stages' domain code never imports a stage or the
//! graph. An import is a
//! `crate::…` or `super::…` path outside comments; a module using its own ancestors' items (a
//! family file using the `Semantics` type its parent defines) is nesting, not an import, and is not
//! counted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path of every `.rs` file under `src` (`lib.rs` or `main.rs` is the root, `x/mod.rs`
/// is `x`).
fn modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("read_dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = p.strip_prefix(src).expect("under src");
            let mut path: Vec<String> = rel
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let root = path.len() == 1 && (path[0] == "lib" || path[0] == "main");
            if root || path.last().is_some_and(|l| l == "mod") {
                path.pop();
            }
            out.insert(path, p);
        }
    }
    out
}

/// The module paths a file's source names through `crate::` or `super::`, braces expanded.
fn references(source: &str, module: &[String]) -> Vec<Vec<String>> {
    // `super` of a file module `a::b` is `a`; of `a/mod.rs` (module `a`) it is the root.
    let parent: Vec<String> = module[..module.len().saturating_sub(1)].to_vec();
    let mut out = Vec::new();
    for (prefix, base) in [("crate::", Vec::new()), ("super::", parent)] {
        let mut rest = source;
        while let Some(at) = rest.find(prefix) {
            let before = rest[..at].chars().last();
            rest = &rest[at + prefix.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let mut path = base.clone();
            let mut s = rest;
            loop {
                if let Some(group) = s.strip_prefix('{') {
                    let end = group.find('}').unwrap_or(group.len());
                    for item in group[..end].split(',') {
                        let head: String = item
                            .trim()
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        if !head.is_empty() && head != "self" {
                            let mut p = path.clone();
                            p.push(head);
                            out.push(p);
                        }
                    }
                    break;
                }
                let seg: String = s
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if seg.is_empty() {
                    break;
                }
                s = &s[seg.len()..];
                path.push(seg);
                match s.strip_prefix("::") {
                    Some(n) => s = n,
                    None => break,
                }
            }
            out.push(path);
        }
    }
    out
}

/// The file-level import graph: file module → the modules it imports (longest known prefix of
/// each path; the file itself and its ancestors left out).
fn graph(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mods = modules(src);
    let mut g = BTreeMap::new();
    for (m, file) in &mods {
        // Comments (doc links included) name modules without importing them.
        let text: String = std::fs::read_to_string(file)
            .expect("read source")
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let mut deps = BTreeSet::new();
        for r in references(&text, m) {
            let target = (0..=r.len())
                .rev()
                .map(|n| r[..n].to_vec())
                .find(|p| mods.contains_key(p));
            if let Some(t) = target
                && &t != m
                && !m.starts_with(&t)
            {
                deps.insert(t);
            }
        }
        g.insert(m.clone(), deps);
    }
    g
}

/// A cycle in `g`, if one exists.
fn find_cycle(g: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<Vec<String>>> {
    fn visit(
        n: &Vec<String>,
        g: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        match state.get(n) {
            Some(2) => return None,
            Some(1) => {
                let at = stack.iter().position(|s| s == n).unwrap_or(0);
                let mut c = stack[at..].to_vec();
                c.push(n.clone());
                return Some(c);
            }
            _ => {}
        }
        state.insert(n.clone(), 1);
        stack.push(n.clone());
        for d in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(d, g, state, stack) {
                return Some(c);
            }
        }
        stack.pop();
        state.insert(n.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if let Some(c) = visit(n, g, &mut state, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

fn show(p: &[String]) -> String {
    if p.is_empty() {
        "crate".into()
    } else {
        p.join("::")
    }
}

fn crate_src(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(name)
        .join("src")
}

/// Every crate of the workspace: the members the root `Cargo.toml` lists, and the binary at the
/// root itself (`.`).
fn workspace_crates() -> Vec<String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("root Cargo.toml");
    let line = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("a members line");
    let mut crates: Vec<String> = line
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    assert!(crates.len() >= 5, "members: {line}");
    crates.push(".".into());
    crates
}

#[test]
fn no_two_files_of_any_crate_import_each_other() {
    for krate in workspace_crates() {
        let g = graph(&crate_src(&krate));
        assert!(g.len() > 2, "{krate}: only {} modules found", g.len());
        if let Some(c) = find_cycle(&g) {
            let names: Vec<String> = c.iter().map(|p| show(p)).collect();
            panic!("{krate}: import cycle {}", names.join(" -> "));
        }
    }
}

#[test]
fn the_domain_code_never_imports_a_stage_or_the_graph() {
    let g = graph(&crate_src("stages"));
    let domain = [
        "format",
        "semantics",
        "layout",
        "stats",
        "verify",
        "model_spec",
        "kernel_set",
        "hub",
        "error",
    ];
    let mut checked = 0;
    for (m, deps) in &g {
        if !m.first().is_some_and(|f| domain.contains(&f.as_str())) {
            continue;
        }
        checked += 1;
        for d in deps {
            assert!(
                !matches!(d.first().map(String::as_str), Some("stage" | "graph")),
                "{} imports {}",
                show(m),
                show(d)
            );
        }
    }
    assert!(checked > 20, "only {checked} domain files found");
}

#[test]
fn the_cycle_finder_sees_a_cycle_between_two_files() {
    let src = tempfile::tempdir().expect("tempdir");
    std::fs::write(src.path().join("lib.rs"), "pub mod a;\npub mod b;\n").expect("write");
    std::fs::write(src.path().join("a.rs"), "use crate::b::B;\npub struct A;\n").expect("write");
    std::fs::write(
        src.path().join("b.rs"),
        "use super::{a::A, c};\npub struct B;\n",
    )
    .expect("write");
    let g = graph(src.path());
    let c = find_cycle(&g).expect("a cycle");
    assert_eq!(
        c.iter().map(|p| show(p)).collect::<Vec<_>>(),
        ["a", "b", "a"]
    );
}

/// The runtime's crates stay in rooms a reader can take in: no source file over 600 lines, tests
/// apart (a file named `*tests.rs`).
#[test]
fn no_runtime_source_file_is_over_600_lines() {
    for krate in ["kernels", "runtime", "serve"] {
        let mods = modules(&crate_src(krate));
        assert!(mods.len() > 10, "only {} {krate} files found", mods.len());
        for file in mods.values() {
            let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.ends_with("tests.rs") {
                continue;
            }
            let lines = std::fs::read_to_string(file).expect("read").lines().count();
            assert!(lines <= 600, "{}: {lines} lines", file.display());
        }
    }
}

/// The `onebit-*` crates a workspace crate's manifest depends on (any section).
fn onebit_deps(krate: &str) -> BTreeSet<String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifest =
        std::fs::read_to_string(root.join(krate).join("Cargo.toml")).expect("Cargo.toml");
    let own = if krate == "." {
        "onebit-pipe".to_string()
    } else {
        format!("onebit-{krate}")
    };
    manifest
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.starts_with("name"))
        .filter_map(|l| {
            let name: String = l
                .trim_start()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '-')
                .collect();
            (name.starts_with("onebit-") && name != own && l.contains('=')).then_some(name)
        })
        .collect()
}

/// The runtime's crates in their order: the kernels know only the pack format, the runtime
/// only the kernels and the pack format, nothing but the server and the binary know the
/// server, and nothing but the binary knows XRT's runner; no crate below the binary depends on a crate above it.
#[test]
fn the_runtime_crates_depend_downward_only() {
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(onebit_deps("kernels"), set(&["onebit-pack"]));
    assert_eq!(
        onebit_deps("runtime"),
        set(&["onebit-kernels", "onebit-pack"])
    );
    let serve = onebit_deps("serve");
    assert!(serve.contains("onebit-runtime"), "{serve:?}");
    // XRT's runner knows the runtime's backend and the kernels' matrices, nothing above them, and
    // only the binary links it (its feature rebuilds nothing else).
    assert_eq!(
        onebit_deps("xrt"),
        set(&["onebit-kernels", "onebit-runtime"])
    );
    for krate in workspace_crates() {
        let deps = onebit_deps(&krate);
        if krate != "." && krate != "serve" {
            assert!(
                !deps.contains("onebit-serve"),
                "{krate} depends on the server"
            );
        }
        if krate != "." {
            assert!(!deps.contains("onebit-xrt"), "{krate} depends on XRT");
        }
        for below in ["pack", "pipeline", "kernels"] {
            if krate == below {
                for above in ["onebit-runtime", "onebit-serve", "onebit-stages"] {
                    assert!(!deps.contains(above), "{krate} depends on {above}");
                }
            }
        }
    }
    // No engine code compiled only for the server.
    for krate in ["kernels", "runtime"] {
        for file in modules(&crate_src(krate)).values() {
            let text = std::fs::read_to_string(file).expect("read");
            assert!(
                !text.contains("feature = \"server\""),
                "{}: code for the server's feature",
                file.display()
            );
        }
    }
}

/// `src` with comments, string and character literals blanked (newlines kept), so that braces
/// count code only.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let blank = |s: &[u8], out: &mut Vec<u8>| {
        out.extend(s.iter().map(|&c| if c == b'\n' { b'\n' } else { b' ' }))
    };
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        let ident_before = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if rest.starts_with(b"//") {
            let end = rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len());
            blank(&rest[..end], &mut out);
            i += end;
        } else if rest.starts_with(b"/*") {
            let (mut depth, mut j) = (0usize, 0usize);
            while j < rest.len() {
                if rest[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if rest[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&rest[..j], &mut out);
            i += j;
        } else if !ident_before
            && (rest.starts_with(b"r\"")
                || rest.starts_with(b"r#")
                || rest.starts_with(b"br\"")
                || rest.starts_with(b"br#"))
        {
            let start = rest.iter().position(|&c| c == b'r').unwrap_or(0) + 1;
            let hashes = rest[start..].iter().take_while(|&&c| c == b'#').count();
            if rest.get(start + hashes) != Some(&b'"') {
                out.push(b[i]);
                i += 1;
                continue;
            }
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            let body = start + hashes + 1;
            let end = rest[body..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(rest.len(), |p| body + p + close.len());
            blank(&rest[..end], &mut out);
            i += end;
        } else if b[i] == b'"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != b'"' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(rest.len());
            blank(&rest[..end], &mut out);
            i += end;
        } else if b[i] == b'\'' {
            // A character literal ('x', '\n', '\u{..}'), not a lifetime ('a).
            let len = if rest.get(1) == Some(&b'\\') {
                rest[2..].iter().position(|&c| c == b'\'').map(|p| p + 3)
            } else {
                let ch = std::str::from_utf8(&rest[1..rest.len().min(5)])
                    .ok()
                    .or_else(|| std::str::from_utf8(&rest[1..rest.len().min(4)]).ok())
                    .or_else(|| std::str::from_utf8(&rest[1..rest.len().min(3)]).ok())
                    .or_else(|| std::str::from_utf8(&rest[1..rest.len().min(2)]).ok())
                    .and_then(|s| s.chars().next())
                    .map_or(1, char::len_utf8);
                (rest.get(1 + ch) == Some(&b'\'')).then_some(ch + 2)
            };
            match len {
                Some(n) => {
                    blank(&rest[..n], &mut out);
                    i += n;
                }
                None => {
                    out.push(b[i]);
                    i += 1;
                }
            }
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Each function of `src` with a body: (name, first line, lines from its `fn` line to its
/// closing brace).
fn functions(src: &str) -> Vec<(String, usize, usize)> {
    let code = code_only(src);
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(at) = words.iter().position(|w| *w == "fn") else {
            continue;
        };
        let before_ok = words[..at].iter().all(|w| {
            matches!(
                *w,
                "pub" | "const" | "async" | "unsafe" | "extern" | "\"C\"" | "default"
            ) || w.starts_with("pub(")
        });
        let Some(name) = words.get(at + 1).filter(|_| before_ok) else {
            continue;
        };
        let name: String = name
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let (mut depth, mut opened) = (0i64, false);
        for (j, l) in lines.iter().enumerate().skip(i) {
            if !opened && l.contains(';') && !l.contains('{') {
                break;
            }
            for c in l.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if opened && depth == 0 {
                out.push((name.clone(), i + 1, j - i + 1));
                break;
            }
        }
    }
    out
}

/// Every `.rs` file under `dir`, build outputs and vendored trees left out.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read_dir") {
        let p = e.expect("entry").path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if p.is_dir() {
            if !matches!(name, "target" | ".git" | "node_modules") {
                rust_files(&p, out);
            }
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

/// No function of the workspace, tests included, is over 150 lines (its `fn` line to its closing
/// brace): a longer one is cut into its steps, each named for what it does.
#[test]
fn no_function_in_the_workspace_is_over_150_lines() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    assert!(files.len() > 100, "only {} Rust files found", files.len());
    let mut long = Vec::new();
    let mut counted = 0;
    for f in &files {
        let src = std::fs::read_to_string(f).expect("read");
        for (name, line, n) in functions(&src) {
            counted += 1;
            if n > 150 {
                long.push(format!("{}:{line} {name}: {n} lines", f.display()));
            }
        }
    }
    assert!(counted > 1000, "only {counted} functions found");
    assert!(
        long.is_empty(),
        "functions over 150 lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_function_counter_skips_braces_in_strings_and_comments() {
    let src = "fn a() {\n    let s = \"}}}\";\n    // }\n    let c = '}';\n    let r = r#\"{\"#;\n}\nfn b<'x>(v: &'x str) -> &'x str {\n    v\n}\nfn c();\n";
    let f = functions(src);
    assert_eq!(f, vec![("a".to_string(), 1, 6), ("b".to_string(), 7, 3)]);
}
