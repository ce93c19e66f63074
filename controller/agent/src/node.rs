//! The DaemonSet's node loop: which ModelCaches this node must hold, syncing them, and reporting on
//! the node's own Node object (contract in `warmpath_api::model_cache`).
//!
//! Each pass ([`NodeAgent::reconcile_once`]) lists ModelCaches and reads its Node; a cache that targets
//! the node gets a background sync task (one per cache; all share the agent-wide range-read permits),
//! and a cache that no longer does (deleted, deleting, retargeted) is cancelled, removed from disk,
//! and its label and report are removed — which is what the controller's finalizer waits for.
//!
//! Only directories the agent created are ever removed ([`crate::cache_dir`]); a root holding files
//! it did not create is refused unless allowed ([`NodeAgent::with_allow_foreign_files`]). A failed sync
//! is retried with exponential back-off, not on every pass. A source that cannot be reached while a
//! verified copy of the same request is current leaves the node Ready (reason `SourceUnavailable`).
//!
//! Once the controller records a pinned version (`ModelCache.status.pinned`), the agent fetches only
//! that version: a node holding it stays Ready when the source changes (reason `SourceChanged`), and a
//! node without it fails with `SourceChanged` (and loses its ready label) rather than fetching
//! different bytes than the other nodes serve.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Node;
use kube::{
    api::{Api, ListParams, Patch, PatchParams},
    Client, Resource, ResourceExt,
};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use warmpath_api::{
    model_cache::{
        cache_dir_name, cache_ready_label, parse_reports, phase, report_key, ModelCache, ModelSource, NodeCacheReport,
        CACHE_READY_PREFIX, NODE_CACHE_STATES,
    },
    nodes::is_target,
};

use crate::{
    cache_dir::{claim_root, CacheDir},
    error::{AgentError, Result},
    source::SourceSpec,
    sync::{remove_cache, serving_copy, sync_cache, CacheRequest, SyncOptions},
};

/// First wait after a failed sync; doubled after every further failure of the same generation.
pub const DEFAULT_RETRY_BASE: Duration = Duration::from_secs(30);
/// Longest wait between two attempts of a failing sync.
pub const DEFAULT_RETRY_MAX: Duration = Duration::from_secs(30 * 60);

/// Failed attempts of one cache generation and when the next one may start.
struct Backoff {
    generation: i64,
    failures: u32,
    next: Instant,
}

/// Converts a ModelCache source into the agent's source (`None` for volume sources: nothing to fetch).
pub fn source_of(s: &ModelSource) -> Option<SourceSpec> {
    if let Some(s3) = &s.s3 {
        return Some(SourceSpec::S3 {
            bucket: s3.bucket.clone(),
            prefix: s3.prefix.clone(),
            region: s3.region.clone(),
            endpoint: s3.endpoint.clone(),
        });
    }
    if let Some(h) = &s.http {
        return Some(SourceSpec::Http { url: h.url.clone() });
    }
    s.hugging_face.as_ref().map(|h| SourceSpec::HuggingFace {
        repo: h.repo.clone(),
        revision: h.revision.clone(),
        endpoint: h.endpoint.clone(),
    })
}

/// What a sync task works towards: the cache's generation and its pinned version (when recorded).
type Target = (i64, Option<String>);

struct Task {
    target: Target,
    cancel: CancellationToken,
    handle: JoinHandle<()>,
}

struct Inner {
    client: Client,
    node: String,
    host_path: String,
    opts: SyncOptions,
    /// Current reports of this node, keyed `namespace/name` (mirrors the Node annotation).
    reports: Mutex<BTreeMap<String, NodeCacheReport>>,
    /// Serialises Node patches so reports are never written out of order.
    patch_lock: tokio::sync::Mutex<()>,
    tasks: Mutex<HashMap<String, Task>>,
    /// Generation (and pin) last synced successfully per cache: no re-listing of the source until the
    /// spec changes or a pin is recorded.
    synced: Mutex<HashMap<String, Target>>,
    /// Failed syncs per cache, for the back-off.
    backoff: Mutex<HashMap<String, Backoff>>,
    retry_base: Duration,
    retry_max: Duration,
    /// Use a root that holds files the agent did not create (never touching them).
    allow_foreign_files: bool,
}

