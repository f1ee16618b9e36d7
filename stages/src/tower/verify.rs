//! A tower file against llama.cpp's mmproj GGUF of the same model: every tower tensor with its
//! twin ([`super::names`]), value for value after the twin is rounded to bf16 as the converter
//! rounds it; every mmproj tensor that no tower tensor holds named as missing. A failure names
//! what the data shows instead: the transpose of the twin, another block geometry, or values
//! that are simply different; a projection's padding must be zero.

use super::names::{self, Relation, second_slice};
use crate::error::Result;
use crate::format::gguf::GgufFile;
use crate::format::q4nx::Container;
use crate::layout::mm_block::MmBlock;
use crate::layout::reader::TensorRows;
use crate::layout::{Layout, TensorLayout};
use crate::verify::{PackVerdict, PairStats, Verdict, VerifyRow, pack_verdict};

/// A tower tensor's logical values, row-major `rows × k`, and its padding (MM blocks).
fn tower_values(c: &Container, l: &TensorLayout) -> Result<(Vec<f32>, Vec<f32>)> {
    let rows = TensorRows::new(c, l)?;
    let (mut all, mut pad) = (Vec::new(), Vec::new());
    let (mut out, mut p, mut scratch) = (Vec::new(), Vec::new(), Vec::new());
    for b in 0..rows.blocks() {
        rows.block(b, &mut out, &mut p, &mut scratch);
        all.extend_from_slice(&out);
        pad.extend_from_slice(&p);
    }
    Ok((all, pad))
}

/// The values of `l` read as an `n × k` matrix in `block` geometry, when the tensor holds
/// exactly that geometry's padded extent of it (the declared shape aside: a converter that cut the
/// blocks one way may declare them the other).
fn read_as(c: &Container, l: &TensorLayout, block: MmBlock, n: u64, k: u64) -> Option<Vec<f32>> {
    let info = c.tensor(&l.name)?;
    if block.padded(n) * block.padded(k) * 2 != info.nbytes() {
        return None;
    }
    let blocks_k = block.padded(k) / block.mm_k;
    let mut all = Vec::with_capacity((n * k) as usize);
    let mut row = Vec::new();
    for r in 0..n {
        block.read_row(c.data(info), blocks_k, r, &mut row);
        all.extend_from_slice(row.get(..k as usize)?);
    }
    Some(all)
}

/// The twin's values in the tower's order, and the `(rows, k)` they form.
fn reference_values(
    g: &GgufFile,
    twin: &str,
    relation: Relation,
) -> Result<Option<(Vec<f32>, u64, u64)>> {
    let Some(t) = g.tensor(twin) else {
        return Ok(None);
    };
    let mut v = Vec::new();
    g.rows_f32(t, 0, t.rows(), &mut v)?;
    let (rows, k) = (t.rows(), t.row_len());
    Ok(Some(match relation {
        Relation::Same => (v, rows, k),
        Relation::Transposed => (transpose(&v, rows, k), k, rows),
        Relation::StackedTime => {
            // [out, in, p, p] twice → [out, in, 2, p, p]: per (out, in) pair, slice 0 then 1.
            let Some(t1) = g.tensor(&second_slice(twin)) else {
                return Ok(None);
            };
            let mut v1 = Vec::new();
            g.rows_f32(t1, 0, t1.rows(), &mut v1)?;
            let plane = (t.dims.first().copied().unwrap_or(1) * t.dims.get(1).copied().unwrap_or(1))
                as usize;
            let mut out = Vec::with_capacity(v.len() * 2);
            for (a, b) in v.chunks(plane.max(1)).zip(v1.chunks(plane.max(1))) {
                out.extend_from_slice(a);
                out.extend_from_slice(b);
            }
            let outer = t.dims.last().copied().unwrap_or(1);
            let len = out.len() as u64;
            (out, outer, len / outer.max(1))
        }
    }))
}

