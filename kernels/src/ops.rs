//! The element-wise and small reductions of the forward pass, written plainly: they are a small
//! fraction of a token's time next to the matrix products. The dot product and `axpy` that
//! attention runs over every cached key and value use AVX2 + FMA where the CPU has it.

/// `out = x / rms(x) · w` over each row of width `w.len()`, in f32 (as the reference
/// implementations compute it). Norm weights already include any `1 +` offset.
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    for (row, o) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / n as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((o, &v), &wi) in o.iter_mut().zip(row).zip(w) {
            *o = v * inv * wi;
        }
    }
}

/// In-place [`rmsnorm`].
pub fn rmsnorm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    for row in x.chunks_exact_mut(n) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / n as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for (v, &wi) in row.iter_mut().zip(w) {
            *v = *v * inv * wi;
        }
    }
}

/// Rotate-half RoPE on one head vector: pairs `(i, i + rot/2)` for `i < inv_freq.len()`,
/// rotated by `pos·θ_i`, cos/sin scaled by `factor`. Dims past `2·inv_freq.len()` are left
/// alone (partial rotary).
pub fn rope(head: &mut [f32], pos: usize, inv_freq: &[f32], factor: f32) {
    rope_angles(pos, inv_freq, factor).rotate(head);
}

/// The cosines and sines (times the attention factor) RoPE rotates by at one position: computed
/// once per row and table, shared by every head and every layer of that table.
#[derive(Clone, Debug)]
pub struct RopeAngles {
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// The angles [`rope`] rotates by at `pos`.
pub fn rope_angles(pos: usize, inv_freq: &[f32], factor: f32) -> RopeAngles {
    let (cos, sin) = inv_freq
        .iter()
        .map(|&f| {
            let angle = (pos as f32 * f) as f64;
            let (s, c) = angle.sin_cos();
            (c as f32 * factor, s as f32 * factor)
        })
        .unzip();
    RopeAngles { cos, sin }
}

impl RopeAngles {
    /// Rotates one head (rotate-half convention on its first `2·len` dims).
    #[inline]
    pub fn rotate(&self, head: &mut [f32]) {
        let half = self.cos.len();
        let (lo, hi) = head.split_at_mut(half);
        for (((a, b), &c), &s) in lo
            .iter_mut()
            .zip(&mut hi[..half])
            .zip(&self.cos)
            .zip(&self.sin)
        {
            let (x, y) = (*a, *b);
            *a = x * c - y * s;
            *b = y * c + x * s;
        }
    }
}

/// σ(x) = 1 / (1 + e⁻ˣ).
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// x·σ(x).
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU with the tanh approximation (`gelu_pytorch_tanh`).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // √(2/π)
    0.5 * x * (1.0 + (C * (x + 0.044_715 * x * x * x)).tanh())
}

/// eˣ in plain float arithmetic that vectorizes (a libm `expf` call does not): `x = n·ln 2 + r`
/// with `n` rounded to nearest, Cephes' degree-6 polynomial for `eʳ` on |r| ≤ ln 2 / 2, and 2ⁿ
/// built in the exponent bits. Relative error under 2·10⁻⁷ over the clamped range [−87.3, 88];
/// below it the result is about 10⁻³⁸ (not 0), above it e⁸⁸.
#[inline(always)]
pub fn exp_fast(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5·2²³: adding it rounds to an integer
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.3, 88.0);
    let shifted = x * std::f32::consts::LOG2_E + MAGIC;
    let n = shifted - MAGIC;
    // `n` as an integer straight from the bits (|n| ≤ 127 sits in the low mantissa bits of
    // `shifted`): `n as i32` is a saturating conversion that compiles to one scalar step per
    // lane, which made the whole FFN gate scalar.
    let ni = (shifted.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    e * f32::from_bits(((ni + 127) as u32) << 23)
}

/// The FFN's gate over whole rows: `g[i] = act(g[i])·u[i]` with SiLU or tanh-approximated GELU,
/// through [`exp_fast`] (GELU's `0.5·x·(1 + tanh y)` is `x·σ(2y)`), on AVX2+FMA where the CPU has
/// it. A prefill spent a tenth of its time in libm's `tanhf` and `expf` before.
pub fn gate_rows(act: onebit_pack::spec::Act, g: &mut [f32], u: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: `simd()` checked AVX2 and FMA.
        return unsafe { avx2::gate_rows(act, g, u) };
    }
    gate_rows_portable(act, g, u)
}