/// The node agent.
#[derive(Clone)]
pub struct NodeAgent {
    inner: Arc<Inner>,
}

impl NodeAgent {
    /// An agent for `node` whose cache root (`opts.root`, inside the container) is the node's `host_path`.
    pub fn new(client: Client, node: impl Into<String>, host_path: impl Into<String>, opts: SyncOptions) -> NodeAgent {
        NodeAgent {
            inner: Arc::new(Inner {
                client,
                node: node.into(),
                host_path: host_path.into(),
                opts,
                reports: Mutex::new(BTreeMap::new()),
                patch_lock: tokio::sync::Mutex::new(()),
                tasks: Mutex::new(HashMap::new()),
                synced: Mutex::new(HashMap::new()),
                backoff: Mutex::new(HashMap::new()),
                retry_base: DEFAULT_RETRY_BASE,
                retry_max: DEFAULT_RETRY_MAX,
                allow_foreign_files: false,
            }),
        }
    }

    fn configure(mut self, f: impl FnOnce(&mut Inner)) -> NodeAgent {
        f(Arc::get_mut(&mut self.inner).expect("configure the agent before cloning or running it"));
        self
    }

    /// Back-off of failed syncs: `base` after the first failure, doubled each time up to `max`.
    pub fn with_retry_backoff(self, base: Duration, max: Duration) -> NodeAgent {
        self.configure(|i| {
            i.retry_base = base;
            i.retry_max = max.max(base);
        })
    }

    /// Accept a root that holds files the agent did not create (they are never touched).
    pub fn with_allow_foreign_files(self, allow: bool) -> NodeAgent {
        self.configure(|i| i.allow_foreign_files = allow)
    }

    /// One pass: start syncs for caches this node must hold, remove the ones it must not.
    pub async fn reconcile_once(&self) -> Result<()> {
        let inner = &self.inner;
        let nodes: Api<Node> = Api::all(inner.client.clone());
        let node = nodes.get(&inner.node).await.map_err(|e| AgentError::Kube(e.to_string()))?;
        {
            // Adopt what an earlier agent process reported, so removals cover it too.
            let mut reports = inner.reports.lock().expect("lock");
            if reports.is_empty() {
                *reports = parse_reports(node.annotations().get(NODE_CACHE_STATES));
            }
        }
        let caches = Api::<ModelCache>::all(inner.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| AgentError::Kube(e.to_string()))?
            .items;

        let mut wanted: HashMap<String, ModelCache> = HashMap::new();
        for mc in caches {
            let ns = mc.namespace().unwrap_or_default();
            let key = report_key(&ns, &mc.name_any());
            if mc.meta().deletion_timestamp.is_none() && is_target(&mc.spec, &node) && mc.spec.source.volume.is_none() {
                if mc.spec.host_path() != inner.host_path {
                    let msg =
                        format!("cache hostPath {} differs from the agent's {}", mc.spec.host_path(), inner.host_path);
                    self.report(
                        &key,
                        &ns,
                        &mc.name_any(),
                        failed("HostPathNotMounted", &msg, mc.meta().generation),
                        None,
                    )
                    .await?;
                    continue;
                }
                wanted.insert(key, mc);
            }
        }

        // A root holding files the agent did not create is refused (every wanted cache says why).
        if let Err(e) = claim_root(&inner.opts.root, inner.allow_foreign_files) {
            for (key, mc) in &wanted {
                let r = failed(e.reason(), &e.to_string(), mc.meta().generation);
                self.report(key, &mc.namespace().unwrap_or_default(), &mc.name_any(), r, None).await?;
            }
            return Err(e);
        }

        // Remove what is no longer wanted: reported caches, labelled caches, and cache directories the
        // agent created (nothing else under the root is touched).
        let mut known: Vec<(String, String)> = inner
            .reports
            .lock()
            .expect("lock")
            .keys()
            .filter_map(|k| k.split_once('/').map(|(a, b)| (a.to_string(), b.to_string())))
            .collect();
        if let Ok(rd) = std::fs::read_dir(&inner.opts.root) {
            for e in rd.flatten() {
                let Some(dir_name) = e.file_name().to_str().map(str::to_string) else { continue };
                let owned = CacheDir::new(&inner.opts.root, &dir_name).is_ok_and(|d| d.is_owned());
                if let Some((ns, name)) = dir_name.split_once('.').filter(|_| owned) {
                    known.push((ns.to_string(), name.to_string()));
                }
            }
        }
        known.sort();
        known.dedup();
        for (ns, name) in known {
            let key = report_key(&ns, &name);
            if !wanted.contains_key(&key) {
                self.remove(&ns, &name).await?;
            }
        }
        // Labels of caches this agent never reported (e.g. set before a node rename) are removed too.
        let stray: Vec<String> = node
            .labels()
            .keys()
            .filter(|l| l.starts_with(CACHE_READY_PREFIX))
            .filter(|l| {
                !wanted.values().any(|mc| cache_ready_label(&mc.namespace().unwrap_or_default(), &mc.name_any()) == **l)
            })
            .cloned()
            .collect();
        for l in stray {
            self.patch_node(json!({"metadata": {"labels": {l: null}}})).await?;
        }

        for (key, mc) in wanted {
            self.ensure_task(key, mc);
        }
        Ok(())
    }

