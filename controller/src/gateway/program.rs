//! The pipeline shared by the policy and annotation reconcilers: resolve the HTTPRoute, its
//! Gateways (and their provider) and the backend; render; apply with server-side apply; sweep
//! objects of the same owner that are no longer wanted.

use std::collections::{BTreeMap, BTreeSet};

use gateway_api::apis::standard::httproutes::HttpRoute;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::DynamicObject;
use kube::ResourceExt;

use super::source::Source;
use crate::conditions::{self, reason, ACCEPTED, PROGRAMMED, RESOLVED_REFS};
use crate::crd::routing_policy::{
    AncestorRef, PolicyAncestorStatus, CONTROLLER_NAME, GATEWAY_API_GROUP, INFERENCE_POOL_GROUP,
};
use crate::reconcile::{Context, ControllerConfig, FeedSource};
use crate::render::{self, GatewayRef, Owner, Provider, RenderInput, ResolvedBackend, XdsNameScheme, LABEL_OWNER_UID};
use crate::routing::RoutingIntent;
use crate::{foreign, Result};

/// What resolving + rendering one targeted HTTPRoute produced.
#[derive(Debug, Default)]
pub struct TargetOutcome {
    /// Status entries (one per Gateway, or one for the route when it cannot be resolved).
    pub ancestors: Vec<PolicyAncestorStatus>,
    /// Objects to apply (empty when something did not resolve).
    pub objects: Vec<DynamicObject>,
    /// Feed source, when the backend resolved.
    pub feed: Option<FeedSource>,
}

/// Identity of an object for sweeps: (kind, namespace, name).
pub type ObjectKey = (String, String, String);

/// Key of a rendered object.
pub fn key_of(o: &DynamicObject) -> ObjectKey {
    (
        o.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default(),
        o.metadata.namespace.clone().unwrap_or_default(),
        o.metadata.name.clone().unwrap_or_default(),
    )
}

/// Merges objects with the same key: one owner's routes on one Gateway each render the Gateway's
/// `EnvoyPatchPolicy` (same name), whose `jsonPatches` are united in order without repeats (the
/// feed cluster is added once); other kinds with the same key are identical and kept once.
pub fn merge_same_key(objects: Vec<DynamicObject>) -> Vec<DynamicObject> {
    let mut out: Vec<DynamicObject> = vec![];
    for o in objects {
        let Some(prev) = out.iter_mut().find(|p| key_of(p) == key_of(&o)) else {
            out.push(o);
            continue;
        };
        if let (Some(have), Some(more)) =
            (prev.data["spec"]["jsonPatches"].as_array().cloned(), o.data["spec"]["jsonPatches"].as_array())
        {
            let mut merged = have;
            for p in more {
                if !merged.contains(p) {
                    merged.push(p.clone());
                }
            }
            prev.data["spec"]["jsonPatches"] = serde_json::Value::Array(merged);
        }
    }
    out.sort_by_key(key_of);
    out
}

/// Ancestor entry with the three policy conditions.
pub fn ancestor(
    aref: AncestorRef,
    conds: [(bool, &str, String); 3],
    generation: Option<i64>,
    now: &Time,
) -> PolicyAncestorStatus {
    let [a, r, p] = conds;
    PolicyAncestorStatus {
        ancestor_ref: aref,
        controller_name: CONTROLLER_NAME.into(),
        conditions: vec![
            conditions::new(ACCEPTED, a.0, a.1, a.2, generation, now),
            conditions::new(RESOLVED_REFS, r.0, r.1, r.2, generation, now),
            conditions::new(PROGRAMMED, p.0, p.1, p.2, generation, now),
        ],
    }
}

/// Ancestor reference naming an HTTPRoute (used when its Gateways are unknown).
pub fn route_ref(ns: &str, name: &str) -> AncestorRef {
    AncestorRef {
        group: GATEWAY_API_GROUP.into(),
        kind: "HTTPRoute".into(),
        namespace: Some(ns.into()),
        name: name.into(),
        section_name: None,
    }
}

fn gateway_ref(gw: &GatewayRef) -> AncestorRef {
    AncestorRef {
        group: GATEWAY_API_GROUP.into(),
        kind: "Gateway".into(),
        namespace: Some(gw.namespace.clone()),
        name: gw.name.clone(),
        section_name: None,
    }
}

