//! `ModelCache` (`warmpath.dev/v1alpha1`, namespaced): model weights kept on node-local disk of the
//! target nodes by the node agent (`warmpath-agent`).
//!
//! This file also holds the agent ↔ controller contract, so both sides compile against one definition:
//! - The agent on node N syncs every ModelCache whose target selects N into
//!   `<hostPath>/<namespace>.<name>/current` (see `warmpath_agent::cache_dir`).
//! - It reports on its own Node object only (RBAC: `nodes` get/patch):
//!   label [`cache_ready_label`] = `"true"` once the cache is current and verified (removed when the cache
//!   is removed from the node), and annotation [`NODE_CACHE_STATES`]: a JSON object
//!   `{"<namespace>/<name>": NodeCacheReport, ...}` with the per-cache state and reason.
//! - The controller reads both from the Node objects into `ModelCache.status` (it never writes them), and
//!   uses the label for pods' *preferred* node affinity.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Default directory on each node under which caches live (one subdirectory per cache).
pub const DEFAULT_HOST_PATH: &str = "/opt/warmpath/models";
/// Finalizer the controller puts on a ModelCache until every node has dropped it.
pub const FINALIZER: &str = "warmpath.dev/model-cache-cleanup";
/// Node annotation holding the agent's per-cache reports (JSON object keyed `namespace/name`).
pub const NODE_CACHE_STATES: &str = "warmpath.dev/model-cache-states";
/// Schema pattern of a sha256 checksum value: 64 hex characters.
pub const SHA256_PATTERN: &str = "^[0-9a-fA-F]{64}$";
/// Prefix of the per-cache node label set by the agent when the cache is ready on that node.
pub const CACHE_READY_PREFIX: &str = "warmpath.dev/cache-ready-";

/// Phases of a ModelCache (and states of one node's copy).
pub mod phase {
    /// Nothing downloaded yet.
    pub const PENDING: &str = "Pending";
    /// At least one target node is downloading.
    pub const DOWNLOADING: &str = "Downloading";
    /// Every target node holds the current version.
    pub const READY: &str = "Ready";
    /// At least one node failed (reason in `status.nodes`).
    pub const FAILED: &str = "Failed";
    /// The cache is being removed from the nodes.
    pub const DELETING: &str = "Deleting";
}

/// Model weights to keep on the target nodes.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "warmpath.dev",
    version = "v1alpha1",
    kind = "ModelCache",
    derive = "Default",
    namespaced,
    status = "ModelCacheStatus",
    shortname = "mc",
    category = "warmpath",
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Target","type":"integer","jsonPath":".status.target"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.ready"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[kube(cel)]
#[serde(rename_all = "camelCase")]
pub struct ModelCacheSpec {
    /// Where the weights come from.
    pub source: ModelSource,
    /// Target nodes: labels a node must have (empty: every node).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Target nodes: allowed `node.kubernetes.io/instance-type` values (empty: any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instance_types: Vec<String>,
    /// Directory on the node under which this cache lives as `<namespace>.<name>/` (absolute path).
    /// Default `/opt/warmpath/models`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^/"))]
    pub host_path: Option<String>,
    /// Expected total size in bytes (informational; the agent checks free disk against the real size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub expected_size_bytes: Option<i64>,
    /// Expected sha256 (64 hex chars) per file path inside the cache; a mismatch fails that node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("additionalProperties" = {"type": "string", "pattern": SHA256_PATTERN}))]
    pub sha256: BTreeMap<String, String>,
}

impl ModelCacheSpec {
    /// The host path, defaulted.
    pub fn host_path(&self) -> &str {
        self.host_path.as_deref().unwrap_or(DEFAULT_HOST_PATH)
    }

    /// What decides the bytes: 16 hex chars of sha256 over the source and the checksums.
    pub fn content_hash(&self) -> String {
        let doc = serde_json::json!({ "source": self.source, "sha256": self.sha256 });
        hex::encode(&Sha256::digest(doc.to_string().as_bytes())[..8])
    }
}

