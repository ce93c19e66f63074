//! `warmpath-controller` command line: `run` (the controller), `render -f FILE...` (print offline
//! what would be created), `crdgen` (write the CRDs into the Helm chart), `feed` (a standalone
//! endpoint/load feed server, for local end-to-end tests without a cluster), `cleanup` (uninstall:
//! remove what the controller created and its finalizers).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use warmpath_controller::feed::{scrape, server, store::FeedStore, FeedEndpoint, FeedSnapshot};
use warmpath_controller::reconcile::ControllerConfig;
use warmpath_controller::render::{ControllerEndpoint, Provider, WasmModule, XdsNameScheme};

#[derive(Parser)]
#[command(name = "warmpath-controller", version, about = "warmpath Kubernetes controller")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone)]
struct Common {
    /// Data-plane provider: auto (from each GatewayClass's controllerName), envoy-gateway, istio.
    #[arg(long, env = "WARMPATH_PROVIDER", default_value = "auto", value_parser = parse_provider)]
    provider: ProviderArg,
    /// Service through which gateways reach the controller (wasm module and feed).
    #[arg(long, env = "WARMPATH_SERVICE", default_value = "warmpath-controller", value_parser = parse_service)]
    service: String,
    /// Namespace of that Service (in a pod: the downward-API POD_NAMESPACE).
    #[arg(long, env = "POD_NAMESPACE", default_value = "warmpath-system", value_parser = parse_namespace)]
    namespace: String,
    /// Service port of the controller's HTTP server.
    #[arg(long, env = "WARMPATH_SERVICE_PORT", default_value_t = 8080, value_parser = clap::value_parser!(u16).range(1..))]
    service_port: u16,
    /// The cluster's DNS domain: every Service name is rendered as `<svc>.<ns>.svc.<domain>`.
    #[arg(long, env = "WARMPATH_CLUSTER_DOMAIN", default_value = warmpath_controller::render::DEFAULT_CLUSTER_DOMAIN, value_parser = parse_cluster_domain)]
    cluster_domain: String,
    /// Envoy Gateway's xDS resource names: v1, or v2 when its `XDSNameSchemeV2` runtime flag is on (the
    /// `EnvoyPatchPolicy` operations name listeners and route configurations).
    #[arg(long, env = "WARMPATH_ENVOY_GATEWAY_XDS_NAME_SCHEME", default_value = "v1", value_parser = XdsNameScheme::parse)]
    envoy_gateway_xds_name_scheme: XdsNameScheme,
}

fn parse_cluster_domain(s: &str) -> Result<String, String> {
    warmpath_controller::render::validate_cluster_domain(s).map(|()| s.to_string())
}

/// `--provider` as parsed (`None`: auto). A plain `Option` field would tell clap the flag is optional instead.
#[derive(Clone, Copy)]
struct ProviderArg(Option<Provider>);

fn parse_provider(s: &str) -> Result<ProviderArg, String> {
    Provider::parse(s).map(ProviderArg)
}

/// `--metrics-addr` as parsed (`None`: `off`).
#[derive(Clone, Copy)]
struct MetricsAddr(Option<SocketAddr>);

fn parse_metrics_addr(s: &str) -> Result<MetricsAddr, String> {
    if s == "off" {
        return Ok(MetricsAddr(None));
    }
    s.parse().map(|a| MetricsAddr(Some(a))).map_err(|e| format!("{s:?} is neither an IP:port nor off: {e}"))
}

fn parse_feed_key(s: &str) -> Result<String, String> {
    warmpath_controller::render::validate_feed_key(s).map(|()| s.to_string())
}

fn parse_namespace(s: &str) -> Result<String, String> {
    warmpath_controller::render::validate_namespace(s).map(|()| s.to_string())
}

fn parse_service(s: &str) -> Result<String, String> {
    warmpath_controller::render::validate_service_name(s).map(|()| s.to_string())
}

impl Common {
    fn controller(&self) -> ControllerEndpoint {
        ControllerEndpoint {
            cluster_domain: self.cluster_domain.clone(),
            ..ControllerEndpoint::new(&self.service, &self.namespace, self.service_port)
        }
    }
}

