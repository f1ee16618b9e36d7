//! The int8 activations every kernel path reads (llama.cpp's `Q8_1`): per token and 32-column
//! group one f32 scale, 32 codes and their sum, plus the copies some paths want (i16 codes for
//! the AVX2 8-bit kernel, AMX tile order).

/// The activations of one call as every path reads them: `n` tokens padded to `kp` columns (pad
/// = 0) in int8 form — per (token, 32-column group) a scale `amax/127`, codes `round(x/scale)` and
/// the codes' sum.
#[derive(Clone, Debug, Default)]
pub struct Activations {
    /// Tokens.
    pub n: usize,
    /// Padded K.
    pub kp: usize,
    /// `n × kp` int8 codes.
    pub q: Vec<i8>,
    /// The same codes widened to i16 (the AVX2 8-bit kernel broadcasts two of them as one i32);
    /// empty until [`Activations::widen`].
    pub q16: Vec<i16>,
    /// The codes of every whole block of 16 tokens in AMX tile order (per 32-column group and
    /// block, 16 rows of 32 codes, contiguous: the tokens' own rows lie `kp` bytes apart, which
    /// maps a block's rows onto a few cache sets; group-major, so the blocks a kernel walks for
    /// one group follow each other in memory); empty until [`Activations::tile_order`].
    pub qt: Vec<i8>,
    /// `n × kp/32` int8 scales.
    pub qd: Vec<f32>,
    /// [`Activations::qd`] and [`Activations::zs`] of every whole block of 16 tokens in tile
    /// order (per group and block, the 16 tokens' values contiguous: one cache line where the
    /// token-major arrays spread them over 16); empty until [`Activations::tile_order`].
    pub qdt: Vec<f32>,
    /// See [`Activations::qdt`].
    pub zst: Vec<f32>,
    /// [`Activations::qsum8`] in the order of [`Activations::qdt`].
    pub qs8t: Vec<i32>,
    /// The order of [`Activations::qt`] and the arrays beside it; `None` until
    /// [`Activations::tile_order`].
    pub order: Option<BlockOrder>,
    /// `n × kp/32` sums of the int8 codes.
    pub qsum: Vec<i32>,
    /// `8·qsum`: what reading signed nibbles as `q + 8` adds to a group's sum, taken back.
    pub qsum8: Vec<i32>,
    /// `qd·qsum` (f32): the factor of a group's zero-point.
    pub zs: Vec<f32>,
}

/// How the whole blocks of 16 tokens lie in [`Activations::qt`]: each (block, group) is 16 rows
/// of 32 codes (and 16 factors) contiguous, in one of two orders of the pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockOrder {
    /// All blocks of group 0, then of group 1, …: the AMX kernel walks one group's blocks in a
    /// row (A tiles stream).
    GroupMajor,
    /// All groups of block 0, then of block 1, …: the AVX-512 VNNI kernel walks one block's
    /// groups in a row, and a block's codes are one contiguous run (the group-major order puts
    /// a block's groups 512·blocks bytes apart, all on the same few L1 sets).
    BlockMajor,
}

impl BlockOrder {
    /// The first of 16 slots of (block `b`, group `g`).
    pub fn index(self, b: usize, g: usize, blocks: usize, groups: usize) -> usize {
        match self {
            BlockOrder::GroupMajor => (g * blocks + b) * 16,
            BlockOrder::BlockMajor => (b * groups + g) * 16,
        }
    }
}

