//! One cached key or value vector as attention's kernels read it, in the cache's own element
//! type: f32, IEEE half, bfloat16, or 8-bit codes with one f16 scale per 32 values (llama.cpp's
//! `q8_0`). The kernels load 8 or 16 lanes at a time straight from the cache and widen them in
//! registers; nothing is converted into a copy first.
//!
//! For f32 rows the loads are the plain loads the kernels always made, so an f32 cache gives the
//! same bits as before the cache had types.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Values per scale in a [`Q8Row`] (llama.cpp's `QK8_0`).
pub const Q8_GROUP: usize = 32;

/// A vector of the KV cache, read element by element or 8/16 lanes at a time.
pub trait Row: Copy + Send + Sync {
    /// Its length in values.
    fn len(&self) -> usize;

    /// Whether it holds no value.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Value `i` as f32.
    fn get(&self, i: usize) -> f32;

    /// Values `c..c + 8` as f32 lanes.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `c + 8 ≤ len()` and `c` is a multiple of 8.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(&self, c: usize) -> __m256;

    /// Values `c..c + 16` as f32 lanes.
    ///
    /// # Safety
    /// The CPU has AVX-512 F; `c + 16 ≤ len()` and `c` is a multiple of 16.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(&self, c: usize) -> __m512;
}

impl Row for &[f32] {
    fn len(&self) -> usize {
        <[f32]>::len(self)
    }

    fn get(&self, i: usize) -> f32 {
        self[i]
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(&self, c: usize) -> __m256 {
        // SAFETY: c + 8 ≤ len (the caller's contract).
        unsafe { _mm256_loadu_ps(self.as_ptr().add(c)) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(&self, c: usize) -> __m512 {
        // SAFETY: c + 16 ≤ len (the caller's contract).
        unsafe { _mm512_loadu_ps(self.as_ptr().add(c)) }
    }
}

/// IEEE half-precision values (bit patterns).
#[derive(Clone, Copy, Debug)]
pub struct F16Row<'a>(pub &'a [u16]);

impl Row for F16Row<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn get(&self, i: usize) -> f32 {
        half::f16::from_bits(self.0[i]).to_f32()
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(&self, c: usize) -> __m256 {
        // SAFETY: c + 8 ≤ len: 16 bytes from element c.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(self.0.as_ptr().add(c).cast())) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(&self, c: usize) -> __m512 {
        // SAFETY: c + 16 ≤ len: 32 bytes from element c.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(self.0.as_ptr().add(c).cast())) }
    }
}

/// bfloat16 values (bit patterns): an f32's upper half.
#[derive(Clone, Copy, Debug)]
pub struct Bf16Row<'a>(pub &'a [u16]);

impl Row for Bf16Row<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn get(&self, i: usize) -> f32 {
        f32::from_bits((self.0[i] as u32) << 16)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(&self, c: usize) -> __m256 {
        // SAFETY: c + 8 ≤ len: 16 bytes from element c.
        unsafe {
            let h = _mm_loadu_si128(self.0.as_ptr().add(c).cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(&self, c: usize) -> __m512 {
        // SAFETY: c + 16 ≤ len: 32 bytes from element c.
        unsafe {
            let h = _mm256_loadu_si256(self.0.as_ptr().add(c).cast());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }
}

/// 8-bit codes with one f16 scale per [`Q8_GROUP`] values: value `i` is
/// `codes[i] · scales[i / 32]`.
#[derive(Clone, Copy, Debug)]
pub struct Q8Row<'a> {
    /// One code per value.
    pub codes: &'a [i8],
    /// One f16 scale (bit pattern) per 32 codes.
    pub scales: &'a [u16],
}

impl Q8Row<'_> {
    fn scale(&self, i: usize) -> f32 {
        half::f16::from_bits(self.scales[i / Q8_GROUP]).to_f32()
    }
}

impl Row for Q8Row<'_> {
    fn len(&self) -> usize {
        self.codes.len()
    }

    fn get(&self, i: usize) -> f32 {
        self.codes[i] as f32 * self.scale(i)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(&self, c: usize) -> __m256 {
        // Lanes c..c+8 share one scale: c is a multiple of 8, groups are of 32.
        let d = _mm256_set1_ps(self.scale(c));
        // SAFETY: c + 8 ≤ len: 8 bytes from code c.
        unsafe {
            let q = _mm_loadl_epi64(self.codes.as_ptr().add(c).cast());
            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d)
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(&self, c: usize) -> __m512 {
        // Lanes c..c+16 share one scale: c is a multiple of 16, groups are of 32.
        let d = _mm512_set1_ps(self.scale(c));
        // SAFETY: c + 16 ≤ len: 16 bytes from code c.
        unsafe {
            let q = _mm_loadu_si128(self.codes.as_ptr().add(c).cast());
            _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d)
        }
    }
}

/// Quantizes `x` (a multiple of 32 long) into `codes` and `scales` as llama.cpp's
/// `quantize_row_q8_0_ref` does: per 32 values `d = max|x| / 127`, `code = round(x / d)`, the
/// scale stored as f16.
pub fn quantize_q8(x: &[f32], codes: &mut [i8], scales: &mut [u16]) {
    for ((g, q), s) in x
        .chunks_exact(Q8_GROUP)
        .zip(codes.chunks_exact_mut(Q8_GROUP))
        .zip(scales.iter_mut())
    {
        let amax = g.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (c, &v) in q.iter_mut().zip(g) {
            *c = (v * id).round() as i8;
        }
        *s = half::f16::from_f32(d).to_bits();
    }
}
