//! Writing `model.q4nx`: every planned tensor from the GGUF, plain (bf16/f32, in parallel row
//! batches) or tiled (quantization groups placed by the tile encoders), each with its error against
//! the GGUF's values reported.

use std::io::Write;
use std::path::Path;

use half::bf16;
use rayon::prelude::*;

use crate::groups::{Group, Method};
use crate::{Planned, TensorReport, encode, gptq, groups, refuse};
use onebit_stages::error::{Error, Result, io_at};
use onebit_stages::format::encode::ErrorSums;
use onebit_stages::format::gguf::names::RowMap;
use onebit_stages::format::gguf::{GgufFile, GgufTensor};
use onebit_stages::format::q4nx::Dtype;
use onebit_stages::format::q4nx::writer::{self, Entry};
use onebit_stages::format::tiles::{Codes, TileKind};

/// Whether a plain tensor is stored in f32 (FastFlowLM's Qwen3.5 `ssm_a` and `ssm_dt.bias`,
/// q4nx-format §2), not bf16.
fn stays_f32(name: &str) -> bool {
    name.ends_with("linear_attn.ssm_a") || name.ends_with("linear_attn.ssm_dt.bias")
}

/// Whether a tiled tensor with fewer rows than a tile fills the tile with copies of its rows
/// (FastFlowLM's Qwen3.5 `ssm_alpha/beta`: `h0..h15, h0..h15`, q4nx-format §4).
fn repeats_rows(name: &str) -> bool {
    name.ends_with("ssm_alpha_proj.weight") || name.ends_with("ssm_beta_proj.weight")
}

pub(crate) fn write_pack(
    g: &GgufFile,
    planned: &[Planned],
    path: &Path,
    three_d: bool,
) -> Result<Vec<TensorReport>> {
    let mut entries = Vec::new();
    for p in planned {
        let src = g
            .tensor(&p.src)
            .ok_or_else(|| Error::Internal(p.src.clone()))?;
        let (rows, k) = (src.rows(), src.row_len());
        let shape = match p.tiled {
            None if src.dims.len() == 1 => vec![k],
            None if p.rows == RowMap::Transpose => vec![k, rows],
            None => vec![rows, k],
            Some(kind) => {
                let (r, c) = (kind.rows() as u64, encode::grid_cols(kind) as u64);
                let (rows_p, k_p) = p.padded;
                // Rows off the tile's row block are padded with zero rows (as FastFlowLM's later
                // converter writes them, q4nx-format §4); readers accept such pads only when
                // every pad row decodes to exactly 0.
                if k % 32 != 0 {
                    return Err(refuse(
                        g.path(),
                        &p.src,
                        format!("K = {k} is not a multiple of the 32-column group"),
                    ));
                }
                let bands = rows_p.div_ceil(r);
                if three_d {
                    vec![bands, k_p.div_ceil(c), kind.bytes() as u64]
                } else {
                    vec![bands * k_p.div_ceil(c), kind.bytes() as u64]
                }
            }
        };
        let dtype = if p.tiled.is_some() {
            Dtype::I8
        } else if stays_f32(&p.name) {
            Dtype::F32
        } else {
            Dtype::BF16
        };
        entries.push(Entry {
            name: p.name.clone(),
            dtype,
            shape,
        });
    }
    writer::data_order(&mut entries);
    let by_name: std::collections::HashMap<&str, &Planned> =
        planned.iter().map(|p| (p.name.as_str(), p)).collect();
    let mut reports = Vec::new();
    writer::write_container(path, &entries, |i, w| {
        let p = by_name[entries[i].name.as_str()];
        let src = g
            .tensor(&p.src)
            .ok_or_else(|| Error::Internal(p.src.clone()))?;
        let r = match p.tiled {
            None => write_plain(g, src, p, w)?,
            Some(kind) => write_tiled(g, src, p, kind, w)?,
        };
        tracing::debug!(tensor = %p.name, stored = %r.stored_as, rel_l2 = r.rel_l2, "converted");
        reports.push(r);
        Ok(())
    })?;
    reports.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(reports)
}

fn io(w: &mut dyn Write, b: &[u8], path: &Path) -> Result<()> {
    Ok(w.write_all(b).map_err(|e| io_at(e, "write", path))?)
}