#[inline(always)]
fn gate_rows_portable(act: onebit_pack::spec::Act, g: &mut [f32], u: &[f32]) {
    use onebit_pack::spec::Act;
    const C: f32 = 0.797_884_6; // √(2/π)
    match act {
        Act::Silu => {
            for (a, &b) in g.iter_mut().zip(u) {
                *a = *a / (1.0 + exp_fast(-*a)) * b;
            }
        }
        Act::GeluTanh => {
            for (a, &b) in g.iter_mut().zip(u) {
                let x = *a;
                let y = C * (x + 0.044_715 * x * x * x);
                *a = x / (1.0 + exp_fast(-2.0 * y)) * b;
            }
        }
    }
}

/// Tanh-approximated GELU in place (`gelu_pytorch_tanh`, as `x·σ(2y)` through [`exp_fast`]): an
/// image encoder's MLP, AVX2 + FMA where the CPU has it.
pub fn gelu_rows(g: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: `simd()` checked AVX2 and FMA.
        return unsafe { avx2::gelu_rows(g) };
    }
    gelu_rows_portable(g)
}

#[inline(always)]
fn gelu_rows_portable(g: &mut [f32]) {
    const C: f32 = 0.797_884_6; // √(2/π)
    for a in g.iter_mut() {
        let x = *a;
        let y = C * (x + 0.044_715 * x * x * x);
        *a = x / (1.0 + exp_fast(-2.0 * y));
    }
}

/// Softmax in place (max-subtracted): attention's weights over every key in its window.
///
/// eˣ by [`exp_fast`] and the max and the sum kept in eight partial values, combined in one fixed
/// order, so the loop vectorizes (AVX2 + FMA where the CPU has it) and gives the same bits on
/// every path. A 4,000-token prefill spent 8 % of its time in libm's scalar `expf` here, beside a
/// serial sum, before.
pub fn softmax(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: `simd()` checked AVX2 and FMA.
        return unsafe { avx2::softmax(x) };
    }
    softmax_portable(x)
}

/// Partial sums (and maxima) [`softmax`] keeps.
const SOFTMAX_LANES: usize = 8;

#[inline(always)]
fn softmax_portable(x: &mut [f32]) {
    let inv = 1.0 / exp_shifted_portable(x);
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `x[i] = e^(x[i] − max x)` in place, returning their sum: softmax without its last pass, for a
/// caller that divides a product of the weights instead of the weights (an image encoder's
/// attention scales its 72 outputs a row, not its 4,096 weights).
pub fn exp_shifted(x: &mut [f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: `simd()` checked AVX2 and FMA.
        return unsafe { avx2::exp_shifted(x) };
    }
    exp_shifted_portable(x)
}

#[inline(always)]
fn exp_shifted_portable(x: &mut [f32]) -> f32 {
    const L: usize = SOFTMAX_LANES;
    let whole = x.len() / L * L;
    let mut m = [f32::NEG_INFINITY; L];
    for c in x[..whole].chunks_exact(L) {
        for (mi, &v) in m.iter_mut().zip(c) {
            *mi = mi.max(v);
        }
    }
    let max = x[whole..].iter().fold(
        m.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)),
        |a, &b| a.max(b),
    );
    let mut s = [0f32; L];
    for c in x[..whole].chunks_exact_mut(L) {
        for (si, v) in s.iter_mut().zip(c.iter_mut()) {
            *v = exp_fast(*v - max);
            *si += *v;
        }
    }
    let mut sum = s.iter().fold(0f32, |a, &b| a + b);
    for v in x[whole..].iter_mut() {
        *v = exp_fast(*v - max);
        sum += *v;
    }
    sum
}

/// Dot product (AVX2 + FMA where the CPU has it: attention reads every cached key through it).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: `simd()` checked AVX2 and FMA.
        return unsafe { avx2::dot(a, b) };
    }
    dot_portable(a, b)
}

/// `out += w·v` (the attention's weighted sum of cached values).
#[inline]
pub fn axpy(out: &mut [f32], w: f32, v: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: `simd()` checked AVX2 and FMA.
        return unsafe { avx2::axpy(out, w, v) };
    }
    for (a, &b) in out.iter_mut().zip(v) {
        *a += w * b;
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) fn simd() -> bool {
    // F16C: the KV cache's 16-bit rows widen in registers (every AVX2 CPU has it).
    std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("fma")
        && std::is_x86_feature_detected!("f16c")
}

