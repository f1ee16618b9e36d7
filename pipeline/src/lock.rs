//! Advisory file locks (std's `File::lock`). A second process that wants a held lock says what it
//! waits for, then blocks; the OS releases the lock when a holder dies, even by SIGKILL.

use std::fs::TryLockError;

use fs_err::{File, OpenOptions};
use std::path::Path;

use crate::error::{Result, io_at};

/// A held lock; released on drop.
#[derive(Debug)]
pub struct FileLock {
    file: File,
}

/// Shared (many readers, e.g. runs) or exclusive (one writer, e.g. a stage body or `gc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    /// Many holders at once.
    Shared,
    /// One holder.
    Exclusive,
}

impl FileLock {
    /// Takes the lock on `path` (created if missing). If it is held, calls `on_wait` once, then
    /// blocks until it is free.
    pub fn acquire(path: &Path, mode: LockMode, on_wait: impl FnOnce()) -> Result<FileLock> {
        let (file, tried) = try_lock(path, mode)?;
        match tried {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                on_wait();
                match mode {
                    LockMode::Shared => file.lock_shared(),
                    LockMode::Exclusive => file.lock(),
                }?;
            }
            Err(TryLockError::Error(e)) => return Err(io_at(e, "lock file", path).into()),
        }
        Ok(FileLock { file })
    }

    /// Takes the lock only if it is free now.
    pub fn try_acquire(path: &Path, mode: LockMode) -> Result<Option<FileLock>> {
        let (file, tried) = try_lock(path, mode)?;
        match tried {
            Ok(()) => Ok(Some(FileLock { file })),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(e)) => Err(io_at(e, "lock file", path).into()),
        }
    }
}

/// Opens the lock file (created if missing) and tries the lock once.
fn try_lock(path: &Path, mode: LockMode) -> Result<(File, Result<(), TryLockError>)> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)?;
    let tried = match mode {
        LockMode::Shared => file.try_lock_shared(),
        LockMode::Exclusive => file.try_lock(),
    };
    Ok((file, tried))
}

impl Drop for FileLock {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}
