//! The GGUF header parser never panics: any bytes yield a header or an error.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = onebit_stages::format::gguf::GgufHeader::parse(std::path::Path::new("fuzz.gguf"), data);
});
