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
        assert!(g.len() > 5, "{krate}: only {} modules found", g.len());
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

/// The runtime stays in rooms a reader can take in: no source file over 600 lines, tests apart
/// (a file named `*tests.rs`).
#[test]
fn no_runtime_source_file_is_over_600_lines() {
    let mods = modules(&crate_src("runtime"));
    assert!(mods.len() > 20, "only {} runtime files found", mods.len());
    for file in mods.values() {
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.ends_with("tests.rs") {
            continue;
        }
        let lines = std::fs::read_to_string(file).expect("read").lines().count();
        assert!(lines <= 600, "{}: {lines} lines", file.display());
    }
}
