//! Dequantization of GGUF block formats to f32, following ggml's reference definitions with the
//! same operation order as gguf-py's `quants.py` (0.19.0), so results are bit-identical to it (the
//! `gguf_reference` test checks every type). In every legacy type a 32-element block of nibbles
//! holds elements 0..15 in the low nibbles and 16..31 in the high nibbles (verification.md §2).

use half::f16;

use super::dtype::GgmlType;

/// Elements per K-quant super-block.
pub const QK_K: usize = 256;

#[inline]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Dequantizes whole blocks of `ty` from `bytes` into `out`. `Err(ty)` when `ty` has no
/// dequantizer; panics only if the caller passes lengths that disagree (a bug, not bad input).
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), GgmlType> {
    let (bs, ts) = ty.block().ok_or(ty)?;
    let (bs, ts) = (bs as usize, ts as usize);
    assert_eq!(
        bytes.len() / ts * bs,
        out.len(),
        "{ty}: {} bytes for {} values",
        bytes.len(),
        out.len()
    );
    let f: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::F32 => |b, o| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::F16 => |b, o| o[0] = f16_at(b, 0),
        GgmlType::BF16 => {
            |b, o| o[0] = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)
        }
        GgmlType::Q4_0 => q4_0,
        GgmlType::Q4_1 => q4_1,
        GgmlType::Q5_0 => q5_0,
        GgmlType::Q5_1 => q5_1,
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q2_K => q2_k,
        GgmlType::Q3_K => q3_k,
        GgmlType::Q4_K => q4_k,
        GgmlType::Q5_K => q5_k,
        GgmlType::Q6_K => q6_k,
        GgmlType::MXFP4 => mxfp4,
        other => return Err(other),
    };
    for (b, o) in bytes.chunks_exact(ts).zip(out.chunks_exact_mut(bs)) {
        f(b, o);
    }
    Ok(())
}

/// Q4_0 (18 B): `d`; 16 B nibbles. `d·(q − 8)`.
fn q4_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..16 {
        let x = b[2 + j];
        o[j] = d * ((x & 15) as i8 - 8) as f32;
        o[j + 16] = d * ((x >> 4) as i8 - 8) as f32;
    }
}

/// Q4_1 (20 B): `d`; `m`; 16 B nibbles. `d·q + m`.
fn q4_1(b: &[u8], o: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for j in 0..16 {
        let x = b[4 + j];
        o[j] = d * (x & 15) as f32 + m;
        o[j + 16] = d * (x >> 4) as f32 + m;
    }
}

/// Q5_0 (22 B): `d`; u32 `qh`; 16 B nibbles. `q = nibble + 16·bit_j(qh)`; `d·(q − 16)`.
fn q5_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for j in 0..16 {
        let x = b[6 + j];
        let lo = (x & 15) | ((((qh >> j) & 1) as u8) << 4);
        let hi = (x >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
        o[j] = d * (lo as i8 - 16) as f32;
        o[j + 16] = d * (hi as i8 - 16) as f32;
    }
}

/// Q5_1 (24 B): `d`; `m`; u32 `qh`; 16 B nibbles. `d·q + m`.
fn q5_1(b: &[u8], o: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    for j in 0..16 {
        let x = b[8 + j];
        let lo = (x & 15) | ((((qh >> j) & 1) as u8) << 4);
        let hi = (x >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
        o[j] = d * lo as f32 + m;
        o[j + 16] = d * hi as f32 + m;
    }
}

/// Q8_0 (34 B): `d`; 32 × i8. `q·d`.
fn q8_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..32 {
        o[j] = (b[2 + j] as i8) as f32 * d;
    }
}

