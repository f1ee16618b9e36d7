//! The q4nx header parser never panics: any bytes yield a header or an error.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = onebit_stages::format::q4nx::Header::parse(std::path::Path::new("fuzz.q4nx"), data);
});
