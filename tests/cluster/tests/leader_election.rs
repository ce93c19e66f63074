//! Leader election on a `coordination.k8s.io/v1` Lease, on the in-memory API client: one leader
//! among candidates, take-over only after the lease duration (explicit instants), exactly one winner
//! of a race, and `run_while_leading` starting the work only while leading and stopping it when the
//! Lease is lost (short real durations, bounded by timeouts).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use kube::Client;
use warmpath_controller::leader::{run_while_leading, Elector, LeaseSettings};

const NS: &str = "warmpath-system";
const LEASE: &str = "warmpath-controller";

async fn client() -> Client {
    kube_fake_client::ClientBuilder::new().build().await.expect("fake client")
}

fn candidate(client: &Client, id: &str) -> Elector {
    Elector::new(client.clone(), LeaseSettings::new(NS, LEASE, id))
}

fn at(t0: Timestamp, secs: i64) -> Timestamp {
    t0 + SignedDuration::from_secs(secs)
}

async fn holder(client: &Client) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), NS).get(LEASE).await.unwrap().spec.and_then(|s| s.holder_identity)
}

#[tokio::test]
async fn two_candidates_one_leader() {
    let client = client().await;
    let (a, b) = (candidate(&client, "pod-a"), candidate(&client, "pod-b"));
    let t0 = Timestamp::now();
    assert!(a.try_acquire_or_renew(t0).await.unwrap(), "the first candidate creates and holds the Lease");
    assert!(!b.try_acquire_or_renew(t0).await.unwrap(), "the second does not lead");
    for s in [2, 4, 6, 30] {
        // A keeps renewing: B never leads, however long it waits.
        assert!(a.try_acquire_or_renew(at(t0, s)).await.unwrap());
        assert!(!b.try_acquire_or_renew(at(t0, s)).await.unwrap());
    }
    assert_eq!(holder(&client).await.as_deref(), Some("pod-a"));
    let lease = Api::<Lease>::namespaced(client.clone(), NS).get(LEASE).await.unwrap().spec.unwrap();
    assert_eq!(lease.lease_duration_seconds, Some(15));
    assert_eq!(lease.lease_transitions, Some(0));
}

#[tokio::test]
async fn holder_stops_renewing_and_the_other_takes_over_after_the_lease_duration() {
    let client = client().await;
    let (a, b) = (candidate(&client, "pod-a"), candidate(&client, "pod-b"));
    let t0 = Timestamp::now();
    assert!(a.try_acquire_or_renew(t0).await.unwrap());
    assert!(!b.try_acquire_or_renew(t0).await.unwrap(), "B sees A's record at t0");
    // A stops renewing (crashed, partitioned). Expiry counts on B's clock from when B saw the record.
    assert!(!b.try_acquire_or_renew(at(t0, 14)).await.unwrap(), "not before the 15 s lease duration");
    assert_eq!(holder(&client).await.as_deref(), Some("pod-a"));
    assert!(b.try_acquire_or_renew(at(t0, 16)).await.unwrap(), "B takes the expired Lease");
    assert_eq!(holder(&client).await.as_deref(), Some("pod-b"));
    let spec = Api::<Lease>::namespaced(client.clone(), NS).get(LEASE).await.unwrap().spec.unwrap();
    assert_eq!(spec.lease_transitions, Some(1));
    // A comes back: it finds B holding a fresh Lease and does not lead.
    assert!(!a.try_acquire_or_renew(at(t0, 17)).await.unwrap());
    assert_eq!(holder(&client).await.as_deref(), Some("pod-b"));
}

#[tokio::test]
async fn renewals_seen_by_the_follower_push_expiry_back() {
    let client = client().await;
    let (a, b) = (candidate(&client, "pod-a"), candidate(&client, "pod-b"));
    let t0 = Timestamp::now();
    assert!(a.try_acquire_or_renew(t0).await.unwrap());
    assert!(!b.try_acquire_or_renew(t0).await.unwrap());
    assert!(a.try_acquire_or_renew(at(t0, 10)).await.unwrap(), "A renews at t0+10");
    assert!(!b.try_acquire_or_renew(at(t0, 12)).await.unwrap(), "B sees the renewed record at t0+12");
    assert!(!b.try_acquire_or_renew(at(t0, 20)).await.unwrap(), "t0+20 is past t0+15 but within 15 s of the renewal B saw");
    assert!(b.try_acquire_or_renew(at(t0, 28)).await.unwrap(), "15 s after B last saw a change");
}

#[tokio::test]
async fn a_race_for_an_expired_lease_has_exactly_one_winner() {
    let client = client().await;
    let a = candidate(&client, "pod-a");
    let (b, c) = (candidate(&client, "pod-b"), candidate(&client, "pod-c"));
    let t0 = Timestamp::now();
    assert!(a.try_acquire_or_renew(t0).await.unwrap());
    assert!(!b.try_acquire_or_renew(t0).await.unwrap());
    assert!(!c.try_acquire_or_renew(t0).await.unwrap());
    let (rb, rc) = tokio::join!(b.try_acquire_or_renew(at(t0, 16)), c.try_acquire_or_renew(at(t0, 16)));
    let (rb, rc) = (rb.unwrap(), rc.unwrap());
    assert!(rb ^ rc, "exactly one of B and C leads (B {rb}, C {rc})");
    assert_eq!(holder(&client).await.as_deref(), Some(if rb { "pod-b" } else { "pod-c" }));
}

