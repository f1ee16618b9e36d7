//! Rebuilding tensors a converter broke, from sources verification can prove.
//!
//! FastFlowLM's converter (at the fixtures' commit) sends Q8_0 sources through its 4-bit packer:
//! only the low nibble of each code survives and `m` equals `d` bit for bit. Detection names that
//! signature ([`BROKEN_CONVERSION`]) and verification fails every such tensor. Each one is
//! rebuilt here, in the tile kind and layout the pack used for it (so the NPU kernels still find
//! what they expect), from one of two sources:
//! - with a reference GGUF, any tensor from its twin (a tied head's twin is `token_embd`): its
//!   codes copied where the tile holds them natively ([`native_copy`]), requantized from its
//!   dequantized values otherwise (as conversion does, so a repaired tensor is byte for byte what
//!   a correct conversion of the same GGUF writes), with the error reported;
//! - without one, a tied head from the pack's own plain embedding (÷√H where the pack stores it
//!   pre-scaled): the head of a tied model *is* its embedding, and a plain bf16 tensor has one
//!   reading.
//!
//! A broken tensor with neither source is refused by name. Nothing here decides whether to
//! repair: the repair stage does that and verifies the result again.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::encode::groups::{self, Group};
use crate::format::encode::{ErrorSums, place_row, writable};
use crate::format::gguf::names::{MapDims, prescaled_embedding, twin};
use crate::format::gguf::{GgufFile, dequant};
use crate::format::native::native_copy;
use crate::format::q4nx::Container;
use crate::layout::reader::TensorRows;
use crate::layout::{Layout, TensorLayout};

/// The start of the detect flag that marks the broken-conversion signature (every non-zero `d`
/// equals its `m` bitwise: an 8-bit source truncated through a 4-bit packer).
pub const BROKEN_CONVERSION: &str = "broken conversion";

/// Whether detection flagged `l` with the broken-conversion signature.
pub fn is_broken(l: &TensorLayout) -> bool {
    l.flags.iter().any(|f| f.starts_with(BROKEN_CONVERSION))
}

/// Where a rebuilt tensor's values come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "from", rename_all = "snake_case")]
pub enum Source {
    /// The pack's own plain embedding, for a tied head.
    Embedding {
        /// The embedding tensor.
        tensor: String,
        /// The divisor undoing a pre-scaled embedding (Gemma's √H), when there is one.
        unscale: Option<f32>,
    },
    /// The reference GGUF's twin.
    Gguf {
        /// The GGUF tensor.
        tensor: String,
        /// Its type (`Q8_0`, ...).
        ty: String,
        /// Codes copied (`true`) or requantized from the dequantized values.
        native: bool,
    },
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Embedding { tensor, unscale } => {
                write!(f, "the pack's embedding {tensor}")?;
                if let Some(s) = unscale {
                    write!(f, " ÷ {s}")?;
                }
                write!(f, " (tied head)")
            }
            Source::Gguf { tensor, ty, native } => write!(
                f,
                "the GGUF's {tensor} ({ty}, {})",
                if *native {
                    "codes copied"
                } else {
                    "requantized"
                }
            ),
        }
    }
}

/// One tensor to rebuild and from what.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Planned {
    /// The pack tensor.
    pub tensor: String,
    /// The source.
    pub source: Source,
}

/// A broken tensor no provable source can rebuild.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Unrepairable {
    /// The pack tensor.
    pub tensor: String,
    /// Why.
    pub why: String,
}

