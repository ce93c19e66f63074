//! Leader election on a `coordination.k8s.io/v1` Lease, so that several controller replicas (or the
//! old and new pod of a RollingUpdate) never write at the same time: only the holder of the Lease
//! runs the reconcilers and the feed loop; the others wait, serving only the wasm module and health.
//!
//! The algorithm is client-go's `leaderelection` (the one kube-controller-manager uses):
//! - a candidate takes the Lease when it is free (no holder) or expired, and the holder renews it
//!   every retry period;
//! - "expired" is judged on the candidate's own clock: `leaseDurationSeconds` after the candidate
//!   last *saw the record change* (not after `renewTime`, which was written by another node's clock);
//! - every write is a `replace` carrying the `resourceVersion` read just before, so of two
//!   candidates racing for an expired Lease exactly one wins (the other gets 409 Conflict);
//! - a leader that cannot renew within the renew deadline, or finds another holder, stops leading.
//!
//! Why not a crate: `kube-lease-manager` needs kube 5 (this workspace is on kube 4.2, see the
//! workspace manifest), and `kube-leader-election` 0.44 (kube 4) takes and renews the Lease with merge
//! patches without a `resourceVersion`, so two candidates that both see it expired both "acquire" it.
//!
//! Time is an argument of [`Elector::try_acquire_or_renew`], so the election is tested with explicit
//! instants; only [`run_while_leading`] reads the clock.
//!
//! Gateways reach the leader only: the filter's feed is served by the leader alone (followers run no
//! feed loop), so the controller Service selects the pod carrying [`LEADER_LABEL`], which the leader
//! puts on its own pod ([`LeaderPod`]) — taking it off any other pod first (a crashed leader cannot
//! remove it itself) — and removes when it stops leading. Between two leaders the Service has no
//! endpoint for a few seconds; the filter keeps its last snapshot meanwhile.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Client;

/// Where the Lease lives, who we are, and the timings.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    /// Namespace of the Lease (the controller's own).
    pub namespace: String,
    /// Name of the Lease (one per installation).
    pub name: String,
    /// This candidate's identity (the pod name), written as `holderIdentity`.
    pub identity: String,
    /// How long a Lease stays valid after it was last seen renewed (`leaseDurationSeconds`).
    pub lease_duration: Duration,
    /// A leader that has not renewed for this long stops leading (shorter than `lease_duration`, so it
    /// stops before anyone else may take over).
    pub renew_deadline: Duration,
    /// Time between attempts to acquire or renew.
    pub retry_period: Duration,
}

impl LeaseSettings {
    /// client-go's and controller-runtime's defaults: 15 s lease, 10 s renew deadline, 2 s retry.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// The last Lease record this candidate saw, and when (on its own clock).
#[derive(Clone, Debug, PartialEq)]
struct Observed {
    holder: Option<String>,
    renew_time: Option<Timestamp>,
    transitions: Option<i32>,
    at: Timestamp,
}

/// One candidate for the Lease.
pub struct Elector {
    api: Api<Lease>,
    settings: LeaseSettings,
    observed: Mutex<Option<Observed>>,
}

impl Elector {
    /// A candidate using `client`.
    pub fn new(client: Client, settings: LeaseSettings) -> Self {
        Self { api: Api::namespaced(client, &settings.namespace), settings, observed: Mutex::new(None) }
    }

    /// The settings this candidate runs with.
    pub fn settings(&self) -> &LeaseSettings {
        &self.settings
    }

