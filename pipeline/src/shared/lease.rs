//! Leases: the locks of the shared store. A lease is an object `leases/<name>.json` naming its
//! holder and an expiry; it is created only if absent, renewed by its holder (If-Match on the
//! e-tag it last wrote) every third of its time-to-live, deleted when released, and taken over by
//! anyone once it has expired (If-Match on the expired one's e-tag, so only one taker wins). A
//! holder that dies stops renewing, so its lease expires and the work it held moves on.
//!
//! Expiry compares the holder's clock with the reader's: machines sharing a store are assumed to
//! keep time within a few seconds of each other (NTP), well inside the time-to-live.

use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use object_store::path::Path;
use object_store::{PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};

use super::{PutCreate, SharedStore};
use crate::error::{Error, Result};
use crate::store::now_ms;

/// What a lease object says.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LeaseBody {
    /// `host:pid` of the holder.
    pub holder: String,
    /// What it is doing ("stage dequant", "import FastFlowLM/…", "gc").
    pub purpose: String,
    /// When it was taken.
    pub acquired_unix_ms: u64,
    /// When it lapses unless renewed.
    pub expires_unix_ms: u64,
}

impl LeaseBody {
    /// Whether it has lapsed by this machine's clock.
    pub fn expired(&self) -> bool {
        now_ms() >= self.expires_unix_ms
    }
}

/// A held lease, renewed on a thread of its own until dropped; dropping releases it.
pub struct Lease {
    shared: Arc<SharedStore>,
    loc: Path,
    stop: Option<mpsc::Sender<()>>,
    renewer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("loc", &self.loc).finish()
    }
}

/// What [`acquire`] ended with.
#[derive(Debug)]
pub enum Acquired {
    /// The lease is ours.
    Held(Lease),
    /// `done()` said yes while another holder had it: the work is done elsewhere.
    Done,
}

fn body(shared: &SharedStore, purpose: &str) -> Vec<u8> {
    let now = now_ms();
    let b = LeaseBody {
        holder: shared.holder.clone(),
        purpose: purpose.to_string(),
        acquired_unix_ms: now,
        expires_unix_ms: now + shared.lease_ttl.as_millis() as u64,
    };
    serde_json::to_vec(&b).unwrap_or_default()
}

/// The object of lease `name`.
pub fn lease_path(shared: &SharedStore, name: &str) -> Path {
    shared.path(&format!("leases/{name}.json"))
}

/// Reads lease `name`: its body and e-tag, if present.
pub fn read(shared: &SharedStore, name: &str) -> Result<Option<(LeaseBody, Option<String>)>> {
    let loc = lease_path(shared, name);
    let Some((bytes, etag)) = shared.get(&loc)? else {
        return Ok(None);
    };
    match serde_json::from_slice::<LeaseBody>(&bytes) {
        Ok(b) => Ok(Some((b, etag))),
        // An unreadable lease protects nothing: treat it as expired long ago.
        Err(_) => Ok(Some((
            LeaseBody {
                holder: "?".into(),
                purpose: "unreadable lease".into(),
                acquired_unix_ms: 0,
                expires_unix_ms: 0,
            },
            etag,
        ))),
    }
}

/// PUT with If-Match `etag`: whether it was still the current version.
fn put_if_match(
    shared: &SharedStore,
    loc: &Path,
    etag: &str,
    bytes: Vec<u8>,
) -> Result<Option<String>> {
    let opts = PutOptions {
        mode: PutMode::Update(UpdateVersion {
            e_tag: Some(etag.to_string()),
            version: None,
        }),
        ..Default::default()
    };
    match shared.block(shared.os.put_opts(loc, PutPayload::from(bytes), opts)) {
        Ok(r) => Ok(Some(r.e_tag.unwrap_or_default())),
        Err(object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. }) => {
            Ok(None)
        }
        Err(e) => Err(shared.err("put (if match)", loc, e)),
    }
}

