//! Bytes on disk, no policy: the `model.q4nx` container ([`q4nx`]), its tile codecs ([`tiles`]) and
//! their inverse ([`encode`]: 32-column groups placed into tiles),
//! GGUF ([`gguf`]), xclbin headers ([`axlf`]), and which tile codes hold which GGUF codes
//! unchanged ([`native`]).

pub mod axlf;
pub mod encode;
pub mod gguf;
pub mod native;
pub mod q4nx;
pub mod tiles;
