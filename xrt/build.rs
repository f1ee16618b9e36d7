//! With feature `xrt`: compiles the C++ shim over XRT (xrt/npu-shim/, every exception caught)
//! and generates its Rust bindings with bindgen. Paths come from `XRT_INCLUDE_DIR` and
//! `XRT_LIB_DIR` (Debian's libxrt-dev: /usr/include/xrt and the multiarch lib dir), because
//! Debian's `xrt.pc` is broken. The API the build got is detected from the headers: XRT ≥ 2.17
//! has `xrt/xrt_hw_context.h` (the XDNA flow: register_xclbin + hw_context); older XRT loads the
//! xclbin on the device. Without the feature this script does nothing.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=XRT_INCLUDE_DIR");
    println!("cargo:rerun-if-env-changed=XRT_LIB_DIR");
    println!("cargo:rustc-check-cfg=cfg(xrt_hw_context)");
    #[cfg(feature = "xrt")]
    shim::build();
}

#[cfg(feature = "xrt")]
mod shim {
    use std::path::PathBuf;

    pub fn build() {
        let include = PathBuf::from(
            std::env::var("XRT_INCLUDE_DIR").unwrap_or_else(|_| "/usr/include/xrt".into()),
        );
        let lib =
            std::env::var("XRT_LIB_DIR").unwrap_or_else(|_| "/usr/lib/x86_64-linux-gnu".into());
        if !include.join("xrt/xrt_device.h").is_file() {
            panic!(
                "feature `xrt` needs XRT's headers: {} has no xrt/xrt_device.h \
                 (install Debian's libxrt-dev, or set XRT_INCLUDE_DIR)",
                include.display()
            );
        }
        let hw_context = include.join("xrt/xrt_hw_context.h").is_file();
        println!("cargo:rerun-if-changed=npu-shim/onebit_xrt.h");
        println!("cargo:rerun-if-changed=npu-shim/onebit_xrt.cpp");
        let mut cc = cc::Build::new();
        cc.cpp(true)
            .std("c++17")
            .file("npu-shim/onebit_xrt.cpp")
            .include("npu-shim")
            .include(&include)
            .warnings(false);
        if hw_context {
            cc.define("ONEBIT_XRT_HW_CONTEXT", "1");
            println!("cargo:rustc-cfg=xrt_hw_context");
        }
        cc.compile("onebit_xrt");
        println!("cargo:rustc-link-search=native={lib}");
        println!("cargo:rustc-link-lib=dylib=xrt_coreutil");
        println!("cargo:rustc-link-lib=dylib=stdc++");
        // xrt_uuid.h calls libuuid inline (uuid-dev).
        println!("cargo:rustc-link-lib=dylib=uuid");
        println!(
            "cargo:warning=xrt: XRT at {} with the {} API",
            include.display(),
            if hw_context {
                "hw_context"
            } else {
                "xclbin-load (no hw_context: XRT < 2.17)"
            }
        );
        let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default());
        bindgen::Builder::default()
            .header("npu-shim/onebit_xrt.h")
            .allowlist_function("obx_.*")
            .allowlist_type("obx_.*")
            .allowlist_var("OBX_.*")
            .generate()
            .unwrap_or_else(|e| panic!("bindgen over npu-shim/onebit_xrt.h: {e}"))
            .write_to_file(out.join("xrt_bindings.rs"))
            .unwrap_or_else(|e| panic!("write the bindings: {e}"));
    }
}
