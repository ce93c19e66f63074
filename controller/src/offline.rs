//! `warmpath-controller render -f FILE...`: what the controller would create for the given
//! manifests — the routing reconcilers' plans (what each policy and annotated HTTPRoute resolves
//! to, the objects they would apply and the policies' status) and the cache-warming objects of each
//! InferenceEndpoint — computed from the manifests alone — like `helm template`, for review and golden tests. No API
//! client: the plans read the manifests through [`Source::Manifests`], and nothing leaves the
//! process.
//!
//! Determinism: objects without `metadata.uid` get one derived from their kind/namespace/name, and
//! objects without `creationTimestamp` get document order (1 s apart from the epoch), so the
//! output (owner references, labels, conflict resolution) is stable.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::core::DynamicObject;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::crd::image_cache::ImageCache;
use crate::crd::inference_endpoint::InferenceEndpoint;
use crate::crd::model_cache::ModelCache;
use crate::gateway::route_annotations::{self, RoutePlan};
use crate::gateway::routing_policy::{self, PolicyPlan};
use crate::gateway::source::{Manifests, Source};
use crate::gateway::unknown_annotations;
use crate::reconcile::ControllerConfig;
use crate::routing::ANNOTATION_STRATEGY;
use crate::warming::{image_cache, inference_endpoint as ie};
use kube::runtime::events::EventType;
use kube::ResourceExt;

/// Result of an offline render.
#[derive(Debug, Default)]
pub struct Rendered {
    /// Objects the controller would create, sorted by (kind, namespace, name), server fields removed.
    pub objects: Vec<DynamicObject>,
    /// What the controller would report: one line per policy condition
    /// (`InferenceRoutingPolicy ns/name <ancestor kind> <name>: Type=Status (Reason): message`), and one per event
    /// published for an annotated route (`HTTPRoute ns/name: <type> <reason>: <note>`, e.g. `NotProgrammed` with
    /// each parent's reason).
    pub status: Vec<String>,
}

/// Splits multi-document YAML into JSON values (empty documents skipped).
///
/// Errors: a document is not valid YAML.
pub fn parse_manifests(text: &str) -> Result<Vec<Value>, String> {
    use serde::Deserialize;
    let mut out = vec![];
    for doc in serde_yaml::Deserializer::from_str(text) {
        let v = Value::deserialize(doc).map_err(|e| format!("YAML: {e}"))?;
        if v.is_null() {
            continue;
        }
        // The API server names every object (generateName included) before anything reconciles it; objects of
        // other kinds (a List, a Kustomization) are ignored, named or not.
        let kind = v["kind"].as_str().unwrap_or_default();
        if crate::gateway::source::reads_kind(kind) && v["metadata"]["name"].as_str().is_none_or(str::is_empty) {
            return Err(format!("{kind} (document {}) has no metadata.name", out.len() + 1));
        }
        out.push(v);
    }
    Ok(out)
}

