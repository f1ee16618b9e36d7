//! Verification (verification.md): every pack tensor against independent references — a GGUF of
//! the same model (through the name map and the family transforms) and, for a tied head, the pack's
//! own embedding (the four-part fit rule, seed #2194) — plus the structural checks that need no
//! reference. Produces the `verification` table and the pack verdict.

use half::bf16;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::gguf::names::{MapDims, RowMap, Twin, prescaled_embedding, twin};
use crate::format::gguf::{GgmlType, GgufFile, GgufTensor};
use crate::format::native::native_copy;
use crate::format::q4nx::Container;
use crate::format::tiles::{Codes, TileKind};
use crate::layout::geometry::{Geometry, ffn_pad_of};
use crate::layout::reader::{TensorRows, TiledReader};
use crate::layout::{Layout, TensorLayout};
use crate::semantics::Rope;

pub mod rope;
mod tie;

pub use tie::{four_bit_floor, four_bit_floor_symmetric, tie_fit};

/// A verdict of one comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The reading agrees with the reference.
    Pass,
    /// Between pass and fail: reported, not refused.
    Flag,
    /// The reading disagrees: the pack is refused.
    Fail,
    /// No reference (`NO_REF`): reported, never counted as a pass.
    Skipped,
    /// A candidate reading weighed for the table, not a verdict on the pack.
    Candidate,
}

impl Verdict {
    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Flag => "flag",
            Verdict::Fail => "fail",
            Verdict::Skipped => "skipped",
            Verdict::Candidate => "candidate",
        }
    }
}

/// One row of the `verification` table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VerifyRow {
    /// Pack tensor.
    pub tensor: String,
    /// The reference (`gguf:blk.0.attn_q.weight (Q4_1)`, `embedding:...`, `none`).
    pub reference: String,
    /// The reading compared (tile kind or `plain`).
    pub reading: String,
    /// Elements compared.
    pub compared: u64,
    /// Pearson correlation.
    pub corr: Option<f64>,
    /// Σ|x−y| / Σ|y|.
    pub rel_l1: Option<f64>,
    /// ‖x−y‖ / ‖y‖.
    pub rel_l2: Option<f64>,
    /// max |x−y|.
    pub max_err: Option<f64>,
    /// Share of bit-equal elements.
    pub exact_fraction: Option<f64>,
    /// Least-squares scale `a` with `y ≈ a·x`.
    pub scale: Option<f64>,
    /// √(Σx² / Σy²).
    pub rms_ratio: Option<f64>,
    /// The reference's 4-bit noise floor at block 32 (tie rule).
    pub floor: Option<f64>,
    /// Correlation expected from the two quantization noises (independent references).
    pub expected: Option<f64>,
    /// The verdict.
    pub verdict: Verdict,
    /// Why, with the numbers.
    pub reason: String,
}

impl VerifyRow {
    /// A row for `layout` against `reference`, with no numbers yet: `NO_REF` until a comparison
    /// fills it.
    pub fn new(layout: &TensorLayout, reference: String) -> VerifyRow {
        let reading = layout
            .kind()
            .map_or("plain".into(), |k| k.name().to_string());
        VerifyRow::unmeasured(layout.name.clone(), reference, reading)
    }

    /// A row for `tensor` read as `reading` against `reference`, with no numbers yet (`NO_REF`
    /// until a comparison fills it or a verdict replaces it): also for a tensor the file lacks.
    pub fn unmeasured(tensor: String, reference: String, reading: String) -> VerifyRow {
        VerifyRow {
            tensor,
            reference,
            reading,
            compared: 0,
            corr: None,
            rel_l1: None,
            rel_l2: None,
            max_err: None,
            exact_fraction: None,
            scale: None,
            rms_ratio: None,
            floor: None,
            expected: None,
            verdict: Verdict::Skipped,
            reason: "NO_REF: no reference for this tensor".into(),
        }
    }
}

