//! Where weights come from, and how a source becomes a list of files to fetch.
//!
//! Every source resolves to an `object_store` store plus a file list, so the fetch engine
//! ([`crate::fetch`]) does parallel ranged reads the same way for all of them:
//! - S3 (and S3-compatible endpoints): `AmazonS3`, credentials from the environment
//!   (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, web identity / pod identity), every object under the prefix.
//! - HTTP(S): `HttpStore` for one URL.
//! - Hugging Face: `hf-hub` resolves the revision to a commit and lists the repo files; the bytes then come
//!   through `HttpStore` from `{endpoint}/{repo}/resolve/{commit}/` with the token as a bearer header.

use std::{collections::BTreeMap, sync::Arc};

use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use object_store::{
    aws::AmazonS3Builder, http::HttpBuilder, path::Path as StorePath, ClientOptions, ObjectMeta, ObjectStore,
    ObjectStoreExt,
};
use serde::{Deserialize, Serialize};

use crate::error::{AgentError, Result};

/// A model weights source (mirrors `ModelCache.spec.source` without the Kubernetes wrapping).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SourceSpec {
    /// Every object under `s3://bucket/prefix`.
    S3 {
        /// Bucket name.
        bucket: String,
        /// Key prefix; empty means the whole bucket. Files keep their path below the prefix.
        #[serde(default)]
        prefix: String,
        /// AWS region (default `us-east-1`).
        #[serde(default)]
        region: Option<String>,
        /// S3-compatible endpoint URL (MinIO, moto, ...). `http://` endpoints are allowed.
        #[serde(default)]
        endpoint: Option<String>,
    },
    /// One file at an HTTP(S) URL; the file keeps the URL's last path segment as its name.
    Http {
        /// Full URL of the file.
        url: String,
    },
    /// A Hugging Face model repo at a revision (branch, tag or commit; default `main`).
    HuggingFace {
        /// `org/name`.
        repo: String,
        /// Branch, tag or commit sha.
        #[serde(default)]
        revision: Option<String>,
        /// Hub endpoint (default `https://huggingface.co`; a mirror or a local test server otherwise).
        #[serde(default)]
        endpoint: Option<String>,
    },
}

impl SourceSpec {
    /// Parses the CLI form: `s3://bucket/prefix?region=R&endpoint=URL`, `http(s)://host/path/file`,
    /// `hf://org/name?revision=REV&endpoint=URL`.
    /// Path components are percent-decoded and query values form-decoded, as `ModelSource::fetch_uri` encodes them.
    /// An `http(s)` URL must name a file: a query string or a fragment (a presigned URL) is refused, since the
    /// file is read by its path alone.
    pub fn parse_uri(uri: &str) -> Result<SourceSpec> {
        let u = url::Url::parse(uri).map_err(|e| AgentError::InvalidSource(format!("{uri}: {e}")))?;
        let query: BTreeMap<String, String> = u.query_pairs().into_owned().collect();
        let path = || {
            percent_encoding::percent_decode_str(u.path())
                .decode_utf8()
                .map(|p| p.into_owned())
                .map_err(|e| AgentError::InvalidSource(format!("{uri}: path is not UTF-8 once decoded: {e}")))
        };
        match u.scheme() {
            "s3" => Ok(SourceSpec::S3 {
                bucket: u
                    .host_str()
                    .filter(|b| !b.is_empty())
                    .ok_or_else(|| AgentError::InvalidSource(format!("{uri}: missing bucket")))?
                    .to_string(),
                prefix: path()?.trim_start_matches('/').to_string(),
                region: query.get("region").cloned(),
                endpoint: query.get("endpoint").cloned(),
            }),
            "http" | "https" if u.query().is_some() || u.fragment().is_some() => {
                Err(AgentError::InvalidSource(format!(
                "{uri}: an http(s) source is the URL of a file, without a query string or fragment (presigned URLs \
                 are not supported)"
            )))
            }
            "http" | "https" => Ok(SourceSpec::Http { url: uri.to_string() }),
            "hf" => Ok(SourceSpec::HuggingFace {
                repo: format!("{}{}", u.host_str().unwrap_or_default(), path()?),
                revision: query.get("revision").cloned(),
                endpoint: query.get("endpoint").cloned(),
            }),
            other => {
                Err(AgentError::InvalidSource(format!("{uri}: unsupported scheme {other:?} (s3, http, https, hf)")))
            }
        }
    }
}

