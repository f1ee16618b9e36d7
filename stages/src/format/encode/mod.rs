//! Placing quantization groups into tiles: the inverse of the decoders in [`crate::format::tiles`],
//! on the same row of the table of kinds ([`onebit_pack::tiles::TileLayout`]; q4nx-format §2,
//! "General 4-bit formula"). A tensor is laid out as row blocks of `R` rows, each a run of `CT = ceil(K/C)` tiles; columns past K stay zero, so
//! padding decodes to exactly 0 (§4).

pub mod groups;

use crate::format::tiles::{Codes, Scales, SecondPlane, TileKind};
use groups::Group;

/// Whether the converter can write `kind`: every kind whose scales are a bf16 plane (the table's
/// [`Scales::Bf16`]); the Q4_K-like and MXFP4 kinds are read only.
pub fn writable(kind: TileKind) -> bool {
    kind.layout().scales == Scales::Bf16
}

/// The error of stored values against the values they stand for, summed over a tensor in
/// parallel parts: what the converter and the repair stage report per tensor they encode.
#[derive(Clone, Copy, Debug, Default)]
pub struct ErrorSums {
    /// Σ (stored − truth)².
    pub e2: f64,
    /// Σ truth².
    pub n2: f64,
    /// max |stored − truth|.
    pub max: f64,
}

impl ErrorSums {
    /// Adds one value.
    pub fn add(&mut self, stored: f32, truth: f32) {
        let e = (stored - truth) as f64;
        self.e2 += e * e;
        self.n2 += (truth as f64) * (truth as f64);
        self.max = self.max.max(e.abs());
    }

    /// The sums of two parts.
    pub fn merge(mut self, o: ErrorSums) -> ErrorSums {
        self.e2 += o.e2;
        self.n2 += o.n2;
        self.max = self.max.max(o.max);
        self
    }

    /// ‖stored − truth‖ / ‖truth‖ (0 for an all-zero truth).
    pub fn rel(&self) -> f64 {
        if self.n2 > 0.0 {
            (self.e2 / self.n2).sqrt()
        } else {
            0.0
        }
    }
}

/// Columns per tile row for the grid (`C`), i.e. the unit K is padded to.
pub fn grid_cols(kind: TileKind) -> usize {
    kind.cols()
}

/// Writes group `grp` of tile row `r`, tile group `g` into `tile`.
pub fn place(kind: TileKind, tile: &mut [u8], r: usize, g: usize, grp: &Group) {
    let l = kind.layout();
    let slot = l.slot(r, g);
    let planes = l.zero_base();
    tile[2 * slot..2 * slot + 2].copy_from_slice(&grp.d.to_le_bytes());
    // The signed 5120 tile keeps a zero-point plane, written from `m` (zeros for Q4_0 sources).
    match l.second {
        SecondPlane::ZeroPoints | SecondPlane::Zeros => {
            tile[planes + 2 * slot..planes + 2 * slot + 2].copy_from_slice(&grp.m.to_le_bytes())
        }
        SecondPlane::ScaleCopy => {
            tile[planes + 2 * slot..planes + 2 * slot + 2].copy_from_slice(&grp.d.to_le_bytes())
        }
        SecondPlane::None => {}
    }
    let c0 = g * 32;
    match l.codes {
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
    use crate::format::tiles::TileCodec;

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

    /// Reads group (r, g) back out of a tile through the table's accessors alone: the reader's
    /// view of what the writer stored.
    fn read_group(kind: TileKind, tile: &[u8], r: usize, g: usize) -> Group {
        let l = kind.layout();
        let slot = l.slot(r, g);
        let bits = |at: usize| u16::from_le_bytes([tile[at], tile[at + 1]]);
        let m = match l.second {
            SecondPlane::ZeroPoints | SecondPlane::Zeros => bits(l.zero_base() + 2 * slot),
            SecondPlane::ScaleCopy | SecondPlane::None => 0,
        };
        let mut q = [0u8; 32];
        for (j, v) in q.iter_mut().enumerate() {
            *v = l.code(tile, r, g * 32 + j);
        }
        Group {
            d: bits(2 * slot),
            m,
            q,
        }
    }

    /// Every kind of the table the writer writes: a tile written from random groups, read back
    /// group by group through the table's accessors and written again, is the same tile byte
    /// for byte; and every element the import's decoders give is the table's reference decode.
    #[test]
    fn reader_and_writer_agree_byte_for_byte_on_every_kind() {
        let mut seed = 0x2545_f491_u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        let mut checked = 0;
        for kind in crate::format::tiles::ALL_KINDS {
            if !writable(kind) {
                // The read-only kinds: random bytes, decoded both ways, against the table.
                let tile: Vec<u8> = (0..kind.bytes()).map(|_| next() as u8).collect();
                assert_decoders_match_the_table(kind, &tile);
                continue;
            }
            let l = kind.layout();
            let mut tile = vec![0u8; kind.bytes()];
            for r in 0..l.rows {
                for g in 0..l.groups() {
                    let mut q = [0u8; 32];
                    for v in q.iter_mut() {
                        *v = match l.codes {
                            Codes::Signed8 => next() as u8,
                            _ => next() as u8 & 0x0F,
                        };
                    }
                    let d = half::bf16::from_f32(((next() % 2000) as f32 - 1000.0) * 1e-5);
                    let m = match l.second {
                        SecondPlane::ZeroPoints => {
                            half::bf16::from_f32(-((next() % 1000) as f32) * 1e-4).to_bits()
                        }
                        _ => 0,
                    };
                    place(
                        kind,
                        &mut tile,
                        r,
                        g,
                        &Group {
                            d: d.to_bits(),
                            m,
                            q,
                        },
                    );
                }
            }
            let mut again = vec![0u8; kind.bytes()];
            for r in 0..l.rows {
                for g in 0..l.groups() {
                    place(kind, &mut again, r, g, &read_group(kind, &tile, r, g));
                }
            }
            assert!(
                tile == again,
                "{kind}: read back and written again, the bytes differ"
            );
            assert_decoders_match_the_table(kind, &tile);
            checked += 1;
        }
        assert_eq!(checked, 8, "every writable kind was written");
    }

    fn assert_decoders_match_the_table(kind: TileKind, tile: &[u8]) {
        let l = kind.layout();
        let (rr, cc) = (l.rows, l.cols);
        let (mut rows, mut cols) = (vec![0f32; rr * cc], vec![0f32; rr * cc]);
        kind.decode(tile, &mut rows);
        kind.decode_cols(tile, &mut cols);
        for r in 0..rr {
            for c in 0..cc {
                let want = l.w(tile, r, c);
                for (got, how) in [
                    (rows[r * cc + c], "decode"),
                    (cols[c * rr + r], "decode_cols"),
                ] {
                    // `w` adds 0.0 where a kind has no zero-point (−0 reads +0): compare as numbers.
                    assert!(
                        got == want || (got.is_nan() && want.is_nan()),
                        "{kind} {how} ({r}, {c}): {got} against the table's {want}"
                    );
                }
            }
        }
    }
}
