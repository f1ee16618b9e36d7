//! GGUF dequantization throughput per type on the real Gemma 3 270M GGUF, side by side with the
//! independent implementation (gguf-py, numpy) run on the same file in the same process tree.
//!
//! Run: `ONEBIT_GEMMA_GGUF=$(scripts/fetch-gemma.sh) cargo bench -p onebit-stages --bench gguf_dequant`
//! (needs python3 with numpy and gguf for the baseline column).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use onebit_stages::format::gguf::GgufFile;

fn main() {
    let path = std::env::var_os("ONEBIT_GEMMA_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/onebit-models/gemma-3-270m-q4_k_m.gguf")
        });
    if !path.is_file() {
        println!(
            "gguf_dequant: skipped: no GGUF at {} (run scripts/fetch-gemma.sh)",
            path.display()
        );
        return;
    }
    let f = GgufFile::open(&path).expect("open");
    // (seconds, bytes, tensors) per type; best of 3 passes, one thread.
    let mut ours: BTreeMap<String, (f64, u64, u64)> = BTreeMap::new();
    let mut buf = Vec::new();
    for pass in 0..3 {
        let mut this: BTreeMap<String, (f64, u64, u64)> = BTreeMap::new();
        for t in &f.tensors {
            if !t.ty.dequantizable() {
                continue;
            }
            let t0 = Instant::now();
            f.rows_f32(t, 0, t.rows(), &mut buf).expect("dequantize");
            std::hint::black_box(&buf);
            let e = this.entry(t.ty.to_string()).or_default();
            e.0 += t0.elapsed().as_secs_f64();
            e.1 += t.nbytes.unwrap_or(0);
            e.2 += 1;
        }
        for (k, v) in this {
            let best = ours.entry(k).or_insert(v);
            if pass == 0 || v.0 < best.0 {
                *best = v;
            }
        }
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/support/gguf_ref.py");
    let theirs: BTreeMap<String, serde_json::Value> = std::process::Command::new("python3")
        .arg(&script)
        .arg("bench")
        .arg(&path)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| serde_json::from_slice(&o.stdout).ok())
        .unwrap_or_default();
    println!(
        "gguf_dequant: {} — one thread, best of 3; baseline gguf-py 0.19.0 (numpy) on the same tensors",
        path.display()
    );
    println!(
        "{:<6} {:>8} {:>12} {:>12} {:>12} {:>8}",
        "type", "tensors", "MB", "ours GB/s", "gguf-py GB/s", "ratio"
    );
    for (ty, (secs, bytes, n)) in &ours {
        let ours_rate = *bytes as f64 / secs / 1e9;
        let (theirs_rate, ratio) = match theirs.get(ty).and_then(|v| v["seconds"].as_f64()) {
            Some(s) if s > 0.0 => {
                let r = *bytes as f64 / s / 1e9;
                (format!("{r:.3}"), format!("{:.1}x", ours_rate / r))
            }
            _ => ("n/a".into(), "n/a".into()),
        };
        println!(
            "{ty:<6} {n:>8} {:>12.1} {ours_rate:>12.3} {theirs_rate:>12} {ratio:>8}",
            *bytes as f64 / 1e6
        );
    }
}
