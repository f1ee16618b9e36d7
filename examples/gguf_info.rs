//! Prints a GGUF file's architecture, key metadata and tensors with their types:
//! `cargo run --example gguf_info -- model.gguf`.

use std::path::PathBuf;

use onebit_stages::format::gguf::{GgufFile, MetaValue};

fn main() -> anyhow::Result<()> {
    let path = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "model.gguf".into()),
    );
    let f = GgufFile::open(&path)?;
    println!(
        "GGUF v{} alignment {} data at {}",
        f.version, f.alignment, f.data_start
    );
    for (k, v) in &f.metadata {
        let shown = match v {
            MetaValue::Array(a) => format!("[{} items]", a.len()),
            MetaValue::String(s) if s.len() > 80 => format!("{:?}…", &s[..80]),
            other => format!("{other:?}"),
        };
        println!("  {k} = {shown}");
    }
    let mut by_type = std::collections::BTreeMap::new();
    for t in &f.tensors {
        *by_type.entry(t.ty.to_string()).or_insert(0) += 1;
        println!("  {:<40} {:<6} {:?}", t.name, t.ty.to_string(), t.dims);
    }
    println!("types: {by_type:?}");
    Ok(())
}