#[tokio::test]
async fn release_lets_the_next_candidate_lead_at_once() {
    let client = client().await;
    let (a, b) = (candidate(&client, "pod-a"), candidate(&client, "pod-b"));
    let t0 = Timestamp::now();
    assert!(a.try_acquire_or_renew(t0).await.unwrap());
    assert!(!b.try_acquire_or_renew(t0).await.unwrap());
    b.release(t0).await.unwrap();
    assert_eq!(holder(&client).await.as_deref(), Some("pod-a"), "a non-holder's release changes nothing");
    a.release(at(t0, 1)).await.unwrap();
    assert!(b.try_acquire_or_renew(at(t0, 1)).await.unwrap(), "no wait for expiry after a release");
}

/// Fast timings for the loop tests: 1 s lease, 100 ms between attempts.
fn fast(id: &str) -> LeaseSettings {
    LeaseSettings {
        lease_duration: Duration::from_secs(1),
        renew_deadline: Duration::from_millis(600),
        retry_period: Duration::from_millis(100),
        ..LeaseSettings::new(NS, LEASE, id)
    }
}

/// Counts running instances of the "reconcilers"; each writes one ConfigMap named after its
/// candidate (standing in for every write the reconcilers make), then runs until dropped.
struct Work {
    running: Arc<AtomicUsize>,
}
impl Drop for Work {
    fn drop(&mut self) {
        self.running.fetch_sub(1, Ordering::SeqCst);
    }
}

fn spawn_candidate(client: &Client, id: &'static str, running: Arc<AtomicUsize>) -> tokio::task::JoinHandle<()> {
    let client = client.clone();
    tokio::spawn(async move {
        let elector = Elector::new(client.clone(), fast(id));
        run_while_leading(
            &elector,
            || {
                let (client, running) = (client.clone(), running.clone());
                async move {
                    running.fetch_add(1, Ordering::SeqCst);
                    let _guard = Work { running };
                    let cm: ConfigMap = serde_json::from_value(serde_json::json!({"metadata": {"name": format!("written-by-{id}")}})).unwrap();
                    let _ = Api::<ConfigMap>::namespaced(client, NS).create(&PostParams::default(), &cm).await;
                    std::future::pending::<()>().await
                }
            },
            |_| {},
        )
        .await
    })
}

async fn eventually(what: &str, f: impl Fn() -> bool) {
    for _ in 0..100 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("not within 5 s: {what}");
}

async fn written(client: &Client) -> Vec<String> {
    let mut names: Vec<String> =
        Api::<ConfigMap>::namespaced(client.clone(), NS).list(&Default::default()).await.unwrap().items.into_iter().filter_map(|c| c.metadata.name).collect();
    names.sort();
    names
}

#[tokio::test]
async fn only_the_leader_runs_the_reconcilers_and_a_crashed_leader_is_replaced() {
    let client = client().await;
    let (ra, rb) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let a = spawn_candidate(&client, "pod-a", ra.clone());
    eventually("A leads and runs its reconcilers", || ra.load(Ordering::SeqCst) == 1).await;
    let b = spawn_candidate(&client, "pod-b", rb.clone());
    // Several retry periods and more than a lease duration: B stays a follower while A renews.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(rb.load(Ordering::SeqCst), 0, "the follower runs no reconciler");
    assert_eq!(written(&client).await, vec!["written-by-pod-a"], "the follower wrote nothing");
    assert_eq!(holder(&client).await.as_deref(), Some("pod-a"));

    // A dies without releasing the Lease: B takes over once it expires.
    a.abort();
    eventually("B leads after A's Lease expired", || rb.load(Ordering::SeqCst) == 1).await;
    assert_eq!(holder(&client).await.as_deref(), Some("pod-b"));
    assert_eq!(written(&client).await, vec!["written-by-pod-a", "written-by-pod-b"]);
    b.abort();
}

#[tokio::test]
async fn a_leader_that_loses_the_lease_stops_its_reconcilers() {
    let client = client().await;
    let ra = Arc::new(AtomicUsize::new(0));
    let a = spawn_candidate(&client, "pod-a", ra.clone());
    eventually("A leads", || ra.load(Ordering::SeqCst) == 1).await;
    // Another holder takes the Lease (as after a partition that outlived A's lease).
    let api = Api::<Lease>::namespaced(client.clone(), NS);
    let mut lease = api.get(LEASE).await.unwrap();
    lease.spec.as_mut().unwrap().holder_identity = Some("pod-z".into());
    lease.spec.as_mut().unwrap().lease_duration_seconds = Some(3600);
    api.replace(LEASE, &PostParams::default(), &lease).await.unwrap();
    eventually("A's reconcilers stopped", || ra.load(Ordering::SeqCst) == 0).await;
    // And A does not start them again while pod-z holds a valid Lease.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(ra.load(Ordering::SeqCst), 0);
    assert_eq!(holder(&client).await.as_deref(), Some("pod-z"));
    a.abort();
}
