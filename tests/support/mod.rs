//! Helpers the binary's integration tests share: where the real model is, and starting
//! `onebit-pipe serve` on a free port.

#![allow(dead_code)] // each test crate uses part of this module

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The Gemma 3 270M GGUF: `$ONEBIT_GEMMA_GGUF`, else where scripts/fetch-gemma.sh puts it.
pub fn gemma_gguf() -> PathBuf {
    std::env::var_os("ONEBIT_GEMMA_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/onebit-models/gemma-3-270m-q4_k_m.gguf")
        })
}

/// Spawns `cmd` (an `onebit-pipe serve --port 0 …`) and returns it with the address it printed
/// (`listening on http://ADDR`); its stderr keeps being drained so the server never blocks.
pub fn spawn_server(mut cmd: Command) -> (Child, SocketAddr) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("serve exited before listening")
            .expect("stderr line");
        if let Some(rest) = line.strip_prefix("listening on http://") {
            let a = rest.split_whitespace().next().expect("address");
            break a.parse::<SocketAddr>().expect("socket address");
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (child, addr)
}