    fn ensure_task(&self, key: String, mc: ModelCache) {
        let generation = mc.meta().generation.unwrap_or(0);
        let target: Target = (generation, mc.pinned_version().map(str::to_string));
        let inner = &self.inner;
        if inner.synced.lock().expect("lock").get(&key) == Some(&target) {
            return;
        }
        if inner
            .backoff
            .lock()
            .expect("lock")
            .get(&key)
            .is_some_and(|b| b.generation == generation && Instant::now() < b.next)
        {
            return;
        }
        let mut tasks = inner.tasks.lock().expect("lock");
        if let Some(t) = tasks.get(&key) {
            if t.target == target && !t.handle.is_finished() {
                return;
            }
            if t.target != target {
                t.cancel.cancel();
            }
        }
        let cancel = CancellationToken::new();
        let agent = self.clone();
        let (c, k) = (cancel.clone(), key.clone());
        let handle = tokio::spawn(async move { agent.sync_one(k, mc, c).await });
        tasks.insert(key, Task { target, cancel, handle });
    }

    async fn sync_one(&self, key: String, mc: ModelCache, cancel: CancellationToken) {
        let ns = mc.namespace().unwrap_or_default();
        let name = mc.name_any();
        let generation = mc.meta().generation;
        let Some(source) = source_of(&mc.spec.source) else { return };
        let pin = mc.pinned_version().map(str::to_string);
        let req =
            CacheRequest { key: cache_dir_name(&ns, &name), source, sha256: mc.spec.sha256.clone(), pin: pin.clone() };
        let start = NodeCacheReport { state: phase::DOWNLOADING.into(), generation, ..Default::default() };
        let _ = self.report(&key, &ns, &name, start, None).await;
        // Progress reports at most every 5 s (each is a Node patch), with the bytes on disk so far.
        let last = Arc::new(Mutex::new(Instant::now()));
        let per_file: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
        let progress = {
            let (agent, key, ns, name, last) = (self.clone(), key.clone(), ns.clone(), name.clone(), last.clone());
            let handle = tokio::runtime::Handle::current();
            Arc::new(move |file: &str, done: u64| {
                let bytes_done: u64 = {
                    let mut m = per_file.lock().expect("lock");
                    m.insert(file.to_string(), done);
                    m.values().sum()
                };
                let mut l = last.lock().expect("lock");
                if l.elapsed() >= Duration::from_secs(5) {
                    *l = Instant::now();
                    let (agent, key, ns, name) = (agent.clone(), key.clone(), ns.clone(), name.clone());
                    handle.spawn(async move {
                        let r = NodeCacheReport {
                            state: phase::DOWNLOADING.into(),
                            generation,
                            bytes_done,
                            ..Default::default()
                        };
                        let _ = agent.report(&key, &ns, &name, r, None).await;
                    });
                }
            }) as crate::fetch::ChunkCallback
        };
        let outcome = sync_cache(&req, &self.inner.opts, &cancel, Some(progress)).await;
        let result = match outcome {
            Ok(r) => {
                tracing::info!(cache = %key, version = %r.version, fetched = r.bytes_fetched, resumed = r.bytes_resumed, "cache ready");
                self.inner.backoff.lock().expect("lock").remove(&key);
                self.inner.synced.lock().expect("lock").insert(key.clone(), (generation.unwrap_or(0), pin));
                // The source moved on under the pin: this node keeps serving the pinned version.
                let (reason, message) = match &r.source_version {
                    Some(found) => (
                        Some("SourceChanged".to_string()),
                        Some(format!(
                            "serving the pinned version {}; the source now lists version {found}, which no other node \
                             fetches either (new content needs a new ModelCache)",
                            r.version
                        )),
                    ),
                    None => (None, None),
                };
                let ready = NodeCacheReport {
                    state: phase::READY.into(),
                    reason,
                    message,
                    version: Some(r.version),
                    generation,
                    bytes_done: r.bytes_total,
                    bytes_total: r.bytes_total,
                    ..Default::default()
                };
                self.report(&key, &ns, &name, ready, Some(true)).await
            }
            Err(AgentError::Cancelled) => return,
            Err(e) => {
                let wait = self.back_off(&key, generation.unwrap_or(0));
                let serving = CacheDir::new(&self.inner.opts.root, &req.key).ok().and_then(|d| serving_copy(&req, &d));
                // What is on disk (if anything) is not what this cache asks for: pods must not prefer the node.
                let label = serving.is_none().then_some(false);
                match serving {
                    Some(m) if matches!(e, AgentError::Store(_) | AgentError::Hub(_)) => {
                        // The verified copy of exactly this request stays; only the update check failed.
                        tracing::warn!(cache = %key, error = %e, "source unavailable; the verified local copy keeps serving");
                        let r = NodeCacheReport {
                            state: phase::READY.into(),
                            reason: Some("SourceUnavailable".into()),
                            message: Some(format!(
                                "{e}; serving the verified local copy, next check in {}s",
                                wait.as_secs()
                            )),
                            version: Some(m.version),
                            generation,
                            bytes_done: m.bytes,
                            bytes_total: m.bytes,
                            ..Default::default()
                        };
                        self.report(&key, &ns, &name, r, Some(true)).await
                    }
                    _ => {
                        tracing::warn!(cache = %key, reason = e.reason(), error = %e, retry_in_s = wait.as_secs(), "cache failed");
                        let msg = format!("{e}; next attempt in {}s", wait.as_secs());
                        let mut r = failed(e.reason(), &msg, generation);
                        if let AgentError::InsufficientDisk { needed, reserve, available, .. } = &e {
                            (r.needed_bytes, r.available_bytes) =
                                (Some(needed.saturating_add(*reserve)), Some(*available));
                        }
                        self.report(&key, &ns, &name, r, label).await
                    }
                }
            }
        };
        if let Err(e) = result {
            tracing::warn!(cache = %key, error = %e, "could not report on the node");
        }
    }

