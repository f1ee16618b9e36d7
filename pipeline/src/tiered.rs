//! The store the engine and the commands use: the local content-addressed store
//! ([`LocalStore`]), with a shared store on object storage ([`SharedStore`]) behind it when one
//! is configured. The local store is then the shared one's read-through cache: entries are pulled
//! into it before use and pushed from it after publication, and refs live in both.
//!
//! Neither part knows the other; this type composes them. Everything the local store offers is
//! reached through it (`Deref`), so code that only needs local entries takes a [`Store`] or a
//! [`LocalStore`] alike.

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::Result;
use crate::shared::SharedStore;
use crate::store::LocalStore;

/// The local store, and the shared store behind it if there is one.
#[derive(Clone, Debug)]
pub struct Store {
    local: LocalStore,
    shared: Option<Arc<SharedStore>>,
}

impl Store {
    /// `$ONEBIT_HOME`, else `$XDG_CACHE_HOME/onebit-pipe`, else `~/.cache/onebit-pipe`.
    pub fn default_home() -> PathBuf {
        LocalStore::default_home()
    }

    /// Opens (creating as needed) the local store under `home`, with no shared store.
    pub fn open(home: &Path) -> Result<Store> {
        Ok(Store {
            local: LocalStore::open(home)?,
            shared: None,
        })
    }

    /// Opens the shared store at `url` (`s3://bucket/prefix`) with the local store under `home`
    /// as its cache. Access is checked first: wrong credentials fail before anything is written.
    pub fn open_shared(home: &Path, url: &str) -> Result<Store> {
        let shared = SharedStore::open(url)?;
        Ok(Store {
            local: LocalStore::open(home)?,
            shared: Some(Arc::new(shared)),
        })
    }

    /// Opens the store `url` names: a shared one for `s3://…`, else the local one under `home`.
    pub fn open_url(home: &Path, url: Option<&str>) -> Result<Store> {
        match url.filter(|u| !u.is_empty()) {
            Some(u) => Store::open_shared(home, u),
            None => Store::open(home),
        }
    }

    /// The shared store behind the local one, if any.
    pub fn shared(&self) -> Option<&Arc<SharedStore>> {
        self.shared.as_ref()
    }

    /// The local store.
    pub fn local(&self) -> &LocalStore {
        &self.local
    }
}

impl Deref for Store {
    type Target = LocalStore;

    fn deref(&self) -> &LocalStore {
        &self.local
    }
}