/// Exactly one source.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[x_kube(validation = Rule::new("(has(self.s3) ? 1 : 0) + (has(self.http) ? 1 : 0) + (has(self.huggingFace) ? 1 : 0) + (has(self.volume) ? 1 : 0) == 1").message("source needs exactly one of s3, http, huggingFace, volume"))]
#[serde(rename_all = "camelCase")]
pub struct ModelSource {
    /// Every object under an S3 prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Source>,
    /// One file at an HTTP(S) URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpSource>,
    /// A Hugging Face model repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugging_face: Option<HuggingFaceSource>,
    /// An existing PersistentVolumeClaim (e.g. FSx for Lustre) that already holds the weights: nothing
    /// is downloaded; pods mount it directly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<VolumeSource>,
}

/// S3 or S3-compatible source.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3Source {
    /// Bucket name.
    #[schemars(length(min = 3, max = 63))]
    pub bucket: String,
    /// Key prefix (files keep their path below it).
    #[serde(default)]
    pub prefix: String,
    /// AWS region; default: the downloader's `AWS_REGION` (or `AWS_DEFAULT_REGION`), else `us-east-1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Endpoint URL of an S3-compatible store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

/// HTTP(S) source.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpSource {
    /// URL of one file (its last path segment becomes the file name), without a query string or fragment: the
    /// agent reads the file by its path (a presigned URL is not supported).
    #[schemars(regex(pattern = r"^https?://[^/?#]+/[^?#]*[^/?#]$"))]
    pub url: String,
}

/// Hugging Face source.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HuggingFaceSource {
    /// Repository `org/name`.
    #[schemars(regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"))]
    pub repo: String,
    /// Branch, tag or commit; default `main`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Hub endpoint; default `https://huggingface.co`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Secret (same namespace) with the token, for the pods' cold-node fallback (`HF_TOKEN`). The node
    /// agent uses the token configured in the Helm values (`agent.huggingFace.tokenSecret`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret_ref: Option<SecretKeyRef>,
}

/// A key of a Secret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Secret name.
    pub name: String,
    /// Key in the Secret; default `token`.
    #[serde(default = "default_token_key")]
    pub key: String,
}

fn default_token_key() -> String {
    "token".into()
}

/// An existing volume with the weights.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSource {
    /// PersistentVolumeClaim name (same namespace).
    pub claim_name: String,
    /// Sub-path inside the volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_path: Option<String>,
}

impl ModelSource {
    /// The agent's URI form (`s3://…`, `https://…`, `hf://…`), used by the pods' cold-node fallback
    /// (`warmpath-agent fetch --source URI`). `None` for volume sources (nothing to fetch). The S3 prefix and each
    /// query value are percent-encoded where a character would end their component or start an escape, so no value
    /// can add a parameter: a revision `main&endpoint=…` stays a revision and never names another endpoint (which
    /// would receive the Hub token). Ordinary values (`http://minio:9000`, `eu-west-1`) are written as they are, so
    /// the pods' init container arguments, and so their template, do not change with this encoding.
    pub fn fetch_uri(&self) -> Option<String> {
        let q = |pairs: &[(&str, &Option<String>)]| {
            let parts: Vec<String> = pairs
                .iter()
                .filter_map(|(k, v)| {
                    v.as_ref().map(|v| format!("{k}={}", percent_encoding::utf8_percent_encode(v, URI_QUERY_VALUE)))
                })
                .collect();
            if parts.is_empty() {
                String::new()
            } else {
                format!("?{}", parts.join("&"))
            }
        };
        if let Some(s) = &self.s3 {
            return Some(format!(
                "s3://{}/{}{}",
                s.bucket,
                percent_encoding::utf8_percent_encode(&s.prefix, URI_PATH),
                q(&[("region", &s.region), ("endpoint", &s.endpoint)])
            ));
        }
        if let Some(h) = &self.http {
            return Some(h.url.clone());
        }
        if let Some(h) = &self.hugging_face {
            // The repo is `org/name` of letters, digits, `.`, `_` and `-` (the schema's pattern): nothing to encode.
            return Some(format!("hf://{}{}", h.repo, q(&[("revision", &h.revision), ("endpoint", &h.endpoint)])));
        }
        None
    }
}

/// What [`ModelSource::fetch_uri`] percent-encodes in a query value: [`URI_PATH`] and the characters that end a
/// value or a parameter, or that a query decoder reads as a space (`&`, `=`, `+`).
const URI_QUERY_VALUE: &percent_encoding::AsciiSet = &URI_PATH.add(b'&').add(b'=').add(b'+');

/// What [`ModelSource::fetch_uri`] percent-encodes in a path: controls, and the characters that end a path or
/// start an escape (`?`, `#`, `%`), or that a URI may not hold unencoded (space, quotes, brackets).
const URI_PATH: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}');

