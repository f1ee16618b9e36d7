//! Placing quantization groups into tiles: the inverse of the decoders in [`crate::format::tiles`], on the
//! same [`Lanes`] geometry (q4nx-format §2, "General 4-bit formula"). A tensor is laid out as
//! row blocks of `R` rows, each a run of `CT = ceil(K/C)` tiles; columns past K stay zero, so
//! padding decodes to exactly 0 (§4).

pub mod groups;

use crate::format::tiles::{Codes, TileKind};
use groups::Group;

/// Which tile kinds the converter writes, and how their zero-point plane is filled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ZeroPlane {
    /// No zero-point plane.
    None,
    /// `m` values.
    Min,
    /// An exact copy of the scale plane (Q8H_5120).
    CopyOfScale,
}

fn zero_plane(kind: TileKind) -> Option<ZeroPlane> {
    Some(match kind {
        TileKind::Q41_5120 | TileKind::Q41_1280 | TileKind::Q41_2560 => ZeroPlane::Min,
        // The signed 5120 tile keeps a zero-point plane of zeros.
        TileKind::Q40_5120 => ZeroPlane::Min,
        TileKind::Q8H_5120 => ZeroPlane::CopyOfScale,
        TileKind::Q40_4608 | TileKind::Q8C_8704 | TileKind::Q8L_8704 => ZeroPlane::None,
        TileKind::Q4K_4736 | TileKind::MXFP4_2560 => return None,
    })
}

/// Whether the converter can write `kind`.
pub fn writable(kind: TileKind) -> bool {
    zero_plane(kind).is_some()
}

/// Columns per tile row for the grid (`C`), i.e. the unit K is padded to.
pub fn grid_cols(kind: TileKind) -> usize {
    kind.cols()
}

/// Writes group `grp` of tile row `r`, tile group `g` into `tile`.
pub fn place(kind: TileKind, tile: &mut [u8], r: usize, g: usize, grp: &Group) {
    let l = kind.lanes();
    let slot = l.slot(r, g);
    let planes = 2 * l.rows * l.groups();
    tile[2 * slot..2 * slot + 2].copy_from_slice(&grp.d.to_le_bytes());
    match zero_plane(kind) {
        Some(ZeroPlane::Min) => {
            tile[planes + 2 * slot..planes + 2 * slot + 2].copy_from_slice(&grp.m.to_le_bytes())
        }
        Some(ZeroPlane::CopyOfScale) => {
            tile[planes + 2 * slot..planes + 2 * slot + 2].copy_from_slice(&grp.d.to_le_bytes())
        }
        _ => {}
    }
    let c0 = g * 32;
    match kind.codes() {
        Codes::Signed8 => {
            for (j, &q) in grp.q.iter().enumerate() {
                tile[l.code8_at(r, c0 + j)] = q;
            }
        }
        _ => {
            for (j, &q) in grp.q.iter().enumerate() {
                let (at, high) = l.code4_at(r, c0 + j);
                if high {
                    tile[at] = (tile[at] & 0x0F) | (q << 4);
                } else {
                    tile[at] = (tile[at] & 0xF0) | (q & 0x0F);
                }
            }
        }
    }
}

/// Writes the groups of one tensor row (`groups[i]` covers columns `32·i..32·i+32`) as row `r`
/// of a row block whose tiles are `band` (`CT` tiles back to back).
pub fn place_row(kind: TileKind, band: &mut [u8], r: usize, groups: &[Group]) {
    let w = kind.bytes();
    let per_tile = kind.cols() / 32;
    for (i, grp) in groups.iter().enumerate() {
        let (cb, g) = (i / per_tile, i % per_tile);
        place(kind, &mut band[cb * w..(cb + 1) * w], r, g, grp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every writable kind: groups placed by the encoder decode, through the reader's codec, to
    /// exactly the values the groups stand for.
    #[test]
    fn encoder_is_the_decoders_inverse() {
        for kind in crate::format::tiles::ALL_KINDS
            .into_iter()
            .filter(|&k| writable(k))
        {
            let (rr, cc) = (kind.rows(), kind.cols());
            let mut tile = vec![0u8; kind.bytes()];
            let mut seed = 12345u32;
            let mut next = || {
                seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
                (seed >> 16) as u8
            };
            let mut groups = vec![];
            for r in 0..rr {
                for g in 0..cc / 32 {
                    let codes = kind.codes();
                    let mut q = [0u8; 32];
                    for v in q.iter_mut() {
                        *v = if codes == Codes::Signed8 {
                            next()
                        } else {
                            next() & 0x0F
                        };
                    }
                    let d = half::bf16::from_f32(0.01 + r as f32 * 1e-3).to_bits();
                    let m = if kind.codes() == Codes::Unsigned4 && kind != TileKind::Q40_5120 {
                        half::bf16::from_f32(-0.05 - g as f32 * 1e-3).to_bits()
                    } else {
                        0
                    };
                    let grp = Group { d, m, q };
                    place(kind, &mut tile, r, g, &grp);
                    groups.push((r, g, grp));
                }
            }
            let mut out = vec![0f32; rr * cc];
            kind.decode(&tile, &mut out);
            for (r, g, grp) in groups {
                for j in 0..32 {
                    let want = grp.value(kind.codes(), j);
                    let got = out[r * cc + g * 32 + j];
                    assert_eq!(got.to_bits(), want.to_bits(), "{kind:?} r{r} g{g} j{j}");
                }
            }
        }
    }
}