fn not_programmed() -> (bool, &'static str, String) {
    (false, reason::PENDING, "nothing written: see Accepted / ResolvedRefs".into())
}

/// Resolves one targeted HTTPRoute and renders its objects. API errors propagate; every user
/// error (missing route, Gateway, backend, unknown provider) becomes an ancestor condition.
#[allow(clippy::too_many_arguments)]
pub async fn resolve_and_render(
    src: Source<'_>,
    config: &ControllerConfig,
    owner: &Owner,
    intent: &RoutingIntent,
    route_ns: &str,
    route_name: &str,
    feed_path: &str,
    generation: Option<i64>,
    now: &Time,
) -> Result<TargetOutcome> {
    let mut out = TargetOutcome::default();
    let Some(route) = src.route(route_ns, route_name).await? else {
        out.ancestors.push(ancestor(
            route_ref(route_ns, route_name),
            [
                (false, reason::TARGET_NOT_FOUND, format!("HTTPRoute {route_ns}/{route_name} not found")),
                (false, reason::TARGET_NOT_FOUND, format!("HTTPRoute {route_ns}/{route_name} not found")),
                not_programmed(),
            ],
            generation,
            now,
        ));
        return Ok(out);
    };

    // Gateways the route attaches to, with their provider.
    let mut gateways: Vec<(GatewayRef, std::result::Result<Provider, String>)> = vec![];
    // Gateway → its parentRefs' (sectionName, port) selectors; `None` in either part matches any listener.
    let mut parents: BTreeMap<(String, String), Vec<ListenerSelector>> = BTreeMap::new();
    for p in route.spec.parent_refs.iter().flatten().filter(|p| {
        p.kind.as_deref().unwrap_or("Gateway") == "Gateway"
            && p.group.as_deref().unwrap_or(GATEWAY_API_GROUP) == GATEWAY_API_GROUP
    }) {
        let key = (p.namespace.clone().unwrap_or_else(|| route_ns.to_string()), p.name.clone());
        parents.entry(key).or_default().push((p.section_name.clone(), p.port));
    }
    for ((namespace, name), selectors) in parents {
        let mut gw = GatewayRef { namespace, name, listeners: vec![], route_configs: vec![] };
        let mut provider = provider_of(src, config, &gw).await?;
        if provider == Ok(Provider::EnvoyGateway) {
            match xds_listeners(src, &gw, &selectors, config.xds_name_scheme).await? {
                Ok((listeners, route_configs)) => (gw.listeners, gw.route_configs) = (listeners, route_configs),
                Err(msg) => provider = Err(msg),
            }
        }
        gateways.push((gw, provider));
    }
    if gateways.is_empty() {
        out.ancestors.push(ancestor(
            route_ref(route_ns, route_name),
            [
                (
                    false,
                    reason::TARGET_NOT_FOUND,
                    format!("HTTPRoute {route_ns}/{route_name} has no Gateway parentRefs"),
                ),
                (false, reason::TARGET_NOT_FOUND, "no Gateway to attach to".into()),
                not_programmed(),
            ],
            generation,
            now,
        ));
        return Ok(out);
    }

    // Several backends (a weighted canary split): one feed cannot cover them, and the route-wide
    // load-balancer policy would change the canary's traffic too. Refused, with what to do.
    if let Some(msg) = several_backends(&route, route_ns) {
        for (gw, _) in &gateways {
            out.ancestors.push(ancestor(
                gateway_ref(gw),
                [
                    (true, reason::ACCEPTED, "policy accepted".into()),
                    (false, reason::MULTIPLE_BACKENDS, msg.clone()),
                    not_programmed(),
                ],
                generation,
                now,
            ));
        }
        return Ok(out);
    }
    // Backend: explicit, else the route's first backendRef.
    let backend = resolve_backend(src, intent, &route, route_ns).await?;
    // Envoy Gateway attaches one BackendTrafficPolicy and one EnvoyExtensionPolicy per route: a
    // user's own on this route would lose to ours or displace it, silently. Refused, with what to do.
    let user_policies = if gateways.iter().any(|(_, p)| *p == Ok(Provider::EnvoyGateway)) {
        src.user_policies_on_route(route_ns, route_name, route.labels()).await?
    } else {
        vec![]
    };
    let resolved = |b: &std::result::Result<ResolvedBackend, String>| match b {
        Ok(_) => (true, reason::RESOLVED, "route, gateway and backend resolved".to_string()),
        Err(msg) => (false, reason::BACKEND_NOT_FOUND, msg.clone()),
    };

    for (gw, provider) in &gateways {
        let aref = gateway_ref(gw);
        let entry = match (provider, &backend) {
            (Err(msg), _) => ancestor(
                aref,
                [(false, reason::UNSUPPORTED_PROVIDER, msg.clone()), resolved(&backend), not_programmed()],
                generation,
                now,
            ),
            (_, Err(msg)) => ancestor(
                aref,
                [
                    (true, reason::ACCEPTED, "policy accepted".into()),
                    (false, reason::BACKEND_NOT_FOUND, msg.clone()),
                    not_programmed(),
                ],
                generation,
                now,
            ),
            (Ok(Provider::EnvoyGateway), Ok(_)) if !user_policies.is_empty() => {
                let msg = format!(
                    "HTTPRoute {route_ns}/{route_name} already has {}: Envoy Gateway attaches one BackendTrafficPolicy and one EnvoyExtensionPolicy per route \
                     (the older wins), so warmpath writes nothing here. Merge: add warmpath's settings to yours (BackendTrafficPolicy \
                     spec.loadBalancer with endpointOverride from header x-gateway-destination-endpoint; see docs/controller.md), or move \
                     your settings to a policy targeting the Gateway",
                    user_policies.join(", ")
                );
                ancestor(
                    aref,
                    [(false, reason::CONFLICTED, msg), resolved(&backend), not_programmed()],
                    generation,
                    now,
                )
            }
            (Ok(provider), Ok(backend)) => {
                let input = RenderInput {
                    owner,
                    route_namespace: route_ns,
                    route_name,
                    gateways: std::slice::from_ref(gw),
                    provider: *provider,
                    intent,
                    backend,
                    wasm: &config.wasm,
                    controller: &config.controller,
                    feed_path,
                };
                match render::render(&input) {
                    Ok(objs) => {
                        out.objects.extend(objs);
                        ancestor(
                            aref,
                            [
                                (
                                    true,
                                    reason::ACCEPTED,
                                    format!("strategy {} on {:?}", intent.strategy.as_str(), provider),
                                ),
                                (true, reason::RESOLVED, "route, gateway and backend resolved".into()),
                                (true, reason::PROGRAMMED, "objects applied".into()),
                            ],
                            generation,
                            now,
                        )
                    }
                    Err(msg) => ancestor(
                        aref,
                        [(false, reason::INVALID, msg), resolved(&Ok(backend.clone())), not_programmed()],
                        generation,
                        now,
                    ),
                }
            }
        };
        out.ancestors.push(entry);
    }
    // Envoy Gateway objects that target the route (not a Gateway) are identical per Gateway.
    out.objects.sort_by_key(key_of);
    out.objects.dedup_by(|a, b| key_of(a) == key_of(b));
    if let Ok(backend) = backend {
        out.feed = Some(FeedSource { backend, load: intent.load.clone() });
    }
    Ok(out)
}

