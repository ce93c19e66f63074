//! What Envoy Gateway says about the objects warmpath wrote, mirrored into warmpath's own status, so
//! that `Programmed=True` means what Gateway API means by it ("the data plane is configured"), not
//! "the objects were written".
//!
//! Envoy Gateway writes Gateway API `PolicyStatus` on its policies (`status.ancestors[]`, one entry per
//! Gateway, `controllerName: gateway.envoyproxy.io/gatewayclass-controller`, conditions by type):
//! - `EnvoyExtensionPolicy` / `BackendTrafficPolicy`: `Accepted` (False with reason `Conflicted` when
//!   another policy of the same kind already attaches to the route: the older one wins);
//! - `EnvoyPatchPolicy`: `Accepted` (False with reason `Disabled` when EnvoyPatchPolicy is off in
//!   recent releases) and `Programmed` (False with `Invalid` or `ResourceNotFound` when a patch does not
//!   apply, e.g. Envoy Gateway's `XDSNameSchemeV2` flag is not what the controller's `envoyGateway.xdsNameScheme`
//!   setting says). Under `mergeGateways`, `Accepted` False with reason `Invalid` under a `GatewayClass`
//!   ancestor (see `eg_conditions`). Older
//!   releases with EnvoyPatchPolicy disabled write no status at all.
//!
//! Sources: Envoy Gateway `api/v1alpha1/envoypatchpolicy_types.go` (`PolicyConditionProgrammed`,
//! `PolicyReasonDisabled`) and `internal/gatewayapi/backendtrafficpolicy.go` ("another
//! BackendTrafficPolicy has already attached to it", reason `Conflicted`).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ListParams};
use kube::core::DynamicObject;
use kube::ResourceExt;
use serde_json::Value;

use crate::conditions::{self, reason, PROGRAMMED};
use crate::crd::routing_policy::PolicyAncestorStatus;
use crate::reconcile::Context;
use crate::render::LABEL_OWNER_UID;
use crate::{foreign, Result};

/// Envoy Gateway's `controllerName` in the status entries it writes.
pub const EG_CONTROLLER_NAME: &str = "gateway.envoyproxy.io/gatewayclass-controller";

/// An `EnvoyPatchPolicy` without any status from Envoy Gateway this long after it was created is
/// taken for "EnvoyPatchPolicy is disabled" (Envoy Gateway translates within seconds).
pub const EPP_STATUS_BOUND: Duration = Duration::from_secs(60);

/// Re-read status this often while Envoy Gateway has not reported on everything yet.
pub const PENDING_REQUEUE: Duration = Duration::from_secs(10);

/// Reasons of the mirrored `Programmed` condition (besides Envoy Gateway's own reasons, which are
/// copied as they are).
pub mod mirrored {
    /// Envoy Gateway has not reported status on every object yet.
    pub const AWAITING_GATEWAY: &str = "AwaitingGatewayStatus";
    /// No status on the `EnvoyPatchPolicy` within [`super::EPP_STATUS_BOUND`].
    pub const PATCH_POLICY_DISABLED: &str = "EnvoyPatchPolicyDisabled";
}

/// The verdict for one Gateway: `(status, reason, message)` of its `Programmed` condition.
pub type Verdict = (bool, String, String);

/// Reads back the Envoy Gateway objects in `applied` and rewrites the `Programmed` condition of
/// every Gateway ancestor that was programmed (`Programmed=True` from the render step) with what
/// Envoy Gateway reports. Returns how soon to look again (`Some` while a report is pending).
pub async fn mirror(
    ctx: &Context,
    applied: &[DynamicObject],
    ancestors: &mut [PolicyAncestorStatus],
    generation: Option<i64>,
    now: &Time,
) -> Result<Option<Duration>> {
    if !ctx.config.live_status {
        return Ok(None);
    }
    let mut live = vec![];
    for o in applied {
        let kind = o.types.as_ref().map(|t| t.kind.as_str()).unwrap_or_default();
        let Some(ar) = eg_kinds().into_iter().find(|ar| ar.kind == kind) else { continue };
        let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &o.namespace().unwrap_or_default(), &ar);
        if let Some(obj) = api.get_opt(&o.name_any()).await? {
            live.push((kind.to_string(), obj));
        }
    }
    if live.is_empty() {
        return Ok(None);
    }
    let mut requeue = None;
    for a in ancestors.iter_mut().filter(|a| a.ancestor_ref.kind == "Gateway") {
        if !conditions::is_true(&a.conditions, PROGRAMMED) {
            continue;
        }
        let gw_ns = a.ancestor_ref.namespace.clone().unwrap_or_default();
        let (ok, why, msg) = verdict(&live, &gw_ns, &a.ancestor_ref.name, now.0);
        if why == mirrored::AWAITING_GATEWAY {
            requeue = Some(PENDING_REQUEUE);
        }
        conditions::upsert(&mut a.conditions, conditions::new(PROGRAMMED, ok, &why, msg, generation, now));
    }
    Ok(requeue)
}