/// The repair plan of a pack: every tensor detection flagged with [`BROKEN_CONVERSION`], with
/// its source, or why it has none. `gguf` is the optional reference, `arch` its family (for the
/// name map) and `dims` the map's dimensions.
pub fn plan(
    layouts: &[TensorLayout],
    gguf: Option<&GgufFile>,
    arch: &str,
    dims: MapDims,
) -> (Vec<Planned>, Vec<Unrepairable>) {
    let (mut planned, mut refused) = (Vec::new(), Vec::new());
    let embedding = layouts.iter().find(|l| {
        onebit_pack::manifest::EMBEDDING_NAMES.contains(&l.name.as_str())
            && l.layout == Layout::Plain
    });
    let tied = gguf.is_none_or(|g| g.tensor("output.weight").is_none());
    for l in layouts.iter().filter(|l| is_broken(l)) {
        let refuse = |why: String| Unrepairable {
            tensor: l.name.clone(),
            why,
        };
        let Some(kind) = l.kind() else {
            refused.push(refuse("a plain tensor has no tiles to rebuild".into()));
            continue;
        };
        if !writable(kind) {
            refused.push(refuse(format!("no encoder writes {} tiles", kind.name())));
            continue;
        }
        // Without a GGUF, a tied head is its embedding; with one, every tensor comes from the
        // GGUF's own codes (the embedding is only their bf16 copy).
        if l.name == "lm_head.weight"
            && tied
            && gguf.is_none()
            && let Some(e) = embedding.filter(|e| e.rows == l.rows && e.k == l.k)
        {
            planned.push(Planned {
                tensor: l.name.clone(),
                source: Source::Embedding {
                    tensor: e.name.clone(),
                    unscale: prescaled_embedding(arch).then(|| (dims.hidden as f32).sqrt()),
                },
            });
            continue;
        }
        let Some(g) = gguf else {
            refused.push(refuse(
                "no provable source: not a tied head with a plain embedding, and no --reference GGUF"
                    .into(),
            ));
            continue;
        };
        let Some(tw) = twin(arch, &l.name, dims, |n| g.tensor(n).is_some()) else {
            refused.push(refuse(format!(
                "no provable source: the {arch} name map has no GGUF twin for it"
            )));
            continue;
        };
        match g.tensor(&tw.gguf) {
            Some(gt) if gt.ty.dequantizable() && gt.row_len() <= l.k && gt.rows() <= l.rows => {
                planned.push(Planned {
                    tensor: l.name.clone(),
                    source: Source::Gguf {
                        tensor: gt.name.clone(),
                        ty: gt.ty.to_string(),
                        native: tw.scale.is_none() && native_copy(gt.ty, kind.codes()).is_some(),
                    },
                });
            }
            Some(gt) => refused.push(refuse(format!(
                "no provable source: the GGUF's {} ({}, {}x{}) cannot fill a {}x{} tensor",
                gt.name,
                gt.ty,
                gt.rows(),
                gt.row_len(),
                l.rows,
                l.k
            ))),
            None => refused.push(refuse(format!(
                "no provable source: the GGUF has no {}",
                tw.gguf
            ))),
        }
    }
    (planned, refused)
}

/// What a rebuild did, for the manifest and the `repairs` table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Repaired {
    /// The pack tensor.
    pub tensor: String,
    /// The tile kind written (the one the pack used).
    pub kind: String,
    /// Where the values came from (a sentence).
    pub source: String,
    /// `native` (codes copied) or `requantized`.
    pub method: String,
    /// ‖stored − source‖ / ‖source‖ over the source's extent.
    pub rel_l2: f64,
    /// max |stored − source|.
    pub max_abs: f64,
}