/// Tries once to take lease `name`: `Ok(Ok(lease))` if taken, `Ok(Err(body))` with the live
/// holder's body if someone else has it.
pub fn try_acquire(
    shared: &Arc<SharedStore>,
    name: &str,
    purpose: &str,
) -> Result<std::result::Result<Lease, LeaseBody>> {
    let loc = lease_path(shared, name);
    loop {
        match shared.put_create(&loc, body(shared, purpose)) {
            // Read back: a server whose create-if-absent is not atomic (a check, then a write) can
            // let two creators both succeed; the later write is the one in force.
            Ok(etag) => match read(shared, name)? {
                Some((b, now)) if b.holder == shared.holder => {
                    return Ok(Ok(Lease::start(shared.clone(), loc, now.or(etag), purpose)));
                }
                Some((b, _)) => return Ok(Err(b)),
                None => continue,
            },
            Err(PutCreate::Failed(e)) => return Err(e),
            Err(PutCreate::Exists) => {}
        }
        let Some((held, etag)) = read(shared, name)? else {
            continue; // released in between: try to create it again
        };
        if !held.expired() {
            return Ok(Err(held));
        }
        let Some(etag) = etag else {
            return Err(Error::Shared {
                url: shared.url.clone(),
                op: "take over lease",
                location: loc.to_string(),
                reason: "the server gives no e-tag, so a lapsed lease cannot be taken safely"
                    .into(),
            });
        };
        if let Some(new) = put_if_match(shared, &loc, &etag, body(shared, purpose))? {
            tracing::warn!(lease = %loc, holder = %held.holder, purpose = %held.purpose, "lease lapsed (its holder stopped renewing); taken over");
            return Ok(Ok(Lease::start(shared.clone(), loc, Some(new), purpose)));
        }
        // Someone else renewed or took it first: look again.
    }
}

/// Takes lease `name`, waiting while another holder has it. While waiting, `done()` is asked
/// every poll whether the work finished elsewhere (then [`Acquired::Done`]); `on_wait` is called
/// once with the holder's body when waiting starts.
pub fn acquire(
    shared: &Arc<SharedStore>,
    name: &str,
    purpose: &str,
    on_wait: impl FnOnce(&LeaseBody),
    mut done: impl FnMut() -> Result<bool>,
) -> Result<Acquired> {
    let mut on_wait = Some(on_wait);
    let poll = (shared.lease_ttl / 8).clamp(Duration::from_millis(100), Duration::from_secs(2));
    loop {
        match try_acquire(shared, name, purpose)? {
            Ok(lease) => return Ok(Acquired::Held(lease)),
            Err(held) => {
                if let Some(f) = on_wait.take() {
                    f(&held);
                }
            }
        }
        if done()? {
            return Ok(Acquired::Done);
        }
        std::thread::sleep(poll);
    }
}

impl Lease {
    fn start(shared: Arc<SharedStore>, loc: Path, etag: Option<String>, purpose: &str) -> Lease {
        let (tx, rx) = mpsc::channel::<()>();
        let every = shared.lease_ttl / 3;
        let s = shared.clone();
        let l = loc.clone();
        let purpose = purpose.to_string();
        let renewer = std::thread::Builder::new()
            .name("onebit-lease".into())
            .spawn(move || {
                let mut etag = etag;
                // A stop message or a dropped sender (the lease released) ends the renewals.
                while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(every) {
                    let Some(tag) = etag.clone() else {
                        tracing::warn!(lease = %l, "no e-tag to renew the lease with");
                        break;
                    };
                    match put_if_match(&s, &l, &tag, body(&s, &purpose)) {
                        Ok(Some(new)) => {
                            tracing::debug!(lease = %l, "lease renewed");
                            etag = Some(new);
                        }
                        Ok(None) => {
                            tracing::warn!(lease = %l, "the lease was taken over (renewal came too late); the shared store's create-if-absent publication keeps entries whole");
                            break;
                        }
                        Err(e) => tracing::warn!(lease = %l, error = %e, "lease renewal failed; retrying"),
                    }
                }
            })
            .ok();
        Lease {
            shared,
            loc,
            stop: Some(tx),
            renewer,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.renewer.take() {
            let _ = t.join();
        }
        if let Err(e) = self.shared.delete(&self.loc) {
            tracing::warn!(lease = %self.loc, error = %e, "lease not released; it lapses by itself");
        }
    }
}
