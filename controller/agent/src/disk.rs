//! Free-disk check before any byte is downloaded. The free-space source is a trait so tests (and
//! operators who want a hard cap below the filesystem size) can inject their own.

use std::path::Path;

use crate::error::{AgentError, Result};

/// Where the agent learns how many bytes it may still write under a path.
pub trait FreeSpace: Send + Sync {
    /// Bytes available to unprivileged writers on the filesystem holding `path`.
    fn available(&self, path: &Path) -> Result<u64>;
}

/// The real filesystem, via `statvfs` (`fs4::available_space`).
#[derive(Debug, Default, Clone, Copy)]
pub struct FilesystemFreeSpace;

impl FreeSpace for FilesystemFreeSpace {
    fn available(&self, path: &Path) -> Result<u64> {
        fs4::available_space(path).map_err(AgentError::io("statvfs", path))
    }
}

/// A fixed number of free bytes, whatever the filesystem says (tests; operator-imposed quota).
#[derive(Debug, Clone, Copy)]
pub struct FixedFreeSpace(pub u64);

impl FreeSpace for FixedFreeSpace {
    fn available(&self, _path: &Path) -> Result<u64> {
        Ok(self.0)
    }
}

/// Refuses (with [`AgentError::InsufficientDisk`]) unless `needed + reserve` bytes are free under `root`.
pub fn ensure_free(free: &dyn FreeSpace, root: &Path, needed: u64, reserve: u64) -> Result<()> {
    let available = free.available(root)?;
    if needed.saturating_add(reserve) > available {
        return Err(AgentError::InsufficientDisk { path: root.to_path_buf(), needed, reserve, available });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_when_reserve_would_be_eaten() {
        let err = ensure_free(&FixedFreeSpace(100), Path::new("/x"), 60, 50).unwrap_err();
        assert_eq!(err.reason(), "InsufficientDisk");
        let msg = err.to_string();
        assert!(msg.contains("need 60 bytes") && msg.contains("100 bytes available"), "{msg}");
        ensure_free(&FixedFreeSpace(110), Path::new("/x"), 60, 50).unwrap();
    }

    #[test]
    fn real_filesystem_reports_something() {
        let dir = tempfile::tempdir().unwrap();
        assert!(FilesystemFreeSpace.available(dir.path()).unwrap() > 0);
    }
}
