//! # onebit-runtime
//!
//! Will own the verified-pack format, the host forward pass, the NPU backend and the server. It
//! never depends on the other crates: everything the forward pass needs travels inside the pack.
//! Not built yet: `onebit-pipe serve` refuses with a message until it is.
