//! Which tile codes hold which GGUF block codes unchanged: the one fact both the converter (copy
//! natively, else requantize) and verification ("same source" needs native codes) decide by.

use crate::format::gguf::GgmlType;
use crate::format::tiles::Codes;

/// How a GGUF block type reaches a tile's codes without requantizing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum NativeCopy {
    /// Codes copied, scales rounded fp16 → bf16 (the reference converter's path).
    Native,
    /// Codes copied and the zero-point derived exactly (Q4_0 into an unsigned kind: m = −8·d).
    Exact,
}

/// The copy of `ty`'s codes into `codes`, if one exists.
pub fn native_copy(ty: GgmlType, codes: Codes) -> Option<NativeCopy> {
    match (ty, codes) {
        (GgmlType::Q4_1, Codes::Unsigned4)
        | (GgmlType::Q4_0, Codes::Signed4)
        | (GgmlType::Q8_0, Codes::Signed8) => Some(NativeCopy::Native),
        (GgmlType::Q4_0, Codes::Unsigned4) => Some(NativeCopy::Exact),
        _ => None,
    }
}
