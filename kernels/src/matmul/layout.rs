//! Tile layouts the host kernels read: the rows of [`onebit_pack::tiles`]' table whose scales sit in
//! a bf16 plane. The runtime keeps the NPU tiles byte for byte and computes on them directly:
//! every layout is a grid of `R×C` tiles holding per-(row, 32-column group) bf16 scales, optional
//! bf16 zero-points, and codes in lane bands of `P` rows where each column's `P` codes are
//! contiguous. That column-contiguous order is what SIMD wants for a matrix-vector product (one
//! column's codes times one broadcast activation), so no host re-layout is needed and the pack
//! carries one copy of the weights.

pub use onebit_pack::tiles::{Codes, TileLayout};
