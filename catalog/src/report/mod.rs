//! `onebit-pipe report`: one pack seen whole, in one self-contained HTML file (or the same charts
//! as PNG files). Everything on it comes from the catalog's tables by the SQL queries the page
//! lists under each section: verdict and provenance, the decisions with their sources, agreement
//! with the reference per tensor (failing and repaired first), tile kinds and padding per layer,
//! row-block heatmaps and value histograms per tensor, stage runs across imports, and what changed
//! in verification between the last two imports.

pub mod charts;
pub mod frame;
pub mod html;
mod page;
pub mod queries;

use std::collections::BTreeMap;

use charts::{
    Agreement, AgreementPoint, BlockHeatmap, FAIL, FLAG, HEATMAP_COLUMNS, Histogram, MUTED, PASS,
    REPAIRED, StackedBars,
};
use frame::Frame;

use crate::Catalog;
use crate::error::{Error, Result};

/// What to report on.
#[derive(Clone, Debug)]
pub struct Options {
    /// The pack (its ref name, as `packs.name`).
    pub pack: String,
    /// Tensors whose decoded values get a histogram, besides the worst ones.
    pub histograms: Vec<String>,
    /// How many of the worst-agreeing tensors get a histogram without being asked for.
    pub worst: usize,
}

impl Options {
    /// The report of `pack` with histograms of its 3 worst tensors.
    pub fn new(pack: &str) -> Options {
        Options {
            pack: pack.to_string(),
            histograms: Vec::new(),
            worst: 3,
        }
    }
}

/// Tensors above this many values get a histogram only when asked for by name (decoding them
/// takes seconds).
pub const HISTOGRAM_AUTO_MAX_VALUES: f64 = 16_777_216.0;

/// Equal bins of a histogram.
const BINS: usize = 64;

/// One query the report ran: its section and text.
struct Ran {
    section: &'static str,
    sql: String,
}

/// The query results the report is drawn from.
struct Data {
    pack: String,
    ran: Vec<Ran>,
    pack_row: Frame,
    files: Option<Frame>,
    semantics: Option<Frame>,
    agreement: Option<Frame>,
    towers: Option<Frame>,
    tiles: Option<Frame>,
    tensors: Option<Frame>,
    blocks: Option<Frame>,
    histograms: BTreeMap<String, Histogram>,
    runs: Option<Frame>,
    imports: Option<Frame>,
    diff: Option<(String, String, Frame)>,
}