/// The pack verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PackVerdict {
    /// True when every tensor passed (or flagged) against some reference and none failed.
    pub verified: bool,
    /// Tensors that failed, each with its reason.
    pub failing: Vec<String>,
    /// Tensors with no reference.
    pub unreferenced: Vec<String>,
    /// Counts.
    pub passed: usize,
    /// Flagged tensors.
    pub flagged: usize,
    /// One line for logs and the CLI.
    pub summary: String,
    /// Tensors the repair stage rebuilt (each `name <- source`), when it ran.
    #[serde(default)]
    pub repaired: Vec<String>,
    /// For a refused pack: what `--repair` would rebuild and from what.
    #[serde(default)]
    pub repair: Option<String>,
}

/// Streaming sums for the metrics of verification.md §3 (f64).
#[derive(Clone, Copy, Debug, Default)]
pub struct PairStats {
    n: u64,
    sx: f64,
    sy: f64,
    sxx: f64,
    syy: f64,
    sxy: f64,
    sad: f64,
    say: f64,
    sdd: f64,
    max_abs: f64,
    exact: u64,
    bf16_exact: u64,
}

impl PairStats {
    /// Adds pairs (pack value x, reference y).
    pub fn extend(&mut self, xs: &[f32], ys: &[f32]) {
        for (&x, &y) in xs.iter().zip(ys) {
            let (a, b) = (x as f64, y as f64);
            self.n += 1;
            self.sx += a;
            self.sy += b;
            self.sxx += a * a;
            self.syy += b * b;
            self.sxy += a * b;
            self.sad += (a - b).abs();
            self.say += b.abs();
            self.sdd += (a - b) * (a - b);
            self.max_abs = self.max_abs.max((a - b).abs());
            self.exact += (x.to_bits() == y.to_bits()) as u64;
            self.bf16_exact += (x.to_bits() == bf16::from_f32(y).to_f32().to_bits()) as u64;
        }
    }

    /// Merges another set of sums.
    pub fn merge(mut self, o: PairStats) -> PairStats {
        self.n += o.n;
        self.sx += o.sx;
        self.sy += o.sy;
        self.sxx += o.sxx;
        self.syy += o.syy;
        self.sxy += o.sxy;
        self.sad += o.sad;
        self.say += o.say;
        self.sdd += o.sdd;
        self.max_abs = self.max_abs.max(o.max_abs);
        self.exact += o.exact;
        self.bf16_exact += o.bf16_exact;
        self
    }

    /// Pearson r.
    pub fn corr(&self) -> f64 {
        let n = self.n as f64;
        let cov = self.sxy / n - (self.sx / n) * (self.sy / n);
        let vx = self.sxx / n - (self.sx / n).powi(2);
        let vy = self.syy / n - (self.sy / n).powi(2);
        if vx <= 0.0 || vy <= 0.0 {
            0.0
        } else {
            cov / (vx * vy).sqrt()
        }
    }

    /// Share of pack values equal to the reference rounded to bf16.
    pub fn bf16_exact_fraction(&self) -> f64 {
        self.bf16_exact as f64 / self.n.max(1) as f64
    }

    /// Σ(x−y)².
    pub fn sdd(&self) -> f64 {
        self.sdd
    }

    /// Σy².
    pub fn syy(&self) -> f64 {
        self.syy
    }

    /// Writes the metrics into a verification row.
    pub fn fill_row(&self, row: &mut VerifyRow) {
        self.fill(row)
    }

    fn fill(&self, row: &mut VerifyRow) {
        row.compared = self.n;
        row.corr = Some(self.corr());
        row.rel_l1 = Some(self.sad / self.say.max(f64::MIN_POSITIVE));
        row.rel_l2 = Some((self.sdd / self.syy.max(f64::MIN_POSITIVE)).sqrt());
        row.max_err = Some(self.max_abs);
        row.exact_fraction = Some(self.exact as f64 / self.n.max(1) as f64);
        row.scale = Some(self.sxy / self.sxx.max(f64::MIN_POSITIVE));
        row.rms_ratio = Some((self.sxx / self.syy.max(f64::MIN_POSITIVE)).sqrt());
    }
}