impl Activations {
    /// Quantizes `x` (`n × k`), padded to `kp` columns.
    pub fn new(x: &[f32], n: usize, k: usize, kp: usize) -> Activations {
        let groups = kp / 32;
        let mut a = Activations {
            n,
            kp,
            q: vec![0i8; n * kp],
            q16: Vec::new(),
            qt: Vec::new(),
            qd: vec![0f32; n * groups],
            qdt: Vec::new(),
            zst: Vec::new(),
            qs8t: Vec::new(),
            order: None,
            qsum: vec![0i32; n * groups],
            qsum8: Vec::new(),
            zs: Vec::new(),
        };
        #[cfg(target_arch = "x86_64")]
        let simd = std::is_x86_feature_detected!("avx2");
        for t in 0..n {
            for g in 0..groups {
                let (c0, c1) = ((g * 32).min(k), ((g + 1) * 32).min(k));
                let src = &x[t * k + c0..t * k + c1];
                let q = &mut a.q[t * kp + g * 32..t * kp + g * 32 + (c1 - c0)];
                let at = t * groups + g;
                #[cfg(target_arch = "x86_64")]
                if simd && src.len() == 32 {
                    // SAFETY: AVX2 checked above; 32 values in `src` and 32 codes in `q`.
                    if let Some((d, sum)) = unsafe { x86_group(src, q) } {
                        (a.qd[at], a.qsum[at]) = (d, sum);
                        continue;
                    }
                }
                (a.qd[at], a.qsum[at]) = group(src, q);
            }
        }
        // Per group once here, not per row band in every kernel's epilogue (the AMX epilogue
        // runs once per 16 rows × 16 tokens × group).
        a.qsum8 = a.qsum.iter().map(|&s| 8 * s).collect();
        a.zs =
            a.qd.iter()
                .zip(&a.qsum)
                .map(|(&d, &s)| d * s as f32)
                .collect();
        a
    }

    /// Fills [`Activations::q16`]: only calls with 8-bit tiles on the AVX2 path read it.
    pub fn widen(&mut self) {
        self.q16 = self.q.iter().map(|&v| i16::from(v)).collect();
    }

    /// Fills [`Activations::qt`] and the per-group arrays in the same order, `order` of the
    /// whole blocks of 16 tokens: [`BlockOrder::GroupMajor`] for the AMX path,
    /// [`BlockOrder::BlockMajor`] for the AVX-512 VNNI path.
    pub fn tile_order(&mut self, order: BlockOrder) {
        let (groups, blocks) = (self.kp / 32, self.n / 16);
        self.order = Some(order);
        self.qt = vec![0i8; blocks * 16 * self.kp];
        self.qdt = vec![0f32; blocks * 16 * groups];
        self.zst = vec![0f32; blocks * 16 * groups];
        self.qs8t = vec![0i32; blocks * 16 * groups];
        for b in 0..blocks {
            for g in 0..groups {
                let at = order.index(b, g, blocks, groups);
                for m in 0..16 {
                    let from = (b * 16 + m) * groups + g;
                    self.qdt[at + m] = self.qd[from];
                    self.zst[at + m] = self.zs[from];
                    self.qs8t[at + m] = self.qsum8[from];
                    let src = &self.q[(b * 16 + m) * self.kp + g * 32..][..32];
                    self.qt[(at + m) * 32..][..32].copy_from_slice(src);
                }
            }
        }
    }

    /// The values a product reads, dequantized: the input of the exact reference a kernel is
    /// checked against.
    pub fn effective(&self) -> Vec<f32> {
        self.q
            .chunks_exact(32)
            .zip(&self.qd)
            .flat_map(|(q, &d)| q.iter().map(move |&v| d * v as f32))
            .collect()
    }
}

/// One group's scale and code sum, its codes into `q` (the portable form, and the reference of
/// [`x86_group`]).
fn group(src: &[f32], q: &mut [i8]) -> (f32, i32) {
    let amax = src.iter().fold(0f32, |m, v| m.max(v.abs()));
    if amax > 0.0 && amax.is_finite() {
        let inv = 127.0 / amax;
        for (o, &v) in q.iter_mut().zip(src) {
            *o = round_code(v * inv);
        }
        (amax / 127.0, q.iter().map(|&v| v as i32).sum())
    } else if !amax.is_finite() {
        // Non-finite input: keep it visible in the result instead of hiding it.
        (f32::NAN, 0)
    } else {
        (0.0, 0)
    }
}