/// One object to fetch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteFile {
    /// Location in the store.
    pub location: String,
    /// Path of the file inside the cache version directory (`/`-separated, no `..`).
    pub rel: String,
    /// Size in bytes as reported by the source.
    pub size: u64,
    /// Entity tag reported by the source, if any; sent as `If-Match` on every ranged read so an object that
    /// changes mid-download fails instead of mixing two versions.
    pub e_tag: Option<String>,
    /// Last modification time reported by the source, kept only when it gives no strong entity tag (a plain
    /// web server): sent as `If-Unmodified-Since` on every ranged read instead of `If-Match`, and part of the
    /// version's fingerprint, so an object rewritten with the same size is a new version rather than the same
    /// one (RFC 9110 §8.8.2: a modification date is the weaker validator, used where no entity tag exists).
    /// Absent from the fingerprint when `None`, so sources with entity tags keep their versions' names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_modified: Option<DateTime<Utc>>,
}

impl RemoteFile {
    /// The file at `location`, cached as `rel`, as the source's metadata describes it. A modification time is
    /// kept only without a strong entity tag, and only when the source gave one (`object_store` reports a
    /// missing `Last-Modified` as the Unix epoch).
    pub fn new(location: String, rel: String, meta: ObjectMeta) -> RemoteFile {
        let mut file = RemoteFile { location, rel, size: meta.size, e_tag: meta.e_tag, last_modified: None };
        let dated = meta.last_modified.timestamp() != 0;
        if file.strong_e_tag().is_none() && dated {
            file.last_modified = Some(meta.last_modified);
        }
        file
    }

    /// The entity tag when it is a strong one, the only kind `If-Match` can carry (RFC 9110 §13.1.1 compares
    /// strongly; a weak tag starts with `W/`).
    pub fn strong_e_tag(&self) -> Option<&str> {
        self.e_tag.as_deref().filter(|t| !t.starts_with("W/"))
    }
}

/// A source resolved to a store and concrete files.
pub struct ResolvedSource {
    /// Store to read from.
    pub store: Arc<dyn ObjectStore>,
    /// Files, sorted by `rel`.
    pub files: Vec<RemoteFile>,
    /// What pins this content besides the file list (the Hugging Face commit sha), for the fingerprint.
    pub pin: Option<String>,
}

/// Credentials and endpoints that do not live in the spec.
#[derive(Debug, Clone, Default)]
pub struct SourceAuth {
    /// Hugging Face token (read by the agent from a file or `HF_TOKEN`).
    pub hf_token: Option<String>,
}

/// Rejects absolute paths and `..` so a hostile listing cannot write outside the cache directory.
pub fn safe_rel(rel: &str) -> Result<String> {
    let rel = rel.trim_start_matches('/');
    if rel.is_empty() || rel.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err(AgentError::InvalidSource(format!("unsafe file path {rel:?} in source listing")));
    }
    Ok(rel.to_string())
}

fn allow_http(endpoint: &str) -> bool {
    endpoint.starts_with("http://")
}

/// Characters `object_store`'s HTTP store cannot request in a file name: it escapes them in the path it builds and
/// then escapes the escape again when it writes the URL (controls aside, `object_store::path` `INVALID`).
const HTTP_UNREQUESTABLE: &str = "\\{^}%`]\">[~<#|*?";