/// Typical relative RMS error of a quantization type against float weights (verification.md §4).
fn noise_of_gguf(t: GgmlType) -> f64 {
    use GgmlType::*;
    match t {
        F32 | F64 => 0.0,
        F16 => 0.0005,
        BF16 => 0.003,
        Q8_0 | Q8_1 | Q8_K => 0.005,
        Q6_K => 0.02,
        Q5_0 | Q5_1 | Q5_K => 0.04,
        Q4_0 | Q4_1 | Q4_K | IQ4_NL | IQ4_XS | MXFP4 => 0.08,
        _ => 0.2,
    }
}

fn noise_of_pack(l: &TensorLayout) -> f64 {
    match l.codes {
        Some(Codes::Signed8) => 0.005,
        Some(_) => 0.08,
        None => 0.003,
    }
}

/// What the verifier needs to know about the model.
#[derive(Clone, Copy, Debug)]
pub struct VerifyDims {
    /// Map dimensions (hidden, heads, RoPE dim, head dim).
    pub map: MapDims,
}

/// Decodes the logical rows `[r0, r1)` of a pack tensor (row-major).
fn pack_rows(
    rows: &TensorRows<'_>,
    blk: usize,
    out: &mut Vec<f32>,
    scratch: &mut Vec<f32>,
) -> usize {
    let mut pad = Vec::new();
    rows.block(blk, out, &mut pad, scratch)
}

/// Reference rows for pack rows `[r0, r0+n)`, through the twin's row map and scale.
fn gguf_rows(
    g: &GgufFile,
    t: &GgufTensor,
    tw: &Twin,
    r0: u64,
    n: u64,
    out: &mut Vec<f32>,
) -> Result<()> {
    match tw.rows {
        RowMap::Identity => g.rows_f32(t, r0, r0 + n, out)?,
        RowMap::Transpose => {
            // A small tensor (a convolution kernel): pack row r is GGUF column r.
            let mut all = Vec::new();
            g.rows_f32(t, 0, t.rows(), &mut all)?;
            let k = t.row_len() as usize;
            out.clear();
            for r in r0..r0 + n {
                out.extend(all.chunks_exact(k).map(|row| row[r as usize]));
            }
        }
        map => {
            out.clear();
            let mut one = Vec::new();
            for r in r0..r0 + n {
                let gr = map.gguf_row(r);
                g.rows_f32(t, gr, gr + 1, &mut one)?;
                out.extend_from_slice(&one);
            }
        }
    }
    if let Some(s) = tw.scale {
        for v in out.iter_mut() {
            *v *= s;
        }
    }
    Ok(())
}

/// Compares a pack tensor (read as `layout`) with its GGUF twin over the whole tensor.
/// The GGUF's (rows, K) when the pack tensor is its twin padded by the family's FFN padding
/// (q4nx-format §4: qwen2's `gate/up_proj` rows and `down_proj` columns to a multiple of 512).
fn ffn_padded_twin(arch: &str, l: &TensorLayout, gt: &GgufTensor) -> Option<(u64, u64)> {
    let pad = ffn_pad_of(arch);
    let (g_rows, g_k) = (gt.rows(), gt.row_len());
    let up = |n: u64| n.div_ceil(pad) * pad;
    let fits = (l.rows == g_rows || l.rows == up(g_rows)) && (l.k == g_k || l.k == up(g_k));
    (pad > 1 && fits && (l.rows, l.k) != (g_rows, g_k)).then_some((g_rows, g_k))
}