fn fake_uid(kind: &str, ns: &str, name: &str) -> String {
    let h = hex::encode(Sha256::digest(format!("{kind}/{ns}/{name}").as_bytes()));
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

fn normalise(mut objects: Vec<Value>) -> Vec<Value> {
    for (i, o) in objects.iter_mut().enumerate() {
        let kind = o["kind"].as_str().unwrap_or_default().to_string();
        let cluster_scoped = kind == "GatewayClass";
        let meta = &mut o["metadata"];
        if !meta.is_object() {
            *meta = serde_json::json!({});
        }
        if !cluster_scoped && meta.get("namespace").is_none() {
            meta["namespace"] = "default".into();
        }
        let ns = meta["namespace"].as_str().unwrap_or_default().to_string();
        let name = meta["name"].as_str().unwrap_or_default().to_string();
        if meta.get("uid").is_none() {
            meta["uid"] = fake_uid(&kind, &ns, &name).into();
        }
        if meta.get("creationTimestamp").is_none() {
            meta["creationTimestamp"] = format!("1970-01-01T00:{:02}:{:02}Z", (i / 60) % 60, i % 60).into();
        }
    }
    objects
}

/// Renders what the controller would create for `manifests`: the routing plan of every policy
/// (oldest first wins a contested route, as on a cluster) and of every annotated HTTPRoute that no
/// policy overrides. A pure function of its input.
///
/// Errors: a manifest of a kind routing reads that does not match its schema, or a policy or route
/// without a name.
pub async fn render(manifests: Vec<Value>, config: ControllerConfig) -> Result<Rendered, String> {
    // No gateway runs offline: nothing to read its status back from.
    let config = ControllerConfig { live_status: false, ..config };
    // What the API server would refuse is refused here too, with its reasons.
    for v in &manifests {
        let (kind, name) = (v["kind"].as_str().unwrap_or("?"), v["metadata"]["name"].as_str().unwrap_or("?"));
        validate_warmpath_object(v).map_err(|e| format!("{kind} {name}: {e}"))?;
    }
    let m = Manifests::from_values(normalise(manifests))?;
    let src = Source::Manifests(&m);
    let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    let err = |e: crate::Error| e.to_string();
    let mut out = Rendered::default();
    let mut policies = m.policies.clone();
    policies.sort_by_key(|p| (p.metadata.namespace.clone(), p.metadata.name.clone()));
    for p in policies.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
        let plan = routing_policy::plan(p, src, &config, &now).await.map_err(err)?;
        for a in plan.ancestors().iter().take(16) {
            for c in &a.conditions {
                out.status.push(format!(
                    "InferenceRoutingPolicy {}/{} {} {}: {}={} ({}){}",
                    p.metadata.namespace.as_deref().unwrap_or_default(),
                    p.metadata.name.as_deref().unwrap_or_default(),
                    a.ancestor_ref.kind,
                    a.ancestor_ref.name,
                    c.type_,
                    c.status,
                    c.reason,
                    if c.message.is_empty() { String::new() } else { format!(": {}", c.message) }
                ));
            }
        }
        if let PolicyPlan::Program { objects, .. } = plan {
            out.objects.extend(objects);
        }
    }
    // No gateway runs offline: nothing to read its status back from.
    let config = ControllerConfig { live_status: false, ..config };
    // Annotated routes: their status is only written on a live cluster, so report the events the
    // reconciler would publish for them (Programmed / NotProgrammed with each ancestor's reason, …),
    // as `HTTPRoute ns/name: <type> <reason>: <note>`.
    let mut lines = vec![];
    for r in
        m.routes.iter().filter(|r| r.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(ANNOTATION_STRATEGY)))
    {
        let mut event = |type_: EventType, reason: &str, note: String| {
            let type_ = if type_ == EventType::Normal { "Normal" } else { "Warning" };
            let note: String = note.chars().take(1024).collect();
            lines.push(format!(
                "HTTPRoute {}/{}: {type_} {reason}: {note}",
                r.namespace().unwrap_or_default(),
                r.name_any()
            ));
        };
        if let Some(msg) = unknown_annotations::message(r.annotations()) {
            event(EventType::Warning, "UnknownAnnotation", msg);
        }
        match route_annotations::plan(r, src, &config, &now).await.map_err(err)? {
            RoutePlan::Overridden { policy } => {
                event(EventType::Warning, "AnnotationsOverridden", route_annotations::overridden_note(&policy, 0))
            }
            RoutePlan::Invalid(msg) => {
                event(EventType::Warning, "InvalidAnnotation", route_annotations::invalid_note(&msg))
            }
            RoutePlan::NotAnnotated => {}
            RoutePlan::Program { strategy, outcome } => {
                let (type_, reason, note) =
                    route_annotations::outcome_event(strategy, &outcome.ancestors, outcome.objects.len());
                event(type_, reason, note);
                out.objects.extend(outcome.objects);
            }
        }
    }
    lines.sort();
    lines.dedup();
    for e in &m.endpoints {
        out.objects.extend(warming_objects(e).map_err(|e| e.to_string())?);
    }
    out.objects.sort_by_key(crate::gateway::program::key_of);
    // Endpoints that share an image share its ImageCache and pre-pull DaemonSet (one object, applied by each).
    out.objects.dedup_by(|a, b| crate::gateway::program::key_of(a) == crate::gateway::program::key_of(b));
    out.status.extend(lines);
    Ok(out)
}