    /// Records a failed attempt and returns the wait before the next one (`base · 2^(failures-1)`, at
    /// most `max`; a new generation starts over).
    fn back_off(&self, key: &str, generation: i64) -> Duration {
        let mut all = self.inner.backoff.lock().expect("lock");
        let b = all.entry(key.to_string()).or_insert(Backoff { generation, failures: 0, next: Instant::now() });
        if b.generation != generation {
            *b = Backoff { generation, failures: 0, next: Instant::now() };
        }
        b.failures += 1;
        let wait = self.inner.retry_base.saturating_mul(1u32 << (b.failures - 1).min(20)).min(self.inner.retry_max);
        b.next = Instant::now() + wait;
        wait
    }

    /// Writes one cache's report (and optionally its ready label) onto the Node.
    async fn report(&self, key: &str, ns: &str, name: &str, r: NodeCacheReport, ready: Option<bool>) -> Result<()> {
        let _g = self.inner.patch_lock.lock().await;
        let annotation = {
            let mut reports = self.inner.reports.lock().expect("lock");
            reports.insert(key.to_string(), r);
            serde_json::to_string(&*reports).expect("reports serialize")
        };
        let mut patch = json!({"metadata": {"annotations": {NODE_CACHE_STATES: annotation}}});
        if let Some(ready) = ready {
            patch["metadata"]["labels"] =
                json!({ cache_ready_label(ns, name): if ready { json!("true") } else { json!(null) } });
        }
        self.patch_node_locked(patch).await
    }

