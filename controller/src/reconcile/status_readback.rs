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
//!   apply, e.g. the listener name differs under mergeGateways or another xDS name scheme). Older
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

use super::Context;
use crate::conditions::{self, reason, PROGRAMMED};
use crate::crd::routing_policy::PolicyAncestorStatus;
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
pub async fn mirror(ctx: &Context, applied: &[DynamicObject], ancestors: &mut [PolicyAncestorStatus], generation: Option<i64>, now: &Time) -> Result<Option<Duration>> {
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
fn eg_conditions<'a>(obj: &'a DynamicObject, gw_ns: &str, gw: &str) -> Option<Vec<&'a Value>> {
    let generation = obj.metadata.generation;
    let entry = obj.data["status"]["ancestors"].as_array()?.iter().find(|a| {
        let r = &a["ancestorRef"];
        a["controllerName"] == EG_CONTROLLER_NAME
            && r["name"] == gw
            && r["kind"].as_str().unwrap_or("Gateway") == "Gateway"
            && r["namespace"].as_str().unwrap_or(obj.metadata.namespace.as_deref().unwrap_or_default()) == gw_ns
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
        if kind == "EnvoyPatchPolicy" && (o.namespace().as_deref() != Some(gw_ns) || o.data["spec"]["targetRef"]["name"] != gw) {
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
            return (false, why.clone(), format!("Envoy Gateway did not accept {id}: {}{}", text(c, "message"), hint(kind, &why)));
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
                            "Envoy Gateway did not apply {id}: {} (the listener name may differ, e.g. under mergeGateways or another xDS name scheme)",
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
        return (false, mirrored::AWAITING_GATEWAY.into(), format!("objects applied; waiting for Envoy Gateway's status on {}", pending.join(", ")));
    }
    (true, reason::PROGRAMMED.into(), "Envoy Gateway accepted every object and programmed the EnvoyPatchPolicy".into())
}

/// User-owned `BackendTrafficPolicy` / `EnvoyExtensionPolicy` objects in `ns` that target HTTPRoute
/// `route` (warmpath's own carry the owner label). Envoy Gateway attaches only one of each kind to a
/// route, so warmpath's would silently lose to an older one, or silently displace a newer one.
pub async fn user_policies_on_route(ctx: &Context, ns: &str, route: &str) -> Result<Vec<String>> {
    let mut found = vec![];
    for ar in [foreign::backend_traffic_policy(), foreign::envoy_extension_policy()] {
        let list = match Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, &ar).list(&ListParams::default()).await {
            Ok(l) => l,
            Err(kube::Error::Api(e)) if e.code == 404 => continue,
            Err(e) => return Err(e.into()),
        };
        for o in list.items {
            if o.labels().contains_key(LABEL_OWNER_UID) {
                continue;
            }
            let spec = &o.data["spec"];
            let refs = spec["targetRefs"].as_array().cloned().unwrap_or_default().into_iter().chain(spec.get("targetRef").cloned());
            if refs.into_iter().any(|r| r["kind"] == "HTTPRoute" && r["name"] == route) {
                found.push(format!("{} {ns}/{}", ar.kind, o.name_any()));
            }
        }
    }
    Ok(found)
}