/// `Some(message)` when the route's rules name more than one distinct backend.
fn several_backends(route: &HttpRoute, route_ns: &str) -> Option<String> {
    let mut seen: Vec<String> = vec![];
    for br in route.spec.rules.iter().flatten().flat_map(|r| r.backend_refs.iter().flatten()) {
        let id = format!(
            "{} {}/{}{}",
            br.kind.as_deref().unwrap_or("Service"),
            br.namespace.as_deref().unwrap_or(route_ns),
            br.name,
            br.port.map(|p| format!(":{p}")).unwrap_or_default()
        );
        if !seen.contains(&id) {
            seen.push(id);
        }
    }
    (seen.len() > 1).then(|| {
        format!(
            "the HTTPRoute names {} backends ({}); warmpath routes one backend per route (one endpoint feed, one load-balancer policy for the whole route, \
             which would also change the other backends' traffic). Put the other backends (e.g. a canary) on their own HTTPRoute, or drop them",
            seen.len(),
            seen.join(", ")
        )
    })
}

/// A parentRef's listener selection: (`sectionName`, `port`); `None` matches any listener.
type ListenerSelector = (Option<String>, Option<i32>);

/// Envoy Gateway: the names of the xDS listeners that serve the route, one per port, and of the route
/// configurations that hold its xDS routes (see [`GatewayRef::listeners`] and [`GatewayRef::route_configs`]),
/// under `scheme`: of the `HTTP`/`HTTPS` listeners that one of the route's parentRefs selects (by `sectionName`
/// and/or `port`, as Gateway API defines them; neither set = every listener). Envoy Gateway merges the Gateway's
/// listeners on one port into one xDS listener; plain `HTTP` listeners on a port also share one route
/// configuration, while each `HTTPS` listener has a filter chain and a route configuration of its own.
async fn xds_listeners(
    src: Source<'_>,
    gw: &GatewayRef,
    selectors: &[ListenerSelector],
    scheme: XdsNameScheme,
) -> Result<std::result::Result<(Vec<String>, Vec<String>), String>> {
    let Some(gateway) = src.gateway(&gw.namespace, &gw.name).await? else {
        return Ok(Err(format!("Gateway {}/{} not found", gw.namespace, gw.name)));
    };
    let all = &gateway.spec.listeners;
    let (mut listeners, mut route_configs): (Vec<String>, Vec<String>) = (vec![], vec![]);
    let selected = |l: &&gateway_api::apis::standard::gateways::GatewayListeners| {
        selectors
            .iter()
            .any(|(section, port)| section.as_ref().is_none_or(|s| s == &l.name) && port.is_none_or(|p| p == l.port))
    };
    for l in all.iter().filter(|l| matches!(l.protocol.as_str(), "HTTP" | "HTTPS")).filter(selected) {
        let first_on_port = all.iter().find(|o| o.port == l.port).map_or(&l.name, |o| &o.name);
        let listener = scheme.listener(&gw.namespace, &gw.name, first_on_port, l.port);
        if !listeners.contains(&listener) {
            listeners.push(listener);
        }
        let https = l.protocol == "HTTPS";
        let route_config = scheme.route_config(&gw.namespace, &gw.name, &l.name, first_on_port, l.port, https);
        if !route_configs.contains(&route_config) {
            route_configs.push(route_config);
        }
    }
    if listeners.is_empty() {
        return Ok(Err(format!(
            "Gateway {}/{} has no HTTP or HTTPS listener this route attaches to",
            gw.namespace, gw.name
        )));
    }
    Ok(Ok((listeners, route_configs)))
}

