//! Each tower tensor's layout, with its evidence: plain bf16/f16/f32, or a projection in MM
//! blocks whose geometry `(MM_K, MM_N)` and logical `N × K` are decided from the declared shape
//! and, in this order, the mmproj twin's shape, the zero padding in the data, config.json's
//! `vision_MM_K`/`vision_MM_N`, and the converter's orientation (`MM_K ≥ MM_N`).

use serde_json::Value;

use super::names::{self, Relation};
use crate::error::{Error, Result};
use crate::format::gguf::GgufFile;
use crate::format::q4nx::{Container, Dtype, TensorInfo};
use crate::layout::mm_block::MmBlock;
use crate::layout::{Layout, TensorLayout};

/// The geometries a tower file may use: the converter's, then each turned the other way (a
/// tensor whose shape only fits one of those is read as it fits, and the decision says so).
fn candidates() -> impl Iterator<Item = MmBlock> {
    MmBlock::KNOWN
        .into_iter()
        .chain(MmBlock::KNOWN.into_iter().map(|b| MmBlock {
            mm_k: b.mm_n,
            mm_n: b.mm_k,
        }))
}

/// config.json's tower keys (`vision_MM_K`, `vision_MM_N`; top level or in `vision_config`), for
/// the tower kind's prefix (`vision`, `audio`).
pub fn configured_block(config: Option<&Value>, prefix: &str) -> Option<MmBlock> {
    let config = config?;
    let get = |key: &str| {
        let key = format!("{prefix}_{key}");
        config
            .get(&key)
            .or_else(|| {
                config
                    .get(format!("{prefix}_config"))
                    .and_then(|c| c.get(&key))
            })
            .and_then(Value::as_u64)
    };
    Some(MmBlock {
        mm_k: get("MM_K")?,
        mm_n: get("MM_N")?,
    })
}

/// The logical `(N, K)` of a tower projection as its mmproj twin gives it.
fn twin_dims(gguf: &GgufFile, name: &str) -> Option<(u64, u64, String)> {
    let (g, _, relation) = names::twin(name)?;
    let t = gguf.tensor(&g)?;
    let (rows, k) = (t.rows(), t.row_len());
    Some(match relation {
        Relation::Transposed => (k, rows, format!("{g} {rows}x{k}, transposed")),
        _ => (rows, k, format!("{g} {rows}x{k}")),
    })
}

/// The extent of the non-zero values of a tensor read with `block`: one past the last non-zero
/// row and column.
fn data_dims(data: &[u8], shape: &[u64], block: MmBlock) -> (u64, u64) {
    let (rows, blocks_k) = (shape[0] * block.mm_n, shape[1]);
    let (mut n, mut k) = (0, 0);
    let mut row = Vec::new();
    for r in 0..rows {
        block.read_row(data, blocks_k, r, &mut row);
        if let Some(last) = row.iter().rposition(|&v| v != 0.0) {
            n = r + 1;
            k = k.max(last as u64 + 1);
        }
    }
    (n, k)
}

