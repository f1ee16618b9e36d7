//! The `Stage` abstraction: a named, versioned transformation from named input artifacts to named
//! output artifacts, whose output is fully determined by (name, version, params, input content).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::StageError;
use crate::progress::{Event, Reporter};

/// Where an input artifact comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InputSource {
    /// An output of another stage of the same graph.
    Artifact {
        /// The producing stage.
        stage: String,
        /// Its output name.
        output: String,
    },
    /// A file or directory outside the store (a graph root). The engine hashes its content, and
    /// memoizes the hash by (path, size, mtime) so an unchanged file is not read again.
    External(PathBuf),
}

/// One named input of a stage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Input {
    /// The name the stage body asks for.
    pub name: String,
    /// Where it comes from.
    pub source: InputSource,
}

impl Input {
    /// An input read from `stage`'s output `output`.
    pub fn artifact(name: &str, stage: &str, output: &str) -> Self {
        Input {
            name: name.to_string(),
            source: InputSource::Artifact {
                stage: stage.to_string(),
                output: output.to_string(),
            },
        }
    }

    /// An input read from a path outside the store.
    pub fn external(name: &str, path: impl Into<PathBuf>) -> Self {
        Input {
            name: name.to_string(),
            source: InputSource::External(path.into()),
        }
    }
}

/// A stage of a graph.
///
/// A stage's identity in keys, run records and `status`: its name and the version of its code.
/// A stage whose name is fixed states both once, as a constant (`StageId::new("detect", 4)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageId<'a> {
    /// The name, unique within a graph.
    pub name: &'a str,
    /// Bumped whenever what the stage writes for the same inputs can change.
    pub version: u32,
}

impl<'a> StageId<'a> {
    /// A name and a version.
    pub const fn new(name: &'a str, version: u32) -> StageId<'a> {
        StageId { name, version }
    }
}

/// The output must be a pure function of the key's fields: [`Stage::id`] (name and version),
/// [`Stage::params`] and the content of the inputs. Whoever changes what a stage writes bumps its
/// version in the same commit; that re-runs it and its descendants, never its ancestors.
pub trait Stage: Send + Sync {
    /// The stage's name, unique within a graph, and the version of the code behind it.
    fn id(&self) -> StageId<'_>;
    /// The stage name ([`Stage::id`]'s).
    fn name(&self) -> &str {
        self.id().name
    }
    /// The code version ([`Stage::id`]'s).
    fn version(&self) -> u32 {
        self.id().version
    }
    /// Canonical params (JSON). Anything that changes the output and is not an input goes here.
    fn params(&self) -> Value {
        Value::Null
    }
    /// The named inputs.
    fn inputs(&self) -> Vec<Input>;
    /// The names of the outputs the stage writes (a file or a directory each).
    fn outputs(&self) -> Vec<String>;
    /// Runs the body: read [`StageContext::input`], write every [`StageContext::output`].
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError>;
}

/// What a stage body sees: paths of its inputs, where to write its outputs, and a progress sink.
pub struct StageContext<'a> {
    pub(crate) stage: String,
    pub(crate) inputs: BTreeMap<String, PathBuf>,
    pub(crate) out_dir: PathBuf,
    pub(crate) reporter: &'a dyn Reporter,
}

impl StageContext<'_> {
    /// The path of input `name` (a file or directory, read-only by contract).
    pub fn input(&self, name: &str) -> Result<&Path, StageError> {
        self.inputs.get(name).map(PathBuf::as_path).ok_or_else(|| {
            format!(
                "stage {} asked for input {name}, which it does not declare",
                self.stage
            )
            .into()
        })
    }

    /// Where to write output `name`. The stage creates it as a file or a directory.
    pub fn output(&self, name: &str) -> PathBuf {
        self.out_dir.join(name)
    }

    /// Reports progress of a long stage: `done` of `total` units (bytes when `bytes` is true).
    pub fn progress(&self, done: u64, total: u64) {
        self.reporter.event(&Event::StageProgress {
            stage: self.stage.clone(),
            done,
            total,
        });
    }
}
