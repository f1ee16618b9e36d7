//! Loading (`crate::pack`, `crate::model::load`): an unverified pack is refused unless allowed.

use crate::model::Model;
use crate::pack::Pack;
use onebit_pack::manifest::{Manifest, Verification};
use onebit_pack::spec::{Act, QkNorm};

use crate::testing::*;

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

#[test]
fn streamed_weights_are_copied_once_and_the_embedding_stays_mapped() {
    let sp = spec(QkNorm::Off, Act::Silu, false);
    let dir = tempfile::tempdir().expect("tempdir");
    // A tiled head with the scan head: the embedding is read by rows only (lookups, re-scored
    // candidates), so it is not streamed.
    write_pack_with(dir.path(), &sp, true, true);
    let open = || Pack::open(dir.path(), false).expect("open");
    let copied = Model::load(open()).expect("load");
    let mapped = Model::load_mapped(open()).expect("load");
    let file = std::fs::read(dir.path().join("model.q4nx")).expect("read");
    let huge = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|s| s.contains("[always]") || s.contains("[madvise]"))
        && std::env::var(crate::pack::HUGE_PAGES_VAR).map_or(true, |v| v != "0");
    for r in copied.streamed() {
        assert_eq!(copied.pack.slice(r.clone()), &file[r.clone()]);
        assert_eq!(copied.pack.is_copied(&r), huge, "a streamed weight");
        assert!(!mapped.pack.is_copied(&r), "nothing copied when mapped");
    }
    assert!(copied.pack.head_scan().is_some());
    let embed = copied
        .pack
        .stored("model.embed_tokens.weight")
        .expect("embedding");
    assert!(
        !copied.pack.is_copied(&embed.range),
        "the embedding stays mapped"
    );
    assert_eq!(
        copied.pack.slice(embed.range.clone()),
        &file[embed.range.clone()]
    );
    let toks = [1, 4, 8, 15];
    let a = copied
        .forward(&mut copied.session(8), &toks, true)
        .expect("forward");
    let b = mapped
        .forward(&mut mapped.session(8), &toks, true)
        .expect("forward");
    assert_eq!(bits(&a), bits(&b), "the same logits either way");
}
