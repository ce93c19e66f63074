//! InferenceEndpoint reconciler: creates and owns the ModelCache, references the shared ImageCache,
//! and creates the Deployment only once the weights are on every target node (images do not block).
//!
//! Source or image change without a serving gap: the new ModelCache is created beside the old one; the
//! Deployment keeps the old cache until the new one is ready everywhere, then rolls (maxUnavailable 0,
//! so old pods serve until new ones are available); only after the rollout completes are the old
//! ModelCache deleted and the old ImageCache reference released.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{
    Affinity, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction,
    HostPathVolumeSource, LocalObjectReference, NodeAffinity, NodeSelectorRequirement, NodeSelectorTerm,
    PersistentVolumeClaimVolumeSource, PodSpec, PodTemplateSpec, PreferredSchedulingTerm, Probe, SecretKeySelector,
    Service, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::conditions;
use crate::crd::image_cache::{
    image_cache_name, image_ready_label, ImageCache, ImageCacheSpec, MANAGED_BY_ENDPOINTS, MANAGED_LABEL,
};
use crate::crd::inference_endpoint::{
    phase, InferenceEndpoint, InferenceEndpointStatus, ENDPOINT_LABEL, FINALIZER, MODEL_CACHE_ANNOTATION, MODEL_MOUNT,
};
use crate::crd::model_cache::{self, cache_dir_name, cache_ready_label, ModelCache, ModelCacheSpec};
use crate::crd::routing_policy::{
    BackendRef, FailureMode, InferenceRoutingPolicy, InferenceRoutingPolicySpec, PolicyTargetRef, ServiceBackend,
    GATEWAY_API_GROUP,
};
use crate::reconcile::{finalizers, Context};
use crate::{Error, Result, FIELD_MANAGER};

/// Name used in metrics and logs.
pub const CONTROLLER: &str = "inference-endpoint";
/// Weight of the preferred affinity to nodes holding the weights (of 100; the scheduler's max).
pub const CACHE_AFFINITY_WEIGHT: i32 = 100;
/// Weight of the preferred affinity to nodes holding the image: smaller, since weights are usually
/// the larger download (145 GB vs ~10–20 GB images in the HyperPod example).
pub const IMAGE_AFFINITY_WEIGHT: i32 = 30;
/// Default image of the cold-node fallback init container (the agent image); `WARMPATH_AGENT_IMAGE`
/// (set by the Helm chart) overrides it.
pub const DEFAULT_AGENT_IMAGE: &str = "ghcr.io/warmpath/warmpath-agent:0.1.0";

/// Path of the default readiness probe: the health endpoint of vLLM, SGLang, TGI and llama.cpp's server
/// (it fails while the weights are loading).
pub const DEFAULT_READINESS_PATH: &str = "/health";
/// Deployment annotation naming the image its pods run.
pub const IMAGE_ANNOTATION: &str = "warmpath.dev/image";

/// The readiness probe of the model server: `spec.readinessProbe`, else `GET /health` on the serving
/// port every 5 s, timeout 2 s, unready after 3 failures.
pub fn readiness_probe(ie: &InferenceEndpoint) -> Probe {
    ie.spec.readiness_probe.clone().unwrap_or_else(|| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(DEFAULT_READINESS_PATH.into()),
            port: IntOrString::String("http".into()),
            ..Default::default()
        }),
        period_seconds: Some(5),
        timeout_seconds: Some(2),
        failure_threshold: Some(3),
        ..Default::default()
    })
}

fn agent_image() -> String {
    std::env::var("WARMPATH_AGENT_IMAGE").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| DEFAULT_AGENT_IMAGE.into())
}

/// The ModelCache spec the endpoint wants (`None` when the weights cache is off).
pub fn desired_cache_spec(ie: &InferenceEndpoint) -> Option<ModelCacheSpec> {
    let cfg = &ie.spec.model_cache_config.weights_cache;
    cfg.enabled.then(|| ModelCacheSpec {
        source: ie.spec.model.clone(),
        node_selector: ie.spec.node_selector.clone(),
        instance_types: vec![],
        host_path: cfg.host_path.clone(),
        expected_size_bytes: None,
        sha256: ie.spec.sha256.clone(),
    })
}

