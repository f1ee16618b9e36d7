//! Loading (`crate::pack`, `crate::model::load`): an unverified pack is refused unless allowed.

use crate::pack::{Manifest, Pack, Verification};
use crate::spec::{Act, QkNorm};

use super::*;

#[test]
fn unverified_packs_are_refused_unless_allowed() {
    let sp = spec(QkNorm::Off, Act::Silu, false);
    let dir = tempfile::tempdir().expect("tempdir");
    write_pack(dir.path(), &sp);
    let mpath = dir.path().join("manifest.json");
    let mut man: Manifest =
        serde_json::from_slice(&std::fs::read(&mpath).expect("read")).expect("json");
    man.verification = Verification {
        verified: false,
        summary: "1 of 30 tensors failed: lm_head.weight".into(),
        repaired: Vec::new(),
    };
    std::fs::write(&mpath, serde_json::to_vec(&man).expect("json")).expect("write");
    let e = Pack::open(dir.path(), false).expect_err("refused");
    let msg = e.to_string();
    assert!(
        msg.contains("not verified") && msg.contains("lm_head.weight"),
        "{msg}"
    );
    assert!(Pack::open(dir.path(), true).is_ok());
}
