//! The fetch stage: records a fetched snapshot — every file's path, size, sha256 and blake3, with
//! the repository, revision and commit — as `manifest.json` and the `files` table. The download
//! itself ([`crate::hub::fetch::ensure_snapshot`]) runs before the graph, so the stage's input, the
//! snapshot folder, is content-addressed like any other.

use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::builder::{BooleanBuilder, StringBuilder, UInt64Builder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use onebit_pipeline::{Input, Stage, StageContext, StageError, StageId};
use serde::{Deserialize, Serialize};

use super::write_parquet;
use crate::error::{Error, Result};
use crate::hub::client::RemoteFile;
use crate::hub::fetch::{FetchedFile, Resolved, record_files};

/// Where a fetched repository came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchInfo {
    /// `ORG/NAME`.
    pub repo: String,
    /// The revision asked for.
    pub revision: String,
    /// The commit it resolved to.
    pub commit: String,
    /// The listing.
    #[serde(skip)]
    pub files: Vec<(String, Option<u64>, Option<String>)>,
}

/// The manifest the stage writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchManifest {
    /// `ORG/NAME`.
    pub repo: String,
    /// The revision asked for.
    pub revision: String,
    /// The commit.
    pub commit: String,
    /// Every file.
    pub files: Vec<FetchedFile>,
}

/// The stage.
pub struct FetchStage {
    /// The source.
    pub info: FetchInfo,
    /// The snapshot folder.
    pub snapshot: PathBuf,
}

impl FetchStage {
    /// The stage's name and version; the version is bumped whenever the manifest or table written
    /// for the same snapshot can change.
    pub const ID: StageId<'static> = StageId::new("fetch", 1);
}

impl Stage for FetchStage {
    fn params(&self) -> serde_json::Value {
        serde_json::json!({ "repo": self.info.repo, "revision": self.info.revision, "commit": self.info.commit })
    }
    fn inputs(&self) -> Vec<Input> {
        vec![Input::external("snapshot", &self.snapshot)]
    }
    fn outputs(&self) -> Vec<String> {
        vec!["manifest.json".into(), "files.parquet".into()]
    }
    fn run(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let resolved = Resolved {
            repo: self.info.repo.clone(),
            revision: self.info.revision.clone(),
            commit: self.info.commit.clone(),
            snapshot: ctx.input("snapshot")?.to_path_buf(),
            files: self
                .info
                .files
                .iter()
                .map(|(path, size, sha256)| RemoteFile {
                    path: path.clone(),
                    size: *size,
                    sha256: sha256.clone(),
                    blob_id: None,
                })
                .collect(),
            offline: false,
        };
        let files = record_files(&resolved)?;
        let manifest = FetchManifest {
            repo: self.info.repo.clone(),
            revision: self.info.revision.clone(),
            commit: self.info.commit.clone(),
            files,
        };
        fs_err::write(
            ctx.output("manifest.json"),
            serde_json::to_vec_pretty(&manifest)?,
        )?;
        write_parquet(
            &ctx.output("files.parquet"),
            "files",
            &files_table(&manifest)?,
        )?;
        Ok(())
    }
    fn id(&self) -> StageId<'_> {
        Self::ID
    }
}

/// The `files` table: one row per repository file.
pub fn files_table(m: &FetchManifest) -> Result<RecordBatch> {
    let (mut repo, mut rev, mut commit, mut path, mut sha, mut b3) = (
        StringBuilder::new(),
        StringBuilder::new(),
        StringBuilder::new(),
        StringBuilder::new(),
        StringBuilder::new(),
        StringBuilder::new(),
    );
    let mut size = UInt64Builder::new();
    let mut lfs = BooleanBuilder::new();
    for f in &m.files {
        repo.append_value(&m.repo);
        rev.append_value(&m.revision);
        commit.append_value(&m.commit);
        path.append_value(&f.path);
        size.append_value(f.size);
        sha.append_value(&f.sha256);
        b3.append_value(&f.blake3);
        lfs.append_value(f.lfs);
    }
    let fields = vec![
        Field::new("repo", DataType::Utf8, false),
        Field::new("revision", DataType::Utf8, false),
        Field::new("commit", DataType::Utf8, false),
        Field::new("path", DataType::Utf8, false),
        Field::new("size", DataType::UInt64, false),
        Field::new("sha256", DataType::Utf8, false),
        Field::new("blake3", DataType::Utf8, false),
        Field::new("lfs", DataType::Boolean, false),
    ];
    let cols: Vec<ArrayRef> = vec![
        Arc::new(repo.finish()),
        Arc::new(rev.finish()),
        Arc::new(commit.finish()),
        Arc::new(path.finish()),
        Arc::new(size.finish()),
        Arc::new(sha.finish()),
        Arc::new(b3.finish()),
        Arc::new(lfs.finish()),
    ];
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).map_err(|e| Error::Table {
        table: "files",
        reason: e.to_string(),
    })
}