impl Data {
    fn gather(catalog: &Catalog, opts: &Options) -> Result<Data> {
        let p = opts.pack.as_str();
        let mut ran = Vec::new();
        let mut run =
            |section: &'static str, tables: &[&str], sql: String| -> Result<Option<Frame>> {
                if tables.iter().any(|t| !catalog.tables().contains_key(*t)) {
                    return Ok(None);
                }
                let f = Frame::from_batches(&catalog.sql(&sql)?)?;
                ran.push(Ran { section, sql });
                Ok(Some(f))
            };
        let pack_row = run("Verdict", &["packs"], queries::pack(p))?.unwrap_or_default();
        if pack_row.is_empty() {
            let known = Frame::from_batches(&catalog.sql("SELECT name FROM packs ORDER BY name")?)?;
            let names: Vec<&str> = (0..known.rows())
                .filter_map(|r| known.text(r, "name"))
                .collect();
            return Err(Error::UnknownPack {
                pack: p.to_string(),
                known: if names.is_empty() {
                    "none".into()
                } else {
                    names.join(", ")
                },
            });
        }
        let files = run("Provenance", &["files"], queries::files(p))?;
        let semantics = run("Provenance", &["semantics"], queries::semantics(p))?;
        let with_repair = catalog.tables().contains_key("repair_verification");
        let agreement = run(
            "Agreement",
            &["verification"],
            queries::agreement(p, with_repair),
        )?;
        let towers =
            run("Agreement", &["verification"], queries::towers(p))?.filter(|f| f.rows() > 0);
        let tiles = run("Tiles", &["tensors"], queries::tiles(p))?;
        let tensors = run("Tensors", &["tensors", "tensor_stats"], queries::tensors(p))?;
        let blocks = run("Tensors", &["block_stats"], queries::blocks(p))?;
        let runs = run("Runs", &["runs"], queries::runs(p))?;
        let imports = run("Changes", &["verification_history"], queries::imports(p))?;
        // The newest import against the one before it.
        let last_two = imports
            .as_ref()
            .filter(|f| f.rows() >= 2)
            .map(|f| (f.text(0, "import_key"), f.text(1, "import_key")));
        let diff = match last_two {
            Some((Some(a), Some(b))) => {
                let (a, b) = (a.to_string(), b.to_string());
                let sql = queries::diff(p, &b, &a);
                run("Changes", &["verification_history"], sql)?.map(|f| (b, a, f))
            }
            _ => None,
        };
        // Histograms: the tensors asked for, then the worst-agreeing ones of moderate size.
        let mut picks: Vec<String> = Vec::new();
        let find = |name: &str| -> Option<usize> {
            let t = tensors.as_ref()?;
            (0..t.rows()).find(|&r| t.text(r, "name") == Some(name))
        };
        for name in &opts.histograms {
            if find(name).is_none() {
                return Err(Error::UnknownTensor {
                    pack: p.to_string(),
                    tensor: name.clone(),
                });
            }
            picks.push(name.clone());
        }
        let mut auto = 0;
        if let (Some(a), Some(t)) = (&agreement, &tensors) {
            for r in 0..a.rows() {
                if auto >= opts.worst {
                    break;
                }
                let Some(name) = a.text(r, "tensor") else {
                    continue;
                };
                let Some(i) = find(name) else { continue };
                let values = t.num(i, "rows").unwrap_or(0.0) * t.num(i, "k").unwrap_or(0.0);
                if picks.iter().any(|p| p == name) || values > HISTOGRAM_AUTO_MAX_VALUES {
                    continue;
                }
                picks.push(name.to_string());
                auto += 1;
            }
        }
        let mut histograms = BTreeMap::new();
        let asked = opts.histograms.clone();
        for name in picks {
            let (Some(t), Some(i)) = (&tensors, find(&name)) else {
                continue;
            };
            let (Some(min), Some(max)) = (t.num(i, "min"), t.num(i, "max")) else {
                continue;
            };
            if !(min.is_finite() && max.is_finite()) {
                continue;
            }
            // A pack imported on another machine (a shared store) may have no repository folder
            // here to decode values from: the worst tensors' histograms are then left out, said in
            // the log; a tensor asked for by name is an error.
            let f = match run("Tensors", &[], queries::histogram(p, &name, min, max, BINS)) {
                Ok(Some(f)) => f,
                Ok(None) => continue,
                Err(e) if !asked.contains(&name) => {
                    tracing::warn!(tensor = %name, error = %e, "histogram left out");
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mut counts = vec![0u64; BINS];
            for r in 0..f.rows() {
                if let (Some(b), Some(n)) = (f.num(r, "bin"), f.num(r, "n")) {
                    counts[(b.max(0.0) as usize).min(BINS - 1)] += n as u64;
                }
            }
            let width = ((max - min) / BINS as f64).max(f64::MIN_POSITIVE);
            histograms.insert(
                name.clone(),
                Histogram {
                    tensor: name,
                    min,
                    width,
                    counts,
                },
            );
        }
        Ok(Data {
            pack: p.to_string(),
            ran,
            pack_row,
            files,
            semantics,
            agreement,
            towers,
            tiles,
            tensors,
            blocks,
            histograms,
            runs,
            imports,
            diff,
        })
    }

    /// The class of an agreement row: fail, repaired, flag, skipped or pass.
    fn agreement_class(a: &Frame, r: usize) -> &'static str {
        let verdict = a.text(r, "verdict").unwrap_or("");
        let repaired = a.text(r, "repaired_verdict");
        match (verdict, repaired) {
            ("fail", Some("pass")) => "repaired",
            ("fail", _) => "fail",
            ("flag", _) => "flag",
            ("skipped", _) => "skipped",
            _ => "pass",
        }
    }

    fn agreement_chart(&self) -> Option<Agreement> {
        let a = self.agreement.as_ref()?;
        let points = (0..a.rows())
            .map(|r| AgreementPoint {
                one_minus_corr: a.num(r, "corr").map_or(1.0, |c| 1.0 - c),
                color: match Data::agreement_class(a, r) {
                    "fail" => FAIL,
                    "repaired" => REPAIRED,
                    "flag" => FLAG,
                    "skipped" => MUTED,
                    _ => PASS,
                },
            })
            .collect();
        Some(Agreement { points })
    }

    fn tiles_chart(&self) -> Option<StackedBars> {
        let t = self.tiles.as_ref()?;
        // The embedding and head dwarf a layer: the chart draws the layers (when there are any)
        // and the table lists the rest.
        let in_layers = (0..t.rows()).any(|r| t.text(r, "layer").is_some());
        let (bars, series, values) = stack(
            t,
            &|r| t.text(r, "layer").unwrap_or("-").to_string(),
            &|r| t.text(r, "kind").unwrap_or("?").to_string(),
            &|r| !(in_layers && t.text(r, "layer").is_none()),
            &|r| t.num(r, "bytes").unwrap_or(0.0) / (1 << 20) as f64,
        );
        Some(StackedBars {
            name: "tiles",
            title: "Bytes per layer by tile kind (tensors outside the layers: see the table)",
            unit: "MiB",
            bars,
            series,
            values,
            palette: 0,
        })
    }

