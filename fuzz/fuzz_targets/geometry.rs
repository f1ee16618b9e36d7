//! The config reader never panics: arbitrary JSON yields a geometry or an error.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        if let Ok(g) = onebit_stages::layout::geometry::Geometry::from_config(&v) {
            for role in [
                onebit_stages::layout::geometry::Role::Q,
                onebit_stages::layout::geometry::Role::Down,
                onebit_stages::layout::geometry::Role::LmHead,
            ] {
                let _ = g.shape_of(role);
            }
        }
    }
});