/// What the cache-warming reconcilers create for one InferenceEndpoint: the ModelCache, the shared
/// ImageCache and its pre-pull DaemonSet, the Deployment (as created once the weights are ready),
/// the Service and the InferenceRoutingPolicy.
///
/// Errors: an object that cannot be built from the spec (as the reconciler would report it).
fn warming_objects(e: &InferenceEndpoint) -> crate::Result<Vec<DynamicObject>> {
    let mut e = e.clone();
    // Owner references need a uid (`normalise` derived one); the API server assigns the real one.
    let uid = fake_uid("InferenceEndpoint", &e.namespace().unwrap_or_default(), &e.name_any());
    e.metadata.uid.get_or_insert(uid);
    let cache = ie::desired_cache_spec(&e).filter(|_| e.spec.model.volume.is_none()).map(|spec| {
        let mut mc = ModelCache::new(&ie::cache_name(&e.name_any(), &spec), spec);
        mc.metadata.namespace = e.namespace();
        mc
    });
    let image = e.spec.model_cache_config.image_cache.enabled.then(|| {
        let (name, spec) = ie::endpoint_image_cache(&e);
        let mut ic = ImageCache::new(&name, spec);
        ic.metadata.namespace = e.namespace();
        ic.metadata.uid = Some(fake_uid("ImageCache", &e.namespace().unwrap_or_default(), &ic.name_any()));
        ic
    });
    let mut out: Vec<Value> = vec![];
    let json = |v: serde_json::Result<Value>| v.map_err(|err| crate::Error::InvalidSpec(err.to_string()));
    if let Some(mc) = &cache {
        out.push(json(serde_json::to_value(mc))?);
    }
    if let Some(ic) = &image {
        out.push(json(serde_json::to_value(ic))?);
        out.push(json(serde_json::to_value(image_cache::prepull_daemonset(ic)))?);
    }
    let d = ie::deployment(
        &e,
        cache.as_ref().map(|m| m.name_any()).as_deref(),
        None,
        image.as_ref().map(|i| i.name_any()).as_deref(),
    )?;
    out.push(json(serde_json::to_value(d))?);
    out.push(json(serde_json::to_value(ie::service(&e)?))?);
    if let Some(p) = ie::routing_policy(&e)? {
        out.push(json(serde_json::to_value(p))?);
    }
    out.into_iter()
        .map(|v| serde_json::from_value::<DynamicObject>(v).map_err(|err| crate::Error::InvalidSpec(err.to_string())))
        .collect()
}

/// Checks a document of one of warmpath's own kinds (InferenceRoutingPolicy, InferenceEndpoint,
/// ModelCache, ImageCache) as the API server would with strict field validation: against the
/// `openAPIV3Schema` of the CRD generated from the Rust types (types, enums, ranges, patterns;
/// unknown fields refused instead of pruned, as `kubectl apply` does by default) and its CEL rules.
/// Documents of other kinds, or of another `apiVersion`, pass unchecked (`Ok(false)`).
///
/// Errors: every schema violation (with its JSON path), or the CEL rules that fail.
pub fn validate_warmpath_object(doc: &Value) -> Result<bool, String> {
    let Some(crd) = crate::crd::all().into_iter().find(|c| {
        doc["kind"] == c.spec.names.kind.as_str()
            && doc["apiVersion"] == format!("{}/{}", c.spec.group, c.spec.versions[0].name).as_str()
    }) else {
        return Ok(false);
    };
    let crd_schema =
        serde_json::to_value(crd.spec.versions[0].schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref()))
            .map_err(|e| e.to_string())?;
    let mut schema = crd_schema.clone();
    to_json_schema(&mut schema);
    // The CRD schema leaves the envelope to the API server.
    for (k, v) in [
        ("apiVersion", serde_json::json!({"type": "string"})),
        ("kind", serde_json::json!({"type": "string"})),
        ("metadata", serde_json::json!({"type": "object"})),
    ] {
        if let Some(props) = schema["properties"].as_object_mut() {
            props.entry(k).or_insert(v);
        }
    }
    let validator = jsonschema::validator_for(&schema).map_err(|e| format!("CRD schema: {e}"))?;
    let errors: Vec<String> = validator.iter_errors(doc).map(|e| format!("{}: {e}", e.instance_path())).collect();
    if !errors.is_empty() {
        return Err(errors.join("; "));
    }
    kube::core::cel::Validator::new().validate(&crd_schema, doc, None).map_err(|e| e.to_string())?;
    Ok(true)
}

/// Turns a structural OpenAPI v3 schema into the JSON Schema the API server effectively applies:
/// `nullable` admits `null`, `x-kubernetes-int-or-string` admits both, and objects with
/// `properties` (unless they preserve unknown fields) refuse other properties.
fn to_json_schema(s: &mut Value) {
    match s {
        Value::Object(m) => {
            let structural = m.get("type").and_then(|t| t.as_str()) == Some("object")
                && m.contains_key("properties")
                && !m.contains_key("additionalProperties")
                && m.get("x-kubernetes-preserve-unknown-fields") != Some(&Value::Bool(true));
            if structural {
                m.insert("additionalProperties".into(), Value::Bool(false));
            }
            if m.get("nullable") == Some(&Value::Bool(true)) {
                if let Some(Value::String(t)) = m.get("type").cloned() {
                    m.insert("type".into(), serde_json::json!([t, "null"]));
                }
            }
            if m.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
                m.remove("type");
                m.insert("anyOf".into(), serde_json::json!([{"type": "integer"}, {"type": "string"}]));
            }
            m.values_mut().for_each(to_json_schema);
        }
        Value::Array(a) => a.iter_mut().for_each(to_json_schema),
        _ => {}
    }
}