fn eg_kinds() -> Vec<kube::core::ApiResource> {
    vec![foreign::envoy_extension_policy(), foreign::backend_traffic_policy(), foreign::envoy_patch_policy()]
}

/// Envoy Gateway's conditions on `obj` for Gateway `gw_ns/gw`, current for the object's
/// generation; `None` when it has written none (yet).
///
/// Under `mergeGateways` Envoy Gateway takes an `EnvoyPatchPolicy`'s target name as a GatewayClass's
/// (`internal/gatewayapi/envoypatchpolicy.go`): it finds none named like the Gateway and writes its refusal under
/// a `GatewayClass` ancestor of that name, which counts here as the Gateway's, so that the refusal is reported
/// instead of a missing status.
fn eg_conditions<'a>(obj: &'a DynamicObject, gw_ns: &str, gw: &str) -> Option<Vec<&'a Value>> {
    let generation = obj.metadata.generation;
    let entry = obj.data["status"]["ancestors"].as_array()?.iter().find(|a| {
        let r = &a["ancestorRef"];
        let ns = r["namespace"].as_str().unwrap_or(obj.metadata.namespace.as_deref().unwrap_or_default());
        a["controllerName"] == EG_CONTROLLER_NAME
            && r["name"] == gw
            && match r["kind"].as_str().unwrap_or("Gateway") {
                "Gateway" => ns == gw_ns,
                "GatewayClass" => true,
                _ => false,
            }
    })?;
    let conds: Vec<&Value> = entry["conditions"]
        .as_array()?
        .iter()
        .filter(|c| generation.is_none() || c["observedGeneration"].as_i64().is_none_or(|g| Some(g) >= generation))
        .collect();
    (!conds.is_empty()).then_some(conds)
}

fn find<'a>(conds: &[&'a Value], type_: &str) -> Option<&'a Value> {
    conds.iter().copied().find(|c| c["type"] == type_)
}

fn text(c: &Value, field: &str) -> String {
    c[field].as_str().unwrap_or_default().to_string()
}

/// What to do when Envoy Gateway refused one of warmpath's objects, by kind and reason.
fn hint(kind: &str, reason: &str) -> &'static str {
    match (kind, reason) {
        ("EnvoyPatchPolicy", "Disabled") => "; EnvoyPatchPolicy looks disabled: enable `extensionApis.enableEnvoyPatchPolicy` in Envoy Gateway's configuration",
        ("BackendTrafficPolicy" | "EnvoyExtensionPolicy", "Conflicted") => {
            "; Envoy Gateway attaches one policy of each kind per HTTPRoute (the older wins): merge the settings into one object, or move yours to a policy targeting the Gateway"
        }
        _ => "",
    }
}

