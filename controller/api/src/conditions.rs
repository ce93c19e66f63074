//! Status conditions in the Gateway API policy style (GEP-713 / GEP-2648): condition types and
//! reasons as constants, and one helper that upserts a condition by type.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The policy is valid and attached to the target (Gateway API `PolicyConditionType` "Accepted").
pub const ACCEPTED: &str = "Accepted";
/// Every reference in the policy (target, backend) resolved to an existing object.
pub const RESOLVED_REFS: &str = "ResolvedRefs";
/// The data-plane objects were written to the API server.
pub const PROGRAMMED: &str = "Programmed";
/// Ready (used by the cache-warming resources: InferenceEndpoint, ModelCache, ImageCache).
pub const READY: &str = "Ready";

/// Reasons, named as in Gateway API where one exists (`PolicyReasonAccepted`, `...Conflicted`,
/// `...Invalid`, `...TargetNotFound`).
pub mod reason {
    /// Condition holds.
    pub const ACCEPTED: &str = "Accepted";
    /// Another policy/annotation already decides routing for this target; this one lost.
    pub const CONFLICTED: &str = "Conflicted";
    /// The spec is invalid (a value the schema could not reject).
    pub const INVALID: &str = "Invalid";
    /// The targeted HTTPRoute does not exist.
    pub const TARGET_NOT_FOUND: &str = "TargetNotFound";
    /// All references resolved.
    pub const RESOLVED: &str = "ResolvedRefs";
    /// The backend Service / InferencePool does not exist.
    pub const BACKEND_NOT_FOUND: &str = "BackendNotFound";
    /// A policy's targeted routes resolve to different backends; one policy routes one backend's
    /// endpoints (its feed), so the later routes are not programmed.
    pub const BACKEND_MISMATCH: &str = "BackendMismatch";
    /// The HTTPRoute names several backends (e.g. a weighted canary split); warmpath routes one.
    pub const MULTIPLE_BACKENDS: &str = "MultipleBackends";
    /// The gateway's provider (Envoy Gateway / Istio) could not be determined.
    pub const UNSUPPORTED_PROVIDER: &str = "UnsupportedProvider";
    /// Objects written.
    pub const PROGRAMMED: &str = "Programmed";
    /// Not written yet, because an earlier condition failed.
    pub const PENDING: &str = "Pending";
}

/// Builds a condition. `status` is `"True"`/`"False"`/`"Unknown"`; `generation` is the
/// `metadata.generation` the condition was computed from.
pub fn new(
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: now.clone(),
    }
}

/// Inserts or replaces the condition of the same type. `lastTransitionTime` is kept when the
/// status did not change (Kubernetes API conventions), so that repeated reconciles are no-ops.
pub fn upsert(conditions: &mut Vec<Condition>, mut cond: Condition) {
    match conditions.iter_mut().find(|c| c.type_ == cond.type_) {
        Some(old) => {
            if old.status == cond.status {
                cond.last_transition_time = old.last_transition_time.clone();
            }
            *old = cond;
        }
        None => conditions.push(cond),
    }
}

/// Looks a condition up by type.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// True when the condition of `type_` exists with status `"True"`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn upsert_keeps_transition_time_when_status_is_unchanged() {
        let mut conds = vec![];
        upsert(&mut conds, new(ACCEPTED, true, reason::ACCEPTED, "ok", Some(1), &t(10)));
        upsert(&mut conds, new(ACCEPTED, true, reason::ACCEPTED, "still ok", Some(2), &t(20)));
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0].last_transition_time, t(10));
        assert_eq!(conds[0].message, "still ok");
        assert_eq!(conds[0].observed_generation, Some(2));
        upsert(&mut conds, new(ACCEPTED, false, reason::INVALID, "bad", Some(3), &t(30)));
        assert_eq!(conds[0].last_transition_time, t(30));
        assert!(!is_true(&conds, ACCEPTED));
        upsert(&mut conds, new(PROGRAMMED, true, reason::PROGRAMMED, "", Some(3), &t(30)));
        assert_eq!(conds.len(), 2);
        assert!(is_true(&conds, PROGRAMMED));
    }
}