/// Q2_K (84 B): 16 B scales (low nibble scale, high nibble min); 64 B 2-bit codes; `d`; `dmin`.
/// Element `h·128 + s·32 + l` is bits `2s..2s+2` of `qs[32h + l]`; value `(d·sc)·q − dmin·mn` for
/// its 16-element sub-block.
fn q2_k(b: &[u8], o: &mut [f32]) {
    let (scales, qs) = (&b[..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for h in 0..2 {
        for s in 0..4 {
            for l in 0..32 {
                let e = h * 128 + s * 32 + l;
                let sb = e / 16;
                let dl = d * (scales[sb] & 15) as f32;
                let ml = dmin * (scales[sb] >> 4) as f32;
                let q = ((qs[32 * h + l] >> (2 * s)) & 3) as f32;
                o[e] = dl * q - ml;
            }
        }
    }
}

/// Q3_K (110 B): 32 B `hmask`; 64 B 2-bit low codes; 12 B packed 6-bit scales; `d`.
fn q3_k(b: &[u8], o: &mut [f32]) {
    let (hmask, qs, sc) = (&b[..32], &b[32..96], &b[96..108]);
    let d = f16_at(b, 108);
    let mut scales = [0f32; 16];
    for (i, s) in scales.iter_mut().enumerate() {
        let low = if i < 8 { sc[i] & 15 } else { sc[i - 8] >> 4 };
        let high = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
        *s = (((low | (high << 4)) as i8) - 32) as f32;
    }
    for h in 0..2 {
        for s in 0..4 {
            for l in 0..32 {
                let e = h * 128 + s * 32 + l;
                let dl = d * scales[e / 16];
                let ql = ((qs[32 * h + l] >> (2 * s)) & 3) as i8;
                // The high bit is set when the offset is zero (hence the xor in gguf-py).
                let hbit = ((hmask[l] >> (h * 4 + s)) & 1) ^ 1;
                o[e] = dl * (ql - ((hbit << 2) as i8)) as f32;
            }
        }
    }
}

/// The 6-bit scales and mins of Q4_K/Q5_K sub-blocks from their 12 packed bytes.
fn scale_min_k4(sc: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut s, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..4 {
        s[j] = sc[j] & 63;
        m[j] = sc[j + 4] & 63;
        s[j + 4] = (sc[j + 8] & 15) | ((sc[j] >> 2) & 0x30);
        m[j + 4] = (sc[j + 8] >> 4) | ((sc[j + 4] >> 2) & 0x30);
    }
    (s, m)
}

/// Q4_K (144 B): `d`; `dmin`; 12 B scales/mins; 128 B nibbles. Chunk i of 64 reads bytes
/// `32i..32i+32`: low nibbles are sub-block 2i, high nibbles 2i+1. `(d·sc)·q − dmin·mn`.
fn q4_k(b: &[u8], o: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, mn) = scale_min_k4(&b[4..16]);
    let qs = &b[16..144];
    for sb in 0..8 {
        let ds = d * sc[sb] as f32;
        let dm = dmin * mn[sb] as f32;
        let (chunk, shift) = (sb / 2, 4 * (sb % 2));
        for l in 0..32 {
            let q = ((qs[32 * chunk + l] >> shift) & 15) as f32;
            o[32 * sb + l] = ds * q - dm;
        }
    }
}

/// Q5_K (176 B): as Q4_K plus 32 B `qh`: the fifth bit of element l of sub-block s is bit s of
/// `qh[l]`.
fn q5_k(b: &[u8], o: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, mn) = scale_min_k4(&b[4..16]);
    let (qh, qs) = (&b[16..48], &b[48..176]);
    for sb in 0..8 {
        let ds = d * sc[sb] as f32;
        let dm = dmin * mn[sb] as f32;
        let (chunk, shift) = (sb / 2, 4 * (sb % 2));
        for l in 0..32 {
            let q = ((qs[32 * chunk + l] >> shift) & 15) | (((qh[l] >> sb) & 1) << 4);
            o[32 * sb + l] = ds * q as f32 - dm;
        }
    }
}

/// Q6_K (210 B): 128 B `ql`; 64 B `qh`; 16 × i8 scales; `d`. `(d·sc)·(q − 32)`.
fn q6_k(b: &[u8], o: &mut [f32]) {
    let (ql, qh, sc) = (&b[..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for h in 0..2 {
        for j in 0..2 {
            for t in 0..64 {
                // Low 4 bits: nibble j of ql[64h + t], element h·128 + j·64 + t.
                let e = h * 128 + j * 64 + t;
                let low = (ql[64 * h + t] >> (4 * j)) & 15;
                // Top 2 bits: element h·128 + s·32 + l takes bits 2s..2s+2 of qh[32h + l].
                let (s, l) = ((e % 128) / 32, e % 32);
                let high = (qh[32 * h + l] >> (2 * s)) & 3;
                let q = ((low | (high << 4)) as i8) - 32;
                o[e] = (d * sc[e / 16] as i8 as f32) * q as f32;
            }
        }
    }
}

/// ggml's E2M1 table, doubled (the scale is halved to match).
const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// MXFP4 (17 B): u8 E8M0 `e`; 16 B nibbles. `kvalues[q] · 2^(e−128)` (gguf-py's half scale).
fn mxfp4(b: &[u8], o: &mut [f32]) {
    let e = b[0] as u32;
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e - 1) << 23
    };
    let d = f32::from_bits(bits);
    for j in 0..16 {
        let x = b[1 + j];
        o[j] = d * KVALUES_MXFP4[(x & 15) as usize] as f32;
        o[j + 16] = d * KVALUES_MXFP4[(x >> 4) as usize] as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_blocks_decode_by_hand() {
        // Q4_0 with d = 1.0: nibble 9 → 1, nibble 0 (high) → −8.
        let mut b = vec![0u8; 18];
        b[0..2].copy_from_slice(&f16::from_f32(1.0).to_bits().to_le_bytes());
        b[2] = 0x09;
        let mut o = [0f32; 32];
        dequantize(GgmlType::Q4_0, &b, &mut o).expect("q4_0");
        assert_eq!((o[0], o[16], o[1]), (1.0, -8.0, -8.0));
        // Q8_0 with d = 0.5: code −3 → −1.5.
        let mut b = vec![0u8; 34];
        b[0..2].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
        b[2] = (-3i8) as u8;
        let mut o = [0f32; 32];
        dequantize(GgmlType::Q8_0, &b, &mut o).expect("q8_0");
        assert_eq!(o[0], -1.5);
    }

    #[test]
    fn unknown_types_are_named() {
        let mut o = [0f32; 256];
        assert_eq!(
            dequantize(GgmlType::IQ2_XXS, &[0u8; 66], &mut o),
            Err(GgmlType::IQ2_XXS)
        );
    }
}
