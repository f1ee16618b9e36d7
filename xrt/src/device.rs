//! Safe handles over the XRT shim: a device opened only after discovery found an XDNA node,
//! xclbin loading, buffer objects and kernel runs. Every XRT failure comes back as
//! [`Error::Npu`] with XRT's own message; no exception can reach Rust.

use std::ffi::{CStr, CString, c_char};
use std::path::Path;

use crate::sys;
use onebit_runtime::device::find_npus;
use onebit_runtime::error::{Error, Result};

const ERR_LEN: usize = 1024;

fn call(what: &str, f: impl FnOnce(*mut c_char, usize) -> i32) -> Result<()> {
    let mut err = vec![0 as c_char; ERR_LEN];
    let rc = f(err.as_mut_ptr(), ERR_LEN);
    if rc == 0 {
        return Ok(());
    }
    // SAFETY: the shim writes a NUL-terminated message within ERR_LEN (strncpy + terminator),
    // and the buffer is zeroed, so it is terminated even if nothing was written.
    let msg = unsafe { CStr::from_ptr(err.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    Err(Error::Npu(format!("{what}: {msg}")))
}

fn c_string(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::Npu(format!("{s:?} contains a NUL byte")))
}

/// The XRT API the build got: `xclbin-load` (XRT < 2.17) or `hw_context`.
pub fn api() -> &'static str {
    // SAFETY: returns a pointer to a static NUL-terminated string.
    unsafe { CStr::from_ptr(sys::obx_api()) }
        .to_str()
        .unwrap_or("unknown")
}

/// XRT's version as built against.
pub fn xrt_version() -> &'static str {
    // SAFETY: returns a pointer to a static NUL-terminated string.
    unsafe { CStr::from_ptr(sys::obx_xrt_version()) }
        .to_str()
        .unwrap_or("unknown")
}

/// An opened NPU.
pub struct Device {
    raw: *mut sys::obx_device,
}

// SAFETY: xrt::device is usable from any thread; the handle is owned and freed once.
unsafe impl Send for Device {}

impl Device {
    /// Opens the first XDNA NPU, or says why there is none without calling XRT.
    pub fn open() -> Result<Device> {
        let npus = find_npus().map_err(|why| Error::Npu(format!("no XDNA NPU found: {why}")))?;
        tracing::info!(node = %npus[0].node.display(), api = api(), "opening the NPU");
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; errors come back as a status.
        call("open the NPU", |e, n| unsafe {
            sys::obx_open(0, &mut raw, e, n)
        })?;
        Ok(Device { raw })
    }

    /// Loads the xclbin at `path` (and creates its hardware context where XRT has them).
    pub fn load_xclbin(&mut self, path: &Path) -> Result<()> {
        let p = c_string(&path.to_string_lossy())?;
        // SAFETY: `self.raw` is a live device; `p` outlives the call.
        call(&format!("load {}", path.display()), |e, n| unsafe {
            sys::obx_load_xclbin(self.raw, p.as_ptr(), e, n)
        })
    }

    /// A buffer of `bytes` in the memory group of `kernel`'s argument `arg`.
    pub fn buffer(&self, kernel: &str, arg: u32, bytes: usize) -> Result<Buffer> {
        let k = c_string(kernel)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: live device, valid out-pointer, `k` outlives the call.
        call(
            &format!("allocate {bytes} bytes for {kernel} arg {arg}"),
            |e, n| unsafe { sys::obx_bo_alloc(self.raw, k.as_ptr(), arg, bytes, &mut raw, e, n) },
        )?;
        Ok(Buffer { raw, bytes })
    }

    /// Runs `kernel` on `args` (in argument order), waiting up to `timeout_ms`.
    pub fn run(&self, kernel: &str, args: &[&Buffer], timeout_ms: u32) -> Result<()> {
        let k = c_string(kernel)?;
        let raws: Vec<*mut sys::obx_bo> = args.iter().map(|b| b.raw).collect();
        // SAFETY: live device and buffers; the pointer array outlives the call.
        call(&format!("run {kernel}"), |e, n| unsafe {
            sys::obx_run(
                self.raw,
                k.as_ptr(),
                raws.as_ptr(),
                raws.len(),
                timeout_ms,
                e,
                n,
            )
        })
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: owned handle, freed once.
        unsafe { sys::obx_close(self.raw) }
    }
}

/// A device buffer.
pub struct Buffer {
    raw: *mut sys::obx_bo,
    bytes: usize,
}

// SAFETY: an xrt::bo is an owned handle usable from any thread; it is freed once, and the
// engine that holds buffers serializes their use behind a mutex.
unsafe impl Send for Buffer {}

impl Buffer {
    /// Refuses a transfer of `len` bytes larger than the buffer.
    fn fits(&self, len: usize, dir: &str) -> Result<()> {
        if len > self.bytes {
            return Err(Error::Npu(format!(
                "{len} bytes {dir} a {}-byte buffer",
                self.bytes
            )));
        }
        Ok(())
    }

    /// Writes `data` at offset 0 and syncs it to the device.
    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        self.fits(data.len(), "into")?;
        // SAFETY: live buffer; `data` is valid for its length, which fits the buffer.
        call("write a buffer", |e, n| unsafe {
            sys::obx_bo_write(self.raw, data.as_ptr().cast(), data.len(), 0, e, n)
        })
    }

    /// Syncs from the device and reads `out.len()` bytes at offset 0.
    pub fn read(&mut self, out: &mut [u8]) -> Result<()> {
        self.fits(out.len(), "from")?;
        // SAFETY: live buffer; `out` is valid for its length, which fits the buffer.
        call("read a buffer", |e, n| unsafe {
            sys::obx_bo_read(self.raw, out.as_mut_ptr().cast(), out.len(), 0, e, n)
        })
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: owned handle, freed once.
        unsafe { sys::obx_bo_free(self.raw) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_says_which_xrt_api_it_got_and_opening_without_a_device_refuses() {
        assert!(["xclbin-load", "hw_context"].contains(&api()), "{}", api());
        assert!(xrt_version().starts_with("2."), "{}", xrt_version());
        if std::path::Path::new("/dev/accel").exists() {
            return; // a machine with accelerators: the refusal is not what this test checks
        }
        let e = Device::open().err().expect("no device here");
        assert!(
            e.to_string().starts_with("no XDNA NPU found: /dev/accel"),
            "{e}"
        );
    }
}