/// Observed state.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelCacheStatus {
    /// `Pending`, `Downloading`, `Ready`, `Failed` or `Deleting`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Target nodes.
    #[serde(default)]
    pub target: i32,
    /// Target nodes holding the current version.
    #[serde(default)]
    pub ready: i32,
    /// Target nodes whose last attempt failed.
    #[serde(default)]
    pub failed: i32,
    /// One entry per target node (sorted by node name).
    #[serde(default)]
    pub nodes: Vec<NodeCacheStatus>,
    /// Conditions (`Ready`), keyed by type.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The version every node and every pod start fetches: the first version a node verified for this
    /// source and these checksums, recorded once and then never changed. A source whose content changes under the same
    /// spec is refused (`SourceChanged`) on nodes that do not hold the pinned version yet, instead of
    /// mixing versions; new content arrives through a new ModelCache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<PinnedVersion>,
}

/// What a ModelCache serves, fixed once the first node verified it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PinnedVersion {
    /// Version fingerprint (16 hex chars: sha256 over the source, the checksums, the Hugging Face commit
    /// and the listing with every file's size and ETag).
    pub version: String,
    /// Hash of the source and checksums the pin was made for (16 hex chars). When either changes, a new
    /// version is pinned; node selector, host path and the like do not count.
    pub content_hash: String,
    /// Node that verified this version first.
    pub node: String,
}

impl ModelCache {
    /// The pinned version for the current source and checksums, if one is recorded.
    pub fn pinned_version(&self) -> Option<&str> {
        let hash = self.spec.content_hash();
        self.status.as_ref()?.pinned.as_ref().filter(|p| p.content_hash == hash).map(|p| p.version.as_str())
    }
}

/// One node's copy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeCacheStatus {
    /// Node name.
    pub node: String,
    /// `Pending`, `Downloading`, `Ready` or `Failed`.
    pub state: String,
    /// CamelCase reason from the agent (`ChecksumMismatch`, `InsufficientDisk`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Version fingerprint current on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Bytes on the node's disk for the version being fetched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_done: Option<i64>,
    /// Total bytes of the version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_total: Option<i64>,
    /// Reason `InsufficientDisk`: bytes the download needs (still to fetch plus the agent's reserve).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needed_bytes: Option<i64>,
    /// Reason `InsufficientDisk`: bytes free on the node's cache filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<i64>,
}

/// What the agent writes per cache into [`NODE_CACHE_STATES`] on its node (JSON, camelCase).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodeCacheReport {
    /// `Pending`, `Downloading`, `Ready` or `Failed` (see [`phase`]).
    pub state: String,
    /// CamelCase reason when not Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Version fingerprint current (Ready) or being fetched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The `metadata.generation` of the ModelCache this report answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Bytes on disk of the version being fetched.
    #[serde(default)]
    pub bytes_done: u64,
    /// Total bytes of the version.
    #[serde(default)]
    pub bytes_total: u64,
    /// When the cache does not fit: bytes needed (still to fetch plus the reserve).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needed_bytes: Option<u64>,
    /// When the cache does not fit: bytes free on the cache filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
}

/// Key of a cache in [`NODE_CACHE_STATES`]: `namespace/name`.
pub fn report_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Directory name of a cache under the host path: `namespace.name` (both DNS names, so one path component).
pub fn cache_dir_name(namespace: &str, name: &str) -> String {
    format!("{namespace}.{name}")
}

/// Node label key marking the cache ready on a node: `warmpath.dev/cache-ready-<namespace>.<name>`.
/// A label name is at most 63 characters, so long `namespace.name` pairs are cut to 42 characters plus
/// `-` and 8 hex chars of their sha256 (stays unique, stays valid).
pub fn cache_ready_label(namespace: &str, name: &str) -> String {
    format!("{CACHE_READY_PREFIX}{}", label_suffix(&cache_dir_name(namespace, name), 63 - "cache-ready-".len()))
}

/// Shortens `s` to `max` chars keeping it unique (prefix + hash) and ending in an alphanumeric.
pub fn label_suffix(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let hash = hex::encode(&Sha256::digest(s.as_bytes())[..4]);
    let keep = s[..max - 9].trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{keep}-{hash}")
}

