//! Links the `onebit-pipe` binary with packed relative relocations (`-z pack-relative-relocs`,
//! DT_RELR) where the C library that will load it understands them.
//!
//! The binary is position-independent (ASLR), so every pointer in its read-only data (vtables,
//! string tables) needs a load-time relocation; as classic RELA entries those were 10.6 MB of the
//! installed binary, as DT_RELR 70 kB (docs/benchmarks.md, "Per-crate optimization levels and
//! packed relocations"). glibc reads DT_RELR from 2.36 on; a binary linked this way does not start on an
//! older one, so the flag is only passed when the build machine's glibc is 2.36 or newer and the
//! binary is built for that same machine (no cross compilation). Elsewhere it links as before.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=ONEBIT_NO_RELR");
    if std::env::var_os("ONEBIT_NO_RELR").is_some() {
        return;
    }
    let (Ok(host), Ok(target)) = (std::env::var("HOST"), std::env::var("TARGET")) else {
        return;
    };
    if host != target || !target.ends_with("-linux-gnu") {
        return;
    }
    match host_glibc() {
        Some((major, minor)) if (major, minor) >= (2, 36) => {
            println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
        }
        found => println!(
            "cargo:warning=glibc {found:?} is older than 2.36: linking without packed relative relocations (a larger binary)"
        ),
    }
}

/// The version of the glibc this build script runs on (the target's, when host == target).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn host_glibc() -> Option<(u32, u32)> {
    unsafe extern "C" {
        fn gnu_get_libc_version() -> *const std::ffi::c_char;
    }
    // SAFETY: glibc returns a pointer to a static NUL-terminated string.
    let v = unsafe { std::ffi::CStr::from_ptr(gnu_get_libc_version()) };
    let mut parts = v.to_str().ok()?.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Not a glibc build machine: no packed relocations.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn host_glibc() -> Option<(u32, u32)> {
    None
}