    /// Cancels, deletes from disk, then drops the label and report of one cache.
    async fn remove(&self, ns: &str, name: &str) -> Result<()> {
        let key = report_key(ns, name);
        if let Some(t) = self.inner.tasks.lock().expect("lock").remove(&key) {
            t.cancel.cancel();
            t.handle.abort();
        }
        self.inner.synced.lock().expect("lock").remove(&key);
        self.inner.backoff.lock().expect("lock").remove(&key);
        remove_cache(&self.inner.opts.root, &cache_dir_name(ns, name))?;
        tracing::info!(cache = %key, "removed from node");
        let _g = self.inner.patch_lock.lock().await;
        let annotation = {
            let mut reports = self.inner.reports.lock().expect("lock");
            reports.remove(&key);
            serde_json::to_string(&*reports).expect("reports serialize")
        };
        self.patch_node_locked(json!({"metadata": {
            "labels": { cache_ready_label(ns, name): null },
            "annotations": { NODE_CACHE_STATES: annotation },
        }}))
        .await
    }

    async fn patch_node(&self, patch: serde_json::Value) -> Result<()> {
        let _g = self.inner.patch_lock.lock().await;
        self.patch_node_locked(patch).await
    }

    async fn patch_node_locked(&self, patch: serde_json::Value) -> Result<()> {
        Api::<Node>::all(self.inner.client.clone())
            .patch(&self.inner.node, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| AgentError::Kube(e.to_string()))?;
        Ok(())
    }

    /// Waits for every running sync task to finish (tests; graceful shutdown after cancel).
    pub async fn wait_idle(&self) {
        loop {
            let handles: Vec<JoinHandle<()>> = {
                let mut tasks = self.inner.tasks.lock().expect("lock");
                let done: Vec<String> =
                    tasks.iter().filter(|(_, t)| t.handle.is_finished()).map(|(k, _)| k.clone()).collect();
                for k in done {
                    tasks.remove(&k);
                }
                if tasks.is_empty() {
                    return;
                }
                tasks.drain().map(|(_, t)| t.handle).collect()
            };
            for h in handles {
                let _ = h.await;
            }
        }
    }

    /// Cancels every running download (progress is kept for the next start).
    pub fn shutdown(&self) {
        for t in self.inner.tasks.lock().expect("lock").values() {
            t.cancel.cancel();
        }
    }

    /// Runs passes every `poll` until `stop` is cancelled.
    pub async fn run(&self, poll: Duration, stop: CancellationToken) {
        loop {
            if let Err(e) = self.reconcile_once().await {
                tracing::warn!(error = %e, "node pass failed");
            }
            tokio::select! {
                _ = tokio::time::sleep(poll) => {}
                _ = stop.cancelled() => break,
            }
        }
        self.shutdown();
        self.wait_idle().await;
    }
}

fn failed(reason: &str, message: &str, generation: Option<i64>) -> NodeCacheReport {
    NodeCacheReport {
        state: phase::FAILED.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        generation,
        ..Default::default()
    }
}
