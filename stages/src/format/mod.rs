//! Bytes on disk, no policy: the `model.q4nx` container ([`q4nx`]), its tile codecs ([`tiles`]),
//! GGUF ([`gguf`]), xclbin headers ([`axlf`]), and which tile codes hold which GGUF codes
//! unchanged ([`native`]).

pub mod axlf;
pub mod gguf;
pub mod native;
pub mod q4nx;
pub mod tiles;
