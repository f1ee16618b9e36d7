//! Tile-kind detection (q4nx-format §3): for each tensor, from its declared width, byte count and
//! the config geometry, decide kind, grid, padded K and signedness, with the evidence. Where two
//! readings remain, decide by data or refuse naming both.
//!
//! Detection is a decision with a source, not decoding: every [`TensorLayout`] carries a
//! `decision` line in the `name=value <- source` form and the candidate readings it weighed.

use super::geometry::{Geometry, Role, role_of};
use super::reader::TiledReader;
use super::{Layout, Reading, TensorLayout};
use crate::error::{Error, Result};
use crate::format::q4nx::{Container, Dtype, TensorInfo};
use crate::format::tiles::{TileKind, WidthReading, candidates_for_width};
use crate::stats::pearson;

/// Accept a data decision when the best reading reaches this correlation…
pub const ACCEPT_CORR: f64 = 0.99;
/// …and the runner-up stays at or below this one (q4nx-format §3 step 6).
pub const RUNNER_UP_MAX: f64 = 0.95;

/// Detects every tensor of a container. Refusals are collected and returned together, one line
/// per tensor, so a user sees everything that stops the pack at once.
pub fn detect_pack(
    container: &Container,
    geometry: Option<&Geometry>,
) -> Result<Vec<TensorLayout>> {
    detect_pack_with(container, geometry, None)
}

/// A GGUF of the same model, for deciding readings no byte and no in-pack reference can
/// (q4nx-format §3 step 6): the reading that correlates with the GGUF twin wins.
pub struct Reference<'a> {
    /// The GGUF.
    pub gguf: &'a crate::format::gguf::GgufFile,
    /// Its architecture (name map family).
    pub arch: String,
    /// Dimensions for the name map.
    pub dims: crate::format::gguf::names::MapDims,
}

/// [`detect_pack`] with an optional GGUF reference for data decisions.
pub fn detect_pack_with(
    container: &Container,
    geometry: Option<&Geometry>,
    reference: Option<&Reference<'_>>,
) -> Result<Vec<TensorLayout>> {
    let mut layouts = Vec::new();
    let mut refusals = Vec::new();
    for t in container.tensors() {
        match detect_tensor_with(container, t, geometry, reference) {
            Ok(l) => layouts.push(l),
            Err(reason) => refusals.push(format!("{}: {reason}", t.name)),
        }
    }
    if !refusals.is_empty() {
        return Err(Error::Refused {
            file: container.path().to_path_buf(),
            tensor: if refusals.len() == 1 {
                "1 tensor".into()
            } else {
                format!("{} tensors", refusals.len())
            },
            reason: format!("\n  {}", refusals.join("\n  ")),
        });
    }
    Ok(layouts)
}

fn plain_dims(shape: &[u64]) -> (u64, u64) {
    match shape {
        [] => (1, 1),
        [k] => (1, *k),
        [rest @ .., k] => (rest.iter().product(), *k),
    }
}

/// Detects one tensor; `Err` is the refusal reason (the caller names file and tensor).
pub fn detect_tensor(
    container: &Container,
    t: &TensorInfo,
    geometry: Option<&Geometry>,
) -> std::result::Result<TensorLayout, String> {
    detect_tensor_with(container, t, geometry, None)
}