    /// One election step at instant `now`: creates the Lease if absent, renews it if we hold it,
    /// takes it if it is free or expired. Returns whether we hold it afterwards. A write that lost a
    /// race (409 Conflict, 409 AlreadyExists) is `Ok(false)`; other API errors propagate.
    pub async fn try_acquire_or_renew(&self, now: Timestamp) -> Result<bool, kube::Error> {
        let me = &self.settings.identity;
        let Some(lease) = self.api.get_opt(&self.settings.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.settings.name.clone()), ..Default::default() },
                spec: Some(self.record(now, now, 0)),
            };
            return lost_race(self.api.create(&PostParams::default(), &lease).await.map(|l| self.observe(&l, now)));
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let seen = self.observe_record(&lease, now);
        let transitions = spec.lease_transitions.unwrap_or(0);
        let record = if holder.as_deref() == Some(me.as_str()) {
            // Renew: keep acquireTime and the transition count.
            let acquired = spec.acquire_time.map_or(now, |t| t.0);
            self.record(acquired, now, transitions)
        } else {
            let duration = spec
                .lease_duration_seconds
                .map_or(self.settings.lease_duration, |s| Duration::from_secs(s.max(0) as u64));
            let expires = seen
                .at
                .saturating_add(SignedDuration::try_from(duration).unwrap_or(SignedDuration::MAX))
                .unwrap_or(Timestamp::MAX);
            if holder.is_some() && now < expires {
                return Ok(false);
            }
            self.record(now, now, transitions + 1)
        };
        let updated = Lease { metadata: lease.metadata.clone(), spec: Some(record) };
        lost_race(
            self.api
                .replace(&self.settings.name, &PostParams::default(), &updated)
                .await
                .map(|l| self.observe(&l, now)),
        )
    }

    /// Gives the Lease up if we hold it (on shutdown), so the next candidate need not wait for it
    /// to expire: clears the holder, as client-go's `ReleaseOnCancel` does.
    pub async fn release(&self, now: Timestamp) -> Result<(), kube::Error> {
        let Some(lease) = self.api.get_opt(&self.settings.name).await? else { return Ok(()) };
        let spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
            return Ok(());
        }
        let released = LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            renew_time: Some(MicroTime(now)),
            ..spec
        };
        let updated = Lease { metadata: lease.metadata.clone(), spec: Some(released) };
        lost_race(self.api.replace(&self.settings.name, &PostParams::default(), &updated).await.map(|_| false))
            .map(|_| ())
    }

    /// Deletes the Lease (uninstall clean-up; only once no controller runs).
    pub async fn delete(&self) -> Result<(), kube::Error> {
        match self.api.delete(&self.settings.name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn record(&self, acquired: Timestamp, renewed: Timestamp, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.settings.identity.clone()),
            lease_duration_seconds: Some(self.settings.lease_duration.as_secs().clamp(1, i32::MAX as u64) as i32),
            acquire_time: Some(MicroTime(acquired)),
            renew_time: Some(MicroTime(renewed)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// Records `lease` as seen at `now` unless it is the record already seen (then the earlier
    /// instant stays: expiry counts from the last *change* of the record). Returns whether we hold it.
    fn observe(&self, lease: &Lease, now: Timestamp) -> bool {
        self.observe_record(lease, now);
        lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(self.settings.identity.as_str())
    }

    /// Like [`Self::observe`]; returns the record as now remembered.
    fn observe_record(&self, lease: &Lease, now: Timestamp) -> Observed {
        let spec = lease.spec.clone().unwrap_or_default();
        let fresh = Observed {
            holder: spec.holder_identity,
            renew_time: spec.renew_time.map(|t| t.0),
            transitions: spec.lease_transitions,
            at: now,
        };
        let mut seen = self.observed.lock().unwrap_or_else(|p| p.into_inner());
        match &*seen {
            Some(old) if Observed { at: old.at, ..fresh.clone() } == *old => old.clone(),
            _ => {
                *seen = Some(fresh.clone());
                fresh
            }
        }
    }
}

/// A 409 (someone else wrote first) means we do not hold the Lease; anything else is an error.
fn lost_race(res: Result<bool, kube::Error>) -> Result<bool, kube::Error> {
    match res {
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        other => other,
    }
}

/// Label the leader puts on its own pod, valued with the Lease name (one per installation); the
/// controller Service selects `warmpath.dev/leader: <Lease name>`, so the gateways' module and feed
/// requests reach the leader only.
pub const LEADER_LABEL: &str = "warmpath.dev/leader";

/// The leader's mark on its own pod ([`LEADER_LABEL`]).
pub struct LeaderPod {
    api: Api<Pod>,
    pod: String,
    value: String,
}

impl LeaderPod {
    /// Pod `pod` in `namespace` (this replica's, from the downward API), marked for Lease `lease`.
    pub fn new(client: Client, namespace: &str, pod: impl Into<String>, lease: impl Into<String>) -> Self {
        Self { api: Api::namespaced(client, namespace), pod: pod.into(), value: lease.into() }
    }

    /// Marks this pod as the leader's, after taking the mark off every other pod of the same Lease
    /// (a leader that crashed, or was partitioned away, left it on its pod).
    ///
    /// Errors: an API error (the caller retries).
    pub async fn mark(&self) -> Result<(), kube::Error> {
        let marked = self.api.list(&ListParams::default().labels(&format!("{LEADER_LABEL}={}", self.value))).await?;
        for p in marked.items.iter().filter(|p| p.metadata.name.as_deref() != Some(self.pod.as_str())) {
            if let Some(name) = &p.metadata.name {
                not_found_ok(self.set(name, None).await)?;
            }
        }
        self.set(&self.pod, Some(&self.value)).await
    }

    /// Takes the mark off this pod (on losing the Lease, and at start: a restarted container's pod
    /// may still carry it). A pod that is gone needs nothing.
    ///
    /// Errors: an API error.
    pub async fn unmark(&self) -> Result<(), kube::Error> {
        not_found_ok(self.set(&self.pod, None).await)
    }

    async fn set(&self, pod: &str, value: Option<&str>) -> Result<(), kube::Error> {
        let patch = serde_json::json!({"metadata": {"labels": {LEADER_LABEL: value}}});
        self.api.patch(pod, &PatchParams::default(), &Patch::Merge(&patch)).await.map(|_| ())
    }
}

fn not_found_ok(res: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match res {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        other => other,
    }
}

/// Why [`run_while_leading`] stopped leading.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stopped {
    /// Another candidate holds the Lease.
    Lost,
    /// The Lease could not be renewed within the renew deadline (API errors).
    RenewDeadline,
}

/// Campaigns for the Lease forever: while leading, runs `work()` (the reconcilers) and keeps `pod`
/// marked as the leader's (retried every retry period until it succeeds); when leadership is lost,
/// drops that future (stopping every reconciler it drives), unmarks `pod` and campaigns again.
/// Returns when `work()` completes (shutdown) after releasing the Lease. `on_change` is told each
/// change (`true`: now leading).
pub async fn run_while_leading<W, Fut>(
    elector: &Elector,
    pod: Option<&LeaderPod>,
    mut work: W,
    on_change: impl Fn(bool),
) where
    W: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let s = elector.settings().clone();
    let unmark = async || {
        if let Some(p) = pod {
            if let Err(e) = p.unmark().await {
                tracing::warn!(pod = %p.pod, error = %e, "could not take the leader label off this pod");
            }
        }
    };
    let mark = async || match pod {
        Some(p) => match p.mark().await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(pod = %p.pod, error = %e, "could not label this pod as the leader (the Service reaches no feed until it is)");
                false
            }
        },
        None => true,
    };
    unmark().await;
    loop {
        loop {
            match elector.try_acquire_or_renew(Timestamp::now()).await {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(lease = %s.name, error = %e, "leader election: cannot read or write the Lease")
                }
            }
            tokio::time::sleep(s.retry_period).await;
        }
        tracing::info!(lease = %s.name, identity = %s.identity, "leading: starting the reconcilers");
        on_change(true);
        let renew = async {
            let mut last_renewed = tokio::time::Instant::now();
            let mut marked = mark().await;
            loop {
                tokio::time::sleep(s.retry_period).await;
                if !marked {
                    marked = mark().await;
                }
                match elector.try_acquire_or_renew(Timestamp::now()).await {
                    Ok(true) => last_renewed = tokio::time::Instant::now(),
                    Ok(false) => return Stopped::Lost,
                    Err(e) => {
                        tracing::warn!(lease = %s.name, error = %e, "leader election: renewal failed");
                        if last_renewed.elapsed() >= s.renew_deadline {
                            return Stopped::RenewDeadline;
                        }
                    }
                }
            }
        };
        tokio::select! {
            _ = work() => {
                unmark().await;
                if let Err(e) = elector.release(Timestamp::now()).await {
                    tracing::warn!(lease = %s.name, error = %e, "leader election: could not release the Lease");
                }
                on_change(false);
                return;
            }
            why = renew => {
                tracing::warn!(lease = %s.name, reason = ?why, "stopped leading: reconcilers stopped");
                unmark().await;
                on_change(false);
            }
        }
    }
}
