//! Prints what the reader decides for each tensor of a pack, with its statistics, without touching
//! the store: `cargo run --example inspect -- tests/fixtures/q4nx/llama-q40`.

use std::path::PathBuf;

use onebit_stages::format::q4nx::Container;
use onebit_stages::layout::detect::detect_pack;
use onebit_stages::layout::geometry::Geometry;
use onebit_stages::stats::tensor::tensor_stats;

fn main() -> anyhow::Result<()> {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| ".".into()));
    let container = Container::open(&dir.join("model.q4nx"))?;
    let config = dir.join("config.json");
    let geometry = if config.is_file() {
        Some(Geometry::from_file(&config)?)
    } else {
        None
    };
    if let Some(g) = &geometry {
        for d in &g.decisions {
            println!("{d}");
        }
    }
    for l in detect_pack(&container, geometry.as_ref())? {
        let s = tensor_stats(&container, &l)?;
        println!("{}  [{}x{}]  {}", l.name, l.rows, l.k, l.decision);
        let zero = if s.zeros.count > 0 {
            format!(", m/d mean {:.3}", s.zeros.mean() / s.scales.mean())
        } else {
            String::new()
        };
        println!(
            "    mean {:+.5} std {:.5} absmax {:.4} zeros {:.4} pad≠0 {}  d mean {:.3e}{zero}",
            s.values.mean(),
            s.values.std(),
            s.values.absmax(),
            s.values.zero_fraction(),
            s.pad.count - s.pad.zeros + s.pad.nan + s.pad.inf,
            s.scales.mean(),
        );
        for f in &l.flags {
            println!("    FLAG {f}");
        }
    }
    Ok(())
}