/// [`detect_tensor`] with an optional GGUF reference.
pub fn detect_tensor_with(
    container: &Container,
    t: &TensorInfo,
    geometry: Option<&Geometry>,
    reference: Option<&Reference<'_>>,
) -> std::result::Result<TensorLayout, String> {
    let (role, layer) = role_of(&t.name);
    let base = |layout: Layout, rows: u64, k: u64, decision: String| TensorLayout {
        name: t.name.clone(),
        dtype: t.dtype.name().to_string(),
        shape: t.shape.clone(),
        bytes: t.nbytes(),
        layer,
        role: role.as_str().to_string(),
        layout,
        rows,
        k,
        codes: None,
        decision,
        readings: Vec::new(),
        flags: Vec::new(),
    };
    let is_u8 = match &t.dtype {
        Dtype::BF16 | Dtype::F16 | Dtype::F32 => {
            let (rows, k) = plain_dims(&t.shape);
            return Ok(base(
                Layout::Plain,
                rows,
                k,
                format!("layout=plain <- dtype {}", t.dtype.name()),
            ));
        }
        Dtype::Other(d) => return Err(format!("dtype {d} is not used by q4nx packs; no reader")),
        Dtype::I8 => false,
        Dtype::U8 => true,
    };
    let candidates = tile_kinds(container, t, is_u8)?;
    let (rows, k, geo_src) = grid(t, geometry, role, &candidates)?;
    let fitting = fitting(t, &candidates, rows, k, &geo_src)?;
    let data = container.data(t);
    let mut readings = Vec::new();
    let mut flags = Vec::new();
    let mut why = vec![format!("declared width {}", t.width()), geo_src];
    let (kind, rb, ct) = if fitting.len() == 1 {
        fitting[0]
    } else if fitting.iter().all(|(k, ..)| k.bytes() == 5120) {
        let chosen = decide_5120(data, &fitting, &mut why, &mut flags)?;
        confirm_signedness(
            container,
            t,
            data,
            &fitting,
            chosen,
            &mut why,
            &mut readings,
        )?;
        chosen
    } else if fitting.iter().all(|(k, ..)| k.bytes() == 8704) {
        decide_8704(
            container,
            t,
            data,
            &fitting,
            reference,
            &mut why,
            &mut readings,
        )?
    } else {
        return Err(format!(
            "{} readings fit and no rule separates them",
            fitting
                .iter()
                .map(|(k, ..)| k.name())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    };
    why.push(format!("grid {rb}x{ct} = {} B", t.nbytes()));
    let padded_rows = rb * kind.rows() as u64;
    if padded_rows != rows {
        why.push(pad_rows(data, (kind, rb, ct), rows, role)?);
    }
    let mut l = base(
        Layout::Tiled {
            kind,
            row_blocks: rb,
            col_tiles: ct,
            padded_rows,
            padded_k: ct * kind.cols() as u64,
        },
        rows,
        k,
        format!("kind={kind} <- {}", why.join("; ")),
    );
    l.codes = Some(kind.codes());
    l.readings = readings;
    l.flags = flags;
    Ok(l)
}

/// The tile kinds a tile tensor's declared row width allows, once the shape is one a reader
/// exists for.
fn tile_kinds(
    container: &Container,
    t: &TensorInfo,
    is_u8: bool,
) -> std::result::Result<Vec<TileKind>, String> {
    let stem = t.name.strip_suffix(".weight").unwrap_or(&t.name);
    if container.tensor(&format!("{}.scale", t.name)).is_some()
        || container.tensor(&format!("{stem}.scale")).is_some()
    {
        return Err(
            "plain int8 with a .scale companion (Gemma4 embeddings, q4nx-format §6) has no reader yet"
                .into(),
        );
    }
    let width = t.width();
    let candidates = match candidates_for_width(width, is_u8) {
        WidthReading::Candidates(c) => c,
        WidthReading::KnownUnreadable(w, u) => {
            return Err(format!(
                "declared row width {w} is a known FastFlowLM tile size ({}) with no reader",
                u.describe()
            ));
        }
        WidthReading::NotAKind(w) => {
            return Err(format!(
                "declared row width {w} ({}) is not a tile kind (known widths: 1280, 2560, 4608, 4736, 5120, 8704)",
                t.dtype.name()
            ));
        }
    };
    if t.shape.len() < 2 {
        return Err(format!(
            "tile tensor with rank-{} shape {:?}",
            t.shape.len(),
            t.shape
        ));
    }
    if t.shape.len() > 3 {
        return Err(format!(
            "rank-{} tile shape {:?} is a gpt-oss regrouping (q4nx-format §4), which has no reader until a real pack settles its padding (§10 open 9)",
            t.shape.len(),
            t.shape
        ));
    }
    Ok(candidates)
}

/// The tensor's (rows, K) and where they come from: the config's geometry for its role, else the
/// 3-D grid itself.
fn grid(
    t: &TensorInfo,
    geometry: Option<&Geometry>,
    role: Role,
    candidates: &[TileKind],
) -> std::result::Result<(u64, u64, String), String> {
    match geometry.and_then(|g| g.shape_of(role)) {
        Some((r, k)) => Ok((
            r,
            k,
            format!("config.json geometry {r}x{k} ({})", role.as_str()),
        )),
        None if t.shape.len() == 3 => {
            let c0 = candidates[0];
            Ok((
                t.shape[0] * c0.rows() as u64,
                t.shape[1] * c0.cols() as u64,
                format!(
                    "grid [{}, {}] (no config role for this tensor)",
                    t.shape[0], t.shape[1]
                ),
            ))
        }
        None => Err(match geometry {
            None => {
                "no config.json geometry, and a 2-D tile shape does not state rows and K".into()
            }
            Some(_) => format!(
                "config.json gives no geometry for role {} and a 2-D tile shape does not state rows and K",
                role.as_str()
            ),
        }),
    }
}

/// The candidate kinds whose grid for `rows × k` is the declared shape and size, as (kind, row
/// blocks, column tiles); none is a refusal naming what each would need.
fn fitting(
    t: &TensorInfo,
    candidates: &[TileKind],
    rows: u64,
    k: u64,
    geo_src: &str,
) -> std::result::Result<Vec<Fit>, String> {
    let lead = &t.shape[..t.shape.len() - 1];
    let n_tiles: u64 = lead.iter().product();
    let mut fitting = Vec::new();
    let mut misfits = Vec::new();
    for &kind in candidates {
        let rb = rows.div_ceil(kind.rows() as u64);
        let ct = k.div_ceil(kind.cols() as u64);
        let tiles = rb.checked_mul(ct);
        let shape_ok = match lead {
            [n] => Some(*n) == tiles,
            [a, b] => *a == rb && *b == ct,
            _ => false,
        };
        let bytes = tiles.and_then(|n| n.checked_mul(kind.bytes() as u64));
        if shape_ok && bytes == Some(t.nbytes()) {
            fitting.push((kind, rb, ct));
        } else {
            misfits.push(format!(
                "{rb}x{ct} = {} {kind} tiles",
                rb.saturating_mul(ct)
            ));
        }
    }
    if fitting.is_empty() {
        return Err(format!(
            "declared {:?} = {n_tiles} tiles; {geo_src} needs {}: config.json and model.q4nx disagree",
            t.shape,
            misfits.join(" or ")
        ));
    }
    Ok(fitting)
}

/// Rows off the tile grid: accepted only when every pad row decodes to exactly 0, or (Qwen3.5's
/// α/β, fewer rows than a tile) when the pad rows are copies of the real ones (q4nx-format §4:
/// row r of the band is row r mod rows). Returns the decision's words.
fn pad_rows(
    data: &[u8],
    (kind, rb, ct): Fit,
    rows: u64,
    role: Role,
) -> std::result::Result<String, String> {
    let padded_rows = rb * kind.rows() as u64;
    let reader =
        TiledReader::new(data, kind, rb as usize, ct as usize).map_err(|e| e.to_string())?;
    let (mut out, mut scratch) = (Vec::new(), Vec::new());
    reader.decode_row_block(rb as usize - 1, &mut out, &mut scratch);
    let first_pad = (rows % kind.rows() as u64) as usize;
    let kp = reader.padded_k();
    let pad = &out[first_pad * kp..];
    let copies = role == Role::LinearHead
        && rb == 1
        && pad.chunks_exact(kp).enumerate().all(|(i, row)| {
            let src = (first_pad + i) % first_pad.max(1);
            row == &out[src * kp..(src + 1) * kp]
        });
    if copies {
        Ok(format!(
            "rows {rows} repeated to fill the {padded_rows}-row tile (FastFlowLM's α/β copies)"
        ))
    } else if pad.iter().any(|v| *v != 0.0) {
        Err(format!(
            "{rows} rows are off the {}-row grid of {kind} and the pad rows {rows}..{padded_rows} do not decode to 0",
            kind.rows()
        ))
    } else {
        Ok(format!(
            "rows {rows} padded to {padded_rows} with zero rows"
        ))
    }
}

type Fit = (TileKind, u64, u64);

/// For a tied head whose signedness the byte signature decided, reads it both ways and correlates
/// each reading with the embedding: the signature must agree with the data, or the pack is refused
/// naming both readings.
fn confirm_signedness(
    container: &Container,
    t: &TensorInfo,
    data: &[u8],
    fitting: &[Fit],
    chosen: Fit,
    why: &mut Vec<String>,
    readings: &mut Vec<Reading>,
) -> std::result::Result<(), String> {
    if !matches!(chosen.0, TileKind::Q41_5120 | TileKind::Q40_5120) {
        return Ok(());
    }
    let pair: Vec<Fit> = fitting
        .iter()
        .copied()
        .filter(|f| matches!(f.0, TileKind::Q41_5120 | TileKind::Q40_5120))
        .collect();
    let Some(found) = tie_readings(container, t, data, &pair)? else {
        return Ok(());
    };
    *readings = found;
    let (sorted, listing) = ranked(readings);
    if sorted[0].corr < ACCEPT_CORR {
        // Neither reading matches the embedding well (e.g. a broken conversion): the signature
        // stands, and verification judges the values.
        why.push(format!("tie test inconclusive: {listing}"));
        Ok(())
    } else if sorted[0].kind == chosen.0 {
        why.push(format!("data agrees: {listing}"));
        Ok(())
    } else {
        Err(format!(
            "5120-byte tiles: the byte signature says {} but the data says {listing}",
            chosen.0
        ))
    }
}

/// Q41 / Q40 / Q8H among 5,120-byte tiles: byte signatures (q4nx-format §3 step 4).
fn decide_5120(
    data: &[u8],
    fitting: &[Fit],
    why: &mut Vec<String>,
    flags: &mut Vec<String>,
) -> std::result::Result<Fit, String> {
    let tiles: Vec<&[u8]> = data.chunks_exact(5120).collect();
    let find = |k: TileKind| fitting.iter().copied().find(|f| f.0 == k);
    let duplicate_plane = tiles.iter().all(|t| t[..256] == t[256..512]);
    if duplicate_plane && let Some(f) = find(TileKind::Q8H_5120) {
        why.push(format!(
            "bytes 0..256 == 256..512 in all {} tiles (the Q8H duplicate scale plane)",
            tiles.len()
        ));
        return Ok(f);
    }
    let four_bit: Vec<Fit> = fitting
        .iter()
        .copied()
        .filter(|f| f.0 != TileKind::Q8H_5120)
        .collect();
    if four_bit.is_empty() {
        return Err(
            "only the 8-bit Q8H_5120 grid fits, but its duplicate scale plane is absent".into(),
        );
    }
    if fitting.iter().any(|f| f.0 == TileKind::Q8H_5120) {
        why.push("no duplicate scale plane, so not Q8H_5120".into());
    }
    // Zero-point plane: bf16 bits at 512..1024 of each tile.
    let zero_plane = tiles.iter().all(|t| t[512..1024].iter().all(|&b| b == 0));
    let nonzero_d = tiles
        .iter()
        .flat_map(|t| t[..512].chunks_exact(2).zip(t[512..1024].chunks_exact(2)))
        .filter(|(d, _)| d != &[0, 0])
        .collect::<Vec<_>>();
    if zero_plane {
        let f = four_bit
            .iter()
            .copied()
            .find(|f| f.0 == TileKind::Q40_5120)
            .ok_or("zero-point plane is all zero but Q40_5120 does not fit")?;
        why.push(format!(
            "zero-point plane all +0.0 across {} tiles (Q41 would hold m ≈ −7.5·d), so signed",
            tiles.len()
        ));
        return Ok(f);
    }
    let f = four_bit
        .iter()
        .copied()
        .find(|f| f.0 == TileKind::Q41_5120)
        .ok_or("Q41_5120 does not fit")?;
    why.push("zero-point plane populated, so unsigned with zero-points".into());
    if !nonzero_d.is_empty() && nonzero_d.iter().all(|(d, m)| d == m) {
        flags.push(format!(
            "broken conversion: every non-zero d equals its m bitwise ({} slots): an 8-bit source truncated through the 4-bit packer; decoded as written",
            nonzero_d.len()
        ));
    }
    Ok(f)
}

/// The tie test (q4nx-format §3 step 6): for a tied `lm_head`, each candidate reading of its first
/// row blocks correlated with the pack's own plain embedding. `None` when the tensor is not a head
/// or the pack has no plain embedding. Correlation is scale-free, so a pre-scaled embedding (Gemma's
/// √H) needs no correction here.
fn tie_readings(
    container: &Container,
    t: &TensorInfo,
    data: &[u8],
    fitting: &[Fit],
) -> std::result::Result<Option<Vec<Reading>>, String> {
    let (role, _) = role_of(&t.name);
    let embedding = container.tensors().iter().find(|e| {
        role_of(&e.name).0 == Role::Embedding
            && matches!(e.dtype, Dtype::BF16 | Dtype::F32 | Dtype::F16)
    });
    let (Role::LmHead, Some(emb)) = (role, embedding) else {
        return Ok(None);
    };
    let (emb_rows, k) = plain_dims(&emb.shape);
    let emb_bytes = container.data(emb);
    let to_f32 = |i: usize| -> f32 {
        match emb.dtype {
            Dtype::F32 => f32::from_le_bytes([
                emb_bytes[4 * i],
                emb_bytes[4 * i + 1],
                emb_bytes[4 * i + 2],
                emb_bytes[4 * i + 3],
            ]),
            Dtype::F16 => {
                half::f16::from_le_bytes([emb_bytes[2 * i], emb_bytes[2 * i + 1]]).to_f32()
            }
            _ => half::bf16::from_le_bytes([emb_bytes[2 * i], emb_bytes[2 * i + 1]]).to_f32(),
        }
    };
    let k = k as usize;
    let readings = readings_vs(
        data,
        fitting,
        emb_rows,
        k,
        |row, out| {
            out.clear();
            out.extend((0..k).map(|c| to_f32(row * k + c)));
            Ok(())
        },
        |blocks| format!("tie test vs {}, {blocks} row blocks", emb.name),
    )?;
    Ok(Some(readings))
}

/// Each candidate reading's first row blocks (up to 4) against reference rows: `reference(row,
/// out)` fills `out` with row `row`'s K reference values; `test(blocks)` describes the test.
fn readings_vs(
    data: &[u8],
    fitting: &[Fit],
    rows: u64,
    k: usize,
    mut reference: impl FnMut(usize, &mut Vec<f32>) -> std::result::Result<(), String>,
    test: impl Fn(usize) -> String,
) -> std::result::Result<Vec<Reading>, String> {
    let mut readings = Vec::new();
    let mut want = Vec::new();
    for &(kind, rb, ct) in fitting {
        let reader =
            TiledReader::new(data, kind, rb as usize, ct as usize).map_err(|e| e.to_string())?;
        let blocks = (rb as usize).min(4);
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        let (mut out, mut scratch) = (Vec::new(), Vec::new());
        let kp = reader.padded_k();
        for b in 0..blocks {
            reader.decode_row_block(b, &mut out, &mut scratch);
            for r in 0..kind.rows() {
                let row = b * kind.rows() + r;
                if row as u64 >= rows {
                    break;
                }
                reference(row, &mut want)?;
                for c in 0..k.min(kp) {
                    ours.push(out[r * kp + c]);
                    theirs.push(want[c]);
                }
            }
        }
        readings.push(Reading {
            kind,
            test: test(blocks),
            corr: pearson(&ours, &theirs),
        });
    }
    Ok(readings)
}

/// Each candidate reading of the first row blocks against the GGUF twin (row map and scale
/// applied); `None` when the GGUF has no twin for this tensor.
fn gguf_readings(
    t: &TensorInfo,
    data: &[u8],
    fitting: &[Fit],
    r: &Reference<'_>,
) -> std::result::Result<Option<Vec<Reading>>, String> {
    let g = r.gguf;
    let Some(twin) =
        crate::format::gguf::names::twin(&r.arch, &t.name, r.dims, |n| g.tensor(n).is_some())
    else {
        return Ok(None);
    };
    let Some(src) = g.tensor(&twin.gguf) else {
        return Ok(None);
    };
    let k = src.row_len() as usize;
    let scale = twin.scale.unwrap_or(1.0);
    let readings = readings_vs(
        data,
        fitting,
        src.rows(),
        k,
        |row, out| {
            let gr = twin.rows.gguf_row(row as u64);
            g.rows_f32(src, gr, gr + 1, out)
                .map_err(|e| e.to_string())?;
            out.iter_mut().for_each(|v| *v *= scale);
            Ok(())
        },
        |blocks| format!("vs GGUF {} ({}), {blocks} row blocks", twin.gguf, src.ty),
    )?;
    Ok(Some(readings))
}

/// Orders readings best first and lists them for messages.
fn ranked(readings: &[Reading]) -> (Vec<Reading>, String) {
    let mut sorted = readings.to_vec();
    sorted.sort_by(|a, b| b.corr.total_cmp(&a.corr));
    let listing = sorted
        .iter()
        .map(|r| format!("{} (corr {:.4} vs embedding)", r.kind, r.corr))
        .collect::<Vec<_>>()
        .join(" and ");
    (sorted, listing)
}

/// Q8L / Q8C: no byte tells them apart; the tie test against the pack's own embedding decides
/// for a tied head, otherwise the pack is refused with both readings.
fn decide_8704(
    container: &Container,
    t: &TensorInfo,
    data: &[u8],
    fitting: &[Fit],
    reference: Option<&Reference<'_>>,
    why: &mut Vec<String>,
    readings: &mut Vec<Reading>,
) -> std::result::Result<Fit, String> {
    let found = match tie_readings(container, t, data, fitting)? {
        Some(f) => Some(f),
        None => match reference {
            Some(r) => gguf_readings(t, data, fitting, r)?,
            None => None,
        },
    };
    let Some(found) = found else {
        return Err(format!(
            "8704-byte tiles admit {} and no in-pack reference decides between them; supply a GGUF of this model",
            fitting
                .iter()
                .map(|f| f.0.name())
                .collect::<Vec<_>>()
                .join(" and ")
        ));
    };
    *readings = found;
    let (sorted, listing) = ranked(readings);
    if sorted[0].corr >= ACCEPT_CORR && sorted.get(1).is_none_or(|r| r.corr <= RUNNER_UP_MAX) {
        why.push(format!("decided by data: {listing}"));
        let kind = sorted[0].kind;
        return fitting
            .iter()
            .copied()
            .find(|f| f.0 == kind)
            .ok_or_else(|| "internal: chosen reading lost".into());
    }
    Err(format!(
        "8704-byte tiles admit {listing}; no reading reaches {ACCEPT_CORR} with the runner-up ≤ {RUNNER_UP_MAX}; supply a GGUF of this model"
    ))
}
