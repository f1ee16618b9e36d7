//! The Hugging Face hub side of the fetch stage: the HTTP client ([`client`]), the
//! `huggingface_hub`-compatible cache ([`hf_cache`], [`fetch`]) and name validation ([`paths`]).

pub mod client;
pub mod fetch;
pub mod hf_cache;
pub mod paths;
