//! Every tile decoder, both paths, never panics on any bytes of the right length, and the two
//! paths agree element for element.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onebit_stages::format::tiles::{ALL_KINDS, TileCodec};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    let kind = ALL_KINDS[sel as usize % ALL_KINDS.len()];
    let mut tile = vec![0u8; kind.bytes()];
    for (t, b) in tile.iter_mut().zip(rest.iter().cycle()) {
        *t = *b;
    }
    let (r, c) = (kind.rows(), kind.cols());
    let mut rows = vec![0f32; r * c];
    let mut cols = vec![0f32; r * c];
    kind.decode(&tile, &mut rows);
    kind.decode_cols(&tile, &mut cols);
    for i in 0..r {
        for j in 0..c {
            let (a, b) = (rows[i * c + j], cols[j * r + i]);
            assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()), "{kind} ({i},{j})");
        }
    }
});
