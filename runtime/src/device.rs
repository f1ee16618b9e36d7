//! Where a pack runs: the host CPU or an AMD XDNA NPU. Discovery only looks at the filesystem
//! (`/dev/accel/accel*` whose sysfs driver is `amdxdna`): no vendor library is called on a
//! machine without a device node, because XRT throws through its C API when there is none.

use std::path::{Path, PathBuf};

/// The `--device` choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The NPU when one is usable, else the host (saying so).
    Auto,
    /// The host CPU.
    Host,
    /// The NPU or a refusal.
    Npu,
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(DeviceChoice::Auto),
            "host" | "cpu" => Ok(DeviceChoice::Host),
            "npu" => Ok(DeviceChoice::Npu),
            other => Err(format!("unknown device '{other}' (auto, host or npu)")),
        }
    }
}

/// One XDNA NPU device node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Npu {
    /// `/dev/accel/accelN`.
    pub node: PathBuf,
    /// The kernel driver bound to it.
    pub driver: String,
}

/// The XDNA NPUs under `dev` (`/dev`) as described by `sys` (`/sys`); `Err` says why none.
pub fn find_npus_in(dev: &Path, sys: &Path) -> Result<Vec<Npu>, String> {
    let accel = dev.join("accel");
    let entries = std::fs::read_dir(&accel).map_err(|e| {
        format!(
            "{} cannot be read ({e}): no accelerator driver is loaded (the amdxdna driver creates it)",
            accel.display()
        )
    })?;
    let mut found = Vec::new();
    let mut others = Vec::new();
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("accel"))
        .collect();
    names.sort();
    for name in names {
        let link = sys.join("class/accel").join(&name).join("device/driver");
        let driver = std::fs::read_link(&link)
            .ok()
            .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "unknown".into());
        if driver == "amdxdna" {
            found.push(Npu {
                node: accel.join(&name),
                driver,
            });
        } else {
            others.push(format!("{name} (driver {driver})"));
        }
    }
    if found.is_empty() {
        return Err(if others.is_empty() {
            format!("{} has no accel* device node", accel.display())
        } else {
            format!("no amdxdna device among {}", others.join(", "))
        });
    }
    Ok(found)
}

/// The XDNA NPUs of this machine.
pub fn find_npus() -> Result<Vec<Npu>, String> {
    find_npus_in(Path::new("/dev"), Path::new("/sys"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_reads_device_nodes_and_their_driver() {
        let d = tempfile::tempdir().expect("tmp");
        let (dev, sys) = (d.path().join("dev"), d.path().join("sys"));
        let e = find_npus_in(&dev, &sys).expect_err("no /dev/accel");
        assert!(e.contains("accel") && e.contains("amdxdna"), "{e}");
        std::fs::create_dir_all(dev.join("accel")).expect("mkdir");
        assert!(
            find_npus_in(&dev, &sys)
                .expect_err("empty")
                .contains("no accel*")
        );
        for (n, drv) in [("accel0", "habanalabs"), ("accel1", "amdxdna")] {
            std::fs::write(dev.join("accel").join(n), b"").expect("node");
            let dir = sys.join("class/accel").join(n).join("device");
            std::fs::create_dir_all(&dir).expect("sys");
            std::os::unix::fs::symlink(
                format!("../../../bus/pci/drivers/{drv}"),
                dir.join("driver"),
            )
            .expect("link");
        }
        let npus = find_npus_in(&dev, &sys).expect("one npu");
        assert_eq!(npus.len(), 1);
        assert_eq!(npus[0].node, dev.join("accel/accel1"));
        std::fs::remove_file(sys.join("class/accel/accel1/device/driver")).expect("rm");
        let e = find_npus_in(&dev, &sys).expect_err("only other drivers");
        assert!(e.contains("accel0 (driver habanalabs)"), "{e}");
        assert_eq!("npu".parse::<DeviceChoice>(), Ok(DeviceChoice::Npu));
        assert!("gpu".parse::<DeviceChoice>().is_err());
    }
}