/// The provider of Gateway `gw`, from its GatewayClass's `controllerName`. An explicit `provider`
/// setting is still checked against it: a class implemented by the *other* supported provider is
/// refused (its data plane would ignore the objects); a controllerName warmpath does not know (e.g. an
/// Envoy Gateway configured with its own `controllerName`) is what the explicit setting is for.
async fn provider_of(
    src: Source<'_>,
    config: &ControllerConfig,
    gw: &GatewayRef,
) -> Result<std::result::Result<Provider, String>> {
    Ok(match (config.provider, class_provider(src, gw).await?) {
        (_, ClassProvider::Missing(msg)) => Err(msg),
        (None, ClassProvider::Known(d)) => Ok(d),
        (None, ClassProvider::Foreign(msg)) => Err(msg),
        (Some(p), ClassProvider::Known(d)) if d != p => Err(format!(
            "Gateway {}/{} is served by {d:?} (its GatewayClass's controllerName), but the controller is set to provider {p:?}: \
             nothing would program this gateway; set the chart value provider to auto or to that gateway's provider",
            gw.namespace, gw.name
        )),
        (Some(p), _) => Ok(p),
    })
}

/// What a Gateway's GatewayClass says about its provider.
enum ClassProvider {
    /// Envoy Gateway or Istio, by `controllerName`.
    Known(Provider),
    /// A `controllerName` warmpath does not know (message says which).
    Foreign(String),
    /// The Gateway or its GatewayClass does not exist (message says which).
    Missing(String),
}

async fn class_provider(src: Source<'_>, gw: &GatewayRef) -> Result<ClassProvider> {
    let Some(gateway) = src.gateway(&gw.namespace, &gw.name).await? else {
        return Ok(ClassProvider::Missing(format!("Gateway {}/{} not found", gw.namespace, gw.name)));
    };
    let class = &gateway.spec.gateway_class_name;
    let Some(gc) = src.gateway_class(class).await? else {
        return Ok(ClassProvider::Missing(format!("GatewayClass {class} not found")));
    };
    Ok(match Provider::from_controller_name(&gc.spec.controller_name) {
        Some(p) => ClassProvider::Known(p),
        None => ClassProvider::Foreign(format!(
            "GatewayClass {class} is implemented by {:?}; warmpath supports Envoy Gateway and Istio (set the chart value provider to use it anyway)",
            gc.spec.controller_name
        )),
    })
}

