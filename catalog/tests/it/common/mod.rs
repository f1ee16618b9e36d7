//! Builds a store from the fixture packs by running the real import graph in-process.

use std::path::{Path, PathBuf};

use onebit_pipeline::{NullReporter, RunOptions, Store, run_graph};
use onebit_stages::{ImportSource, import_graph};

/// `tests/fixtures/q4nx/<case>` at the workspace root.
pub fn fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/q4nx")
        .join(case)
}

/// Imports `dir` as pack `name` (with a GGUF reference when given).
pub fn import(store: &Store, name: &str, dir: &Path, reference: Option<PathBuf>) {
    let source = ImportSource {
        dir: dir.to_path_buf(),
        reference,
        mmproj: None,
        fetch: None,
        repair: false,
    };
    let graph =
        import_graph(&source, std::sync::Arc::new(onebit_runtime::HostKernels)).expect("graph");
    let opts = RunOptions {
        jobs: 2,
        ref_name: Some(name.to_string()),
        source: serde_json::json!({"args": format!("--path {}", dir.display()), "dir": dir.display().to_string()}),
        deep_check: false,
    };
    run_graph(store, &graph, &opts, &NullReporter).expect("import");
}

/// A store holding four fixture packs: two verified against their GGUF, the broken q80 one, and
/// one imported without a reference.
pub fn fixture_store() -> (tempfile::TempDir, Store) {
    let home = tempfile::tempdir().expect("tmp");
    let store = Store::open(home.path()).expect("store");
    import(
        &store,
        "llama-q41",
        &fixture("llama-q41"),
        Some(fixture("llama-q41/model.gguf")),
    );
    import(
        &store,
        "llama-q40",
        &fixture("llama-q40"),
        Some(fixture("llama-q40/model.gguf")),
    );
    import(
        &store,
        "llama-q80",
        &fixture("llama-q80"),
        Some(fixture("llama-q80/model.gguf")),
    );
    import(
        &store,
        "gemma3-rb16",
        &fixture("gemma3-q41-quarter/rb16"),
        None,
    );
    (home, store)
}