/// A pack tensor against its GGUF twin over the GGUF's extent (rows × K), every pack row block
/// in parallel. Values past that extent (the family's FFN padding) are not compared; those that
/// are not exactly zero are counted. For an unpadded tensor the extent is the whole tensor.
fn compare_with_gguf(
    c: &Container,
    layout: &TensorLayout,
    g: &GgufFile,
    gt: &GgufTensor,
    tw: &Twin,
) -> Result<(PairStats, u64)> {
    let rows = TensorRows::new(c, layout)?;
    let br = rows.block_rows() as u64;
    let (g_rows, g_k) = match tw.rows {
        RowMap::Transpose => (gt.row_len(), gt.rows() as usize),
        _ => (gt.rows(), gt.row_len() as usize),
    };
    let k = layout.k as usize;
    (0..rows.blocks())
        .into_par_iter()
        .map_init(
            || (Vec::new(), Vec::new(), Vec::new(), Vec::new()),
            |(x, y, s, live), b| -> Result<(PairStats, u64)> {
                let n = pack_rows(&rows, b, x, s) as u64;
                let r0 = b as u64 * br;
                let real = n.min(g_rows.saturating_sub(r0));
                gguf_rows(g, gt, tw, r0, real, y)?;
                let mut p = PairStats::default();
                if real == n && g_k == k {
                    p.extend(x, y);
                    return Ok((p, 0));
                }
                live.clear();
                let mut nonzero = 0u64;
                for (i, row) in x.chunks(k).enumerate().take(n as usize) {
                    let (kept, pad) = row.split_at(if (i as u64) < real { g_k } else { 0 });
                    live.extend_from_slice(kept);
                    nonzero += pad.iter().filter(|v| **v != 0.0).count() as u64;
                }
                p.extend(live, y);
                Ok((p, nonzero))
            },
        )
        .try_reduce(
            || (PairStats::default(), 0),
            |a, b| Ok((a.0.merge(b.0), a.1 + b.1)),
        )
}

/// Decodes the first row blocks of a tiled tensor as `kind` (same grid) and correlates them with
/// the GGUF twin: a candidate reading for the table.
fn candidate(
    c: &Container,
    layout: &TensorLayout,
    kind: TileKind,
    g: &GgufFile,
    gt: &GgufTensor,
    tw: &Twin,
) -> Result<f64> {
    let Layout::Tiled {
        row_blocks,
        col_tiles,
        ..
    } = layout.layout
    else {
        return Ok(0.0);
    };
    let info = c
        .tensor(&layout.name)
        .ok_or_else(|| Error::Internal("tensor vanished".into()))?;
    let reader = TiledReader::new(c.data(info), kind, row_blocks as usize, col_tiles as usize)?;
    let (mut out, mut s, mut y) = (Vec::new(), Vec::new(), Vec::new());
    let mut p = PairStats::default();
    let k = layout.k as usize;
    for b in 0..(row_blocks as usize).min(4) {
        reader.decode_row_block(b, &mut out, &mut s);
        let r0 = (b * kind.rows()) as u64;
        let n = (kind.rows() as u64).min(layout.rows.saturating_sub(r0));
        gguf_rows(g, gt, tw, r0, n, &mut y)?;
        let kp = reader.padded_k();
        for r in 0..n as usize {
            p.extend(&out[r * kp..r * kp + k], &y[r * k..(r + 1) * k]);
        }
    }
    Ok(p.corr())
}

/// The alternative readings of a tiled tensor's bytes (same tile width and grid).
fn alternatives(kind: TileKind) -> &'static [TileKind] {
    match kind {
        TileKind::Q41_5120 => &[TileKind::Q40_5120],
        TileKind::Q40_5120 => &[TileKind::Q41_5120],
        TileKind::Q8L_8704 => &[TileKind::Q8C_8704],
        TileKind::Q8C_8704 => &[TileKind::Q8L_8704],
        _ => &[],
    }
}