/// The file name an http source's URL names, as the store is handed it: percent-decoded (the store encodes it
/// itself, so `my%20model.bin` is requested as such and not as `my%2520model.bin`).
///
/// Errors: a name that is not UTF-8 once decoded, that decodes to a path (`%2F`), or that holds a character the
/// store cannot request (a 404 on a mangled path otherwise).
fn http_file_name(url: &str, encoded: &str) -> Result<String> {
    let name = percent_encoding::percent_decode_str(encoded)
        .decode_utf8()
        .map_err(|e| AgentError::InvalidSource(format!("{url}: file name is not UTF-8 once decoded: {e}")))?;
    if let Some(c) = name.chars().find(|&c| c == '/' || c.is_control() || HTTP_UNREQUESTABLE.contains(c)) {
        return Err(AgentError::InvalidSource(format!(
            "{url}: the file name {name:?} holds {c:?}, which an http source cannot request; serve the file under \
             another name"
        )));
    }
    Ok(name.into_owned())
}

/// The S3 store of `bucket` on top of `base` (the environment's settings: credentials, `AWS_REGION` or
/// `AWS_DEFAULT_REGION`): the source's own region wins, then the environment's; with neither the store uses
/// `us-east-1`.
fn s3_builder(base: AmazonS3Builder, bucket: &str, region: Option<&str>, endpoint: Option<&str>) -> AmazonS3Builder {
    let mut b = base.with_bucket_name(bucket);
    if let Some(region) = region {
        b = b.with_region(region);
    }
    if let Some(ep) = endpoint {
        b = b.with_endpoint(ep).with_allow_http(allow_http(ep));
    }
    b
}

/// Resolves a spec to a store and its file list (lists S3, HEADs HTTP, asks the Hub for the repo files).
pub async fn resolve(spec: &SourceSpec, auth: &SourceAuth) -> Result<ResolvedSource> {
    match spec {
        SourceSpec::S3 { bucket, prefix, region, endpoint } => {
            let b = s3_builder(AmazonS3Builder::from_env(), bucket, region.as_deref(), endpoint.as_deref());
            let store: Arc<dyn ObjectStore> = Arc::new(b.build()?);
            let list_prefix = if prefix.is_empty() { None } else { Some(StorePath::from(prefix.as_str())) };
            let metas: Vec<_> = store.list(list_prefix.as_ref()).try_collect().await?;
            let strip = prefix.trim_end_matches('/');
            let mut files = Vec::with_capacity(metas.len());
            for m in metas {
                let loc = m.location.to_string();
                let rel = loc.strip_prefix(strip).unwrap_or(&loc);
                let rel = safe_rel(rel)?;
                files.push(RemoteFile::new(loc, rel, m));
            }
            if files.is_empty() {
                return Err(AgentError::InvalidSource(format!("no objects under s3://{bucket}/{prefix}")));
            }
            files.sort_by(|a, b| a.rel.cmp(&b.rel));
            Ok(ResolvedSource { store, files, pin: None })
        }
        SourceSpec::Http { url } => {
            let (base, name) = url
                .rsplit_once('/')
                .filter(|(_, n)| !n.is_empty())
                .ok_or_else(|| AgentError::InvalidSource(format!("{url}: URL must end in a file name")))?;
            let store: Arc<dyn ObjectStore> = Arc::new(
                HttpBuilder::new()
                    .with_url(base)
                    .with_client_options(ClientOptions::new().with_allow_http(allow_http(url)))
                    .build()?,
            );
            let name = http_file_name(url, name)?;
            let meta = store.head(&StorePath::from(name.as_ref())).await?;
            let file = RemoteFile::new(name.to_string(), safe_rel(&name)?, meta);
            Ok(ResolvedSource { store, files: vec![file], pin: None })
        }
        SourceSpec::HuggingFace { repo, revision, endpoint } => {
            resolve_hf(repo, revision.as_deref().unwrap_or("main"), endpoint.as_deref(), auth).await
        }
    }
}

