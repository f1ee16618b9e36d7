//! The MM-block layout of the towers' projections (q4nx-format §6): a bf16 matrix `W[N][K]`
//! (out × in features) zero-padded so N and K are multiples of `M = max(MM_N, MM_K)`, cut into
//! `MM_N × MM_K` blocks stored row-major, block by block, the blocks themselves row-major. The
//! declared shape is `[N'/MM_N, K'/MM_K, MM_N·MM_K]`; element (n, k) is at block
//! `(n / MM_N, k / MM_K)`, index `(n % MM_N)·MM_K + k % MM_K` inside it.
//!
//! FastFlowLM's converter writes it for every linear weight of a vision or audio tower, with
//! `(MM_K, MM_N)` = 256×64 (Gemma 3/4, Qwen2-VL, Qwen3.5 0.8B/9B) or 512×64 (Qwen3-VL, Qwen3.5
//! 2B/4B), from its per-family configuration (`vision_MM_K`, `vision_MM_N`).

use serde::{Deserialize, Serialize};

/// The block geometry `(MM_K, MM_N)`: block width (input features) and height (outputs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmBlock {
    /// Block width in input features (K).
    pub mm_k: u64,
    /// Block height in output features (N).
    pub mm_n: u64,
}

impl MmBlock {
    /// The geometries FastFlowLM's converter configurations use, as `(MM_K, MM_N)`.
    pub const KNOWN: [MmBlock; 2] = [
        MmBlock {
            mm_k: 256,
            mm_n: 64,
        },
        MmBlock {
            mm_k: 512,
            mm_n: 64,
        },
    ];

    /// `MM_K×MM_N`, as the docs and the converter's configurations write it.
    pub fn name(self) -> String {
        format!("{}x{}", self.mm_k, self.mm_n)
    }

    /// The padding unit of both dimensions: `max(MM_N, MM_K)`.
    pub fn unit(self) -> u64 {
        self.mm_k.max(self.mm_n)
    }

    /// `x` rounded up to the padding unit.
    pub fn padded(self, x: u64) -> u64 {
        x.div_ceil(self.unit()) * self.unit()
    }

    /// Elements of one block.
    pub fn block_len(self) -> u64 {
        self.mm_k * self.mm_n
    }

    /// The declared shape of a logical `N × K` matrix.
    pub fn declared_shape(self, n: u64, k: u64) -> [u64; 3] {
        [
            self.padded(n) / self.mm_n,
            self.padded(k) / self.mm_k,
            self.block_len(),
        ]
    }

    /// Whether a declared shape is this geometry's for some matrix: three dimensions, the last
    /// one block, and both padded extents multiples of the padding unit.
    pub fn fits(self, shape: &[u64]) -> bool {
        let [a, b, c] = shape else { return false };
        *c == self.block_len()
            && *a > 0
            && *b > 0
            && (a * self.mm_n).is_multiple_of(self.unit())
            && (b * self.mm_k).is_multiple_of(self.unit())
    }

    /// Index of element `(n, k)` in a tensor whose declared shape has `blocks_k` column blocks.
    pub fn index(self, blocks_k: u64, n: u64, k: u64) -> u64 {
        ((n / self.mm_n) * blocks_k + k / self.mm_k) * self.block_len()
            + (n % self.mm_n) * self.mm_k
            + k % self.mm_k
    }

    /// Row `n` over the padded width `K' = blocks_k·MM_K`, from the tensor's bf16 bytes: each
    /// block contributes `MM_K` contiguous values.
    pub fn read_row(self, data: &[u8], blocks_k: u64, n: u64, out: &mut Vec<f32>) {
        out.clear();
        for kb in 0..blocks_k {
            let at = self.index(blocks_k, n, kb * self.mm_k) as usize * 2;
            let Some(bytes) = data.get(at..at + self.mm_k as usize * 2) else {
                return;
            };
            out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
            );
        }
    }

    /// The blocked bytes of a row-major `n × k` bf16 matrix (`bits` are its raw bf16 values),
    /// zero-padded: what FastFlowLM's converter writes.
    pub fn encode(self, n: u64, k: u64, bits: &[u16]) -> Vec<u8> {
        let [bn, bk, len] = self.declared_shape(n, k);
        let mut out = vec![0u8; (bn * bk * len * 2) as usize];
        for r in 0..n {
            let row = &bits[(r * k) as usize..((r + 1) * k) as usize];
            for (c, v) in row.iter().enumerate() {
                let at = self.index(bk, r, c as u64) as usize * 2;
                out[at..at + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_of_an_element_follows_the_documented_formula() {
        let g = MmBlock {
            mm_k: 256,
            mm_n: 64,
        };
        // q4nx-format §6: block (n/MM_N, k/MM_K), index (n%MM_N)·MM_K + k%MM_K.
        let blocks_k = 5;
        assert_eq!(g.index(blocks_k, 0, 0), 0);
        assert_eq!(g.index(blocks_k, 1, 0), 256);
        assert_eq!(g.index(blocks_k, 0, 256), 16384);
        assert_eq!(g.index(blocks_k, 64, 0), 5 * 16384);
        assert_eq!(g.index(blocks_k, 65, 257), 6 * 16384 + 256 + 1);
    }

    #[test]
    fn shapes_pad_both_dimensions_to_the_larger_block_side() {
        let g = MmBlock {
            mm_k: 256,
            mm_n: 64,
        };
        // Gemma 3 4B's SigLIP: 1152 → 1280, 4304 → 4352.
        assert_eq!(g.declared_shape(1152, 1152), [20, 5, 16384]);
        assert_eq!(g.declared_shape(4304, 1152), [68, 5, 16384]);
        assert_eq!(g.declared_shape(1152, 4304), [20, 17, 16384]);
        assert!(g.fits(&[20, 5, 16384]));
        assert!(!g.fits(&[20, 5, 32768]));
        // 3 row blocks of 64 = 192 rows: not a multiple of 256, so not a padded extent.
        assert!(!g.fits(&[3, 5, 16384]));
        let wide = MmBlock {
            mm_k: 512,
            mm_n: 64,
        };
        assert_eq!(wide.declared_shape(1024, 1024), [16, 2, 32768]);
    }

    #[test]
    fn an_encoded_matrix_reads_back_row_by_row_with_zero_padding() {
        let g = MmBlock {
            mm_k: 256,
            mm_n: 64,
        };
        let (n, k) = (70u64, 300u64);
        let vals: Vec<f32> = (0..n * k)
            .map(|i| ((i % 97) as f32 - 48.0) / 16.0)
            .collect();
        let bits: Vec<u16> = vals
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_bits())
            .collect();
        let bytes = g.encode(n, k, &bits);
        let [bn, bk, len] = g.declared_shape(n, k);
        assert_eq!(bytes.len() as u64, bn * bk * len * 2);
        let mut row = Vec::new();
        for r in [0, 1, 63, 64, 69] {
            g.read_row(&bytes, bk, r, &mut row);
            assert_eq!(row.len() as u64, bk * 256);
            assert_eq!(
                &row[..k as usize],
                &vals[(r * k) as usize..((r + 1) * k) as usize]
            );
            assert!(row[k as usize..].iter().all(|&v| v == 0.0));
        }
        // A padding row is zero across the padded width.
        g.read_row(&bytes, bk, 200, &mut row);
        assert!(row.iter().all(|&v| v == 0.0));
    }
}