/// Parses a node's [`NODE_CACHE_STATES`] annotation (an unparsable value counts as empty: the agent
/// rewrites it on its next report).
pub fn parse_reports(annotation: Option<&String>) -> BTreeMap<String, NodeCacheReport> {
    annotation.and_then(|a| serde_json::from_str(a).ok()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_label_is_a_valid_label_key_even_for_long_names() {
        assert_eq!(cache_ready_label("ml", "llama-8b"), "warmpath.dev/cache-ready-ml.llama-8b");
        let long = cache_ready_label("a-very-long-namespace-name-x", "an-even-longer-model-cache-name-for-llama-3-70b");
        let name = long.strip_prefix("warmpath.dev/").unwrap();
        assert!(name.len() <= 63, "{name}");
        assert!(name.chars().last().unwrap().is_ascii_alphanumeric());
        assert_ne!(
            long,
            cache_ready_label("a-very-long-namespace-name-x", "an-even-longer-model-cache-name-for-llama-3-70c")
        );
    }

    fn cel(source: serde_json::Value) -> Result<(), String> {
        let mc: ModelCache = serde_json::from_value(serde_json::json!({
            "apiVersion": "warmpath.dev/v1alpha1", "kind": "ModelCache",
            "metadata": {"name": "m", "namespace": "ns"}, "spec": {"source": source},
        }))
        .unwrap();
        mc.validate_cel().map_err(|e| format!("{e:?}"))
    }

    #[test]
    fn source_needs_exactly_one_kind() {
        assert_eq!(cel(serde_json::json!({"http": {"url": "https://h/m.gguf"}})), Ok(()));
        let none = cel(serde_json::json!({})).unwrap_err();
        assert!(none.contains("exactly one of s3, http, huggingFace, volume"), "{none}");
        let two = cel(serde_json::json!({"http": {"url": "https://h/m"}, "s3": {"bucket": "bkt"}})).unwrap_err();
        assert!(two.contains("exactly one"), "{two}");
    }

    #[test]
    fn crd_has_the_printer_columns_and_status() {
        let crd = <ModelCache as kube::CustomResourceExt>::crd();
        let v = &crd.spec.versions[0];
        let cols: Vec<&str> = v.additional_printer_columns.iter().flatten().map(|c| c.name.as_str()).collect();
        assert_eq!(cols, ["State", "Target", "Ready", "Age"]);
        assert!(v.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some());
        let ic = <super::super::image_cache::ImageCache as kube::CustomResourceExt>::crd();
        let cols: Vec<String> =
            ic.spec.versions[0].additional_printer_columns.iter().flatten().map(|c| c.name.clone()).collect();
        assert_eq!(cols, ["Phase", "Cached", "Target", "Refs", "Age"]);
    }

    #[test]
    fn fetch_uri_round_trips_the_source() {
        let s = ModelSource {
            s3: Some(S3Source {
                bucket: "b".into(),
                prefix: "m/".into(),
                region: Some("eu-west-1".into()),
                endpoint: None,
            }),
            ..Default::default()
        };
        assert_eq!(s.fetch_uri().unwrap(), "s3://b/m/?region=eu-west-1");
        // Values that would end their component are encoded.
        let odd = ModelSource {
            s3: Some(S3Source {
                bucket: "b".into(),
                prefix: "team a/llama 8b%?#/".into(),
                region: None,
                endpoint: Some("http://127.0.0.1:9000/?x=1&y=2".into()),
            }),
            ..Default::default()
        };
        assert_eq!(
            odd.fetch_uri().unwrap(),
            "s3://b/team%20a/llama%208b%25%3F%23/?endpoint=http://127.0.0.1:9000/%3Fx%3D1%26y%3D2"
        );
        let hf = ModelSource {
            hugging_face: Some(HuggingFaceSource {
                repo: "Qwen/Qwen3-8B".into(),
                revision: Some("main&endpoint=http://127.0.0.1:18080".into()),
                endpoint: None,
                token_secret_ref: None,
            }),
            ..Default::default()
        };
        assert_eq!(hf.fetch_uri().unwrap(), "hf://Qwen/Qwen3-8B?revision=main%26endpoint%3Dhttp://127.0.0.1:18080");
        let v = ModelSource {
            volume: Some(VolumeSource { claim_name: "fsx".into(), sub_path: None }),
            ..Default::default()
        };
        assert_eq!(v.fetch_uri(), None);
    }
}