async fn resolve_hf(repo: &str, revision: &str, endpoint: Option<&str>, auth: &SourceAuth) -> Result<ResolvedSource> {
    use hf_hub::{api::tokio::ApiBuilder, Repo, RepoType};
    let endpoint = endpoint.unwrap_or("https://huggingface.co").trim_end_matches('/').to_string();
    // Only the Hub's metadata API is used, never hf-hub's download cache. Its default cache lives
    // under $HOME and hf-hub panics when there is none (a scratch image has no /etc/passwd), so
    // name a throwaway one; the token comes from `auth` only.
    let api = ApiBuilder::from_cache(hf_hub::Cache::new(std::env::temp_dir().join("warmpath-hf-hub")))
        .with_endpoint(endpoint.clone())
        .with_token(auth.hf_token.clone())
        .with_progress(false)
        .build()
        .map_err(|e| AgentError::Hub(e.to_string()))?;
    let info = api
        .repo(Repo::with_revision(repo.to_string(), RepoType::Model, revision.to_string()))
        .info()
        .await
        .map_err(|e| AgentError::Hub(format!("{repo}@{revision}: {e}")))?;
    // Pin the bytes to the commit the revision points at now, so a moving branch cannot mix versions.
    let base = format!("{endpoint}/{repo}/resolve/{}", info.sha);
    let mut headers = http::HeaderMap::new();
    if let Some(token) = &auth.hf_token {
        let v = format!("Bearer {token}")
            .parse()
            .map_err(|_| AgentError::Hub("token is not a valid header value".into()))?;
        headers.insert("authorization", v);
    }
    let store: Arc<dyn ObjectStore> = Arc::new(
        HttpBuilder::new()
            .with_url(base)
            .with_client_options(
                ClientOptions::new().with_allow_http(allow_http(&endpoint)).with_default_headers(headers),
            )
            .build()?,
    );
    let mut files = Vec::with_capacity(info.siblings.len());
    for s in &info.siblings {
        let rel = safe_rel(&s.rfilename)?;
        let meta = store.head(&StorePath::from(rel.as_str())).await?;
        files.push(RemoteFile::new(rel.clone(), rel, meta));
    }
    files.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(ResolvedSource { store, files, pin: Some(info.sha) })
}

#[cfg(test)]
mod tests {
    use object_store::aws::AmazonS3ConfigKey;

    use super::*;

    #[test]
    fn a_modification_time_is_kept_only_where_no_strong_etag_validates() {
        use chrono::TimeZone;
        let at = Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap();
        let meta = |e_tag: Option<&str>, last_modified| ObjectMeta {
            location: StorePath::from("w.bin"),
            last_modified,
            size: 7,
            e_tag: e_tag.map(str::to_string),
            version: None,
        };
        let file = |m| RemoteFile::new("w.bin".into(), "w.bin".into(), m);
        assert_eq!(file(meta(Some("\"abc\""), at)).last_modified, None, "a strong ETag validates");
        assert_eq!(file(meta(Some("W/\"abc\""), at)).last_modified, Some(at), "a weak one cannot (If-Match)");
        assert_eq!(file(meta(None, at)).last_modified, Some(at));
        assert_eq!(file(meta(None, Utc.timestamp_nanos(0))).last_modified, None, "no Last-Modified at all");
        // A file with a strong ETag serializes as before, so the fingerprints of existing versions do not change.
        let json = serde_json::to_value(file(meta(Some("\"abc\""), at))).unwrap();
        assert_eq!(json, serde_json::json!({"location": "w.bin", "rel": "w.bin", "size": 7, "e_tag": "\"abc\""}));
    }

