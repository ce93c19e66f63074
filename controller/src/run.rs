//! `warmpath-controller run`: wires the reconcilers to watches, starts the HTTP servers (wasm +
//! feed, metrics) and the feed loop; the reconcilers and the feed loop run only while this replica
//! holds the leader Lease (see [`crate::leader`]). Add further controllers to `reconcilers`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use gateway_api::apis::standard::gateways::Gateway;
use gateway_api::apis::standard::httproutes::HttpRoute;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, Controller};
use kube::{Client, ResourceExt};

use crate::crd::routing_policy::InferenceRoutingPolicy;
use crate::feed::refresh;
use crate::feed::server::{self, WasmBlob};
use crate::gateway::{route_annotations, routing_policy};
use crate::reconcile::{Context, ControllerConfig};
use crate::render::{ControllerEndpoint, Provider, WasmModule, XdsNameScheme};

/// Settings of `run` (command-line flags; the Helm chart fills them from values).
#[derive(Clone, Debug)]
pub struct RunArgs {
    /// The data-plane provider (`None`: from each GatewayClass's controllerName).
    pub provider: Option<Provider>,
    /// How Envoy Gateway names its xDS resources.
    pub xds_name_scheme: XdsNameScheme,
    /// The wasm filter module served to gateways.
    pub wasm_file: PathBuf,
    /// Address of the wasm/feed HTTP server.
    pub http_addr: SocketAddr,
    /// Address of the metrics server (`None`: no metrics server).
    pub metrics_addr: Option<SocketAddr>,
    /// The controller's Service as gateways reach it (name, namespace, port, cluster domain).
    pub controller: ControllerEndpoint,
    /// Also run the cache-warming reconcilers (InferenceEndpoint, ModelCache, ImageCache); their
    /// RBAC is granted only then (chart value `agent.enabled`).
    pub cache_warming: bool,
    /// Leader election: the Lease (in `namespace`) and this replica's identity in it.
    pub lease: crate::leader::LeaseSettings,
}

/// Runs the controller until SIGTERM/SIGINT.
///
/// Errors: no cluster access, CRD missing (with an install hint), unreadable wasm module, or a
/// listener that cannot bind.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let client = Client::try_default().await?;
    if let Err(e) = Api::<InferenceRoutingPolicy>::all(client.clone()).list(&ListParams::default().limit(1)).await {
        anyhow::bail!("cannot list InferenceRoutingPolicies ({e}); are the CRDs installed? `kubectl apply -f charts/warmpath/crds/` or install the Helm chart");
    }
    let bytes = std::fs::read(&args.wasm_file)
        .map_err(|e| anyhow::anyhow!("reading wasm module {}: {e}", args.wasm_file.display()))?;
    let blob = WasmBlob::new(bytes);
    let controller = args.controller.clone();
    let config = ControllerConfig {
        provider: args.provider,
        wasm: WasmModule {
            url: format!("http://{}:{}{}", controller.host(), controller.port, blob.path()),
            sha256: blob.sha256.clone(),
        },
        controller,
        xds_name_scheme: args.xds_name_scheme,
        live_status: true,
    };
    tracing::info!(wasm = %config.wasm.url, sha256 = %config.wasm.sha256, provider = ?config.provider, "starting");
    let ctx = Context::new(client.clone(), config);

    let http = tokio::net::TcpListener::bind(args.http_addr).await?;
    let metrics = match args.metrics_addr {
        Some(addr) => Some(tokio::net::TcpListener::bind(addr).await?),
        None => None,
    };
    let http_srv = axum::serve(http, server::router(ctx.feeds.clone(), Some(blob)));
    let metrics_srv = async {
        match metrics {
            Some(listener) => axum::serve(listener, server::metrics_router(ctx.metrics.clone())).await,
            None => std::future::pending().await,
        }
    };

    // Only the Lease holder reconciles and feeds. The HTTP servers run on every replica, but the
    // controller Service selects the pod the leader labels (followers hold no feed and would answer 404).
    let elector = crate::leader::Elector::new(client.clone(), args.lease.clone());
    let pod =
        crate::leader::LeaderPod::new(client.clone(), &args.lease.namespace, &args.lease.identity, &args.lease.name);
    let cache_warming = args.cache_warming;
    let leading = crate::leader::run_while_leading(
        &elector,
        Some(&pod),
        || reconcilers(client.clone(), ctx.clone(), cache_warming),
        |now_leading| {
            if !now_leading {
                // A former leader must not keep serving snapshots nobody refreshes.
                let keys: Vec<String> =
                    ctx.feed_sources.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
                keys.iter().for_each(|k| ctx.remove_feed(k));
            }
        },
    );
    tokio::select! {
        _ = leading => {}
        r = http_srv => r?,
        r = metrics_srv => r?,
        _ = shutdown_signal() => {
            if let Err(e) = elector.release(k8s_openapi::jiff::Timestamp::now()).await {
                tracing::warn!(error = %e, "could not release the leader Lease");
            }
        }
    }
    Ok(())
}

/// The reconcilers and the feed loop: what only the leader runs. Completes only if they all stop.
async fn reconcilers(client: Client, ctx: Context, cache_warming: bool) {
    let wc = watcher::Config::default();
    let policy_ctl = Controller::new(Api::<InferenceRoutingPolicy>::all(client.clone()), wc.clone());
    let store = policy_ctl.store();
    let (s1, s2, s3) = (store.clone(), store.clone(), store);
    let policies = policy_ctl
        .watches(Api::<HttpRoute>::all(client.clone()), wc.clone(), move |route: HttpRoute| {
            let (ns, name) = (route.namespace(), route.name_any());
            s1.state()
                .into_iter()
                .filter(|p| p.namespace() == ns && p.spec.target_refs.iter().any(|t| t.name == name))
                .map(|p| ObjectRef::from_obj(&*p))
                .collect::<Vec<_>>()
        })
        .watches(Api::<Service>::all(client.clone()), wc.clone(), move |svc: Service| {
            let ns = svc.namespace();
            s2.state().into_iter().filter(|p| p.namespace() == ns).map(|p| ObjectRef::from_obj(&*p)).collect::<Vec<_>>()
        })
        .watches(Api::<Gateway>::all(client.clone()), wc.clone(), move |_gw: Gateway| {
            s3.state().into_iter().map(|p| ObjectRef::from_obj(&*p)).collect::<Vec<_>>()
        })
        .run(routing_policy::reconcile, routing_policy::error_policy, Arc::new(ctx.clone()))
        .for_each(|_| futures::future::ready(()));
    let routes = Controller::new(Api::<HttpRoute>::all(client.clone()), wc.clone())
        .watches(Api::<InferenceRoutingPolicy>::all(client.clone()), wc, |p: InferenceRoutingPolicy| {
            let ns = p.namespace().unwrap_or_default();
            p.spec.target_refs.iter().map(|t| ObjectRef::<HttpRoute>::new(&t.name).within(&ns)).collect::<Vec<_>>()
        })
        .run(route_annotations::reconcile, route_annotations::error_policy, Arc::new(ctx.clone()))
        .for_each(|_| futures::future::ready(()));
    let cache = async {
        if cache_warming {
            crate::warming::run(Arc::new(ctx.clone())).await;
        } else {
            tracing::info!("cache warming off: InferenceEndpoint, ModelCache and ImageCache are not reconciled");
        }
    };
    tokio::select! {
        _ = async { tokio::join!(policies, routes, cache) } => {}
        _ = refresh::run(ctx.clone()) => {}
    }
}

/// SIGTERM (pod deletion) or SIGINT.
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