fn transpose(v: &[f32], rows: u64, k: u64) -> Vec<f32> {
    let (rows, k) = (rows as usize, k as usize);
    let mut out = vec![0.0; v.len()];
    for r in 0..rows {
        for c in 0..k {
            out[c * rows + r] = v[r * k + c];
        }
    }
    out
}

fn stats(x: &[f32], y: &[f32]) -> PairStats {
    let mut p = PairStats::default();
    p.extend(x, y);
    p
}

/// Whether the tower's values are the twin's: bit for bit after rounding to bf16, or equal within
/// the rounding of a twin the tower was not made from directly.
fn same_values(p: &PairStats, row: &VerifyRow) -> Option<String> {
    let exact = p.bf16_exact_fraction();
    if exact == 1.0 {
        return Some("every value is bf16(mmproj) bit for bit".into());
    }
    let (corr, rel) = (p.corr(), row.rel_l2.unwrap_or(f64::INFINITY));
    (corr >= 0.9999 && rel <= 0.01).then(|| {
        format!(
            "equal within rounding: corr {corr:.6}, rel_l2 {rel:.2e}, {:.1} % bit-equal after bf16 rounding",
            exact * 100.0
        )
    })
}

/// What the data shows when the values are not the twin's: the twin's transpose (read with the
/// two extents swapped), or the tensor cut in another block geometry.
fn explain(c: &Container, l: &TensorLayout, x: &[f32], y: &[f32]) -> String {
    let p = stats(x, y);
    let corr_of = |v: &[f32], w: &[f32]| stats(v, w).corr();
    let (n, k) = (l.rows, l.k);
    // The transpose: the bytes hold the twin as [in, out].
    let transposed = match l.layout {
        _ if n <= 1 || k <= 1 => None,
        Layout::MmBlock { block, .. } => read_as(c, l, block, k, n),
        _ => Some(x.to_vec()),
    };
    if let Some(v) = transposed {
        let t = transpose(y, n, k);
        let ct = corr_of(&v, &t);
        if ct >= 0.999 {
            return format!(
                "transposed: the tower holds the mmproj twin as [in, out] ({k}x{n}, corr {ct:.4}); \
                 read as [out, in] {n}x{k} it gives corr {:.4}",
                p.corr()
            );
        }
    }
    if let Layout::MmBlock { block, .. } = l.layout {
        let alternatives = MmBlock::KNOWN
            .into_iter()
            .chain(MmBlock::KNOWN.map(|b| MmBlock {
                mm_k: b.mm_n,
                mm_n: b.mm_k,
            }))
            .filter(|&b| b != block);
        for alt in alternatives {
            if let Some(v) = read_as(c, l, alt, n, k) {
                let ca = corr_of(&v, y);
                if ca >= 0.999 {
                    return format!(
                        "wrong block geometry: read as {} the tower gives corr {:.4}; as {} it \
                         matches the mmproj twin (corr {ca:.4})",
                        block.name(),
                        p.corr(),
                        alt.name()
                    );
                }
            }
        }
    }
    format!(
        "values differ from the mmproj twin: corr {:.4}, rel_l2 {:.3}",
        p.corr(),
        (p.sdd() / p.syy().max(f64::MIN_POSITIVE)).sqrt()
    )
}