/// Rows per parallel batch of plain rows.
const PLAIN_BATCH: u64 = 4096;

fn write_plain(
    g: &GgufFile,
    src: &GgufTensor,
    p: &Planned,
    w: &mut dyn Write,
) -> Result<TensorReport> {
    let (rows, k) = (src.rows(), src.row_len());
    if stays_f32(&p.name) || p.rows == RowMap::Transpose {
        return write_small_plain(g, src, p, w);
    }
    let scale = p.scale;
    let mut total = ErrorSums::default();
    let mut r0 = 0;
    while r0 < rows {
        let r1 = (r0 + PLAIN_BATCH).min(rows);
        let mut vals = Vec::new();
        g.rows_f32(src, r0, r1, &mut vals)?;
        // bf16(f32(v) × f32(√H)) for Gemma's embedding (q4nx-format §5), written straight into
        // the output bytes; the error is reduced per row, not kept per element.
        let mut flat = vec![0u8; vals.len() * 2];
        let err = flat
            .par_chunks_mut(2 * k as usize)
            .zip(vals.par_chunks(k as usize))
            .map(|(out, row)| {
                let mut e = ErrorSums::default();
                for (o, &v) in out.chunks_exact_mut(2).zip(row) {
                    let t = match scale {
                        Some(s) => v * s,
                        None => v,
                    };
                    let b = bf16::from_f32(t);
                    e.add(b.to_f32(), t);
                    o.copy_from_slice(&b.to_le_bytes());
                }
                e
            })
            .reduce(ErrorSums::default, ErrorSums::merge);
        total = total.merge(err);
        io(w, &flat, g.path())?;
        r0 = r1;
    }
    Ok(TensorReport {
        name: p.name.clone(),
        source: p.src.clone(),
        source_type: src.ty.to_string(),
        stored_as: "BF16".into(),
        method: "rounded to bf16".into(),
        transform: p.note.clone(),
        rel_l2: total.rel(),
        max_abs: total.max,
    })
}

/// A small plain tensor read whole: kept in f32 ([`stays_f32`]) or transposed
/// ([`RowMap::Transpose`], Qwen3.5's `ssm_conv1d` as `[kernel][channels]`).
fn write_small_plain(
    g: &GgufFile,
    src: &GgufTensor,
    p: &Planned,
    w: &mut dyn Write,
) -> Result<TensorReport> {
    let (rows, k) = (src.rows() as usize, src.row_len() as usize);
    let mut vals = Vec::new();
    g.rows_f32(src, 0, src.rows(), &mut vals)?;
    if p.rows == RowMap::Transpose {
        let mut t = vec![0f32; vals.len()];
        for (r, row) in vals.chunks_exact(k).enumerate() {
            for (c, &v) in row.iter().enumerate() {
                t[c * rows + r] = v;
            }
        }
        vals = t;
    }
    let f32_out = stays_f32(&p.name);
    let mut e = ErrorSums::default();
    let mut bytes = Vec::with_capacity(vals.len() * 4);
    for &v in &vals {
        if f32_out {
            e.add(v, v);
            bytes.extend_from_slice(&v.to_le_bytes());
        } else {
            let b = bf16::from_f32(v);
            e.add(b.to_f32(), v);
            bytes.extend_from_slice(&b.to_le_bytes());
        }
    }
    io(w, &bytes, g.path())?;
    Ok(TensorReport {
        name: p.name.clone(),
        source: p.src.clone(),
        source_type: src.ty.to_string(),
        stored_as: if f32_out { "F32" } else { "BF16" }.into(),
        method: if f32_out { "copied" } else { "rounded to bf16" }.into(),
        transform: p.note.clone(),
        rel_l2: e.rel(),
        max_abs: e.max,
    })
}

/// Row blocks per parallel batch of tiles.
const TILE_BATCH: u64 = 64;

