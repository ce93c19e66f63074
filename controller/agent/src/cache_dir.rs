//! On-disk layout of one cache on a node, and the atomic switch between versions.
//!
//! ```text
//! <root>/<key>/current            -> versions/<fingerprint>   (symlink, replaced by rename(2))
//! <root>/<key>/versions/<fp>/...  complete, verified files + .warmpath-ready.json
//! <root>/<key>/staging/<fp>/...   in-progress download: *.part, *.part.progress.json, verified files
//! ```
//! Pods mount `<root>/<key>` and read `current/`. A version directory only appears under `versions/` by
//! renaming a fully verified staging directory, and `current` only ever points at such a directory, so
//! a partial file is never visible at a path a model server reads, and a failed update leaves the
//! previous version serving.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{AgentError, Result};

/// Name of the marker written into a version directory once every file is verified.
pub const READY_MARKER: &str = ".warmpath-ready.json";
/// Name of the symlink pods read through.
pub const CURRENT: &str = "current";

/// Contents of [`READY_MARKER`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadyMarker {
    /// Version fingerprint (directory name under `versions/`).
    pub version: String,
    /// Total bytes of the version's files.
    pub bytes: u64,
    /// File paths relative to the version directory.
    pub files: Vec<String>,
}

/// Paths of one cache under the agent's root.
#[derive(Debug, Clone)]
pub struct CacheDir {
    base: PathBuf,
}

impl CacheDir {
    /// `<root>/<key>`; `key` must be a single safe path component (`<namespace>.<name>`).
    pub fn new(root: &Path, key: &str) -> Result<CacheDir> {
        if key.is_empty() || key.contains('/') || key == "." || key == ".." {
            return Err(AgentError::InvalidSource(format!("cache key {key:?} is not a single path component")));
        }
        Ok(CacheDir { base: root.join(key) })
    }
    /// `<root>/<key>`.
    pub fn base(&self) -> &Path {
        &self.base
    }
    /// `<root>/<key>/current`.
    pub fn current_link(&self) -> PathBuf {
        self.base.join(CURRENT)
    }
    /// Final directory of a version.
    pub fn version_dir(&self, version: &str) -> PathBuf {
        self.base.join("versions").join(version)
    }
    /// Staging directory of a version being downloaded.
    pub fn staging_dir(&self, version: &str) -> PathBuf {
        self.base.join("staging").join(version)
    }

    /// Takes the cache's exclusive advisory lock (`flock` on `<key>/.warmpath.lock`, via `fs4`), waiting
    /// for another holder: the node agent and a pod's cold-node fallback fetch may work on the same
    /// cache at once, and the second then finds the first's result (or resumes its progress). Released
    /// when the returned file is dropped.
    pub async fn lock(&self) -> Result<std::fs::File> {
        std::fs::create_dir_all(&self.base).map_err(AgentError::io("create", &self.base))?;
        let path = self.base.join(".warmpath.lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(AgentError::io("open", &path))?;
        tokio::task::spawn_blocking(move || fs4::fs_std::FileExt::lock_exclusive(&file).map(|_| file))
            .await
            .expect("lock task not cancelled")
            .map_err(AgentError::io("lock", path))
    }

    /// The version `current` points at, if it has a ready marker.
    pub fn current(&self) -> Option<ReadyMarker> {
        let target = std::fs::read_link(self.current_link()).ok()?;
        let marker = self.base.join(target).join(READY_MARKER);
        serde_json::from_slice(&std::fs::read(marker).ok()?).ok()
    }

    /// Moves a verified staging directory to `versions/<version>`, writes its marker, points `current` at
    /// it (symlink created beside, then renamed over `current`: atomic), then removes other versions and
    /// stale staging directories.
    pub fn commit(&self, marker: &ReadyMarker) -> Result<()> {
        let staging = self.staging_dir(&marker.version);
        let marker_path = staging.join(READY_MARKER);
        std::fs::write(&marker_path, serde_json::to_vec_pretty(marker).expect("marker serializes"))
            .map_err(AgentError::io("write", &marker_path))?;
        let final_dir = self.version_dir(&marker.version);
        if final_dir.exists() {
            std::fs::remove_dir_all(&final_dir).map_err(AgentError::io("remove", &final_dir))?;
        }
        let versions = self.base.join("versions");
        std::fs::create_dir_all(&versions).map_err(AgentError::io("create", &versions))?;
        std::fs::rename(&staging, &final_dir).map_err(AgentError::io("rename", &staging))?;
        let tmp_link = self.base.join(format!(".{CURRENT}.{}", marker.version));
        let _ = std::fs::remove_file(&tmp_link);
        std::os::unix::fs::symlink(Path::new("versions").join(&marker.version), &tmp_link)
            .map_err(AgentError::io("symlink", &tmp_link))?;
        std::fs::rename(&tmp_link, self.current_link()).map_err(AgentError::io("rename", &tmp_link))?;
        self.prune(&marker.version);
        Ok(())
    }

    /// Best-effort removal of every version and staging directory except `keep`.
    fn prune(&self, keep: &str) {
        for sub in ["versions", "staging"] {
            if let Ok(entries) = std::fs::read_dir(self.base.join(sub)) {
                for e in entries.flatten() {
                    if e.file_name() != keep {
                        let _ = std::fs::remove_dir_all(e.path());
                    }
                }
            }
        }
    }

    /// Removes the whole cache from the node (finalizer cleanup). Missing is fine.
    pub fn remove(&self) -> Result<()> {
        match std::fs::remove_dir_all(&self.base) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(AgentError::Io { op: "remove", path: self.base.clone(), source: e }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_switches_current_and_prunes_old_version() {
        let root = tempfile::tempdir().unwrap();
        let c = CacheDir::new(root.path(), "ns.m").unwrap();
        for (v, body) in [("v1", "one"), ("v2", "two")] {
            std::fs::create_dir_all(c.staging_dir(v)).unwrap();
            std::fs::write(c.staging_dir(v).join("w.bin"), body).unwrap();
            c.commit(&ReadyMarker { version: v.into(), bytes: 3, files: vec!["w.bin".into()] }).unwrap();
            assert_eq!(c.current().unwrap().version, v);
            assert_eq!(std::fs::read_to_string(c.current_link().join("w.bin")).unwrap(), body);
        }
        assert!(!c.version_dir("v1").exists(), "old version pruned after the switch");
        c.remove().unwrap();
        assert!(!c.base().exists());
        c.remove().unwrap();
    }

    #[test]
    fn rejects_keys_that_are_paths() {
        assert!(CacheDir::new(Path::new("/r"), "../x").is_err());
        assert!(CacheDir::new(Path::new("/r"), "a/b").is_err());
    }
}