/// The `Programmed` verdict for Gateway `gw_ns/gw` from the live objects `(kind, object)`, at `now`.
pub fn verdict(live: &[(String, DynamicObject)], gw_ns: &str, gw: &str, now: Timestamp) -> Verdict {
    let mut pending = vec![];
    for (kind, o) in live {
        let id = format!("{kind} {}/{}", o.namespace().unwrap_or_default(), o.name_any());
        // The EnvoyPatchPolicy is per Gateway: another Gateway's is not this one's business.
        if kind == "EnvoyPatchPolicy"
            && (o.namespace().as_deref() != Some(gw_ns) || o.data["spec"]["targetRef"]["name"] != gw)
        {
            continue;
        }
        let Some(conds) = eg_conditions(o, gw_ns, gw) else {
            let created = o.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
            let bound = SignedDuration::try_from(EPP_STATUS_BOUND).unwrap_or(SignedDuration::MAX);
            if kind == "EnvoyPatchPolicy" && now.duration_since(created) >= bound {
                return (
                    false,
                    mirrored::PATCH_POLICY_DISABLED.into(),
                    format!(
                        "{id} has no status from Envoy Gateway {}s after it was created: EnvoyPatchPolicy looks disabled; enable `extensionApis.enableEnvoyPatchPolicy` (without it PREFIX_AWARE requests hang)",
                        EPP_STATUS_BOUND.as_secs()
                    ),
                );
            }
            pending.push(id);
            continue;
        };
        if let Some(c) = find(&conds, "Accepted").filter(|c| c["status"] != "True") {
            let why = text(c, "reason");
            let message = text(c, "message");
            let merged = if message.contains("MergeGateways=true") {
                "; Envoy Gateway runs with mergeGateways, which warmpath does not support (its EnvoyPatchPolicy targets the Gateway)"
            } else {
                ""
            };
            return (
                false,
                why.clone(),
                format!("Envoy Gateway did not accept {id}: {message}{}{merged}", hint(kind, &why)),
            );
        }
        if kind == "EnvoyPatchPolicy" {
            match find(&conds, "Programmed") {
                Some(c) if c["status"] == "True" => {}
                Some(c) => {
                    let why = text(c, "reason");
                    return (
                        false,
                        why,
                        format!(
                            "Envoy Gateway did not apply {id}: {} (a listener or route configuration name may differ: when Envoy Gateway's XDSNameSchemeV2 runtime flag does not match the controller's xDS name scheme setting, chart value envoyGateway.xdsNameScheme; the routes' request_body_buffer_limit needs Envoy Gateway v1.7 or later)",
                            text(c, "message")
                        ),
                    );
                }
                None => pending.push(id),
            }
        } else if find(&conds, "Accepted").is_none() {
            pending.push(id);
        }
    }
    if !pending.is_empty() {
        return (
            false,
            mirrored::AWAITING_GATEWAY.into(),
            format!("objects applied; waiting for Envoy Gateway's status on {}", pending.join(", ")),
        );
    }
    (true, reason::PROGRAMMED.into(), "Envoy Gateway accepted every object and programmed the EnvoyPatchPolicy".into())
}

/// User-owned `BackendTrafficPolicy` / `EnvoyExtensionPolicy` objects in `ns` that target HTTPRoute
/// `route` (labels `route_labels`) — by name (`targetRefs`, `targetRef`) or by label
/// (`targetSelectors`); warmpath's own carry the owner label. Envoy Gateway attaches only one of each
/// kind to a route, so warmpath's would silently lose to an older one, or silently displace a newer one.
pub async fn user_policies_on_route(
    client: &kube::Client,
    ns: &str,
    route: &str,
    route_labels: &std::collections::BTreeMap<String, String>,
) -> Result<Vec<String>> {
    let mut found = vec![];
    for ar in [foreign::backend_traffic_policy(), foreign::envoy_extension_policy()] {
        let list =
            match Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar).list(&ListParams::default()).await {
                Ok(l) => l,
                Err(kube::Error::Api(e)) if e.code == 404 => continue,
                Err(e) => return Err(e.into()),
            };
        for o in list.items {
            if o.labels().contains_key(LABEL_OWNER_UID) {
                continue;
            }
            let spec = &o.data["spec"];
            let refs = spec["targetRefs"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .chain(spec.get("targetRef").cloned());
            let by_name = refs.into_iter().any(|r| r["kind"] == "HTTPRoute" && r["name"] == route);
            let by_label = spec["targetSelectors"]
                .as_array()
                .is_some_and(|s| s.iter().any(|sel| selects_route(sel, route_labels)));
            if by_name || by_label {
                found.push(format!("{} {ns}/{}", ar.kind, o.name_any()));
            }
        }
    }
    Ok(found)
}

/// Whether one Envoy Gateway `targetSelectors` entry (`{group, kind, matchLabels, matchExpressions}`;
/// group defaults to Gateway API's) selects an HTTPRoute with `labels`. A selector with neither
/// labels nor expressions selects every route of its kind, as Kubernetes label selectors do; one
/// that does not parse selects nothing (Envoy Gateway refuses it).
pub fn selects_route(selector: &Value, labels: &std::collections::BTreeMap<String, String>) -> bool {
    use kube::core::SelectorExt;
    let group = selector["group"].as_str().unwrap_or(crate::crd::routing_policy::GATEWAY_API_GROUP);
    if selector["kind"] != "HTTPRoute" || group != crate::crd::routing_policy::GATEWAY_API_GROUP {
        return false;
    }
    let label_selector =
        serde_json::json!({"matchLabels": selector["matchLabels"], "matchExpressions": selector["matchExpressions"]});
    serde_json::from_value::<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>(label_selector)
        .ok()
        .and_then(|s| kube::core::Selector::try_from(s).ok())
        .is_some_and(|s| s.matches(labels))
}