#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use gateway_api::apis::standard::httproutes::HttpRoute;
    use kube::api::PostParams;
    use serde_json::json;

    use super::*;
    use crate::conditions::{ACCEPTED, RESOLVED_REFS};
    use crate::crd::routing_policy::InferenceRoutingPolicy;
    use crate::fixtures::{self, *};
    use crate::reconcile::routing_policy;

    const NS: &str = "llm";
    const GW_NS: &str = "gateways";
    const GW: (&str, &str) = (GW_NS, "inference-gw");
    const EPP: &str = "warmpath-feed-policy-llm-chat-routing";

    async fn setup(route: serde_json::Value) -> (kube::Client, Context) {
        let client = fixtures::client(vec![
            gateway_class("eg", EG_CONTROLLER),
            gateway(GW_NS, "inference-gw", "eg"),
            service(NS, "vllm", 8000),
            service(NS, "vllm-canary", 8000),
            endpoint_slice(NS, "vllm", 8000, &["10.0.0.1"]),
        ])
        .await;
        let _: HttpRoute = create(&client, NS, route).await;
        let _: InferenceRoutingPolicy = create(&client, NS, policy(NS, "chat-routing", "chat", json!({"strategy": "PREFIX_AWARE"}))).await;
        let ctx = fixtures::context(client.clone());
        (client, ctx)
    }

    async fn reconcile(client: &kube::Client, ctx: &Context) -> InferenceRoutingPolicy {
        let api: Api<InferenceRoutingPolicy> = Api::namespaced(client.clone(), NS);
        for _ in 0..2 {
            routing_policy::reconcile(Arc::new(api.get("chat-routing").await.unwrap()), Arc::new(ctx.clone())).await.unwrap();
        }
        api.get("chat-routing").await.unwrap()
    }

    fn cond(p: &InferenceRoutingPolicy, type_: &str) -> (String, String, String) {
        let c = conditions::find(&p.status.as_ref().unwrap().ancestors[0].conditions, type_).unwrap().clone();
        (c.status, c.reason, c.message)
    }

    fn route() -> serde_json::Value {
        http_route(NS, "chat", GW_NS, "inference-gw", "vllm", 8000, json!({}))
    }

    /// Programmed follows Envoy Gateway's own status: awaiting it, then True when every object is
    /// accepted and the patch programmed, then False with Envoy Gateway's reason and message.
    #[tokio::test]
    async fn programmed_mirrors_envoy_gateway_status() {
        let (client, ctx) = setup(route()).await;
        let p = reconcile(&client, &ctx).await;
        let (s, r, m) = cond(&p, PROGRAMMED);
        assert_eq!((s.as_str(), r.as_str()), ("False", mirrored::AWAITING_GATEWAY), "{m}");
        assert!(m.contains("EnvoyPatchPolicy gateways/") && m.contains("EnvoyExtensionPolicy llm/warmpath-chat"), "{m}");

        fixtures::eg_reports_programmed(&client, GW).await;
        let (s, r, _) = cond(&reconcile(&client, &ctx).await, PROGRAMMED);
        assert_eq!((s.as_str(), r.as_str()), ("True", "Programmed"));

        // The listener patch does not apply (e.g. another xDS listener name): reason and message mirrored.
        let failed = [("Accepted", "True", "Accepted", "ok"), ("Programmed", "False", "ResourceNotFound", "unable to find xds resource gateways/inference-gw/http")];
        fixtures::eg_status(&client, "EnvoyPatchPolicy", GW_NS, EPP, GW, &failed).await;
        let (s, r, m) = cond(&reconcile(&client, &ctx).await, PROGRAMMED);
        assert_eq!((s.as_str(), r.as_str()), ("False", "ResourceNotFound"));
        assert!(m.contains("unable to find xds resource gateways/inference-gw/http") && m.contains("listener name"), "{m}");

        // Recent Envoy Gateway releases report a disabled EnvoyPatchPolicy as Accepted=False/Disabled.
        fixtures::eg_status(&client, "EnvoyPatchPolicy", GW_NS, EPP, GW, &[("Accepted", "False", "Disabled", "EnvoyPatchPolicy is disabled")]).await;
        let (s, r, m) = cond(&reconcile(&client, &ctx).await, PROGRAMMED);
        assert_eq!((s.as_str(), r.as_str()), ("False", "Disabled"));
        assert!(m.contains("enableEnvoyPatchPolicy"), "{m}");

        // Our BackendTrafficPolicy lost to an older one on the route.
        fixtures::eg_reports_programmed(&client, GW).await;
        let conflicted = [("Accepted", "False", "Conflicted", "Unable to target HTTPRoute chat, another BackendTrafficPolicy has already attached to it")];
        fixtures::eg_status(&client, "BackendTrafficPolicy", NS, "warmpath-chat", GW, &conflicted).await;
        let (s, r, m) = cond(&reconcile(&client, &ctx).await, PROGRAMMED);
        assert_eq!((s.as_str(), r.as_str()), ("False", "Conflicted"));
        assert!(m.contains("another BackendTrafficPolicy") && m.contains("merge the settings"), "{m}");
    }

    /// An EnvoyPatchPolicy that never gets a status: pending at first, "looks disabled" after the bound.
    #[tokio::test]
    async fn patch_policy_without_status_looks_disabled_after_the_bound() {
        let (client, ctx) = setup(route()).await;
        reconcile(&client, &ctx).await;
        let epp = fixtures::get_owned(&client, "EnvoyPatchPolicy", GW_NS, EPP).await.unwrap();
        let created = epp.metadata.creation_timestamp.clone().unwrap().0;
        let live = vec![("EnvoyPatchPolicy".to_string(), epp)];
        let at = |s: i64| created + SignedDuration::from_secs(s);
        assert_eq!(verdict(&live, GW_NS, "inference-gw", at(10)).1, mirrored::AWAITING_GATEWAY);
        let (ok, why, msg) = verdict(&live, GW_NS, "inference-gw", at(EPP_STATUS_BOUND.as_secs() as i64 + 1));
        assert!(!ok);
        assert_eq!(why, mirrored::PATCH_POLICY_DISABLED);
        assert!(msg.contains("EnvoyPatchPolicy looks disabled; enable `extensionApis.enableEnvoyPatchPolicy`"), "{msg}");
    }

    /// A status Envoy Gateway wrote for an older generation of the object does not count.
    #[test]
    fn status_of_an_older_generation_is_not_current() {
        let mut epp: DynamicObject = serde_json::from_value(json!({"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "EnvoyPatchPolicy",
            "metadata": {"name": EPP, "namespace": GW_NS, "generation": 3},
            "spec": {"targetRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gw"}},
            "status": {"ancestors": [{"ancestorRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": GW_NS, "name": "inference-gw"},
                "controllerName": EG_CONTROLLER_NAME,
                "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "observedGeneration": 2},
                               {"type": "Programmed", "status": "True", "reason": "Programmed", "observedGeneration": 2}]}]}}))
        .unwrap();
        let now = Timestamp::now();
        let v = |o: &DynamicObject| verdict(&[("EnvoyPatchPolicy".to_string(), o.clone())], GW_NS, "inference-gw", now);
        assert_eq!(v(&epp).1, mirrored::AWAITING_GATEWAY, "generation 3, status for 2");
        epp.metadata.generation = Some(2);
        assert_eq!(v(&epp), (true, "Programmed".to_string(), "Envoy Gateway accepted every object and programmed the EnvoyPatchPolicy".to_string()));
    }

    /// A user's own BackendTrafficPolicy on the route: warmpath writes nothing for it and says why.
    #[tokio::test]
    async fn user_policy_on_the_route_is_reported_conflicted() {
        let (client, ctx) = setup(route()).await;
        let users = json!({"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "BackendTrafficPolicy",
            "metadata": {"name": "chat-timeouts", "namespace": NS},
            "spec": {"targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "chat"}], "timeout": {"http": {"requestTimeout": "300s"}}}});
        Api::<DynamicObject>::namespaced_with(client.clone(), NS, &foreign::backend_traffic_policy())
            .create(&PostParams::default(), &serde_json::from_value(users).unwrap())
            .await
            .unwrap();
        let p = reconcile(&client, &ctx).await;
        let (s, r, m) = cond(&p, ACCEPTED);
        assert_eq!((s.as_str(), r.as_str()), ("False", "Conflicted"));
        assert!(m.contains("BackendTrafficPolicy llm/chat-timeouts") && m.contains("Merge"), "{m}");
        assert_eq!(cond(&p, RESOLVED_REFS).0, "True", "the references themselves resolved");
        let owned = owned_objects(&client).await;
        assert_eq!(owned, vec![("BackendTrafficPolicy".to_string(), NS.to_string(), "chat-timeouts".to_string())], "only the user's object");
    }

    /// A 90/10 canary (two backendRefs): refused with a condition naming both backends; nothing written.
    #[tokio::test]
    async fn several_backend_refs_are_refused() {
        let mut r = route();
        r["spec"]["rules"][0]["backendRefs"] = json!([{"name": "vllm", "port": 8000, "weight": 90}, {"name": "vllm-canary", "port": 8000, "weight": 10}]);
        let (client, ctx) = setup(r).await;
        let p = reconcile(&client, &ctx).await;
        let (s, reason, m) = cond(&p, RESOLVED_REFS);
        assert_eq!((s.as_str(), reason.as_str()), ("False", conditions::reason::MULTIPLE_BACKENDS));
        assert!(m.contains("Service llm/vllm:8000") && m.contains("Service llm/vllm-canary:8000") && m.contains("own HTTPRoute"), "{m}");
        assert_eq!(cond(&p, PROGRAMMED).0, "False");
        assert!(owned_objects(&client).await.is_empty());
    }
}
