//! A synthetic graph for demonstrating and benchmarking the engine: ten stages in a diamond
//! lattice, each writing deterministic bytes derived from its name and its parents' content.
//!
//! ```text
//! gen-0 ─┬─ gen-1 ─┬─ gen-3 ─┬─ gen-4 ── gen-6 ─┬─ gen-8 ── gen-9
//!        └─ gen-2 ─┘         └─ gen-5 ── gen-7 ─┘
//! ```
//! Pairs (1, 2), (4, 5) and (6, 7) are independent and run in parallel.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::dag::Graph;
use crate::error::{Result, StageError};
use crate::stage::{Input, Stage, StageContext, StageId};

/// Parents of each demo stage, by index.
pub const DEMO_EDGES: [&[usize]; 10] = [
    &[],
    &[0],
    &[0],
    &[1, 2],
    &[3],
    &[3],
    &[4],
    &[5],
    &[6, 7],
    &[8],
];

/// One synthetic stage: hashes its parents' outputs and expands the hash to `bytes` bytes.
#[derive(Clone, Debug)]
pub struct SyntheticStage {
    /// Stage name.
    pub name: String,
    /// Stage version.
    pub version: u32,
    /// Parent stage names (each read through its `data` output).
    pub parents: Vec<String>,
    /// Bytes to write.
    pub bytes: u64,
    /// Sleep this long halfway through writing (demonstrates locks and crashes; not in the key
    /// because it does not change the output).
    pub delay: Duration,
}

impl Stage for SyntheticStage {
    fn id(&self) -> StageId<'_> {
        StageId::new(&self.name, self.version)
    }

    fn params(&self) -> Value {
        json!({ "bytes": self.bytes })
    }

    fn inputs(&self) -> Vec<Input> {
        self.parents
            .iter()
            .map(|p| Input::artifact(p, p, "data"))
            .collect()
    }

    fn outputs(&self) -> Vec<String> {
        vec!["data".into()]
    }

    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let mut seed = blake3::Hasher::new();
        seed.update(self.name.as_bytes());
        seed.update(&self.version.to_le_bytes());
        let mut buf = vec![0u8; 1 << 20];
        for p in &self.parents {
            let mut f = fs_err::File::open(ctx.input(p)?)?;
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                seed.update(&buf[..n]);
            }
        }
        let mut xof = seed.finalize_xof();
        let mut out = std::io::BufWriter::new(fs_err::File::create(ctx.output("data"))?);
        let mut written = 0u64;
        let mut slept = false;
        while written < self.bytes {
            let n = (self.bytes - written).min(buf.len() as u64) as usize;
            xof.fill(&mut buf[..n]);
            out.write_all(&buf[..n])?;
            written += n as u64;
            ctx.progress(written, self.bytes);
            if !slept && written * 2 >= self.bytes && !self.delay.is_zero() {
                out.flush()?;
                std::thread::sleep(self.delay);
                slept = true;
            }
        }
        out.flush()?;
        Ok(())
    }
}

/// The ten-stage demo graph holding `total_bytes` in all, every stage at `version`, each
/// sleeping `delay` mid-write.
pub fn demo_graph(total_bytes: u64, version: u32, delay: Duration) -> Result<Graph> {
    let per = total_bytes / DEMO_EDGES.len() as u64;
    let stages: Vec<Arc<dyn Stage>> = DEMO_EDGES
        .iter()
        .enumerate()
        .map(|(i, ps)| {
            Arc::new(SyntheticStage {
                name: format!("gen-{i}"),
                version,
                parents: ps.iter().map(|p| format!("gen-{p}")).collect(),
                bytes: per,
                delay,
            }) as Arc<dyn Stage>
        })
        .collect();
    Graph::new(stages)
}