fn gguf_verdict(layout: &TensorLayout, gt: &GgufTensor, p: &PairStats, row: &mut VerifyRow) {
    p.fill(row);
    let corr = p.corr();
    let exact = p.exact as f64 / p.n.max(1) as f64;
    let rel_l2 = row.rel_l2.unwrap_or(f64::INFINITY);
    if layout.layout == Layout::Plain && p.bf16_exact == p.n {
        row.verdict = Verdict::Pass;
        row.reason = "every value is bf16(reference) bit for bit".into();
        return;
    }
    // Same source: the pack kept the GGUF's own codes (a type the tile holds natively) — many
    // values then match exactly — or the two agree to 1 %. A requantized tensor can share a few
    // exact values by chance (zeros of a Q5_0 source), so exact matches alone do not qualify.
    let native = layout
        .kind()
        .is_none_or(|k| native_copy(gt.ty, k.codes()).is_some());
    if (exact > 0.01 && native) || rel_l2 <= 0.01 {
        row.expected = Some(1.0);
        (row.verdict, row.reason) = if corr >= 0.9999 {
            (
                Verdict::Pass,
                format!("same-source reference: corr {corr:.6} ≥ 0.9999"),
            )
        } else if corr >= 0.999 {
            (
                Verdict::Flag,
                format!("same-source reference: corr {corr:.6} < 0.9999"),
            )
        } else {
            (
                Verdict::Fail,
                format!("same-source reference: corr {corr:.6} < 0.999"),
            )
        };
    } else {
        let (ep, eg) = (noise_of_pack(layout), noise_of_gguf(gt.ty));
        let expected = 1.0 / ((1.0 + ep * ep) * (1.0 + eg * eg)).sqrt();
        row.expected = Some(expected);
        let bound = (expected - 0.005).max(0.99);
        (row.verdict, row.reason) = if corr >= bound {
            (
                Verdict::Pass,
                format!(
                    "independent reference: corr {corr:.4} ≥ {bound:.4} (expected {expected:.4})"
                ),
            )
        } else if corr >= 0.95 {
            (
                Verdict::Flag,
                format!(
                    "independent reference: corr {corr:.4} < {bound:.4} (expected {expected:.4})"
                ),
            )
        } else {
            (
                Verdict::Fail,
                format!("independent reference: corr {corr:.4} < 0.95 (expected {expected:.4})"),
            )
        };
    }
}

/// Reads a whole plain-or-tiled tensor's logical values (row-major). Only for heads and embeddings
/// of modest size (the tie test); the GGUF comparison streams instead.
fn whole(c: &Container, l: &TensorLayout, max_rows: u64) -> Result<Vec<f32>> {
    let rows = TensorRows::new(c, l)?;
    let (mut out, mut pad, mut s, mut all) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for b in 0..rows.blocks() {
        if (b * rows.block_rows()) as u64 >= max_rows {
            break;
        }
        rows.block(b, &mut out, &mut pad, &mut s);
        all.extend_from_slice(&out);
    }
    all.truncate((max_rows.min(l.rows) * l.k) as usize);
    Ok(all)
}