    #[test]
    fn s3_region_comes_from_the_source_then_the_environment() {
        let region = |b: &AmazonS3Builder| b.get_config_value(&AmazonS3ConfigKey::Region);
        // The environment's region as `from_env` reads it (`AWS_REGION` or `AWS_DEFAULT_REGION`).
        let env = || AmazonS3Builder::new().with_config(AmazonS3ConfigKey::DefaultRegion, "eu-central-1");
        assert_eq!(region(&s3_builder(env(), "b", None, None)).as_deref(), Some("eu-central-1"));
        assert_eq!(region(&s3_builder(env(), "b", Some("ap-south-1"), None)).as_deref(), Some("ap-south-1"));
        // Neither: left to the store's own default (us-east-1).
        assert_eq!(region(&s3_builder(AmazonS3Builder::new(), "b", None, None)), None);
    }

    #[test]
    fn parses_cli_uris() {
        assert_eq!(
            SourceSpec::parse_uri("s3://models/llama/8b/?region=eu-west-1&endpoint=http://127.0.0.1:9000").unwrap(),
            SourceSpec::S3 {
                bucket: "models".into(),
                prefix: "llama/8b/".into(),
                region: Some("eu-west-1".into()),
                endpoint: Some("http://127.0.0.1:9000".into())
            }
        );
        assert_eq!(
            SourceSpec::parse_uri("hf://Qwen/Qwen3-8B?revision=v1").unwrap(),
            SourceSpec::HuggingFace { repo: "Qwen/Qwen3-8B".into(), revision: Some("v1".into()), endpoint: None }
        );
        // Encoded components read back as written (`ModelSource::fetch_uri` encodes them).
        assert_eq!(
            SourceSpec::parse_uri(
                "s3://b/team%20a/llama%208b%25%3F%23/?endpoint=http%3A%2F%2F127.0.0.1%3A9000%2F%3Fx%3D1%26y%3D2"
            )
            .unwrap(),
            SourceSpec::S3 {
                bucket: "b".into(),
                prefix: "team a/llama 8b%?#/".into(),
                region: None,
                endpoint: Some("http://127.0.0.1:9000/?x=1&y=2".into())
            }
        );
        assert_eq!(
            SourceSpec::parse_uri("hf://Qwen/Qwen3-8B?revision=main%26endpoint%3Dhttp%3A%2F%2F127.0.0.1%3A18080")
                .unwrap(),
            SourceSpec::HuggingFace {
                repo: "Qwen/Qwen3-8B".into(),
                revision: Some("main&endpoint=http://127.0.0.1:18080".into()),
                endpoint: None
            },
            "a revision with & in it is a revision, not a second endpoint"
        );
        let presigned = SourceSpec::parse_uri("https://h/m.bin?X-Amz-Signature=abc").unwrap_err();
        assert!(presigned.to_string().contains("without a query string"), "{presigned}");
        assert!(matches!(SourceSpec::parse_uri("ftp://x/y"), Err(AgentError::InvalidSource(_))));
        assert!(matches!(SourceSpec::parse_uri("s3:///nobucket"), Err(AgentError::InvalidSource(_))));
    }

    #[test]
    fn http_file_names_are_decoded_once_and_unrequestable_ones_refused() {
        assert_eq!(http_file_name("u", "my%20model.bin").unwrap(), "my model.bin");
        assert_eq!(http_file_name("u", "model-v2.safetensors").unwrap(), "model-v2.safetensors");
        for bad in ["a%2Fb.bin", "model~v2.bin", "a%5B1%5D.bin", "x%25y.bin", "a%0Ab.bin"] {
            let e = http_file_name("u", bad).unwrap_err();
            assert_eq!(e.reason(), "InvalidSource", "{bad}: {e}");
        }
    }

    #[test]
    fn rejects_paths_escaping_the_cache() {
        assert_eq!(safe_rel("/a/b.safetensors").unwrap(), "a/b.safetensors");
        for bad in ["../etc/passwd", "a/../../b", "a//b", "", "./x"] {
            assert!(safe_rel(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn spec_json_is_kubernetes_style() {
        let s = SourceSpec::Http { url: "http://h/f".into() };
        assert_eq!(serde_json::to_string(&s).unwrap(), r#"{"http":{"url":"http://h/f"}}"#);
    }
}
