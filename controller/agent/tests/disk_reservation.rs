//! Two downloads at once on a small real filesystem (an 8 MiB tmpfs mounted for the test; needs root,
//! skipped with a message otherwise): space is allocated before any byte is fetched, so exactly one of
//! two 5 MiB caches fits and the other is refused with `InsufficientDisk` — whether both run in one agent
//! (shared space lock) or in two processes' worth of options (the agent and a pod's fallback fetch).
//! The refused download leaves no staging behind and can succeed once space is free.

mod common;

use std::{collections::BTreeMap, path::Path, sync::Arc};

use common::{payload, sha256_hex, RangeServer};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use warmpath_agent::{
    sync::{remove_cache, sync_cache},
    CacheRequest, SourceSpec, SyncOptions,
};

const MIB: usize = 1024 * 1024;

/// An 8 MiB tmpfs on a fresh directory, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount() -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
            .arg(dir.path())
            .status()
            .ok()?;
        st.success().then_some(Tmpfs { dir })
    }
    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(self.dir.path()).status();
    }
}

fn opts(root: &Path) -> SyncOptions {
    let mut o = SyncOptions::new(root);
    o.fetch.chunk_size = 256 * 1024;
    o.fetch.concurrency = 2;
    o.fetch.permits = Arc::new(Semaphore::new(4));
    o.reserve_bytes = 0;
    o
}

fn staging_dirs(root: &Path, key: &str) -> usize {
    std::fs::read_dir(root.join(key).join("staging")).map(|d| d.count()).unwrap_or(0)
}

#[tokio::test]
async fn two_downloads_at_once_do_not_fill_the_disk() {
    let Some(fs) = Tmpfs::mount() else {
        eprintln!("SKIP: cannot mount a tmpfs here (needs root)");
        return;
    };
    let served = tempfile::tempdir().unwrap();
    let (a, b) = (payload(5 * MIB, 51), payload(5 * MIB, 52));
    std::fs::write(served.path().join("a.bin"), &a).unwrap();
    std::fs::write(served.path().join("b.bin"), &b).unwrap();
    let server = RangeServer::start(served.path()).await;
    let req = |key: &str, file: &str, body: &[u8]| CacheRequest {
        key: key.into(),
        source: SourceSpec::Http { url: format!("{}/{file}", server.base) },
        sha256: BTreeMap::from([(file.to_string(), sha256_hex(body))]),
        pin: None,
    };
    let (ra, rb) = (req("ml.a", "a.bin", &a), req("ml.b", "b.bin", &b));

    // One agent (shared options), then two processes' worth of options (separate space locks).
    for shared in [true, false] {
        let oa = opts(fs.path());
        let ob = if shared { oa.clone() } else { opts(fs.path()) };
        let cancel = CancellationToken::new();
        let (x, y) = tokio::join!(sync_cache(&ra, &oa, &cancel, None), sync_cache(&rb, &ob, &cancel, None));
        let (won, lost, lost_key) = match (&x, &y) {
            (Ok(_), Err(e)) => ("ml.a", e, "ml.b"),
            (Err(e), Ok(_)) => ("ml.b", e, "ml.a"),
            other => panic!("shared={shared}: expected exactly one to fit, got {other:?}"),
        };
        assert_eq!(lost.reason(), "InsufficientDisk", "shared={shared}: {lost}");
        assert!(lost.to_string().contains("does not fit"), "{lost}");
        assert_eq!(staging_dirs(fs.path(), lost_key), 0, "the refused download's staging is removed");
        let free = fs4::available_space(fs.path()).unwrap();
        assert!(free >= 2 * MIB as u64, "shared={shared}: only the winner's space is taken, {free} bytes free");
        assert!(fs.path().join(won).join("current").exists());

        // Once the winner is gone, the refused one fits (it is not refused forever).
        remove_cache(fs.path(), won).unwrap();
        let again = if lost_key == "ml.a" {
            sync_cache(&ra, &oa, &cancel, None).await
        } else {
            sync_cache(&rb, &ob, &cancel, None).await
        };
        again.unwrap_or_else(|e| panic!("shared={shared}: retry after space was freed: {e}"));
        remove_cache(fs.path(), lost_key).unwrap();
    }
}

#[tokio::test]
async fn space_is_allocated_before_the_download_not_sparse() {
    let Some(fs) = Tmpfs::mount() else {
        eprintln!("SKIP: cannot mount a tmpfs here (needs root)");
        return;
    };
    let served = tempfile::tempdir().unwrap();
    let body = payload(3 * MIB, 53);
    std::fs::write(served.path().join("w.bin"), &body).unwrap();
    let server = RangeServer::start(served.path()).await;
    let req = CacheRequest {
        key: "ml.w".into(),
        source: SourceSpec::Http { url: format!("{}/w.bin", server.base) },
        sha256: BTreeMap::new(),
        pin: None,
    };
    let o = opts(fs.path());
    // Cancel after the first chunk: the part file already holds all 3 MiB of blocks.
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    let cb: warmpath_agent::fetch::ChunkCallback = Arc::new(move |_, _| c.cancel());
    let before = fs4::available_space(fs.path()).unwrap();
    assert!(sync_cache(&req, &o, &cancel, Some(cb)).await.is_err());
    let after = fs4::available_space(fs.path()).unwrap();
    assert!(
        before - after >= 3 * MIB as u64,
        "allocated {} bytes for a 3 MiB file after one 256 KiB chunk",
        before - after
    );
    let r = sync_cache(&req, &o, &CancellationToken::new(), None).await.unwrap();
    assert_eq!(r.bytes_resumed + r.bytes_fetched, body.len() as u64);
    assert_eq!(std::fs::read(fs.path().join("ml.w/current/w.bin")).unwrap(), body);
}
