//! Kinds with no golden fixture (and the golden ones too): tiles built here from the formulas of
//! q4nx-format §2, byte by byte, independently of the codec's lane helpers; every element of the
//! decoded tile is checked. Plus the spec's worked examples (§8) at their exact bytes.

use onebit_stages::format::tiles::{ALL_KINDS, TileCodec, TileKind};

/// A tiny deterministic generator (xorshift) so the tiles are reproducible.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn byte(&mut self) -> u8 {
        (self.next() >> 24) as u8
    }
    /// A bf16 bit pattern of a moderate finite value with either sign.
    fn bf16(&mut self) -> u16 {
        let exp = 0x70 + (self.next() % 16) as u16; // 2^-15 .. 2^0
        let sign = ((self.next() & 1) as u16) << 15;
        sign | (exp << 7) | (self.next() & 0x7f) as u16
    }
}

fn bf(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

fn put16(t: &mut [u8], at: usize, v: u16) {
    t[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn sext4(n: u8) -> f32 {
    if n >= 8 { n as f32 - 16.0 } else { n as f32 }
}

const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Builds a random tile of `kind` by the spec's per-kind formulas and returns it with the value
/// of every element (row-major R×C) computed from the same formulas.
fn build(kind: TileKind, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let mut rng = Rng(seed | 1);
    let (r_, c_) = (kind.rows(), kind.cols());
    let mut t = vec![0u8; kind.bytes()];
    let mut want = vec![0f32; r_ * c_];
    let nib = |t: &mut [u8], at: usize, high: bool, q: u8| {
        if high {
            t[at] = (t[at] & 0x0f) | (q << 4);
        } else {
            t[at] = (t[at] & 0xf0) | q;
        }
    };
    match kind {
        TileKind::Q41_5120 | TileKind::Q41_1280 | TileKind::Q41_2560 | TileKind::Q40_5120 => {
            // d at 2·(g·R + r); m at 2·G·R + 2·(g·R + r); code byte per kind.
            let g_ = c_ / 32;
            let signed = kind == TileKind::Q40_5120;
            let mut d = vec![0u16; g_ * r_];
            let mut m = vec![0u16; g_ * r_];
            for s in 0..g_ * r_ {
                d[s] = rng.bf16();
                m[s] = if signed { 0 } else { rng.bf16() };
                put16(&mut t, 2 * s, d[s]);
                put16(&mut t, 2 * g_ * r_ + 2 * s, m[s]);
            }
            for r in 0..r_ {
                for c in 0..c_ {
                    let q = rng.byte() & 15;
                    let at = match kind {
                        TileKind::Q41_5120 | TileKind::Q40_5120 => {
                            1024 + (r / 16) * 2048 + c * 8 + (r % 16) / 2
                        }
                        TileKind::Q41_1280 => 256 + c * 8 + r / 2,
                        _ => 512 + (r / 16) * 1024 + c * 8 + (r % 16) / 2,
                    };
                    nib(&mut t, at, r % 2 == 1, q);
                    let s = (c / 32) * r_ + r;
                    want[r * c_ + c] = if signed {
                        bf(d[s]) * sext4(q)
                    } else {
                        bf(d[s]) * q as f32 + bf(m[s])
                    };
                }
            }
        }
        TileKind::Q40_4608 => {
            let mut d = vec![0u16; 256];
            for (s, v) in d.iter_mut().enumerate() {
                *v = rng.bf16();
                put16(&mut t, 2 * s, *v);
            }
            for r in 0..32 {
                for c in 0..256 {
                    let q = rng.byte() & 15;
                    nib(&mut t, 512 + c * 16 + r / 2, r % 2 == 1, q);
                    want[r * 256 + c] = bf(d[(c / 32) * 32 + r]) * sext4(q);
                }
            }
        }
        TileKind::Q4K_4736 => {
            let mut sc = [0u8; 256];
            let mut mn = [0u8; 256];
            for s in 0..256 {
                sc[s] = rng.byte() & 63;
                mn[s] = rng.byte() & 63;
                t[s] = sc[s];
                t[256 + s] = mn[s];
            }
            let mut big_s = [0u16; 32];
            let mut big_m = [0u16; 32];
            for r in 0..32 {
                big_s[r] = rng.bf16() & 0x7fff;
                big_m[r] = rng.bf16() | 0x8000; // stored already negated
                put16(&mut t, 4608 + 2 * r, big_s[r]);
                put16(&mut t, 4672 + 2 * r, big_m[r]);
            }
            for r in 0..32 {
                for c in 0..256 {
                    let q = rng.byte() & 15;
                    nib(&mut t, 512 + c * 16 + r / 2, r % 2 == 1, q);
                    let s = (c / 32) * 32 + r;
                    want[r * 256 + c] =
                        bf(big_s[r]) * sc[s] as f32 * q as f32 + bf(big_m[r]) * mn[s] as f32;
                }
            }
        }
        TileKind::Q8L_8704 | TileKind::Q8C_8704 | TileKind::Q8H_5120 => {
            let g_ = c_ / 32;
            let mut d = vec![0u16; g_ * 32];
            for (s, v) in d.iter_mut().enumerate() {
                *v = rng.bf16();
                put16(&mut t, 2 * s, *v);
                if kind == TileKind::Q8H_5120 {
                    put16(&mut t, 256 + 2 * s, *v); // the duplicate plane
                }
            }
            for r in 0..32 {
                for c in 0..c_ {
                    let q = rng.byte();
                    let at = match kind {
                        TileKind::Q8L_8704 => 512 + (r / 16) * 4096 + c * 16 + r % 16,
                        TileKind::Q8C_8704 => 512 + c * 32 + r,
                        _ => 512 + (r / 16) * 2048 + c * 16 + r % 16,
                    };
                    t[at] = q;
                    want[r * c_ + c] = bf(d[(c / 32) * 32 + r]) * (q as i8) as f32;
                }
            }
        }
        TileKind::MXFP4_2560 => {
            let mut e = [0u8; 128];
            for (s, v) in e.iter_mut().enumerate() {
                *v = 110 + rng.byte() % 30;
                t[s] = *v;
            }
            for r in 0..32 {
                for c in 0..128 {
                    let q = rng.byte() & 15;
                    nib(
                        &mut t,
                        512 + (r / 16) * 1024 + c * 8 + (r % 16) / 2,
                        r % 2 == 1,
                        q,
                    );
                    let mag = E2M1[(q & 7) as usize];
                    let v = if q & 8 != 0 { -mag } else { mag };
                    want[r * 128 + c] = v * 2f32.powi(e[(c / 32) * 32 + r] as i32 - 127);
                }
            }
        }
    }
    (t, want)
}

#[test]
fn every_kind_decodes_every_element_of_a_spec_built_tile() {
    for kind in ALL_KINDS {
        for seed in [1u64, 0x9e37_79b9, 0xdead_beef] {
            let (tile, want) = build(kind, seed);
            let mut out = vec![f32::NAN; kind.rows() * kind.cols()];
            kind.decode(&tile, &mut out);
            let mut cols = vec![f32::NAN; kind.rows() * kind.cols()];
            kind.decode_cols(&tile, &mut cols);
            for (i, (a, b)) in out.iter().zip(&want).enumerate() {
                let (r, c) = (i / kind.cols(), i % kind.cols());
                assert!(
                    a.to_bits() == b.to_bits() || (a == b),
                    "{kind} seed {seed:#x}: element (r {r}, c {c}) decoded {a:e}, spec says {b:e}"
                );
                let fast = cols[c * kind.rows() + r];
                assert!(
                    fast.to_bits() == a.to_bits(),
                    "{kind} seed {seed:#x}: fast path (r {r}, c {c}) {fast:e} != reference {a:e}"
                );
            }
        }
    }
}

#[test]
fn worked_examples_of_section_8() {
    // Q40_4608 (r 5, c 77): d bytes 138..139 = 23 3C, byte 1746 = 0xB4 → −5·d.
    let mut t = vec![0u8; 4608];
    t[138] = 0x23;
    t[139] = 0x3C;
    t[1746] = 0xB4;
    put16(&mut t, 136, 0x3F80); // row 4's d = 1.0 (bf16)
    let mut out = vec![0f32; 32 * 256];
    TileKind::Q40_4608.decode(&t, &mut out);
    assert_eq!(out[5 * 256 + 77], -5.0 * bf(0x3C23));
    assert!((out[5 * 256 + 77] + 0.049743).abs() < 1e-6);
    // Row 4 of the same column reads the low nibble (4) with d at bytes 136..137.
    assert_eq!(out[4 * 256 + 77], 4.0);

    // Q4K_4736 (r 21, c 77): sc 12, mn 20, S = 2^-10, M = −2^-11, code 9 → 0.095703125.
    let mut t = vec![0u8; 4736];
    t[85] = 12;
    t[341] = 20;
    put16(&mut t, 4650, 0x3A80);
    put16(&mut t, 4714, 0xBA00);
    t[1754] = 0x90;
    TileKind::Q4K_4736.decode(&t, &mut out);
    assert_eq!(out[21 * 256 + 77], 0.095703125);

    // Q8L vs Q8C (r 21, c 77): d = 2^-9, code 0xC6 (−58) → −0.11328125 at each layout's byte.
    for (kind, at) in [(TileKind::Q8L_8704, 5845), (TileKind::Q8C_8704, 2997)] {
        let mut t = vec![0u8; 8704];
        put16(&mut t, 170, 0x3B00);
        t[at] = 0xC6;
        TileKind::decode(kind, &t, &mut out);
        assert_eq!(out[21 * 256 + 77], -0.11328125, "{kind}");
    }

    // MXFP4 (r 21, c 77): e = 0x7A (2^-5), nibble 0xB (−1.5) at byte 2154 high → −0.046875.
    let mut t = vec![0u8; 2560];
    t[85] = 0x7A;
    t[2154] = 0xB0;
    let mut out = vec![0f32; 32 * 128];
    TileKind::MXFP4_2560.decode(&t, &mut out);
    assert_eq!(out[21 * 128 + 77], -0.046875);
}

#[test]
fn q8_orders_scramble_each_other() {
    // A wrong Q8 order must be visibly different, never silently equal.
    let (tile, want) = build(TileKind::Q8L_8704, 7);
    let mut out = vec![0f32; 32 * 256];
    TileKind::Q8C_8704.decode(&tile, &mut out);
    let r = onebit_stages::stats::pearson(&out, &want);
    assert!(r.abs() < 0.2, "Q8C reading of a Q8L tile correlates {r}");
}