/// One tower tensor against its twin.
fn verify_tensor(c: &Container, l: &TensorLayout, g: &GgufFile) -> Result<VerifyRow> {
    let Some((twin, _, relation)) = names::twin(&l.name) else {
        let mut row = VerifyRow::new(l, "none".into());
        row.reading = l.reading();
        row.reason = "NO_REF: no mmproj name is known for this tower tensor".into();
        return Ok(row);
    };
    let mut row = VerifyRow::new(l, format!("mmproj:{twin}"));
    row.reading = l.reading();
    let Some((y, rows, k)) = reference_values(g, &twin, relation)? else {
        row.verdict = Verdict::Fail;
        row.reason = format!("missing from the mmproj: it has no {twin}");
        return Ok(row);
    };
    let (x, pad) = tower_values(c, l)?;
    if x.len() != y.len() {
        row.verdict = Verdict::Fail;
        row.reason = format!(
            "shape: the tower reads {}x{} ({} values), the mmproj twin {rows}x{k} ({} values)",
            l.rows,
            l.k,
            x.len(),
            y.len()
        );
        return Ok(row);
    }
    let p = stats(&x, &y);
    p.fill_row(&mut row);
    match same_values(&p, &row) {
        Some(_) if pad.iter().any(|&v| v != 0.0) => {
            row.verdict = Verdict::Fail;
            row.reason = format!(
                "padding not zero: {} of {} padded values are non-zero",
                pad.iter().filter(|&&v| v != 0.0).count(),
                pad.len()
            );
        }
        Some(why) => {
            row.verdict = Verdict::Pass;
            row.reason = why;
        }
        None => {
            row.verdict = Verdict::Fail;
            row.reason = explain(c, l, &x, &y);
        }
    }
    Ok(row)
}

/// Verifies a tower file against `mmproj`; with none, every tensor is `NO_REF` and the verdict
/// says to give one. `file` names the tower in the missing-tensor reasons.
pub fn verify_tower(
    c: &Container,
    layouts: &[TensorLayout],
    mmproj: Option<&GgufFile>,
    file: &str,
) -> Result<(Vec<VerifyRow>, PackVerdict)> {
    let Some(g) = mmproj else {
        let rows: Vec<VerifyRow> = layouts
            .iter()
            .map(|l| {
                let mut r = VerifyRow::new(l, "none".into());
                r.reading = l.reading();
                r.reason = "NO_REF: no mmproj GGUF given (--mmproj)".into();
                r
            })
            .collect();
        let mut verdict = pack_verdict(layouts, &rows);
        verdict.summary = format!(
            "unverified: {} tensors of {file}, no mmproj to compare them with (give --mmproj GGUF)",
            layouts.len()
        );
        return Ok((rows, verdict));
    };
    let mut rows = Vec::with_capacity(layouts.len());
    for l in layouts {
        rows.push(verify_tensor(c, l, g)?);
    }
    let mut verdict = pack_verdict(layouts, &rows);
    // Every mmproj tensor a tower holds must be in the file.
    let family = layouts
        .iter()
        .find_map(|l| names::TowerFamily::of_tensor(&l.name));
    let mut missing = Vec::new();
    if let Some(family) = family {
        for t in g.tensors.iter().map(|t| t.name.as_str()) {
            let Some((tower, _, _)) = names::tower_of(family, t) else {
                continue;
            };
            if !layouts.iter().any(|l| l.name == tower) && !missing.contains(&tower) {
                rows.push(missing_row(&tower, t, file));
                missing.push(tower);
            }
        }
    }
    if !missing.is_empty() {
        verdict.verified = false;
        verdict.failing.extend(
            rows.iter()
                .filter(|r| missing.contains(&r.tensor))
                .map(|r| format!("{} ({}): {}", r.tensor, r.reference, r.reason)),
        );
    }
    if !verdict.failing.is_empty() {
        verdict.summary = format!(
            "refused: {} of {} tensors of {file} fail verification: {}",
            verdict.failing.len(),
            layouts.len(),
            verdict
                .failing
                .iter()
                .map(|f| f.split(" (").next().unwrap_or(f))
                .collect::<Vec<_>>()
                .join(", ")
        );
    } else if verdict.unreferenced.is_empty() {
        verdict.summary = format!(
            "verified: {} tensors of {file} pass against the mmproj",
            verdict.passed
        );
    }
    Ok((rows, verdict))
}

/// The row of a tower tensor the mmproj has and the file lacks.
fn missing_row(tower: &str, twin: &str, file: &str) -> VerifyRow {
    let mut row = VerifyRow::unmeasured(tower.into(), format!("mmproj:{twin}"), "absent".into());
    row.verdict = Verdict::Fail;
    row.reason = format!("missing from {file}: the mmproj has {twin}");
    row
}