fn write_tiled(
    g: &GgufFile,
    src: &GgufTensor,
    p: &Planned,
    kind: TileKind,
    w: &mut dyn Write,
) -> Result<TensorReport> {
    let (rows, k) = (src.rows(), src.row_len());
    let codes = kind.codes();
    let mut method = groups::native_method(src.ty, codes).unwrap_or(Method::Requantized);
    let importance = p.importance.as_deref().filter(|w| w.len() == k as usize);
    // GPTQ where there are second moments and the codes are unsigned 4-bit being requantized.
    let factor = match &p.second_moments {
        Some(h) if method == Method::Requantized && codes == Codes::Unsigned4 => {
            let f = gptq::InverseFactor::new(h, k as usize).ok_or_else(|| {
                refuse(
                    g.path(),
                    &src.name,
                    "the calibration inputs' second moments are not positive definite, even damped",
                )
            })?;
            method = Method::Gptq;
            Some(f)
        }
        _ => None,
    };
    let (bs, ts) = src
        .ty
        .block()
        .ok_or_else(|| refuse(g.path(), &src.name, format!("{} has no block size", src.ty)))?;
    if !src.ty.dequantizable() {
        return Err(refuse(
            g.path(),
            &src.name,
            format!("no dequantizer for {}, so it cannot be converted", src.ty),
        ));
    }
    let data = g.data(src)?;
    let row_bytes = (k / bs * ts) as usize;
    let r_tile = kind.rows() as u64;
    // The family's FFN padding: zero columns past K in every band, zero bands past the rows.
    let (rows_p, k_p) = p.padded;
    let ct = k_p.div_ceil(encode::grid_cols(kind) as u64) as usize;
    let band_bytes = ct * kind.bytes();
    // Fewer rows than a tile (Qwen3.5's α/β): one band, its rows cycling through the source's.
    let repeated = repeats_rows(&p.name) && rows < r_tile;
    // Row blocks holding source rows; the last one's rows past `rows` stay zero (pad rows).
    let rb_total = if repeated { 1 } else { rows.div_ceil(r_tile) };
    let mut total = ErrorSums::default();
    let mut rb0 = 0;
    while rb0 < rb_total {
        let rb1 = (rb0 + TILE_BATCH).min(rb_total);
        let bands: Vec<Result<(Vec<u8>, ErrorSums)>> = (rb0..rb1)
            .into_par_iter()
            .map(|rb| {
                let mut band = vec![0u8; band_bytes];
                let mut err = ErrorSums::default();
                let mut gs: Vec<Group> = Vec::new();
                let mut vals = vec![0f32; k as usize];
                for r in 0..r_tile {
                    if !repeated && rb * r_tile + r >= rows {
                        // A pad row: all-zero bytes, which every tile kind decodes to 0.
                        break;
                    }
                    let gr = if repeated {
                        (r % rows) as usize
                    } else {
                        p.rows.gguf_row(rb * r_tile + r) as usize
                    };
                    let bytes = &data[gr * row_bytes..(gr + 1) * row_bytes];
                    onebit_stages::format::gguf::dequant::dequantize(src.ty, bytes, &mut vals)
                        .map_err(|ty| {
                            refuse(g.path(), &src.name, format!("no dequantizer for {ty}"))
                        })?;
                    if let Some(f) = &factor {
                        gptq::quantize_row(&vals, f, importance, &mut gs);
                    } else if method == Method::Requantized {
                        groups::quantize_row(&vals, codes, importance, &mut gs);
                    } else {
                        groups::native_row(src.ty, codes, bytes, &mut gs);
                    }
                    // A copy of a row already counted adds nothing to the error.
                    if !repeated || r < rows {
                        for (i, &v) in vals.iter().enumerate() {
                            err.add(gs[i / 32].value(codes, i % 32), v);
                        }
                    }
                    encode::place_row(kind, &mut band, r as usize, &gs);
                }
                Ok((band, err))
            })
            .collect();
        for b in bands {
            let (band, err) = b?;
            total = total.merge(err);
            io(w, &band, g.path())?;
        }
        rb0 = rb1;
    }
    let zero = vec![0u8; band_bytes];
    for _ in rb_total..rows_p.div_ceil(r_tile) {
        io(w, &zero, g.path())?;
    }
    Ok(TensorReport {
        name: p.name.clone(),
        source: p.src.clone(),
        source_type: src.ty.to_string(),
        stored_as: kind.name().to_string(),
        method: format!("{method:?}"),
        transform: p.note.clone(),
        rel_l2: total.rel(),
        max_abs: total.max,
    })
}
