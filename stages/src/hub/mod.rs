//! The Hugging Face hub side: for now, resolving files in a local `huggingface_hub` cache
//! (`$HF_HOME/hub/models--ORG--NAME/{refs,snapshots}`), the layout the fetch stage will write.

pub mod hf_cache;