/// The rebuilt bytes of `l` (same tile kind, same grid, same size as the pack's) from `p`'s
/// source, and the report.
pub fn rebuild(
    c: &Container,
    layouts: &[TensorLayout],
    l: &TensorLayout,
    p: &Planned,
    gguf: Option<&GgufFile>,
    arch: &str,
    dims: MapDims,
) -> Result<(Vec<u8>, Repaired)> {
    let Layout::Tiled {
        kind,
        row_blocks,
        col_tiles,
        ..
    } = l.layout
    else {
        return Err(Error::Internal(format!("{} is not tiled", l.name)));
    };
    let codes = kind.codes();
    let r_tile = kind.rows();
    let band_bytes = col_tiles as usize * kind.bytes();
    if band_bytes as u64 * row_blocks != l.bytes {
        return Err(Error::Internal(format!(
            "{}: {row_blocks} row blocks of {band_bytes} bytes are not its {} bytes",
            l.name, l.bytes
        )));
    }
    // One source row as values, and as groups when the codes are copied.
    enum Rows<'a> {
        Embedding(TensorRows<'a>, Option<f32>),
        Gguf {
            g: &'a GgufFile,
            t: &'a crate::format::gguf::GgufTensor,
            map: crate::format::gguf::names::RowMap,
            native: bool,
            row_bytes: usize,
        },
    }
    let src = match &p.source {
        Source::Embedding { tensor, unscale } => {
            let e = layouts
                .iter()
                .find(|e| &e.name == tensor)
                .ok_or_else(|| Error::Internal(format!("no layout for {tensor}")))?;
            Rows::Embedding(TensorRows::new(c, e)?, *unscale)
        }
        Source::Gguf { tensor, native, .. } => {
            let g = gguf.ok_or_else(|| Error::Internal("a GGUF source without a GGUF".into()))?;
            let t = g
                .tensor(tensor)
                .ok_or_else(|| Error::Internal(format!("the GGUF has no {tensor}")))?;
            let tw = twin(arch, &l.name, dims, |n| g.tensor(n).is_some())
                .ok_or_else(|| Error::Internal(format!("no twin for {}", l.name)))?;
            let (bs, ts) =
                t.ty.block()
                    .ok_or_else(|| Error::Internal(format!("{} has no block size", t.ty)))?;
            Rows::Gguf {
                g,
                t,
                map: tw.rows,
                native: *native,
                row_bytes: (t.row_len() / bs * ts) as usize,
            }
        }
    };
    let bands: Vec<Result<(Vec<u8>, ErrorSums)>> = (0..row_blocks as usize)
        .into_par_iter()
        .map(|rb| {
            let mut band = vec![0u8; band_bytes];
            let mut err = ErrorSums::default();
            let mut gs: Vec<Group> = Vec::new();
            let mut vals: Vec<f32> = Vec::new();
            for r in 0..r_tile {
                let i = rb * r_tile + r;
                vals.clear();
                gs.clear();
                match &src {
                    Rows::Embedding(rows, unscale) => {
                        if i >= l.rows as usize {
                            continue;
                        }
                        rows.plain_rows(i, i + 1, &mut vals);
                        if let Some(s) = unscale {
                            vals.iter_mut().for_each(|v| *v /= s);
                        }
                        groups::quantize_row(&vals, codes, None, &mut gs);
                    }
                    Rows::Gguf {
                        g,
                        t,
                        map,
                        native,
                        row_bytes,
                    } => {
                        if i as u64 >= t.rows() {
                            continue; // the family's padding rows stay zero
                        }
                        let gr = map.gguf_row(i as u64) as usize;
                        let data = g.data(t)?;
                        let bytes = data
                            .get(gr * row_bytes..(gr + 1) * row_bytes)
                            .ok_or_else(|| Error::Internal(format!("{} row {gr}", t.name)))?;
                        vals.resize(t.row_len() as usize, 0.0);
                        dequant::dequantize(t.ty, bytes, &mut vals)
                            .map_err(|ty| Error::Internal(format!("no dequantizer for {ty}")))?;
                        if *native {
                            groups::native_row(t.ty, codes, bytes, &mut gs);
                        } else {
                            groups::quantize_row(&vals, codes, None, &mut gs);
                        }
                    }
                }
                for (j, &v) in vals.iter().enumerate() {
                    if let Some(grp) = gs.get(j / 32) {
                        err.add(grp.value(codes, j % 32), v);
                    }
                }
                place_row(kind, &mut band, r, &gs);
            }
            Ok((band, err))
        })
        .collect();
    let mut bytes = Vec::with_capacity(l.bytes as usize);
    let mut total = ErrorSums::default();
    for b in bands {
        let (band, err) = b?;
        total = total.merge(err);
        bytes.extend_from_slice(&band);
    }
    let method = match &p.source {
        Source::Gguf { native: true, .. } => "native",
        _ => "requantized",
    };
    Ok((
        bytes,
        Repaired {
            tensor: l.name.clone(),
            kind: kind.name().to_string(),
            source: p.source.to_string(),
            method: method.into(),
            rel_l2: total.rel(),
            max_abs: total.max,
        },
    ))
}

/// One line for a refusal without `--repair`: which tensors it would rebuild and from what, and
/// which it could not.
pub fn hint(planned: &[Planned], refused: &[Unrepairable]) -> Option<String> {
    if planned.is_empty() && refused.is_empty() {
        return None;
    }
    let mut s = String::new();
    if !planned.is_empty() {
        s.push_str(&format!(
            "--repair would rebuild {} tensor{}: {}",
            planned.len(),
            if planned.len() == 1 { "" } else { "s" },
            planned
                .iter()
                .map(|p| format!("{} from {}", p.tensor, p.source))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    if !refused.is_empty() {
        if !s.is_empty() {
            s.push_str("; ");
        }
        s.push_str(&format!(
            "--repair cannot rebuild {}",
            refused
                .iter()
                .map(|u| format!("{} ({})", u.tensor, u.why))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    Some(s)
}
