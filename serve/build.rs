//! Lists the chat page's built files (webui/dist/, committed; `npm run build` in webui/ makes
//! them) into `$OUT_DIR/webui_assets.rs`, each included in the binary.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    webui();
}

/// Writes `$OUT_DIR/webui_assets.rs`: `WEBUI`, every file of webui/dist/ as (name, bytes).
fn webui() {
    use std::fmt::Write as _;
    let dir = std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default())
        .join("webui/dist");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("the chat page's files: {}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    let mut out = String::from(
        "/// The chat page's files: (name, bytes).\npub static WEBUI: &[(&str, &[u8])] = &[\n",
    );
    for n in &names {
        println!("cargo:rerun-if-changed={}", dir.join(n).display());
        let _ = writeln!(
            out,
            "    ({n:?}, include_bytes!({:?})),",
            dir.join(n).display().to_string()
        );
    }
    out.push_str("];\n");
    let path =
        std::path::Path::new(&std::env::var("OUT_DIR").unwrap_or_default()).join("webui_assets.rs");
    std::fs::write(&path, out).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}