/// Verifies a pack. `gguf` is the optional GGUF reference; `arch` the family used for the name map
/// when no GGUF states one; `tie_rows` caps the rows of the tie test (the seeds used 4,096).
pub fn verify_pack(
    c: &Container,
    layouts: &[TensorLayout],
    gguf: Option<&GgufFile>,
    arch: &str,
    dims: VerifyDims,
    tie_rows: u64,
) -> Result<(Vec<VerifyRow>, PackVerdict)> {
    let arch = gguf
        .and_then(|g| g.architecture())
        .unwrap_or(arch)
        .to_string();
    let mut rows = Vec::new();
    for l in layouts {
        let mut row = VerifyRow::new(l, "none".into());
        let tw = gguf.and_then(|g| twin(&arch, &l.name, dims.map, |n| g.tensor(n).is_some()));
        let gt = tw
            .as_ref()
            .and_then(|t| gguf.and_then(|g| g.tensor(&t.gguf)));
        match (gguf, &tw, gt) {
            (Some(g), Some(tw), Some(gt)) => {
                row.reference = format!(
                    "gguf:{} ({}){}",
                    gt.name,
                    gt.ty,
                    if tw.note.is_empty() {
                        String::new()
                    } else {
                        format!("; {}", tw.note)
                    }
                );
                // The pack tensor is its GGUF twin, or the twin with the family's FFN padding.
                let padded = ffn_padded_twin(&arch, l, gt);
                let (g_rows, g_k) = match tw.rows {
                    RowMap::Transpose => (gt.row_len(), gt.rows()),
                    _ => (gt.rows(), gt.row_len()),
                };
                if padded.is_none() && (g_k != l.k || g_rows != l.rows) {
                    row.verdict = Verdict::Fail;
                    row.reason = format!(
                        "shape: pack {}x{} but GGUF {} is {}x{} (ne {:?})",
                        l.rows,
                        l.k,
                        gt.name,
                        gt.rows(),
                        gt.row_len(),
                        gt.dims
                    );
                } else if !gt.ty.dequantizable() {
                    row.verdict = Verdict::Skipped;
                    row.reason = format!("NO_REF: GGUF type {} has no dequantizer", gt.ty);
                } else {
                    let (p, pad_nonzero) = compare_with_gguf(c, l, g, gt, tw)?;
                    gguf_verdict(l, gt, &p, &mut row);
                    match padded {
                        Some((g_rows, g_k)) => {
                            let note = format!(
                                "; FFN padding {g_rows}x{g_k} -> {}x{} (q4nx-format §4)",
                                l.rows, l.k
                            );
                            if pad_nonzero > 0 {
                                row.verdict = Verdict::Fail;
                                row.reason = format!(
                                    "{pad_nonzero} padding values past the GGUF's {g_rows}x{g_k} are not zero{note}"
                                );
                            } else {
                                row.reason.push_str(&note);
                            }
                        }
                        // Alternative readings are weighed on unpadded tiled tensors only.
                        None => {
                            if let Some(kind) = l.kind() {
                                for &alt in alternatives(kind) {
                                    let corr = candidate(c, l, alt, g, gt, tw)?;
                                    rows.push(VerifyRow {
                                        reading: alt.name().into(),
                                        compared: 0,
                                        corr: Some(corr),
                                        verdict: Verdict::Candidate,
                                        reason: format!(
                                            "alternative reading of the same bytes: corr {corr:.4} vs {:.4} for {kind}",
                                            p.corr()
                                        ),
                                        ..row.clone()
                                    });
                                }
                            }
                        }
                    }
                }
            }
            (Some(_), Some(tw), None) => {
                row.reason = format!("NO_REF: the GGUF has no {}", tw.gguf);
            }
            (Some(_), None, _) => {
                row.reason = format!("NO_REF: no GGUF name for this tensor in family {arch}");
            }
            (None, ..) => {}
        }
        // Rows stored past the real ones (a vocabulary off the tile's row block): detection
        // accepted them only as zero rows or as FastFlowLM's α/β copies; the real rows were
        // compared, and the record says how many were stored.
        if let Layout::Tiled { padded_rows, .. } = l.layout
            && padded_rows > l.rows
        {
            let how = if l.decision.contains("repeated") {
                "copies of the real rows"
            } else {
                "zero rows"
            };
            row.reason.push_str(&format!(
                "; rows {}..{padded_rows} are {how} filling the last row block (q4nx-format §4), not compared",
                l.rows
            ));
        }
        // Structural checks need no reference and override a good correlation.
        if !l.flags.is_empty() {
            row.verdict = Verdict::Fail;
            row.reason = format!("structural: {}; {}", l.flags.join("; "), row.reason);
        }
        rows.push(row);
    }

    if let Some(row) = tied_head_row(c, layouts, gguf, &arch, dims, tie_rows)? {
        rows.push(row);
    }

    let verdict = pack_verdict(layouts, &rows);
    Ok((rows, verdict))
}

/// The tied-head fit's row, when the head is tied (no separate GGUF head) and an embedding of
/// its shape exists: the head's first `tie_rows` rows against the embedding's (divided by
/// √hidden where the family pre-scales its embedding).
fn tied_head_row(
    c: &Container,
    layouts: &[TensorLayout],
    gguf: Option<&GgufFile>,
    arch: &str,
    dims: VerifyDims,
    tie_rows: u64,
) -> Result<Option<VerifyRow>> {
    let head = layouts.iter().find(|l| l.name == "lm_head.weight");
    let emb = layouts.iter().find(|l| {
        onebit_pack::manifest::EMBEDDING_NAMES.contains(&l.name.as_str())
            && l.layout == Layout::Plain
    });
    let tied = gguf.is_none_or(|g| g.tensor("output.weight").is_none());
    let (Some(h), Some(e), true) = (head, emb, tied) else {
        return Ok(None);
    };
    if h.rows != e.rows || h.k != e.k {
        return Ok(None);
    }
    let n = tie_rows.min(h.rows);
    let x = whole(c, h, n)?;
    let mut ev = whole(c, e, n)?;
    let mut reference = format!("embedding:{}", e.name);
    if prescaled_embedding(arch) {
        let s = (dims.map.hidden as f32).sqrt();
        for v in ev.iter_mut() {
            *v /= s;
        }
        reference = format!("{reference} ÷ √{}", dims.map.hidden);
    }
    let mut row = VerifyRow::new(h, format!("{reference}; first {n} rows"));
    tie_fit(&x, &ev, h.k as usize, h.codes, &mut row);
    Ok(Some(row))
}

