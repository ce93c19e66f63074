//! `warmpath-cache-render -f ENDPOINT.yaml`: prints, offline, the objects the cache-warming
//! reconcilers create for InferenceEndpoints — the ModelCache, the shared ImageCache and its pre-pull
//! DaemonSet, the Deployment (as created once the weights are ready), the Service and the
//! InferenceRoutingPolicy — as multi-document YAML, for review and schema validation.
//!
//! Each InferenceEndpoint is first checked like the API server would with strict field validation:
//! against the CRD's OpenAPI schema (types, ranges, patterns; unknown fields refused) and its CEL
//! rules. A document that fails is reported with every error and the tool exits non-zero.

use std::path::PathBuf;

use clap::Parser;
use kube::ResourceExt;
use warmpath_controller::crd::image_cache::ImageCache;
use warmpath_controller::crd::inference_endpoint::InferenceEndpoint;
use warmpath_controller::crd::model_cache::ModelCache;
use warmpath_controller::reconcile::{image_cache, inference_endpoint as ie};

#[derive(Parser)]
#[command(name = "warmpath-cache-render", about = "Print the objects created for InferenceEndpoints (offline)")]
struct Args {
    /// Files with InferenceEndpoint documents (other kinds are skipped).
    #[arg(short = 'f', long = "filename", required = true)]
    files: Vec<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut out = Vec::<serde_json::Value>::new();
    for f in &args.files {
        let text = std::fs::read_to_string(f).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let v = serde_json::to_value(serde_yaml::Value::deserialize(doc)?)?;
            if v.get("kind").and_then(|k| k.as_str()) != Some("InferenceEndpoint") {
                continue;
            }
            let doc_name = v.pointer("/metadata/name").and_then(|n| n.as_str()).unwrap_or("?").to_string();
            validate_schema(&v).map_err(|e| anyhow::anyhow!("{}: InferenceEndpoint {doc_name}: {e}", f.display()))?;
            let mut e: InferenceEndpoint =
                serde_json::from_value(v).map_err(|e| anyhow::anyhow!("{}: InferenceEndpoint {doc_name}: {e}", f.display()))?;
            kube::core::cel::validate_cel(&e).map_err(|e| anyhow::anyhow!("{}: InferenceEndpoint {doc_name}: {e}", f.display()))?;
            // Owner references need a uid; the API server assigns the real one.
            e.metadata.uid.get_or_insert_with(|| "00000000-0000-0000-0000-000000000000".into());
            e.metadata.namespace.get_or_insert_with(|| "default".into());
            let cache = ie::desired_cache_spec(&e).filter(|_| e.spec.model.volume.is_none()).map(|spec| {
                let name = ie::cache_name(&e.name_any(), &spec);
                let mut mc = ModelCache::new(&name, spec);
                mc.metadata.namespace = e.namespace();
                mc
            });
            let image = e.spec.model_cache_config.image_cache.enabled.then(|| {
                let (name, spec) = ie::endpoint_image_cache(&e);
                let mut ic = ImageCache::new(&name, spec);
                ic.metadata.namespace = e.namespace();
                ic.metadata.uid = Some("00000000-0000-0000-0000-000000000001".into());
                ic
            });
            if let Some(mc) = &cache {
                out.push(serde_json::to_value(mc)?);
            }
            if let Some(ic) = &image {
                out.push(serde_json::to_value(ic)?);
                out.push(serde_json::to_value(image_cache::prepull_daemonset(ic))?);
            }
            let d = ie::deployment(&e, cache.as_ref().map(|m| m.name_any()).as_deref(), image.as_ref().map(|i| i.name_any()).as_deref())?;
            out.push(serde_json::to_value(d)?);
            out.push(serde_json::to_value(ie::service(&e)?)?);
            if let Some(p) = ie::routing_policy(&e)? {
                out.push(serde_json::to_value(p)?);
            }
        }
    }
    for v in out {
        print!("---\n{}", serde_yaml::to_string(&v)?);
    }
    Ok(())
}

use serde::Deserialize;

/// Validates a document against the InferenceEndpoint CRD's `openAPIV3Schema` (kube-fake-client's
/// JSON-schema validator), with unknown fields refused as `kubectl apply` does by default (strict
/// server-side field validation) instead of pruned.
fn validate_schema(doc: &serde_json::Value) -> anyhow::Result<()> {
    use kube::CustomResourceExt;
    use kube_fake_client::validator::SchemaValidator;
    let crd = InferenceEndpoint::crd();
    let version = &crd.spec.versions[0];
    let mut schema = serde_json::to_value(version.schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref()))?;
    strict(&mut schema);
    // The CRD schema leaves the envelope to the API server.
    for (k, v) in [("apiVersion", serde_json::json!({"type": "string"})), ("kind", serde_json::json!({"type": "string"})), ("metadata", serde_json::json!({"type": "object"}))] {
        schema["properties"].as_object_mut().expect("object schema").entry(k).or_insert(v);
    }
    let definition = format!("dev.warmpath.{}.InferenceEndpoint", version.name);
    let openapi = serde_json::json!({ "definitions": { definition: schema } });
    let path = std::env::temp_dir().join(format!("warmpath-cache-render-{}.json", std::process::id()));
    std::fs::write(&path, serde_json::to_vec(&openapi)?)?;
    let validator = kube_fake_client::validator::RuntimeOpenAPIValidator::from_file(&path);
    let _ = std::fs::remove_file(&path);
    let validator = validator?;
    validator.enable_validation_for(&format!("warmpath.dev/{}/InferenceEndpoint", version.name))?;
    validator.validate("warmpath.dev", &version.name, "InferenceEndpoint", doc)?;
    Ok(())
}

/// Refuses properties a structural schema does not name (objects with `properties`, unless they
/// preserve unknown fields), recursively.
fn strict(s: &mut serde_json::Value) {
    match s {
        serde_json::Value::Object(m) => {
            let structural = m.get("type").and_then(|t| t.as_str()) == Some("object")
                && m.contains_key("properties")
                && !m.contains_key("additionalProperties")
                && m.get("x-kubernetes-preserve-unknown-fields") != Some(&serde_json::Value::Bool(true));
            if structural {
                m.insert("additionalProperties".into(), serde_json::Value::Bool(false));
            }
            m.values_mut().for_each(strict);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(strict),
        _ => {}
    }
}
