//! Finalizer bookkeeping with merge patches that carry `metadata.resourceVersion` (optimistic
//! concurrency: a stale view gets 409 Conflict and the reconcile is retried).
//!
//! Why not `kube::runtime::finalizer`: its first add uses a JSON-patch `test` of a missing
//! `/metadata/finalizers` against `null`, which the API server accepts but the in-memory test
//! client (`kube-fake-client` 0.3, RFC 6902 strict) refuses — so the reconcilers could not be
//! tested without an API server. Same semantics, expressed as a merge patch.

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::Result;

/// True when `obj` carries finalizer `name`.
pub fn has<K: Resource>(obj: &K, name: &str) -> bool {
    obj.finalizers().iter().any(|f| f == name)
}

/// Adds finalizer `name` (no-op when present). Returns the updated object.
pub async fn add<K>(api: &Api<K>, obj: &K, name: &str) -> Result<Option<K>>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    if has(obj, name) {
        return Ok(None);
    }
    let mut list: Vec<String> = obj.finalizers().to_vec();
    list.push(name.to_string());
    patch(api, obj, list).await.map(Some)
}

/// Removes finalizer `name` (no-op when absent). After the last finalizer goes, the API server
/// completes a pending deletion.
pub async fn remove<K>(api: &Api<K>, obj: &K, name: &str) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    if !has(obj, name) {
        return Ok(());
    }
    let list: Vec<String> = obj.finalizers().iter().filter(|f| *f != name).cloned().collect();
    match patch(api, obj, list).await {
        Ok(_) => Ok(()),
        // Already gone: the deletion completed.
        Err(crate::Error::Kube(kube::Error::Api(e))) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// One finalizer-guarded reconcile, shared by the cache-warming reconcilers: on deletion, `cleanup`
/// must succeed before finalizer `name` goes; otherwise the finalizer is put in place before
/// `apply` runs (on the object as updated by that patch), so nothing is created unguarded.
pub async fn guard<K>(
    api: &Api<K>,
    obj: &K,
    name: &str,
    cleanup: impl AsyncFnOnce(&K) -> Result<Action>,
    apply: impl AsyncFnOnce(&K) -> Result<Action>,
) -> Result<Action>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    if obj.meta().deletion_timestamp.is_some() {
        if has(obj, name) {
            cleanup(obj).await?;
            remove(api, obj, name).await?;
        }
        return Ok(Action::await_change());
    }
    let updated = add(api, obj, name).await?;
    apply(updated.as_ref().unwrap_or(obj)).await
}

async fn patch<K>(api: &Api<K>, obj: &K, list: Vec<String>) -> Result<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let body = json!({"metadata": {"finalizers": list, "resourceVersion": obj.resource_version()}});
    Ok(api.patch(&obj.name_any(), &PatchParams::default(), &Patch::Merge(&body)).await?)
}