/// The geometry and logical size of one MM-blocked tensor, and the decision with its evidence.
fn decide_block(
    info: &TensorInfo,
    data: &[u8],
    configured: Option<MmBlock>,
    gguf: Option<&GgufFile>,
) -> Option<(MmBlock, u64, u64, String)> {
    let shape = &info.shape;
    let fitting: Vec<MmBlock> = candidates().filter(|b| b.fits(shape)).collect();
    if fitting.is_empty() {
        return None;
    }
    let declared = format!("{shape:?}");
    // The twin's shape decides when one geometry lays it out as declared.
    if let Some((n, k, twin)) = gguf.and_then(|g| twin_dims(g, &info.name)) {
        let by_twin: Vec<MmBlock> = fitting
            .iter()
            .copied()
            .filter(|b| b.declared_shape(n, k) == [shape[0], shape[1], shape[2]])
            .collect();
        if let [b] = by_twin.as_slice() {
            return Some((
                *b,
                n,
                k,
                format!(
                    "mm_block={} <- declared {declared} = mmproj twin {twin} padded to {}",
                    b.name(),
                    b.unit()
                ),
            ));
        }
    }
    // The zero padding: a geometry that reads the values as a block of N × K with less than
    // one padding unit of zeros after it.
    let by_data: Vec<(MmBlock, u64, u64)> = fitting
        .iter()
        .map(|&b| {
            let (n, k) = data_dims(data, shape, b);
            (b, n, k)
        })
        .filter(|&(b, n, k)| n > 0 && b.declared_shape(n, k) == [shape[0], shape[1], shape[2]])
        .collect();
    let pick = |b: MmBlock| by_data.iter().find(|c| c.0 == b).copied();
    let (choice, why) = match by_data.as_slice() {
        [] => return None,
        [one] => (
            *one,
            "the only geometry whose zero padding is under one unit".to_string(),
        ),
        _ => match configured.and_then(pick) {
            Some(c) => (
                c,
                "config.json's vision_MM_K/vision_MM_N among those the data allows".into(),
            ),
            None => (
                by_data[0],
                "the converter's orientation (MM_K >= MM_N) among those the data allows".into(),
            ),
        },
    };
    let (b, n, k) = choice;
    Some((
        b,
        n,
        k,
        format!(
            "mm_block={} <- declared {declared}, non-zero extent {n}x{k} (data): {why}",
            b.name()
        ),
    ))
}

/// The layout of every tensor of a tower file. `prefix` is the tower kind's config prefix
/// (`vision`, `audio`); `config` is the repository's config.json, when it has one.
pub fn detect_tower(
    container: &Container,
    config: Option<&Value>,
    prefix: &str,
    gguf: Option<&GgufFile>,
) -> Result<Vec<TensorLayout>> {
    let configured = configured_block(config, prefix);
    let mut out = Vec::new();
    for info in container.tensors() {
        let data = container.data(info);
        let refuse = |reason: String| Error::Refused {
            file: container.path().to_path_buf(),
            tensor: info.name.clone(),
            reason,
        };
        let size = match &info.dtype {
            Dtype::BF16 | Dtype::F16 => 2,
            Dtype::F32 => 4,
            other => {
                return Err(refuse(format!(
                    "dtype {} in a tower file: FastFlowLM's towers are bf16 (q4nx-format §1); \
                     no reading of {} tower tensors is known",
                    other.name(),
                    other.name()
                )));
            }
        };
        let elements: u64 = info.shape.iter().product();
        if elements * size != info.nbytes() {
            return Err(refuse(format!(
                "declared shape {:?} of {} needs {} bytes, the file holds {}",
                info.shape,
                info.dtype.name(),
                elements * size,
                info.nbytes()
            )));
        }
        let layer = names::twin(&info.name).and_then(|t| t.1);
        let blocked = (info.dtype == Dtype::BF16)
            .then(|| decide_block(info, data, configured, gguf))
            .flatten();
        let (layout, rows, k, decision) = match blocked {
            Some((block, n, k, decision)) => (
                Layout::MmBlock {
                    block,
                    padded_rows: info.shape[0] * block.mm_n,
                    padded_k: info.shape[1] * block.mm_k,
                },
                n,
                k,
                decision,
            ),
            None => {
                let (rows, k) = match info.shape.as_slice() {
                    [] => (1, 1),
                    [n] => (1, *n),
                    [r, rest @ ..] => (*r, rest.iter().product()),
                };
                (
                    Layout::Plain,
                    rows,
                    k,
                    format!(
                        "plain <- {} {:?}, not MM-blocked",
                        info.dtype.name(),
                        info.shape
                    ),
                )
            }
        };
        out.push(TensorLayout {
            name: info.name.clone(),
            dtype: info.dtype.name().to_string(),
            shape: info.shape.clone(),
            bytes: info.nbytes(),
            layer,
            role: names::role(&info.name),
            layout,
            rows,
            k,
            codes: None,
            decision,
            readings: Vec::new(),
            flags: Vec::new(),
        });
    }
    Ok(out)
}