/// [`group`] for a whole group of 32 on AVX2, bit for bit (the same f32 operations per value);
/// `None` when a value is not finite, all are zero or the inverse scale overflows, which
/// [`group`] handles. Quantizing was
/// a twentieth of a prefill's product time in scalar code.
///
/// # Safety
/// The CPU supports AVX2; `src` and `q` hold 32 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn x86_group(src: &[f32], q: &mut [i8]) -> Option<(f32, i32)> {
    use std::arch::x86_64::*;
    let (src, q) = (&src[..32], &mut q[..32]);
    // SAFETY: 4 × 8 values inside `src` (sliced above).
    let v: [__m256; 4] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(src[8 * i..].as_ptr()) });
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let m = v.map(|v| _mm256_and_ps(v, abs));
    // Every value finite (a NaN compares false; `max` would drop it).
    let big = _mm256_set1_ps(f32::MAX);
    let finite = m.map(|m| _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(m, big)));
    if finite != [0xFF; 4] {
        return None;
    }
    let m = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
    // A subnormal maximum overflows the inverse: NaN codes, which only the portable form turns
    // into 0 the way `as i8` does.
    if amax <= 0.0 || !(127.0 / amax).is_finite() {
        return None;
    }
    let inv = _mm256_set1_ps(127.0 / amax);
    let magic = _mm256_set1_ps(12_582_912.0);
    let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
    let c = v.map(|v| {
        let r = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(v, inv), magic), magic);
        _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi))
    });
    let sum = _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]));
    let sum = _mm_add_epi32(
        _mm256_castsi256_si128(sum),
        _mm256_extracti128_si256::<1>(sum),
    );
    let sum = _mm_add_epi32(sum, _mm_shuffle_epi32::<0b01_00_11_10>(sum));
    let sum = _mm_cvtsi128_si32(_mm_add_epi32(sum, _mm_shuffle_epi32::<0b10_11_00_01>(sum)));
    // Packing works per 128-bit lane: the dwords come out as 0,2,4,6,1,3,5,7 of the 8 wanted.
    let bytes = _mm256_packs_epi16(
        _mm256_packs_epi32(c[0], c[1]),
        _mm256_packs_epi32(c[2], c[3]),
    );
    let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: 32 bytes in `q` (sliced above).
    unsafe { _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, bytes) };
    Some((amax / 127.0, sum))
}

/// `x` (|x| ≤ 127 up to rounding) to the nearest int8, ties to even: adding and subtracting 1.5·2²³
/// leaves exactly the rounded value for |x| < 2²², in plain float arithmetic that vectorizes (a
/// `round` call does not on the baseline target, and quantizing a prefill's activations was a
/// tenth of its products' time).
#[inline]
fn round_code(x: f32) -> i8 {
    const MAGIC: f32 = 12_582_912.0;
    ((x + MAGIC) - MAGIC).clamp(-127.0, 127.0) as i8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simd_quantizer_gives_the_portable_codes_bit_for_bit() {
        #[cfg(target_arch = "x86_64")]
        {
            if !std::is_x86_feature_detected!("avx2") {
                eprintln!("no AVX2 on this CPU: nothing to compare");
                return;
            }
            let mut cases: Vec<Vec<f32>> = (0..200)
                .map(|s| {
                    (0..32)
                        .map(|i| {
                            let h = (i * 2_654_435_761u64 as usize + s * 40_503) % 1_000_003;
                            (h as f32 / 1_000_003.0 - 0.5) * (1.0 + s as f32)
                        })
                        .collect()
                })
                .collect();
            // Ties at .5 after scaling, zeros, one non-zero, a huge and a tiny range, NaN, ∞.
            cases.push((0..32).map(|i| i as f32 - 15.5).collect());
            cases.push(vec![0.0; 32]);
            cases.push((0..32).map(|i| if i == 7 { -3.0 } else { 0.0 }).collect());
            cases.push((0..32).map(|i| (i as f32) * 1e30).collect());
            cases.push((0..32).map(|i| (i as f32) * 1e-38).collect());
            let mut nan = vec![1.0; 32];
            nan[3] = f32::NAN;
            cases.push(nan);
            let mut inf = vec![1.0; 32];
            inf[30] = f32::NEG_INFINITY;
            cases.push(inf);
            for (c, src) in cases.iter().enumerate() {
                let mut want = vec![0i8; 32];
                let (wd, ws) = group(src, &mut want);
                let mut got = vec![0i8; 32];
                // SAFETY: AVX2 checked above; 32 values each.
                let (gd, gs) =
                    unsafe { x86_group(src, &mut got) }.unwrap_or_else(|| group(src, &mut got));
                assert_eq!(want, got, "case {c}: codes");
                assert_eq!(
                    (wd.to_bits(), ws),
                    (gd.to_bits(), gs),
                    "case {c}: scale, sum"
                );
            }
        }
    }
}
