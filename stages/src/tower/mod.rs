//! The towers a repository ships beside `model.q4nx` (q4nx-format §1, §7): the vision and audio
//! encoders of the multimodal families, each in a file of the same container, bf16, its
//! projections in MM blocks ([`crate::layout::mm_block`]). Read ([`detect`]), tabulated like the
//! language file (the dequant tables, with the file they came from) and verified against
//! llama.cpp's mmproj GGUF of the same model ([`verify`]), by the names of [`names`].

pub mod detect;
pub mod names;
pub mod spec;
pub mod verify;

use serde::{Deserialize, Serialize};

/// What a tower encodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TowerKind {
    /// Images.
    Vision,
    /// Sound.
    Audio,
    /// Images and sound in one file (Gemma4-12B).
    ImageAudio,
}

impl TowerKind {
    /// Lowercase name, as the tables and the manifest write it.
    pub fn as_str(self) -> &'static str {
        match self {
            TowerKind::Vision => "vision",
            TowerKind::Audio => "audio",
            TowerKind::ImageAudio => "image_audio",
        }
    }
}

/// The tower files FastFlowLM's repositories ship, by name (q4nx-format §7).
pub const TOWER_FILES: [(&str, TowerKind); 4] = [
    ("vision_weight.q4nx", TowerKind::Vision),
    // Qwen2.5-VL only (note the plural).
    ("vision_weights.q4nx", TowerKind::Vision),
    ("audio_weight.q4nx", TowerKind::Audio),
    ("image_audio_weights.q4nx", TowerKind::ImageAudio),
];

/// The kind of tower file `name`, when it is one.
pub fn tower_kind(name: &str) -> Option<TowerKind> {
    TOWER_FILES
        .iter()
        .find(|(f, _)| *f == name)
        .map(|(_, k)| *k)
}

/// The name of a tower stage: the language file's stage name and the tower file
/// (`detect:vision_weight.q4nx`), so `runs` and the refs tell the files apart.
pub fn stage_name(stage: &str, file: &str) -> String {
    format!("{stage}:{file}")
}

/// Why no tower of this kind is served, whatever it holds; `None` for a vision tower, which is
/// served when it verifies and the repository says how to run it ([`spec::vision_spec`]).
pub fn not_served(kind: TowerKind) -> Option<&'static str> {
    match kind {
        TowerKind::Vision => None,
        TowerKind::Audio => Some("nothing serves audio yet"),
        TowerKind::ImageAudio => Some("nothing serves images or audio of this file yet"),
    }
}
