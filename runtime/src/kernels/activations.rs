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
    /// The codes of every whole block of 16 tokens in AMX tile order (per block and 32-column
    /// group, 16 rows of 32 codes, contiguous: the tokens' own rows lie `kp` bytes apart, which
    /// maps a block's rows onto a few cache sets); empty until [`Activations::tile_order`].
    pub qt: Vec<i8>,
    /// `n × kp/32` int8 scales.
    pub qd: Vec<f32>,
    /// `n × kp/32` sums of the int8 codes.
    pub qsum: Vec<i32>,
    /// `8·qsum`: what reading signed nibbles as `q + 8` adds to a group's sum, taken back.
    pub qsum8: Vec<i32>,
    /// `qd·qsum` (f32): the factor of a group's zero-point.
    pub zs: Vec<f32>,
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
            qsum: vec![0i32; n * groups],
            qsum8: Vec::new(),
            zs: Vec::new(),
        };
        for t in 0..n {
            for g in 0..groups {
                let (c0, c1) = ((g * 32).min(k), ((g + 1) * 32).min(k));
                let src = &x[t * k + c0..t * k + c1];
                let q = &mut a.q[t * kp + g * 32..t * kp + g * 32 + (c1 - c0)];
                let amax = src.iter().fold(0f32, |m, v| m.max(v.abs()));
                let at = t * groups + g;
                if amax > 0.0 && amax.is_finite() {
                    a.qd[at] = amax / 127.0;
                    let inv = 127.0 / amax;
                    for (o, &v) in q.iter_mut().zip(src) {
                        *o = round_code(v * inv);
                    }
                    a.qsum[at] = q.iter().map(|&v| v as i32).sum();
                } else if !amax.is_finite() {
                    // Non-finite input: keep it visible in the result instead of hiding it.
                    a.qd[at] = f32::NAN;
                }
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

    /// Fills [`Activations::qt`]: only calls on the AMX path with 16 tokens or more read it.
    pub fn tile_order(&mut self) {
        let (groups, blocks) = (self.kp / 32, self.n / 16);
        self.qt = vec![0i8; blocks * 16 * self.kp];
        for b in 0..blocks {
            for g in 0..groups {
                for m in 0..16 {
                    let src = &self.q[(b * 16 + m) * self.kp + g * 32..][..32];
                    self.qt[((b * groups + g) * 16 + m) * 32..][..32].copy_from_slice(src);
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

/// `x` (|x| ≤ 127 up to rounding) to the nearest int8, ties to even: adding and subtracting 1.5·2²³
/// leaves exactly the rounded value for |x| < 2²², in plain float arithmetic that vectorizes (a
/// `round` call does not on the baseline target, and quantizing a prefill's activations was a
/// tenth of its products' time).
#[inline]
fn round_code(x: f32) -> i8 {
    const MAGIC: f32 = 12_582_912.0;
    ((x + MAGIC) - MAGIC).clamp(-127.0, 127.0) as i8
}