async fn resolve_backend(
    src: Source<'_>,
    intent: &RoutingIntent,
    route: &HttpRoute,
    route_ns: &str,
) -> Result<std::result::Result<ResolvedBackend, String>> {
    let wanted = if let Some(b) = &intent.backend {
        match (&b.service, &b.inference_pool) {
            (Some(s), _) => ResolvedBackend::Service {
                namespace: route_ns.into(),
                name: s.name.clone(),
                port: s.port.clamp(1, 65535) as u16,
            },
            (None, Some(p)) => ResolvedBackend::InferencePool { namespace: route_ns.into(), name: p.name.clone() },
            (None, None) => return Ok(Err("backend needs exactly one of service or inferencePool".into())),
        }
    } else {
        let first = route.spec.rules.iter().flatten().flat_map(|r| r.backend_refs.iter().flatten()).next();
        let Some(br) = first else {
            return Ok(Err("no backend: set spec.backend or give the HTTPRoute a backendRef".into()));
        };
        let ns = br.namespace.clone().unwrap_or_else(|| route_ns.to_string());
        match (br.group.as_deref().unwrap_or(""), br.kind.as_deref().unwrap_or("Service")) {
            ("", "Service") => match br.port {
                Some(port) => {
                    ResolvedBackend::Service { namespace: ns, name: br.name.clone(), port: port.clamp(1, 65535) as u16 }
                }
                None => return Ok(Err(format!("backendRef Service {} has no port", br.name))),
            },
            (INFERENCE_POOL_GROUP, "InferencePool") => {
                ResolvedBackend::InferencePool { namespace: ns, name: br.name.clone() }
            }
            (g, k) => return Ok(Err(format!("backendRef kind {k} (group {g:?}) is not a Service or InferencePool"))),
        }
    };
    Ok(if src.backend_exists(&wanted).await? {
        Ok(wanted)
    } else {
        let (kind, ns, name) = match &wanted {
            ResolvedBackend::Service { namespace, name, .. } => ("Service", namespace, name),
            ResolvedBackend::InferencePool { namespace, name } => ("InferencePool", namespace, name),
        };
        Err(format!("backend {kind} {ns}/{name} not found"))
    })
}

/// Server-side applies every object with the controller's fixed field manager (forced, so a
/// restarted controller takes its own fields back instead of creating anything new).
pub async fn apply_all(ctx: &Context, objects: &[DynamicObject]) -> Result<()> {
    let pp = PatchParams::apply(crate::FIELD_MANAGER).force();
    for o in objects {
        let (kind, ns, name) = key_of(o);
        let ar = foreign::owned_kinds()
            .into_iter()
            .find(|ar| ar.kind == kind)
            .ok_or_else(|| crate::Error::InvalidSpec(format!("unexpected kind {kind}")))?;
        Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &ns, &ar).patch(&name, &pp, &Patch::Apply(o)).await?;
    }
    Ok(())
}

/// Deletes every object labelled with `owner_uid` that is not in `keep`. Returns how many were
/// deleted. Only the configured provider's kinds are listed (its RBAC covers no others), and kinds
/// whose CRD is not installed (auto mode, one provider present) are skipped.
pub async fn sweep(ctx: &Context, owner_uid: &str, keep: &BTreeSet<ObjectKey>) -> Result<usize> {
    let lp = ListParams::default().labels(&format!("{LABEL_OWNER_UID}={owner_uid}"));
    let mut deleted = 0;
    for ar in foreign::owned_kinds_for(ctx.config.provider) {
        let api = Api::<DynamicObject>::all_with(ctx.client.clone(), &ar);
        let list = match api.list(&lp).await {
            Ok(l) => l,
            Err(kube::Error::Api(e)) if e.code == 404 => continue,
            Err(e) => return Err(e.into()),
        };
        for o in list.items {
            let key = (ar.kind.clone(), o.namespace().unwrap_or_default(), o.name_any());
            if keep.contains(&key) {
                continue;
            }
            let ns_api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &key.1, &ar);
            match ns_api.delete(&key.2, &DeleteParams::default()).await {
                Ok(_) => deleted += 1,
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(deleted)
}