/// Leader election settings (the Lease lives in the controller's namespace).
#[derive(clap::Args, Clone)]
struct LeaseArgs {
    /// Name of the Lease the replicas elect their leader with (one per installation).
    #[arg(long, env = "WARMPATH_LEADER_LEASE", default_value = "warmpath-controller")]
    leader_lease: String,
    /// This replica's identity in the Lease (in a pod: the downward-API POD_NAME; else the host name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
}

impl LeaseArgs {
    fn settings(&self, namespace: &str) -> warmpath_controller::leader::LeaseSettings {
        let identity = self
            .identity
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| format!("warmpath-controller-{}", std::process::id()));
        warmpath_controller::leader::LeaseSettings::new(namespace, &self.leader_lease, identity)
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the controller against the cluster of the current kubeconfig / service account.
    Run {
        #[command(flatten)]
        common: Common,
        /// The wasm filter module to serve to gateways.
        #[arg(long, env = "WARMPATH_WASM_FILE", default_value = "/opt/warmpath/warmpath_filter.wasm")]
        wasm_file: PathBuf,
        /// Listen address of the HTTP server (wasm module, feed, health).
        #[arg(long, env = "WARMPATH_HTTP_ADDR", default_value = "0.0.0.0:8080")]
        http_addr: SocketAddr,
        /// Listen address of the metrics server, or `off` for none.
        #[arg(long, env = "WARMPATH_METRICS_ADDR", default_value = "0.0.0.0:9090", value_parser = parse_metrics_addr)]
        metrics_addr: MetricsAddr,
        /// Also run the cache-warming reconcilers (InferenceEndpoint, ModelCache, ImageCache): `true` or `false`.
        #[arg(long, env = "WARMPATH_CACHE_WARMING", default_value_t = false, action = clap::ArgAction::Set)]
        cache_warming: bool,
        #[command(flatten)]
        lease: LeaseArgs,
    },
    /// Uninstall clean-up (the chart's pre-delete hook): stop the controller, then delete every object
    /// it rendered and release its finalizers on HTTPRoutes and InferenceRoutingPolicies.
    Cleanup {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        lease: LeaseArgs,
        /// The controller Deployment (in --namespace) to scale to 0 first; omit when it is already stopped.
        #[arg(long, env = "WARMPATH_DEPLOYMENT")]
        deployment: Option<String>,
        /// How long to wait for the running controller to give up its Lease.
        #[arg(long, default_value_t = 60)]
        timeout_seconds: u64,
    },
    /// Print every object the controller would create for the given manifests (YAML, offline):
    /// routing (policies, annotated HTTPRoutes) and cache warming (InferenceEndpoints). Policy
    /// conditions go to stderr.
    Render {
        /// Manifest files (multi-document YAML): policies, HTTPRoutes, Gateways, GatewayClasses, Services, InferenceEndpoints, ...
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<PathBuf>,
        #[command(flatten)]
        common: Common,
        /// The wasm module whose sha256 is rendered (default: the release build in target/).
        #[arg(long, conflicts_with = "wasm_sha256")]
        wasm_file: Option<PathBuf>,
        /// The sha256 (64 hex) to render instead of hashing a file.
        #[arg(long)]
        wasm_sha256: Option<String>,
        /// Output format: yaml (a `---` stream) or json (one array).
        #[arg(short = 'o', long, default_value = "yaml", value_parser = ["yaml", "json"])]
        output: String,
    },
    /// Write the CRDs generated from the Rust types (one file per CRD) into the --out folder.
    Crdgen {
        /// Output directory; `-` prints all CRDs to stdout.
        #[arg(long, default_value = "charts/warmpath/crds")]
        out: String,
    },
    /// Serve a feed without a cluster: from explicit endpoints (their metrics are scraped) or a
    /// JSON file (re-read every interval). Prints `listening on http://ADDR/v1/feed/KEY`.
    Feed {
        /// Listen address (port 0: any free port).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// Feed key: `policy/<namespace>/<name>` or `httproute/<namespace>/<name>`.
        #[arg(long, default_value = "policy/default/local", value_parser = parse_feed_key)]
        key: String,
        /// Endpoints `IP:port` (comma-separated); each is scraped at `--metrics-path`.
        #[arg(long, value_delimiter = ',', conflicts_with = "file", required_unless_present = "file")]
        endpoints: Vec<String>,
        /// A feed document (`{"endpoints":[{"address":...,"load":{...}}]}`), re-read every interval.
        #[arg(long)]
        file: Option<PathBuf>,
        /// Metrics path on each endpoint.
        #[arg(long, default_value = "/metrics")]
        metrics_path: String,
        /// Refresh period in milliseconds.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Runtime::new()?;
    match cli.cmd {
        Cmd::Crdgen { out } => crdgen(&out),
        Cmd::Run { common, wasm_file, http_addr, metrics_addr, cache_warming, lease } => {
            // Port 0 asks for any free port, a different one for each listener; two addresses clash when one of
            // them listens on every interface or both on the same one.
            let clash = metrics_addr.0.is_some_and(|m| {
                m.port() != 0
                    && m.port() == http_addr.port()
                    && (m.ip().is_unspecified() || http_addr.ip().is_unspecified() || m.ip() == http_addr.ip())
            });
            anyhow::ensure!(
                !clash,
                "--metrics-addr and --http-addr cannot share port {}: give the metrics server another port, or off",
                http_addr.port()
            );
            rt.block_on(warmpath_controller::run::run(warmpath_controller::run::RunArgs {
                controller: common.controller(),
                provider: common.provider.0,
                xds_name_scheme: common.envoy_gateway_xds_name_scheme,
                wasm_file,
                http_addr,
                metrics_addr: metrics_addr.0,
                lease: lease.settings(&common.namespace),
                cache_warming,
            }))
        }
        Cmd::Cleanup { common, lease, deployment, timeout_seconds } => {
            rt.block_on(cleanup(common, lease, deployment, timeout_seconds))
        }
        Cmd::Render { files, common, wasm_file, wasm_sha256, output } => {
            rt.block_on(render(files, common, wasm_file, wasm_sha256, &output))
        }
        Cmd::Feed { listen, key, endpoints, file, metrics_path, interval_ms } => {
            rt.block_on(feed(listen, key, endpoints, file, metrics_path, interval_ms))
        }
    }
}

async fn cleanup(
    common: Common,
    lease: LeaseArgs,
    deployment: Option<String>,
    timeout_seconds: u64,
) -> anyhow::Result<()> {
    use warmpath_controller::{cleanup, leader};
    let client = kube::Client::try_default().await?;
    let mut settings = lease.settings(&common.namespace);
    settings.identity = format!("{}-cleanup", settings.identity);
    let elector = leader::Elector::new(client.clone(), settings);
    cleanup::stop_controller(
        &client,
        &common.namespace,
        deployment.as_deref(),
        &elector,
        Duration::from_secs(timeout_seconds),
    )
    .await?;
    let config = ControllerConfig { provider: common.provider.0, ..ControllerConfig::default() };
    let report = cleanup::remove_all(&warmpath_controller::reconcile::Context::new(client, config)).await?;
    // The Lease is the controller's runtime object, not the chart's: nobody else deletes it.
    elector.delete().await?;
    println!(
        "released {} HTTPRoute(s), {} InferenceRoutingPolicy(ies) and {} cache-warming object(s); deleted {} rendered object(s)",
        report.routes_released, report.policies_released, report.cache_objects_released, report.objects_deleted
    );
    Ok(())
}

fn crdgen(out: &str) -> anyhow::Result<()> {
    for crd in warmpath_controller::crd::all() {
        let yaml = warmpath_controller::crd::to_yaml(&crd)?;
        if out == "-" {
            print!("---\n{yaml}");
        } else {
            let name = crd.metadata.name.clone().unwrap_or_default();
            std::fs::create_dir_all(out)?;
            std::fs::write(PathBuf::from(out).join(format!("{name}.yaml")), yaml)?;
        }
    }
    Ok(())
}

async fn render(
    files: Vec<PathBuf>,
    common: Common,
    wasm_file: Option<PathBuf>,
    wasm_sha256: Option<String>,
    output: &str,
) -> anyhow::Result<()> {
    let mut manifests = vec![];
    for f in &files {
        let text = std::fs::read_to_string(f).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?;
        manifests.extend(
            warmpath_controller::offline::parse_manifests(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?,
        );
    }
    let (sha256, path) = match (wasm_sha256, wasm_file) {
        (Some(s), _) => {
            anyhow::ensure!(
                s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()),
                "--wasm-sha256 must be 64 hex characters"
            );
            let s = s.to_ascii_lowercase();
            let path = format!("/wasm/warmpath_filter-{}.wasm", &s[..16]);
            (s, path)
        }
        (None, file) => {
            let file = file.unwrap_or_else(|| PathBuf::from("target/wasm32-wasip1/release/warmpath_filter.wasm"));
            let bytes = std::fs::read(&file).map_err(|e| {
                anyhow::anyhow!("{}: {e} (build the filter, or pass --wasm-file / --wasm-sha256)", file.display())
            })?;
            let blob = server::WasmBlob::new(bytes);
            (blob.sha256.clone(), blob.path())
        }
    };
    let controller = common.controller();
    let config = ControllerConfig {
        provider: common.provider.0,
        wasm: WasmModule { url: format!("http://{}:{}{}", controller.host(), controller.port, path), sha256 },
        controller,
        xds_name_scheme: common.envoy_gateway_xds_name_scheme,
        live_status: false,
    };
    let out = warmpath_controller::offline::render(manifests, config).await.map_err(anyhow::Error::msg)?;
    for line in &out.status {
        eprintln!("{line}");
    }
    if out.objects.is_empty() {
        // Say why instead of printing nothing: the conditions above name each route's reason (e.g. its Gateway,
        // GatewayClass or backend Service is not among the inputs).
        if out.status.is_empty() {
            anyhow::bail!(
                "nothing rendered: no InferenceRoutingPolicy, InferenceEndpoint or HTTPRoute with a warmpath.dev \
                 annotation among the inputs (a ModelCache or ImageCache made by hand renders nothing: the agent and \
                 the controller act on it as it is)"
            );
        }
        anyhow::bail!("nothing rendered (see the conditions above)");
    }
    if output == "json" {
        println!("{}", serde_json::to_string_pretty(&out.objects)?);
    } else {
        print!("{}", warmpath_controller::render::to_yaml_stream(&out.objects)?);
    }
    Ok(())
}

async fn feed(
    listen: SocketAddr,
    key: String,
    endpoints: Vec<String>,
    file: Option<PathBuf>,
    metrics_path: String,
    interval_ms: u64,
) -> anyhow::Result<()> {
    let store = FeedStore::default();
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let targets: Vec<scrape::Target> = endpoints
        .iter()
        .map(|e| {
            let a = warmpath_core::config::normalize_address(e)
                .ok_or_else(|| anyhow::anyhow!("endpoint {e:?} is not IP:port"))?;
            Ok(scrape::Target { address: a.clone(), metrics_address: a })
        })
        .collect::<anyhow::Result<_>>()?;
    let http = reqwest::Client::new();
    let refresh = |store: FeedStore| {
        let (http, targets, file, metrics_path, key) =
            (http.clone(), targets.clone(), file.clone(), metrics_path.clone(), key.clone());
        async move {
            let eps: Result<Vec<FeedEndpoint>, String> = match &file {
                Some(f) => std::fs::read(f)
                    .map_err(|e| e.to_string())
                    .and_then(|b| FeedSnapshot::from_json(&b).map_err(|e| e.to_string()))
                    .map(|s| s.endpoints),
                None => Ok(scrape::scrape_all(&http, &targets, &metrics_path).await.endpoints),
            };
            match eps {
                Ok(eps) => {
                    store.update(&key, eps);
                }
                Err(e) => tracing::warn!(error = %e, "feed source unreadable; keeping the last snapshot"),
            }
        }
    };
    refresh(store.clone()).await;
    println!("listening on http://{addr}/v1/feed/{key}");
    std::io::stdout().flush()?;
    let app = server::router(store.clone(), None);
    let srv = axum::serve(listener, app);
    let mut tick = tokio::time::interval(Duration::from_millis(interval_ms.max(50)));
    let poll = async {
        loop {
            tick.tick().await;
            refresh(store.clone()).await;
        }
    };
    tokio::select! {
        r = srv => r?,
        _ = poll => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}