/// The pack verdict from the table: refused if any tensor failed; verified only if every tensor
/// has a passing (or flagged) comparison.
pub fn pack_verdict(layouts: &[TensorLayout], rows: &[VerifyRow]) -> PackVerdict {
    let mut failing = Vec::new();
    let mut unreferenced = Vec::new();
    let (mut passed, mut flagged) = (0, 0);
    for l in layouts {
        let mine: Vec<&VerifyRow> = rows
            .iter()
            .filter(|r| r.tensor == l.name && r.verdict != Verdict::Candidate)
            .collect();
        if let Some(f) = mine.iter().find(|r| r.verdict == Verdict::Fail) {
            failing.push(format!("{} ({}): {}", l.name, f.reference, f.reason));
        } else if mine.iter().any(|r| r.verdict == Verdict::Pass) {
            passed += 1;
        } else if mine.iter().any(|r| r.verdict == Verdict::Flag) {
            flagged += 1;
        } else {
            unreferenced.push(l.name.clone());
        }
    }
    let verified = failing.is_empty() && unreferenced.is_empty();
    let summary = if !failing.is_empty() {
        format!(
            "refused: {} of {} tensors fail verification: {}",
            failing.len(),
            layouts.len(),
            failing
                .iter()
                .map(|f| f.split(" (").next().unwrap_or(f))
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else if !unreferenced.is_empty() {
        format!(
            "unverified: {} of {} tensors have no reference (give --reference GGUF): {}",
            unreferenced.len(),
            layouts.len(),
            unreferenced.join(", ")
        )
    } else {
        format!("verified: {passed} tensors pass, {flagged} flagged")
    };
    PackVerdict {
        verified,
        failing,
        unreferenced,
        passed,
        flagged,
        summary,
        repaired: Vec::new(),
        repair: None,
    }
}

/// The GGUF architecture name of a config `model_type`, for the name map without a GGUF.
pub fn arch_of_model_type(model_type: &str) -> &str {
    match model_type {
        "gemma3" | "gemma3_text" => "gemma3",
        "gemma2" => "gemma2",
        "gemma4" | "gemma4_text" => "gemma4",
        "qwen3_5" | "qwen3_5_text" | "qwen3_5_moe" => "qwen35",
        "hunyuan_v1_dense" => "hunyuan-dense",
        other => other,
    }
}

/// Runs verification with dimensions from the config (and the GGUF's RoPE dimension when stated).
/// `rope` is the semantics' RoPE of full-attention layers (or why there is none), the reference
/// of a pack's `rope_freqs.weight` besides its GGUF twin.
pub fn run_verify(
    container: &Container,
    layouts: &[TensorLayout],
    geometry: Option<&Geometry>,
    gguf: Option<&GgufFile>,
    rope: std::result::Result<&Rope, &str>,
    tie_rows: u64,
) -> Result<(Vec<VerifyRow>, PackVerdict)> {
    let (arch, map) = reference_dims(geometry, gguf);
    let dims = VerifyDims { map };
    let (mut rows, _) = verify_pack(container, layouts, gguf, &arch, dims, tie_rows)?;
    for l in layouts.iter().filter(|l| l.name == rope::ROPE_FREQS) {
        rows.push(rope::rope_freqs_row(container, l, rope)?);
    }
    let mut verdict = pack_verdict(layouts, &rows);
    // A refusal says what `--repair` would rebuild, and from what.
    if !verdict.failing.is_empty() {
        let (planned, refused) = crate::repair::plan(layouts, gguf, &arch, map);
        if let Some(h) = crate::repair::hint(&planned, &refused) {
            verdict.summary = format!("{}; {h}", verdict.summary);
            verdict.repair = Some(h);
        }
    }
    Ok((rows, verdict))
}

/// The family (GGUF architecture, else the config's `model_type`) and the name map's dimensions,
/// from the config geometry and the GGUF's own keys where the config is silent.
pub fn reference_dims(geometry: Option<&Geometry>, gguf: Option<&GgufFile>) -> (String, MapDims) {
    let arch = gguf
        .and_then(|g| g.architecture().map(str::to_string))
        .or_else(|| geometry.map(|g| arch_of_model_type(&g.model_type).to_string()))
        .unwrap_or_default();
    let meta = |key: &str| {
        gguf.and_then(|g| g.meta(&format!("{arch}.{key}")))
            .and_then(|v| v.as_u64())
    };
    let hidden = geometry
        .map(|g| g.hidden)
        .or_else(|| meta("embedding_length"))
        .unwrap_or(0);
    let heads = geometry
        .map(|g| g.heads)
        .or_else(|| meta("attention.head_count"))
        .unwrap_or(1);
    let head_dim = geometry
        .map(|g| g.head_dim)
        .or_else(|| meta("attention.key_length"))
        .unwrap_or(hidden / heads.max(1));
    let rope_dim = meta("rope.dimension_count").unwrap_or(head_dim);
    (
        arch,
        MapDims {
            hidden,
            heads,
            rope_dim,
            head_dim,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Q4_1-style (min/max) quantization of `e` at block 32: values on an asymmetric grid.
    fn on_asymmetric_grid(e: &[f32]) -> Vec<f32> {
        e.chunks(32)
            .flat_map(|b| {
                let lo = b.iter().copied().fold(f32::INFINITY, f32::min);
                let hi = b.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let s = (hi - lo) / 15.0;
                b.iter()
                    .map(move |v| lo + ((v - lo) / s).round().clamp(0.0, 15.0) * s)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Symmetric requantization of `e` (Q4_0's rule), as a Q40 head holds it.
    fn symmetric(e: &[f32]) -> Vec<f32> {
        e.chunks(32)
            .flat_map(|b| {
                let m = b
                    .iter()
                    .copied()
                    .fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m });
                let d = m / -8.0;
                b.iter()
                    .map(move |v| (v / d).round().clamp(-8.0, 7.0) * d)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn embedding() -> Vec<f32> {
        // A fixed pseudo-random embedding, 64 rows of 128.
        let mut x = 0x2545_f491_u32;
        (0..64 * 128)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x as f32 / u32::MAX as f32 - 0.5) * 0.2
            })
            .collect()
    }

    #[test]
    fn a_symmetric_head_from_an_asymmetric_embedding_fits_by_the_symmetric_floor() {
        let e = on_asymmetric_grid(&embedding());
        let head = symmetric(&e);
        assert!(
            four_bit_floor(&e, 128, 32) < 0.01,
            "e lies on the min/max grid"
        );
        let sym = four_bit_floor_symmetric(&e, 128, 32);
        assert!(sym > 0.05, "symmetric floor {sym}");
        let layout_row = || VerifyRow {
            tensor: "lm_head.weight".into(),
            reference: "embedding".into(),
            reading: "Q40_4608".into(),
            compared: 0,
            corr: None,
            rel_l1: None,
            rel_l2: None,
            max_err: None,
            exact_fraction: None,
            scale: None,
            rms_ratio: None,
            floor: None,
            expected: None,
            verdict: Verdict::Skipped,
            reason: String::new(),
        };
        // Read as signed codes: bounded by the symmetric floor, passes.
        let mut row = layout_row();
        tie_fit(&head, &e, 128, Some(Codes::Signed4), &mut row);
        assert_eq!(row.verdict, Verdict::Pass, "{}", row.reason);
        assert!(row.reason.contains("symmetric floor"), "{}", row.reason);
        // Without the code kind, the seed's floor refuses the same numbers.
        let mut row = layout_row();
        tie_fit(&head, &e, 128, None, &mut row);
        assert_eq!(row.verdict, Verdict::Fail, "{}", row.reason);
        // A scaled symmetric head is still refused.
        let scaled: Vec<f32> = head.iter().map(|v| v * 1.2).collect();
        let mut row = layout_row();
        tie_fit(&scaled, &e, 128, Some(Codes::Signed4), &mut row);
        assert_eq!(row.verdict, Verdict::Fail, "{}", row.reason);
    }
}
