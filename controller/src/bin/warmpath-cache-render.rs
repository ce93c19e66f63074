//! `warmpath-cache-render -f ENDPOINT.yaml`: prints, offline, the objects the cache-warming
//! reconcilers create for InferenceEndpoints — the ModelCache, the shared ImageCache and its pre-pull
//! DaemonSet, the Deployment (as created once the weights are ready), the Service and the
//! InferenceRoutingPolicy — as multi-document YAML, for review and schema validation.

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
            let mut e: InferenceEndpoint = serde_json::from_value(v)?;
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