/// Name of the ModelCache for a spec: `<endpoint>-<8 hex of sha256(spec)>`, so a new source (or
/// checksum, host path, node set) is a new cache and the old one keeps serving meanwhile.
pub fn cache_name(endpoint: &str, spec: &ModelCacheSpec) -> String {
    let h = Sha256::digest(serde_json::to_vec(spec).expect("spec serializes"));
    let base: String = endpoint.chars().take(253 - 9).collect();
    format!("{base}-{}", &hex::encode(h)[..8])
}

fn owner(ie: &InferenceEndpoint) -> Result<OwnerReference> {
    ie.controller_owner_ref(&()).ok_or(Error::MissingField("metadata.uid"))
}

fn labels(ie: &InferenceEndpoint) -> BTreeMap<String, String> {
    BTreeMap::from([
        (ENDPOINT_LABEL.to_string(), ie.name_any()),
        ("app.kubernetes.io/managed-by".to_string(), "warmpath".to_string()),
    ])
}

/// The model server's Deployment for the endpoint, mounting `cache` (a ModelCache name) or, with the
/// weights cache off, an emptyDir filled from the source at start.
///
/// Pods get *preferred* node affinity (never required) to the cache-ready and image-ready labels, and
/// an init container (`warmpath-agent fetch`) that returns at once on a warm node and downloads from
/// the source on a cold one, so a pod placed anywhere still starts. `pin` is the cache's pinned version
/// (`ModelCache.status.pinned`): the init container then fetches only that version (`--pin`).
pub fn deployment(
    ie: &InferenceEndpoint,
    cache: Option<&str>,
    pin: Option<&str>,
    image_cache: Option<&str>,
) -> Result<Deployment> {
    let ns = ie.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let name = ie.name_any();
    let spec = &ie.spec;
    let mut preferred = vec![];
    let mut volumes = vec![];
    let mut init = vec![];
    let model_dir = format!("{MODEL_MOUNT}/current");
    let mut mounts = vec![];
    let mut pod_annotations = BTreeMap::new();
    if let Some(v) = &spec.model.volume {
        // Weights already on a shared volume (PVC / FSx): mount it where `current/` would be.
        volumes.push(Volume {
            name: "weights".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: v.claim_name.clone(),
                read_only: Some(true),
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: "weights".into(),
            mount_path: model_dir.clone(),
            sub_path: v.sub_path.clone(),
            read_only: Some(true),
            ..Default::default()
        });
    } else {
        let uri = spec
            .model
            .fetch_uri()
            .ok_or_else(|| Error::InvalidSpec("model source has no s3, http or huggingFace".into()))?;
        let (key, volume) = match cache {
            Some(cache) => {
                let host = spec
                    .model_cache_config
                    .weights_cache
                    .host_path
                    .as_deref()
                    .unwrap_or(model_cache::DEFAULT_HOST_PATH);
                let dir = cache_dir_name(&ns, cache);
                preferred.push(PreferredSchedulingTerm {
                    weight: CACHE_AFFINITY_WEIGHT,
                    preference: node_term(&cache_ready_label(&ns, cache)),
                });
                pod_annotations.insert(MODEL_CACHE_ANNOTATION.to_string(), cache.to_string());
                let hp = HostPathVolumeSource {
                    path: format!("{}/{dir}", host.trim_end_matches('/')),
                    type_: Some("DirectoryOrCreate".into()),
                };
                (dir, Volume { name: "weights".into(), host_path: Some(hp), ..Default::default() })
            }
            None => (
                "model".to_string(),
                Volume {
                    name: "weights".into(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..Default::default()
                },
            ),
        };
        volumes.push(volume);
        let mut fetch_env: Vec<EnvVar> = spec
            .model
            .hugging_face
            .as_ref()
            .and_then(|h| h.token_secret_ref.as_ref())
            .map(|r| {
                vec![EnvVar {
                    name: "HF_TOKEN".into(),
                    value_from: Some(EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector {
                            name: r.name.clone(),
                            key: r.key.clone(),
                            optional: Some(false),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]
            })
            .unwrap_or_default();
        // Source credentials (AWS_*, a Hub token under another name) reach the fallback fetch too.
        fetch_env.extend(spec.env.iter().cloned());
        let mut args =
            vec!["fetch".into(), "--source".into(), uri, "--root".into(), "/cache".into(), "--key".into(), key.clone()];
        for (file, sum) in &spec.sha256 {
            args.extend(["--sha256".to_string(), format!("{file}={sum}")]);
        }
        if let Some(pin) = pin.filter(|_| cache.is_some()) {
            args.extend(["--pin".to_string(), pin.to_string()]);
        }
        init.push(Container {
            name: "weights".into(),
            image: Some(agent_image()),
            args: Some(args),
            env: (!fetch_env.is_empty()).then_some(fetch_env),
            env_from: (!spec.env_from.is_empty()).then(|| spec.env_from.clone()),
            volume_mounts: Some(vec![VolumeMount {
                name: "weights".into(),
                mount_path: format!("/cache/{key}"),
                ..Default::default()
            }]),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: "weights".into(),
            mount_path: MODEL_MOUNT.into(),
            read_only: Some(true),
            ..Default::default()
        });
    }
    if let Some(ic) = image_cache {
        preferred.push(PreferredSchedulingTerm {
            weight: IMAGE_AFFINITY_WEIGHT,
            preference: node_term(&image_ready_label(&ns, ic)),
        });
    }
    let mut annotations = pod_annotations.clone();
    annotations.insert(IMAGE_ANNOTATION.into(), spec.image.clone());
    let autoscaled = spec.autoscaling.as_ref().is_some_and(|a| a.enabled);
    let mut server_env =
        vec![EnvVar { name: "WARMPATH_MODEL_DIR".into(), value: Some(model_dir), ..Default::default() }];
    server_env.extend(spec.env.iter().cloned());
    Ok(Deployment {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns),
            labels: Some(labels(ie)),
            annotations: Some(annotations),
            owner_references: Some(vec![owner(ie)?]),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            // With an autoscaler the field is left out of the apply, so this field manager never owns it.
            replicas: (!autoscaled).then_some(spec.replicas),
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([(ENDPOINT_LABEL.to_string(), name)])),
                ..Default::default()
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(0)),
                    max_surge: Some(IntOrString::Int(1)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(ie)),
                    annotations: Some(pod_annotations),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    affinity: (!preferred.is_empty()).then(|| Affinity {
                        node_affinity: Some(NodeAffinity {
                            preferred_during_scheduling_ignored_during_execution: Some(preferred),
                            required_during_scheduling_ignored_during_execution: None,
                        }),
                        ..Default::default()
                    }),
                    node_selector: (!spec.node_selector.is_empty()).then(|| spec.node_selector.clone()),
                    tolerations: (!spec.tolerations.is_empty()).then(|| spec.tolerations.clone()),
                    service_account_name: spec.service_account_name.clone(),
                    image_pull_secrets: (!spec.image_pull_secrets.is_empty()).then(|| {
                        spec.image_pull_secrets.iter().map(|s| LocalObjectReference { name: s.clone() }).collect()
                    }),
                    init_containers: (!init.is_empty()).then_some(init),
                    containers: vec![Container {
                        name: "server".into(),
                        image: Some(spec.image.clone()),
                        args: (!spec.args.is_empty()).then(|| spec.args.clone()),
                        env: Some(server_env),
                        env_from: (!spec.env_from.is_empty()).then(|| spec.env_from.clone()),
                        readiness_probe: Some(readiness_probe(ie)),
                        ports: Some(vec![ContainerPort {
                            name: Some("http".into()),
                            container_port: spec.port,
                            ..Default::default()
                        }]),
                        resources: spec.resources.clone(),
                        volume_mounts: Some(mounts),
                        ..Default::default()
                    }],
                    volumes: Some(volumes),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    })
}

fn node_term(label: &str) -> NodeSelectorTerm {
    NodeSelectorTerm {
        match_expressions: Some(vec![NodeSelectorRequirement {
            key: label.into(),
            operator: "In".into(),
            values: Some(vec!["true".into()]),
        }]),
        ..Default::default()
    }
}

/// ClusterIP Service in front of the endpoint's pods (the routing policy's backend).
pub fn service(ie: &InferenceEndpoint) -> Result<Service> {
    Ok(Service {
        metadata: ObjectMeta {
            name: Some(ie.name_any()),
            namespace: ie.namespace(),
            labels: Some(labels(ie)),
            owner_references: Some(vec![owner(ie)?]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([(ENDPOINT_LABEL.to_string(), ie.name_any())])),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: ie.spec.port,
                target_port: Some(IntOrString::String("http".into())),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    })
}

/// The InferenceRoutingPolicy for `spec.routing`, backend = the endpoint's Service.
pub fn routing_policy(ie: &InferenceEndpoint) -> Result<Option<InferenceRoutingPolicy>> {
    let Some(r) = &ie.spec.routing else { return Ok(None) };
    let mut p = InferenceRoutingPolicy::new(
        &ie.name_any(),
        InferenceRoutingPolicySpec {
            target_refs: r
                .http_routes
                .iter()
                .map(|n| PolicyTargetRef { group: GATEWAY_API_GROUP.into(), kind: "HTTPRoute".into(), name: n.clone() })
                .collect(),
            strategy: r.strategy.clone(),
            prefix_length: r.prefix_length,
            block_size: None,
            concurrency_threshold: r.concurrency_threshold,
            tenant_header: None,
            failure_mode: FailureMode::FailOpen,
            backend: Some(BackendRef {
                service: Some(ServiceBackend { name: ie.name_any(), port: ie.spec.port as i64 }),
                inference_pool: None,
            }),
            load: None,
            debug_header: false,
        },
    );
    p.metadata.namespace = ie.namespace();
    p.metadata.labels = Some(labels(ie));
    p.metadata.owner_references = Some(vec![owner(ie)?]);
    Ok(Some(p))
}

fn cache_ready(mc: Option<&ModelCache>) -> bool {
    mc.and_then(|m| m.status.as_ref())
        .is_some_and(|s| s.phase.as_deref() == Some(model_cache::phase::READY) && s.ready == s.target)
}

/// The ModelCache's status has been computed and no node matches its target. (Its name hashes its
/// spec, node selector included, so a status is never about another node set.)
fn no_target_nodes(mc: &ModelCache) -> bool {
    mc.status.as_ref().is_some_and(|s| s.target == 0 && s.phase.as_deref() == Some(model_cache::phase::PENDING))
}

/// The image is on every target node (or there is no target node to wait for).
fn image_pulled(ic: Option<&ImageCache>) -> bool {
    ic.and_then(|i| i.status.as_ref()).is_some_and(|s| {
        s.phase.as_deref() == Some(crate::crd::image_cache::phase::CACHED) || (s.target == 0 && s.phase.is_some())
    })
}

fn rolled_out(d: &Deployment, want_cache: Option<&str>) -> bool {
    let (Some(spec), Some(st)) = (d.spec.as_ref(), d.status.as_ref()) else { return false };
    let replicas = spec.replicas.unwrap_or(1);
    let on_cache = d.annotations().get(MODEL_CACHE_ANNOTATION).map(String::as_str) == want_cache;
    on_cache
        && st.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0)
        && st.updated_replicas.unwrap_or(0) >= replicas
        && st.available_replicas.unwrap_or(0) >= replicas
        && st.replicas.unwrap_or(0) <= replicas
}

fn ssa() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Reconciles one InferenceEndpoint (finalizer-wrapped).
pub async fn reconcile(ie: Arc<InferenceEndpoint>, ctx: Arc<Context>) -> Result<Action> {
    let ns = ie.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let api: Api<InferenceEndpoint> = Api::namespaced(ctx.client.clone(), &ns);
    let result = finalizers::guard(
        &api,
        &*ie,
        FINALIZER,
        async |o| cleanup(o, &ctx).await,
        async |o| apply(&api, o, &ctx).await,
    )
    .await;
    result.inspect(|_| ctx.metrics.reconcile_ok(CONTROLLER))
}

async fn apply(api: &Api<InferenceEndpoint>, ie: &InferenceEndpoint, ctx: &Context) -> Result<Action> {
    let ns = ie.namespace().unwrap_or_default();
    let name = ie.name_any();
    let client = ctx.client.clone();
    let caches: Api<ModelCache> = Api::namespaced(client.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);

    // 1. Weights cache (owned; blocks the Deployment).
    let want_cache = match desired_cache_spec(ie).filter(|_| ie.spec.model.volume.is_none()) {
        Some(spec) => {
            let cname = cache_name(&name, &spec);
            let mut mc = ModelCache::new(&cname, spec);
            mc.metadata.namespace = Some(ns.clone());
            mc.metadata.labels = Some(labels(ie));
            mc.metadata.owner_references = Some(vec![owner(ie)?]);
            let applied = caches.patch(&cname, &ssa(), &Patch::Apply(&mc)).await?;
            Some((cname, applied))
        }
        None => None,
    };
    let weights_ready = want_cache.as_ref().is_none_or(|(_, mc)| cache_ready(Some(mc)));
    // Scale from zero: no node matches yet (a cluster autoscaler adds one only for a pending pod), so
    // the Deployment is created at once; its pods fetch on the cold node and the agent warms nodes as
    // they join.
    let no_targets = want_cache.as_ref().is_some_and(|(_, mc)| no_target_nodes(mc));

    // 2. Image cache (shared, reference-counted). A first Deployment never waits for it; an image
    //    change keeps the old image until the new one is on every target node.
    let image_cache =
        if ie.spec.model_cache_config.image_cache.enabled { Some(reference_image_cache(ie, ctx).await?) } else { None };

    // 3. Deployment: created once weights are ready; switched to a new cache only once it is ready.
    let existing = deployments.get_opt(&name).await?;
    let serving = existing.as_ref().and_then(|d| d.annotations().get(MODEL_CACHE_ANNOTATION).cloned());
    let want_name = want_cache.as_ref().map(|(n, _)| n.clone());
    let served_image = existing.as_ref().and_then(|d| d.annotations().get(IMAGE_ANNOTATION).cloned());
    let hold_image = match (&image_cache, &served_image) {
        (Some(ic), Some(old)) if *old != ie.spec.image => {
            let pulled = Api::<ImageCache>::namespaced(client.clone(), &ns).get_opt(ic).await?;
            (!image_pulled(pulled.as_ref())).then(|| old.clone())
        }
        _ => None,
    };
    let held;
    let (deploy_ie, deploy_ic) = match &hold_image {
        Some(old) => {
            let mut e = ie.clone();
            e.spec.image = old.clone();
            held = e;
            let ic = endpoint_image_cache(&held).0;
            (&held, Some(ic))
        }
        None => (ie, image_cache.clone()),
    };
    // The pods fetch exactly the version their cache pinned (once one node verified it).
    let want_pin = want_cache.as_ref().and_then(|(_, mc)| mc.pinned_version().map(str::to_string));
    let serving_pin = match &serving {
        Some(s) if Some(s) == want_name.as_ref() => want_pin.clone(),
        Some(s) => caches.get_opt(s).await?.and_then(|mc| mc.pinned_version().map(str::to_string)),
        None => None,
    };
    let current = match (&existing, weights_ready) {
        (_, true) => Some(
            apply_deployment(
                &deployments,
                existing.as_ref(),
                deploy_ie,
                want_name.as_deref(),
                want_pin.as_deref(),
                deploy_ic.as_deref(),
            )
            .await?,
        ),
        // New cache not ready yet: keep serving from the old one (image/replica changes still apply).
        (Some(_), false) if serving.is_some() => Some(
            apply_deployment(
                &deployments,
                existing.as_ref(),
                deploy_ie,
                serving.as_deref(),
                serving_pin.as_deref(),
                deploy_ic.as_deref(),
            )
            .await?,
        ),
        (Some(d), false) => Some(d.clone()),
        (None, false) if no_targets => Some(
            apply_deployment(
                &deployments,
                None,
                deploy_ie,
                want_name.as_deref(),
                want_pin.as_deref(),
                deploy_ic.as_deref(),
            )
            .await?,
        ),
        (None, false) => None,
    };

    // 4. Service and routing policy.
    Api::<Service>::namespaced(client.clone(), &ns).patch(&name, &ssa(), &Patch::Apply(&service(ie)?)).await?;
    if let Some(p) = routing_policy(ie)? {
        Api::<InferenceRoutingPolicy>::namespaced(client.clone(), &ns).patch(&name, &ssa(), &Patch::Apply(&p)).await?;
    }

    // 5. After the rollout onto the wanted cache and image: drop old caches and old image references.
    let on_image = |d: &Deployment| d.annotations().get(IMAGE_ANNOTATION) == Some(&ie.spec.image);
    let done = current.as_ref().is_some_and(|d| rolled_out(d, want_name.as_deref()) && on_image(d));
    if done {
        let owned = caches.list(&ListParams::default().labels(&format!("{ENDPOINT_LABEL}={name}"))).await?;
        for old in owned.items.iter().filter(|m| Some(m.name_any()) != want_name) {
            if old.owner_references().iter().any(|o| Some(&o.uid) == ie.uid().as_ref()) {
                tracing::info!(endpoint = %name, cache = %old.name_any(), "rollout complete; deleting the old model cache");
                caches.delete(&old.name_any(), &DeleteParams::default()).await?;
            }
        }
        release_image_caches(ie, ctx, image_cache.as_deref()).await?;
    }

    // 6. Status.
    let mc_failed = want_cache
        .as_ref()
        .is_some_and(|(_, mc)| mc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(model_cache::phase::FAILED));
    let ready_replicas =
        current.as_ref().and_then(|d| d.status.as_ref()).and_then(|s| s.available_replicas).unwrap_or(0);
    // Serving on the wanted cache already: a node joining (downloading) or failing degrades the endpoint,
    // it does not stop it serving.
    let serving_wanted = want_name.is_some()
        && current.as_ref().and_then(|d| d.annotations().get(MODEL_CACHE_ANNOTATION)) == want_name.as_ref();
    let degraded = match &want_cache {
        Some((_, mc)) if serving_wanted => mc.status.as_ref().map_or(0, |s| (s.target - s.ready).max(0)),
        _ => 0,
    };
    let (ph, ok, reason, msg) = if mc_failed && !serving_wanted {
        (
            phase::FAILED,
            false,
            "ModelCacheFailed",
            "the weights cache failed on a node; see the ModelCache status".to_string(),
        )
    } else if current.is_none() || (!weights_ready && !serving_wanted) {
        (
            phase::WAITING_FOR_WEIGHTS,
            false,
            "WaitingForWeights",
            format!("waiting for ModelCache {} on every target node", want_name.clone().unwrap_or_default()),
        )
    } else if done {
        let msg = if degraded > 0 {
            format!("{ready_replicas} replicas available; {degraded} target nodes do not hold the weights (pods there fetch at start)")
        } else {
            format!("{ready_replicas} replicas available")
        };
        (phase::READY, true, if degraded > 0 { "Degraded" } else { "RolledOut" }, msg)
    } else if let Some(old) = &hold_image {
        (
            phase::PROGRESSING,
            false,
            "WaitingForImage",
            format!("serving {old} until {} is pulled on every target node", ie.spec.image),
        )
    } else {
        (phase::PROGRESSING, false, "RollingOut", "Deployment rolling out".to_string())
    };
    let mut st: InferenceEndpointStatus = ie.status.clone().unwrap_or_default();
    st.phase = Some(ph.into());
    st.model_cache = want_name.clone();
    st.serving_model_cache = current.as_ref().and_then(|d| d.annotations().get(MODEL_CACHE_ANNOTATION).cloned());
    st.image_cache = image_cache;
    st.ready_replicas = ready_replicas;
    st.degraded_nodes = degraded;
    st.serving_image = current.as_ref().and_then(|d| d.annotations().get(IMAGE_ANNOTATION).cloned());
    st.observed_generation = ie.meta().generation;
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    conditions::upsert(
        &mut st.conditions,
        conditions::new(conditions::READY, ok, reason, msg, ie.meta().generation, &now),
    );
    if ie.status.as_ref() != Some(&st) {
        let patch = json!({ "apiVersion": "warmpath.dev/v1alpha1", "kind": "InferenceEndpoint", "status": st });
        api.patch_status(&name, &ssa(), &Patch::Apply(&patch)).await?;
    }
    Ok(Action::requeue(Duration::from_secs(if ph == phase::READY { 300 } else { 10 })))
}

/// Annotation holding the sha256 of the applied Deployment: an unchanged desired state is not re-applied
/// (no write, no generation bump, so "rolled out" stays observable).
pub const SPEC_HASH_ANNOTATION: &str = "warmpath.dev/spec-hash";

async fn apply_deployment(
    api: &Api<Deployment>,
    existing: Option<&Deployment>,
    ie: &InferenceEndpoint,
    cache: Option<&str>,
    pin: Option<&str>,
    image_cache: Option<&str>,
) -> Result<Deployment> {
    let mut d = deployment(ie, cache, pin, image_cache)?;
    let hash = hex::encode(Sha256::digest(serde_json::to_vec(&d)?));
    if let Some(e) = existing.filter(|e| e.annotations().get(SPEC_HASH_ANNOTATION) == Some(&hash)) {
        return Ok(e.clone());
    }
    d.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(SPEC_HASH_ANNOTATION.into(), hash);
    Ok(api.patch(&ie.name_any(), &ssa(), &Patch::Apply(&d)).await?)
}

/// The shared ImageCache an endpoint uses: keyed by image *and* target node set (node selector, pull
/// secrets), so endpoints that run the same image on different nodes each get their nodes pre-pulled.
/// `img-<16 hex>` of sha256(image) alone when the endpoint has neither, else of the three together.
pub fn endpoint_image_cache(ie: &InferenceEndpoint) -> (String, ImageCacheSpec) {
    let spec = ImageCacheSpec {
        image: ie.spec.image.clone(),
        image_pull_secrets: ie.spec.image_pull_secrets.clone(),
        node_selector: ie.spec.node_selector.clone(),
        command: vec![],
    };
    let key = if spec.node_selector.is_empty() && spec.image_pull_secrets.is_empty() {
        spec.image.clone()
    } else {
        json!({"image": spec.image, "nodeSelector": spec.node_selector, "imagePullSecrets": spec.image_pull_secrets})
            .to_string()
    };
    (image_cache_name(&key), spec)
}

/// Ensures the ImageCache for the endpoint's image exists and lists the endpoint as an owner
/// (non-controller) reference. Returns its name.
async fn reference_image_cache(ie: &InferenceEndpoint, ctx: &Context) -> Result<String> {
    let ns = ie.namespace().unwrap_or_default();
    let api: Api<ImageCache> = Api::namespaced(ctx.client.clone(), &ns);
    let (name, spec) = endpoint_image_cache(ie);
    let mut me = owner(ie)?;
    me.controller = Some(false);
    me.block_owner_deletion = Some(false);
    for _attempt in 0..5 {
        match api.get_opt(&name).await? {
            None => {
                let mut ic = ImageCache::new(&name, spec.clone());
                ic.metadata.namespace = Some(ns.clone());
                ic.metadata.labels =
                    Some(BTreeMap::from([(MANAGED_LABEL.to_string(), MANAGED_BY_ENDPOINTS.to_string())]));
                ic.metadata.owner_references = Some(vec![me.clone()]);
                match api.create(&PostParams::default(), &ic).await {
                    Ok(_) => return Ok(name),
                    Err(kube::Error::Api(e)) if e.code == 409 => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            Some(mut ic) => {
                if ic.owner_references().iter().any(|o| o.uid == me.uid) {
                    return Ok(name);
                }
                ic.metadata.owner_references.get_or_insert_with(Vec::new).push(me.clone());
                // Optimistic concurrency: the resourceVersion makes a concurrent edit fail with 409; retry.
                match api.replace(&name, &PostParams::default(), &ic).await {
                    Ok(_) => return Ok(name),
                    Err(kube::Error::Api(e)) if e.code == 409 => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Err(Error::InvalidSpec(format!("could not reference ImageCache {name}: too many concurrent updates")))
}

/// Removes the endpoint's reference from every ImageCache except `keep`; an ImageCache the
/// controller created is deleted when its last reference goes.
async fn release_image_caches(ie: &InferenceEndpoint, ctx: &Context, keep: Option<&str>) -> Result<()> {
    let ns = ie.namespace().unwrap_or_default();
    let api: Api<ImageCache> = Api::namespaced(ctx.client.clone(), &ns);
    let uid = ie.uid().ok_or(Error::MissingField("metadata.uid"))?;
    for mut ic in api.list(&ListParams::default()).await?.items {
        if Some(ic.name_any().as_str()) == keep || !ic.owner_references().iter().any(|o| o.uid == uid) {
            continue;
        }
        ic.metadata.owner_references.get_or_insert_with(Vec::new).retain(|o| o.uid != uid);
        let managed = ic.labels().get(MANAGED_LABEL).map(String::as_str) == Some(MANAGED_BY_ENDPOINTS);
        if managed && ic.owner_references().is_empty() {
            tracing::info!(image_cache = %ic.name_any(), "last reference released; deleting");
            api.delete(&ic.name_any(), &DeleteParams::default()).await?;
        } else {
            api.replace(&ic.name_any(), &PostParams::default(), &ic).await?;
        }
    }
    Ok(())
}

/// On deletion: release image references (the owned Deployment, Service, policy and ModelCaches go
/// through garbage collection; the ModelCaches' own finalizers clean the nodes).
async fn cleanup(ie: &InferenceEndpoint, ctx: &Context) -> Result<Action> {
    release_image_caches(ie, ctx, None).await?;
    let ns = ie.namespace().unwrap_or_default();
    let caches: Api<ModelCache> = Api::namespaced(ctx.client.clone(), &ns);
    let uid = ie.uid();
    for mc in caches.list(&ListParams::default().labels(&format!("{ENDPOINT_LABEL}={}", ie.name_any()))).await?.items {
        if mc.owner_references().iter().any(|o| Some(&o.uid) == uid.as_ref()) && mc.meta().deletion_timestamp.is_none()
        {
            caches.delete(&mc.name_any(), &DeleteParams::default()).await?;
        }
    }
    Ok(Action::await_change())
}

/// Error policy: count, log, retry in 30 s.
pub fn error_policy(_ie: Arc<InferenceEndpoint>, err: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(controller = CONTROLLER, error = %err, "reconcile failed");
    ctx.metrics.reconcile_error(CONTROLLER, err);
    Action::requeue(Duration::from_secs(30))
}

/// Runs the InferenceEndpoint controller: owns ModelCaches, Deployments, Services and routing
/// policies; ImageCaches (shared, non-controller references) map back to every referencing endpoint.
pub async fn run(ctx: Arc<Context>) {
    let c = ctx.client.clone();
    Controller::new(Api::<InferenceEndpoint>::all(c.clone()), watcher::Config::default())
        .owns(Api::<ModelCache>::all(c.clone()), watcher::Config::default())
        .owns(Api::<Deployment>::all(c.clone()), watcher::Config::default().labels(ENDPOINT_LABEL))
        .owns(Api::<Service>::all(c.clone()), watcher::Config::default().labels(ENDPOINT_LABEL))
        .owns(Api::<InferenceRoutingPolicy>::all(c.clone()), watcher::Config::default().labels(ENDPOINT_LABEL))
        .watches(Api::<ImageCache>::all(c), watcher::Config::default(), |ic: ImageCache| {
            let ns = ic.namespace();
            ic.owner_references()
                .iter()
                .filter(|o| o.kind == "InferenceEndpoint")
                .map(|o| ObjectRef::<InferenceEndpoint>::new(&o.name).within(ns.as_deref().unwrap_or_default()))
                .collect::<Vec<_>>()
        })
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}
