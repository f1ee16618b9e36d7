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
    /// llama.cpp's mmproj GGUF of the same model (Gemma 3, Qwen3.5): its vision tower is written
    /// as vision_weight.q4nx, as FastFlowLM's converter writes it, and config.json names it.
    #[arg(long, value_name = "GGUF")]
    pub mmproj: Option<PathBuf>,
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

/// Converts and prints a summary (`-v`: every decision and the per-tensor table; `--json`: the
/// whole report); exits 1 on a refusal.
pub fn exec(g: &Global, a: ConvertArgs) -> anyhow::Result<ExitCode> {
    let opts = ConvertOptions {
        tile: a.tile,
        family: a.family,
        calibrate: a.calibrate,
        calibrate_tokens: a.calibrate_tokens,
        tile_for: a.tile_for,
        gptq: a.gptq,
        config: a.config,
        mmproj: a.mmproj,
    };
    let t0 = std::time::Instant::now();
    let report = onebit_convert::convert(&a.gguf, &a.out, &opts)?;
    if g.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    if !g.quiet && g.verbose > 0 {
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
    if !g.quiet && g.verbose == 0 {
        for line in summary(&report) {
            println!("  {line}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Tensors worst by relative error that the summary names.
const WORST: usize = 3;

/// The default output after the headline: tensors per stored kind and method, the worst by
/// relative error, and where the full report is (`-v` prints it, `--json` gives it whole).
fn summary(report: &onebit_convert::ConvertReport) -> Vec<String> {
    let mut by_kind: std::collections::BTreeMap<&str, std::collections::BTreeMap<&str, usize>> =
        std::collections::BTreeMap::new();
    for t in &report.tensors {
        *by_kind
            .entry(t.stored_as.as_str())
            .or_default()
            .entry(t.method.as_str())
            .or_default() += 1;
    }
    let kinds: Vec<String> = by_kind
        .iter()
        .map(|(kind, methods)| {
            let n: usize = methods.values().sum();
            let m: Vec<String> = methods.iter().map(|(m, c)| format!("{c} {m}")).collect();
            format!("{n} {kind} ({})", m.join(", "))
        })
        .collect();
    let mut worst: Vec<&onebit_convert::TensorReport> = report
        .tensors
        .iter()
        .filter(|t| t.stored_as != "BF16" && t.rel_l2 > 0.0)
        .collect();
    worst.sort_by(|a, b| b.rel_l2.total_cmp(&a.rel_l2));
    let mut out = vec![format!("stored: {}", kinds.join("; "))];
    if worst.is_empty() {
        out.push("every tiled tensor holds its source's values exactly (rel L2 0)".into());
    } else {
        let w: Vec<String> = worst
            .iter()
            .take(WORST)
            .map(|t| {
                format!(
                    "{} ({}, {}) {:.2e}",
                    t.name, t.stored_as, t.method, t.rel_l2
                )
            })
            .collect();
        out.push(format!("largest rel L2: {}", w.join("; ")));
    }
    out.push(format!(
        "{} decisions and the per-tensor table: -v, or --json; also {}",
        report.decisions.len(),
        report.out.join("onebit-convert.json").display()
    ));
    out
}