    /// Row-block heatmaps of every tensor with more than one row block.
    fn heatmaps(&self) -> BTreeMap<String, BlockHeatmap> {
        let mut out = BTreeMap::new();
        let Some(b) = &self.blocks else { return out };
        let mut by: BTreeMap<&str, Vec<(f64, f64, f64)>> = BTreeMap::new();
        for r in 0..b.rows() {
            let Some(name) = b.text(r, "name") else {
                continue;
            };
            by.entry(name).or_default().push((
                b.num(r, "absmax").unwrap_or(f64::NAN),
                b.num(r, "rms").unwrap_or(f64::NAN),
                b.num(r, "rows").unwrap_or(1.0),
            ));
        }
        for (name, blocks) in by {
            if blocks.len() < 2 {
                continue;
            }
            let per = blocks.len().div_ceil(HEATMAP_COLUMNS);
            let mut absmax = Vec::new();
            let mut rms = Vec::new();
            for g in blocks.chunks(per) {
                absmax.push(g.iter().map(|x| x.0).fold(f64::NEG_INFINITY, |m, v| {
                    if v.is_nan() { v } else { m.max(v) }
                }));
                let rows: f64 = g.iter().map(|x| x.2).sum();
                rms.push((g.iter().map(|x| x.1 * x.1 * x.2).sum::<f64>() / rows.max(1.0)).sqrt());
            }
            out.insert(
                name.to_string(),
                BlockHeatmap {
                    tensor: name.to_string(),
                    rows: vec![("absmax".into(), absmax), ("rms".into(), rms)],
                    blocks_per_column: per,
                    blocks: blocks.len(),
                },
            );
        }
        out
    }

    fn runs_chart(&self) -> Option<StackedBars> {
        let f = self.runs.as_ref()?;
        let status = |r: usize| f.text(r, "status");
        let (runs, series, values) = stack(
            f,
            &|r| f.text(r, "run_id").unwrap_or("?").to_string(),
            &|r| f.text(r, "stage").unwrap_or("?").to_string(),
            &|r| matches!(status(r), Some("miss" | "hit")),
            &|r| match status(r) {
                Some("miss") => f.num(r, "duration_ms").unwrap_or(0.0),
                _ => 0.0,
            },
        );
        let bars = runs
            .iter()
            .enumerate()
            .map(|(i, run)| {
                let of = |want: &str| {
                    (0..f.rows())
                        .filter(|&r| {
                            f.text(r, "run_id") == Some(run.as_str()) && status(r) == Some(want)
                        })
                        .count()
                };
                format!("#{} ({} ran, {} cached)", i + 1, of("miss"), of("hit"))
            })
            .collect();
        Some(StackedBars {
            name: "runs",
            title: "Stage time per import (cached stages take none)",
            unit: "ms",
            bars,
            series,
            values,
            palette: 3,
        })
    }
}

/// Bars and series of a stacked chart from a frame: one bar per distinct `bar(row)`, one series
/// per distinct `series(row)` (both in first-seen order), summing `value(row)` over the rows
/// `keep` accepts.
fn stack(
    f: &Frame,
    bar: &dyn Fn(usize) -> String,
    series: &dyn Fn(usize) -> String,
    keep: &dyn Fn(usize) -> bool,
    value: &dyn Fn(usize) -> f64,
) -> (Vec<String>, Vec<String>, Vec<Vec<f64>>) {
    let (mut bars, mut names) = (Vec::<String>::new(), Vec::<String>::new());
    let mut cells: Vec<(usize, usize, f64)> = Vec::new();
    for r in (0..f.rows()).filter(|&r| keep(r)) {
        let (b, s) = (bar(r), series(r));
        let bi = bars.iter().position(|x| *x == b).unwrap_or_else(|| {
            bars.push(b);
            bars.len() - 1
        });
        let si = names.iter().position(|x| *x == s).unwrap_or_else(|| {
            names.push(s);
            names.len() - 1
        });
        cells.push((bi, si, value(r)));
    }
    let mut values = vec![vec![0.0; names.len()]; bars.len()];
    for (b, s, v) in cells {
        values[b][s] += v;
    }
    (bars, names, values)
}

/// The report of `opts.pack` as one self-contained HTML page.
pub fn html(catalog: &Catalog, opts: &Options) -> Result<String> {
    page::render(catalog, opts)
}

/// A file-name stem from a tensor name.
fn stem(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The report's charts as PNG files: `(file name, bytes)`. The block heatmaps and histograms are
/// those of the tensors that get a histogram (the worst and the ones asked for).
pub fn png(catalog: &Catalog, opts: &Options) -> Result<Vec<(String, Vec<u8>)>> {
    let d = Data::gather(catalog, opts)?;
    let mut out = Vec::new();
    if let Some(c) = d.agreement_chart() {
        out.push(("agreement.png".to_string(), charts::png(&c)?));
    }
    if let Some(c) = d.tiles_chart() {
        out.push(("tiles.png".to_string(), charts::png(&c)?));
    }
    if let Some(c) = d.runs_chart() {
        out.push(("runs.png".to_string(), charts::png(&c)?));
    }
    let heatmaps = d.heatmaps();
    for (name, h) in &d.histograms {
        if let Some(b) = heatmaps.get(name) {
            out.push((format!("blocks-{}.png", stem(name)), charts::png(b)?));
        }
        out.push((format!("values-{}.png", stem(name)), charts::png(h)?));
    }
    Ok(out)
}