pub(crate) fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    // Eight partial sums: lets the compiler vectorize while the order stays fixed.
    let mut acc = [0f32; 8];
    let chunks = a.len().min(b.len()) / 8;
    for i in 0..chunks {
        for j in 0..8 {
            acc[j] += a[i * 8 + j] * b[i * 8 + j];
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for i in chunks * 8..a.len().min(b.len()) {
        s += a[i] * b[i];
    }
    s
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    /// Two 8-lane FMA accumulators over 16 values at a time, then the tail.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        // SAFETY: every load reads 8 floats below `n` of both slices.
        unsafe {
            while i + 16 <= n {
                s0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), s0);
                s1 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(pa.add(i + 8)),
                    _mm256_loadu_ps(pb.add(i + 8)),
                    s1,
                );
                i += 16;
            }
            if i + 8 <= n {
                s0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), s0);
                i += 8;
            }
        }
        let mut s = hsum(_mm256_add_ps(s0, s1));
        for j in i..n {
            s += a[j] * b[j];
        }
        s
    }

    /// [`super::softmax`] compiled for AVX2 + FMA (the same arithmetic, 8 lanes at a time).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn softmax(x: &mut [f32]) {
        super::softmax_portable(x)
    }

    /// [`super::exp_shifted`] compiled for AVX2 + FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp_shifted(x: &mut [f32]) -> f32 {
        super::exp_shifted_portable(x)
    }

    /// [`super::gelu_rows`] compiled for AVX2 + FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn gelu_rows(g: &mut [f32]) {
        super::gelu_rows_portable(g)
    }

    /// [`super::gate_rows`] compiled for AVX2 + FMA (the same formulas, 8 lanes at a time).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn gate_rows(act: onebit_pack::spec::Act, g: &mut [f32], u: &[f32]) {
        super::gate_rows_portable(act, g, u)
    }

    /// The sum of 8 lanes, in the one fixed order every dot product here ends with.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn hsum(v: __m256) -> f32 {
        let s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)))
    }

    /// `out += w·v`, 8 lanes at a time.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn axpy(out: &mut [f32], w: f32, v: &[f32]) {
        let n = out.len().min(v.len());
        let (po, pv) = (out.as_mut_ptr(), v.as_ptr());
        let wv = _mm256_set1_ps(w);
        let mut i = 0;
        // SAFETY: every access touches 8 floats below `n` of both slices.
        unsafe {
            while i + 8 <= n {
                let o = _mm256_fmadd_ps(wv, _mm256_loadu_ps(pv.add(i)), _mm256_loadu_ps(po.add(i)));
                _mm256_storeu_ps(po.add(i), o);
                i += 8;
            }
        }
        for j in i..n {
            out[j] += w * v[j];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_and_axpy_match_the_definitions_at_every_length() {
        for n in [0, 1, 7, 8, 15, 16, 17, 33, 256] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let want: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
            assert!((dot(&a, &b) as f64 - want).abs() < 1e-4, "dot n={n}");
            assert!(
                (dot_portable(&a, &b) as f64 - want).abs() < 1e-4,
                "portable n={n}"
            );
            let mut out = b.clone();
            axpy(&mut out, 0.5, &a);
            for i in 0..n {
                assert!(
                    (out[i] - (b[i] + 0.5 * a[i])).abs() < 1e-6,
                    "axpy n={n} [{i}]"
                );
            }
        }
    }

    #[test]
    fn rmsnorm_matches_the_definition() {
        let x = [1.0f32, -2.0, 3.0, 0.5];
        let w = [1.0f32, 0.5, 2.0, 1.0];
        let mut out = [0f32; 4];
        rmsnorm(&x, &w, 1e-6, &mut out);
        let rms = ((1.0 + 4.0 + 9.0 + 0.25) / 4.0f64 + 1e-6).sqrt();
        for i in 0..4 {
            let want = x[i] as f64 / rms * w[i] as f64;
            assert!((out[i] as f64 - want).abs() < 1e-6, "{i}");
        }
    }

    #[test]
    fn rope_rotates_pairs_and_keeps_norms() {
        let mut h = [1.0f32, 0.0, 0.0, 1.0, 7.0];
        let inv = [1.0f32, 0.5];
        rope(&mut h, 2, &inv, 1.0);
        // pair (0, 2) rotated by 2 rad; pair (1, 3) by 1 rad; dim 4 untouched.
        assert!((h[0] - 2f32.cos()).abs() < 1e-6 && (h[2] - 2f32.sin()).abs() < 1e-6);
        assert!((h[1] + 1f32.sin()).abs() < 1e-6 && (h[3] - 1f32.cos()).abs() < 1e-6);
        assert_eq!(h[4], 7.0);
    }

    #[test]
    fn activations_match_their_formulas() {
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        // gelu_pytorch_tanh(1.0) = 0.8411920
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-6);
        assert_eq!(gelu_tanh(0.0), 0.0);
    }

    #[test]
    fn the_fast_exp_and_gates_meet_libm() {
        let mut worst = 0f64;
        for i in -8730..=8800 {
            let x = i as f32 * 0.01;
            let (got, want) = (exp_fast(x) as f64, (x as f64).exp());
            worst = worst.max((got - want).abs() / want);
        }
        assert!(worst < 3e-7, "exp_fast relative error {worst}");
        assert!(exp_fast(-1000.0) >= 0.0);
        assert!(exp_fast(1000.0).is_finite());
        use onebit_pack::spec::Act;
        let xs: Vec<f32> = (-400..400).map(|i| i as f32 * 0.05).collect();
        for act in [Act::Silu, Act::GeluTanh] {
            let mut g = xs.clone();
            gate_rows(act, &mut g, &vec![1.5; xs.len()]);
            for (&x, &got) in xs.iter().zip(&g) {
                let want = match act {
                    Act::Silu => silu(x),
                    Act::GeluTanh => gelu_tanh(x),
                } * 1.5;
                assert!(
                    (got - want).abs() <= 2e-6 * want.abs().max(1.0),
                    "{act:?}({x}) = {got}, libm {want}"
                );
            }
        }
        let mut g = xs.clone();
        gelu_rows(&mut g);
        for (&x, &got) in xs.iter().zip(&g) {
            let want = gelu_tanh(x);
            assert!(
                (got - want).abs() <= 2e-6 * want.abs().max(1.0),
                "gelu_rows({x}) = {got}, libm {want}"
            );
        }
    }

    /// `exp_shifted` on every path this CPU runs against libm's `exp` of the shifted values,
    /// with a length that leaves a tail past the vectors.
    #[test]
    fn exp_shifted_matches_libm_and_sums() {
        let x: Vec<f32> = (0..1000)
            .map(|i| ((i * 37) % 2001) as f32 * 0.05 - 60.0)
            .collect();
        let max = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let want: Vec<f64> = x.iter().map(|&v| f64::from(v - max).exp()).collect();
        let mut runs = vec![{
            let mut y = x.clone();
            let s = exp_shifted_portable(&mut y);
            (y, s)
        }];
        let mut y = x.clone();
        let s = exp_shifted(&mut y);
        runs.push((y, s));
        for (y, s) in runs {
            for (got, w) in y.iter().zip(&want) {
                // Below e^-87.3 the scalar path clamps (about 1e-38, not 0).
                assert!(
                    (f64::from(*got) - w).abs() <= 3e-7 * w + 2e-38,
                    "{got} vs {w}"
                );
            }
            let total: f64 = want.iter().sum();
            assert!(
                (f64::from(s) - total).abs() <= 1e-5 * total,
                "{s} vs {total}"
            );
        }
    }

    #[test]
    fn softmax_sums_to_one_and_orders() {
        let mut x = [1.0f32, 2.0, 3.0, 1000.0];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[3] > 0.999);
        let mut y = [0.0f32, (2.0f32).ln()];
        softmax(&mut y);
        assert!((y[1] - 2.0 / 3.0).abs() < 1e-6);
    }

    #[test]
    fn softmax_matches_an_f64_reference_and_every_path_gives_the_same_bits() {
        // Lengths around the lane count and long windows; spreads that underflow some terms.
        for (n, spread) in [
            (1, 1.0),
            (7, 3.0),
            (8, 3.0),
            (9, 10.0),
            (129, 30.0),
            (4001, 80.0),
        ] {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i as f32 * 0.618_034).fract() - 0.5) * spread)
                .collect();
            let m = x.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
            let e: Vec<f64> = x.iter().map(|&v| (v as f64 - m).exp()).collect();
            let total: f64 = e.iter().sum();
            let mut got = x.clone();
            softmax(&mut got);
            for (i, (&g, &w)) in got.iter().zip(&e).enumerate() {
                let want = w / total;
                assert!(
                    (g as f64 - want).abs() <= 1e-6 * want + 1e-30,
                    "n {n}, [{i}]: {g} against {want}"
                );
            }
            let mut portable = x.clone();
            softmax_portable(&mut portable);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                portable.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "n {n}: the AVX2 and portable paths differ"
            );
        }
    }

    #[test]
    fn dot_handles_tails() {
        let a: Vec<f32> = (0..19).map(|i| i as f32).collect();
        let want: f32 = a.iter().map(|v| v * v).sum();
        assert_eq!(dot(&a, &a), want);
    }
}
