//! Leader election on a `coordination.k8s.io/v1` Lease, on the in-memory API client: one leader
//! among candidates, take-over only after the lease duration (explicit instants), exactly one winner
//! of a race, `run_while_leading` starting the work only while leading and stopping it when the
//! Lease is lost, and the leader label the controller Service selects staying on the leader's pod
//! only (short real durations, bounded by timeouts).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use kube::Client;
use warmpath_controller::leader::{run_while_leading, Elector, LeaderPod, LeaseSettings, LEADER_LABEL};

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
    assert!(
        !b.try_acquire_or_renew(at(t0, 20)).await.unwrap(),
        "t0+20 is past t0+15 but within 15 s of the renewal B saw"
    );
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
    spawn_candidate_with_pod(client, id, running, false)
}

/// A candidate; with `label_pod`, it marks its pod (named `id`) while leading, as `run` does.
fn spawn_candidate_with_pod(
    client: &Client,
    id: &'static str,
    running: Arc<AtomicUsize>,
    label_pod: bool,
) -> tokio::task::JoinHandle<()> {
    let client = client.clone();
    tokio::spawn(async move {
        let elector = Elector::new(client.clone(), fast(id));
        let pod = LeaderPod::new(client.clone(), NS, id, LEASE);
        run_while_leading(
            &elector,
            label_pod.then_some(&pod),
            || {
                let (client, running) = (client.clone(), running.clone());
                async move {
                    running.fetch_add(1, Ordering::SeqCst);
                    let _guard = Work { running };
                    let cm: ConfigMap =
                        serde_json::from_value(serde_json::json!({"metadata": {"name": format!("written-by-{id}")}}))
                            .unwrap();
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
    let mut names: Vec<String> = Api::<ConfigMap>::namespaced(client.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
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

/// A controller pod, with `labels`.
fn pod(name: &str, labels: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"containers": [{"name": "controller", "image": "warmpath-controller"}]}})
}

/// The pods the controller Service selects (`warmpath.dev/leader: <Lease name>`), by name.
async fn selected_by_the_service(client: &Client) -> Vec<String> {
    let lp = kube::api::ListParams::default().labels(&format!("{LEADER_LABEL}={LEASE}"));
    let mut names: Vec<String> = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), NS)
        .list(&lp)
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    names.sort();
    names
}

/// Waits (at most 5 s) until the Service selects exactly `want`.
async fn eventually_selected(client: &Client, want: &[&str]) {
    for _ in 0..100 {
        if selected_by_the_service(client).await == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the Service selects {:?}, not {want:?}, after 5 s", selected_by_the_service(client).await);
}

async fn pods_client(objects: Vec<serde_json::Value>) -> Client {
    kube_fake_client::ClientBuilder::new().with_runtime_objects(objects).build().await.expect("fake client")
}

/// The leader's mark: marking takes it off every other pod of the same Lease (a crashed leader's),
/// not off another installation's; unmarking is idempotent, also for a pod that is gone.
#[tokio::test]
async fn the_leader_label_is_on_exactly_one_pod_of_the_installation() {
    let client = pods_client(vec![
        pod("pod-a", serde_json::json!({LEADER_LABEL: LEASE, "app": "warmpath"})),
        pod("pod-b", serde_json::json!({"app": "warmpath"})),
        pod("other-install", serde_json::json!({LEADER_LABEL: "other-lease"})),
    ])
    .await;
    assert_eq!(selected_by_the_service(&client).await, ["pod-a"], "a stale mark from a crashed leader");
    let b = LeaderPod::new(client.clone(), NS, "pod-b", LEASE);
    b.mark().await.unwrap();
    assert_eq!(selected_by_the_service(&client).await, ["pod-b"]);
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), NS);
    let a = pods.get("pod-a").await.unwrap();
    assert_eq!(
        a.metadata.labels.unwrap().get("app").map(String::as_str),
        Some("warmpath"),
        "only the leader label goes"
    );
    let other = pods.get("other-install").await.unwrap();
    assert_eq!(
        other.metadata.labels.unwrap().get(LEADER_LABEL).map(String::as_str),
        Some("other-lease"),
        "another installation's mark stays"
    );
    b.unmark().await.unwrap();
    b.unmark().await.unwrap();
    assert!(selected_by_the_service(&client).await.is_empty());
    LeaderPod::new(client.clone(), NS, "gone", LEASE).unmark().await.unwrap();
}

/// With several replicas the Service reaches the leader only: the leader's pod carries the label
/// while it leads; a follower's never does; after the leader crashes (its label left behind) the
/// new leader moves the label to its own pod; a leader that loses the Lease takes its label off.
#[tokio::test]
async fn the_service_follows_the_leader_across_a_crash_and_a_lost_lease() {
    let client = pods_client(vec![pod("pod-a", serde_json::json!({})), pod("pod-b", serde_json::json!({}))]).await;
    let (ra, rb) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let a = spawn_candidate_with_pod(&client, "pod-a", ra.clone(), true);
    eventually("A leads", || ra.load(Ordering::SeqCst) == 1).await;
    let b = spawn_candidate_with_pod(&client, "pod-b", rb.clone(), true);
    eventually_selected(&client, &["pod-a"]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(selected_by_the_service(&client).await, ["pod-a"], "the follower never labels itself");

    a.abort();
    eventually("B leads after A's Lease expired", || rb.load(Ordering::SeqCst) == 1).await;
    eventually_selected(&client, &["pod-b"]).await; // A's stale label removed, B's set

    // Another holder takes the Lease: B stops leading and takes its label off.
    let api = Api::<Lease>::namespaced(client.clone(), NS);
    let mut lease = api.get(LEASE).await.unwrap();
    lease.spec.as_mut().unwrap().holder_identity = Some("pod-z".into());
    lease.spec.as_mut().unwrap().lease_duration_seconds = Some(3600);
    api.replace(LEASE, &PostParams::default(), &lease).await.unwrap();
    eventually("B's reconcilers stopped", || rb.load(Ordering::SeqCst) == 0).await;
    eventually_selected(&client, &[]).await; // a former leader is not selected
    b.abort();
}
