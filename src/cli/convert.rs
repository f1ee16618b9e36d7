//! `onebit-pipe convert --gguf FILE --out DIR`: write a FastFlowLM NPU2 repository folder from a
//! GGUF, and print what each tensor became with its error.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use onebit_convert::{ConvertOptions, TileChoice};

use super::Global;

/// Arguments of `convert`.
#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// The GGUF to convert.
    #[arg(long, value_name = "FILE")]
    pub gguf: PathBuf,
    /// The repository folder to write (must not exist, or be empty).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Tile kind: auto (quarter tiles when a K is off the 256 grid), q4-5120, q4-1280, q4s-4608,
    /// q8-8704.
    #[arg(long, default_value = "auto", value_parser = parse_tile)]
    pub tile: TileChoice,
    /// Family, overriding the GGUF's general.architecture.
    #[arg(long)]
    pub family: Option<String>,
    /// Calibrate requantization on this text (repeatable): each column's error is weighted by the
    /// mean square of the activations that multiply it. Use text you will not evaluate on.
    #[arg(long, value_name = "FILE")]
    pub calibrate: Vec<PathBuf>,
    /// Calibration tokens at most.
    #[arg(long, default_value_t = 4096)]
    pub calibrate_tokens: usize,
    /// A different tile kind for the tensors whose pack name contains PATTERN (repeatable; the
    /// last match wins), e.g. `--tile-for lm_head=q8-8704`.
    #[arg(long, value_name = "PATTERN=TILE", value_parser = parse_tile_for)]
    pub tile_for: Vec<(String, TileChoice)>,
    /// Requantize 4-bit tensors with GPTQ: each column's rounding error is compensated on the
    /// columns after it through the calibration inputs' second moments (needs --calibrate).
    #[arg(long)]
    pub gptq: bool,
    /// The model's real config.json: it wins over what the GGUF implies (each difference is
    /// recorded as a decision); a config whose dimensions contradict the GGUF is refused.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

fn parse_tile_for(s: &str) -> Result<(String, TileChoice), String> {
    let (pat, tile) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not PATTERN=TILE"))?;
    if pat.is_empty() {
        return Err(format!("{s:?} has an empty pattern"));
    }
    Ok((pat.to_string(), parse_tile(tile)?))
}

fn parse_tile(s: &str) -> Result<TileChoice, String> {
    TileChoice::parse(s)
        .ok_or_else(|| format!("unknown tile {s:?}: auto, q4-5120, q4-1280, q4s-4608, q8-8704"))
}

/// Converts, prints the per-tensor table (or JSON), exits 1 on a refusal.
pub fn exec(g: &Global, a: ConvertArgs) -> anyhow::Result<ExitCode> {
    let opts = ConvertOptions {
        tile: a.tile,
        family: a.family,
        calibrate: a.calibrate,
        calibrate_tokens: a.calibrate_tokens,
        tile_for: a.tile_for,
        gptq: a.gptq,
        config: a.config,
    };
    let t0 = std::time::Instant::now();
    let report = match onebit_convert::convert(&a.gguf, &a.out, &opts) {
        Ok(r) => r,
        Err(e @ onebit_stages::Error::Refused { .. }) => {
            return Err(anyhow::Error::new(super::Refused(e.to_string())));
        }
        Err(e) => return Err(e.into()),
    };
    if g.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    if !g.quiet {
        for d in &report.decisions {
            println!("  {d}");
        }
        println!(
            "{:<48} {:<10} {:<11} {:<12} {:>9} {:>9}",
            "tensor", "source", "stored", "method", "rel L2", "max abs"
        );
        for t in &report.tensors {
            println!(
                "{:<48} {:<10} {:<11} {:<12} {:>9.2e} {:>9.2e}",
                t.name, t.source_type, t.stored_as, t.method, t.rel_l2, t.max_abs
            );
        }
    }
    println!(
        "converted {} ({}, {} tensors) into {} in {:.1} s",
        report.gguf.display(),
        report.family,
        report.tensors.len(),
        report.out.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}
