//! Golden tests of `render -f`: every `testdata/render/<case>.yaml` is rendered through the real
//! reconcilers (offline, in-memory API) and compared with `<case>.expected.yaml` (objects, then
//! the policies' conditions as comments). Regenerate with `WARMPATH_BLESS=1 cargo test -p
//! warmpath-controller --test render_golden` and review the diff.

use std::path::{Path, PathBuf};
use std::process::Command;

use warmpath_controller::reconcile::ControllerConfig;
use warmpath_controller::render::{ControllerEndpoint, WasmModule, XdsNameScheme};

/// sha256 of the bytes `warmpath` — a fixed stand-in so the goldens do not depend on a wasm build.
const SHA: &str = "045fe3661531d607341bb5878db489d5cd8a55f65289da111fb3d42075e74101";

fn cases() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/render");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml") && !p.to_string_lossy().ends_with(".expected.yaml"))
        .collect();
    v.sort();
    assert!(v.len() >= 2, "test cases missing in {}", dir.display());
    v
}

fn config() -> ControllerConfig {
    let controller = ControllerEndpoint::new("warmpath-controller", "warmpath-system", 8080);
    ControllerConfig {
        provider: None,
        wasm: WasmModule {
            url: format!("http://{}:8080/wasm/warmpath_filter-{}.wasm", controller.host(), &SHA[..16]),
            sha256: SHA.into(),
        },
        controller,
        xds_name_scheme: XdsNameScheme::V1,
        live_status: false,
    }
}

fn golden_text(objects: &str, status: &[String]) -> String {
    let mut s = String::from(objects);
    for l in status {
        s.push_str(&format!("# {l}\n"));
    }
    s
}

#[tokio::test]
async fn rendered_objects_match_the_goldens() {
    for case in cases() {
        let text = std::fs::read_to_string(&case).unwrap();
        let manifests = warmpath_controller::offline::parse_manifests(&text).unwrap();
        let out = warmpath_controller::offline::render(manifests, config()).await.unwrap();
        assert!(!out.objects.is_empty(), "{}: nothing rendered", case.display());
        let got = golden_text(&warmpath_controller::render::to_yaml_stream(&out.objects).unwrap(), &out.status);
        let expected_path = case.with_extension("expected.yaml");
        if std::env::var_os("WARMPATH_BLESS").is_some() {
            std::fs::write(&expected_path, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&expected_path)
            .unwrap_or_else(|_| panic!("{} missing: run with WARMPATH_BLESS=1", expected_path.display()));
        assert_eq!(got, want, "{} differs from its golden", case.display());
        // Every plugin configuration we render is one the filter accepts.
        for o in &out.objects {
            let cfg = o.data["spec"]["wasm"][0]["config"].clone();
            let cfg = if cfg.is_null() { o.data["spec"]["pluginConfig"].clone() } else { cfg };
            if !cfg.is_null() {
                warmpath_core::Settings::from_json(cfg.to_string().as_bytes()).unwrap();
            }
        }
    }
}

#[test]
fn the_binary_prints_the_same_objects() {
    let case = &cases()[0];
    let out = Command::new(env!("CARGO_BIN_EXE_warmpath-controller"))
        .args(["render", "-f"])
        .arg(case)
        .args(["--wasm-sha256", SHA])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    let status: Vec<String> = stderr
        .lines()
        .filter(|l| l.starts_with("InferenceRoutingPolicy ") || l.starts_with("HTTPRoute "))
        .map(String::from)
        .collect();
    let want = std::fs::read_to_string(case.with_extension("expected.yaml")).unwrap();
    assert_eq!(golden_text(&stdout, &status), want);
}

/// The README's annotated HTTPRoute alone (its Gateway, GatewayClass and backend Service not among the inputs):
/// nothing can be rendered, and the command says why — per route, the reasons the controller publishes in the
/// route's events — and exits non-zero.
#[test]
fn render_of_a_route_alone_says_why_nothing_was_rendered() {
    let text = std::fs::read_to_string(cases().into_iter().find(|c| c.ends_with("docs-annotated-route.yaml")).unwrap())
        .unwrap();
    let route = text.split("\n---\n").find(|d| d.contains("kind: HTTPRoute")).expect("the case has the route");
    let out = render_text(route);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exit 0 with nothing rendered; stderr: {stderr}");
    assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(stderr.contains("HTTPRoute llm/chat: Warning NotProgrammed"), "{stderr}");
    assert!(stderr.contains("Gateway gateways/inference-gateway not found"), "{stderr}");
    assert!(stderr.contains("backend Service llm/vllm-llama not found"), "{stderr}");
    assert!(stderr.contains("nothing rendered"), "{stderr}");
}

#[test]
fn render_refuses_bad_yaml_and_bad_sha() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "kind: [unclosed").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_warmpath-controller"))
        .args(["render", "-f"])
        .arg(&bad)
        .args(["--wasm-sha256", SHA])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("YAML"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(env!("CARGO_BIN_EXE_warmpath-controller"))
        .args(["render", "-f"])
        .arg(&cases()[0])
        .args(["--wasm-sha256", "xyz"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("64 hex"));
    // An object without a name: said so, where the reconcilers would have failed on something else.
    let endpoint =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/cache/endpoint.yaml")).unwrap();
    let out = render_text(&endpoint.replacen("  name: qwen3-8b\n", "", 1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("InferenceEndpoint (document 1) has no metadata.name"),
        "{stderr}"
    );
}

/// The one `render` command covers cache warming too: an InferenceEndpoint renders what the
/// cache-warming reconcilers create for it, and nothing of the routing kinds by itself.
#[tokio::test]
async fn inference_endpoints_render_their_cache_warming_objects() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/cache/endpoint.yaml");
    let manifests = warmpath_controller::offline::parse_manifests(&std::fs::read_to_string(path).unwrap()).unwrap();
    let out = warmpath_controller::offline::render(manifests, config()).await.unwrap();
    let mut kinds: Vec<String> = out.objects.iter().map(|o| o.types.as_ref().unwrap().kind.clone()).collect();
    kinds.sort();
    assert_eq!(kinds, ["DaemonSet", "Deployment", "ImageCache", "InferenceRoutingPolicy", "ModelCache", "Service"]);
    let dep = out.objects.iter().find(|o| o.types.as_ref().unwrap().kind == "Deployment").unwrap();
    let owner = &dep.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.uid.is_empty()), ("InferenceEndpoint", false), "owned by its endpoint");
    assert!(out.status.is_empty(), "no policy among the inputs: {:?}", out.status);
}

/// `render` checks InferenceEndpoints like the API server: the CRD schema (ranges, patterns,
/// unknown fields) and its CEL rules; a bad endpoint is a clear error and a non-zero exit.
#[test]
fn render_refuses_endpoints_the_api_server_would_refuse() {
    let good = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/cache/endpoint.yaml")).unwrap();
    let render = |text: &str| {
        let out = render_text(text);
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ok, err) = render(&good);
    assert!(ok, "{err}");
    for (what, from, to, needle) in [
        ("negative replicas", "replicas: 2", "replicas: -5", "replicas"),
        ("port out of range", "port: 8000", "port: 70000", "port"),
        (
            "relative hostPath",
            "weightsCache: {enabled: true}",
            "weightsCache: {enabled: true, hostPath: models}",
            "hostPath",
        ),
        ("unknown key", "replicas: 2", "replicas: 2\n  replica: 3", "replica"),
        (
            "two sources",
            "    huggingFace:",
            "    http: {url: \"https://h/m.gguf\"}\n    huggingFace:",
            "exactly one of s3, http, huggingFace, volume",
        ),
        ("non-hex sha256", "replicas: 2", "replicas: 2\n  sha256: {model.safetensors: nothex}", "sha256"),
        // The name names the endpoint's Service and a label value: a DNS label starting with a letter.
        ("a dot in the name", "name: qwen3-8b", "name: qwen2.5-7b", "must be a DNS label"),
        ("a digit first", "name: qwen3-8b", "name: 7b-llama", "must be a DNS label"),
        (
            "a name over 63 characters",
            "name: qwen3-8b",
            "name: bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
            "must be a DNS label",
        ),
        (
            "an http URL with a query",
            "    huggingFace:\n      repo: Qwen/Qwen3-8B\n      revision: main\n      tokenSecretRef: {name: hf-token}",
            "    http: {url: \"https://h/m.gguf?X-Amz-Signature=1\"}",
            "/spec/model/http/url",
        ),
    ] {
        assert!(good.contains(from), "{what}: fixture changed");
        let (ok, err) = render(&good.replacen(from, to, 1));
        assert!(!ok, "{what} accepted");
        assert!(err.contains(needle), "{what}: {err}");
    }
}

/// Two endpoints of one image on the same nodes share its ImageCache and pre-pull DaemonSet: `render` prints each
/// once (it printed both twice), and each endpoint's own objects once each.
#[test]
fn endpoints_sharing_an_image_render_its_cache_once() {
    let one = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/cache/endpoint.yaml")).unwrap();
    let two = format!("{one}\n---\n{}", one.replacen("name: qwen3-8b", "name: qwen3-8b-second", 1));
    let out = render_text(&two);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let count = |kind: &str| {
        stdout.matches(&format!("\nkind: {kind}\n")).count()
            + usize::from(stdout.starts_with(&format!("kind: {kind}\n")))
    };
    assert_eq!((count("ImageCache"), count("DaemonSet")), (1, 1), "{stdout}");
    assert_eq!((count("Deployment"), count("Service"), count("ModelCache")), (2, 2, 2), "{stdout}");
}

/// `render` checks InferenceRoutingPolicies like the API server: the schema of the CRD generated
/// from the types (the strategy enum in its one spelling, ranges, unknown fields) and its CEL rules.
#[test]
fn render_refuses_policies_the_api_server_would_refuse() {
    let good =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/render/envoy-gateway.yaml")).unwrap();
    let render = |text: &str| {
        let out = render_text(text);
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ok, err) = render(&good);
    assert!(ok, "{err}");
    for (what, from, to, needle) in [
        (
            "another spelling of the strategy",
            "strategy: PREFIX_AWARE",
            "strategy: prefix-aware",
            r#"/spec/strategy: "prefix-aware" is not one of "RANDOM", "LEAST_OUTSTANDING_REQUESTS" or "PREFIX_AWARE""#,
        ),
        ("prefixLength out of range", "prefixLength: 4096", "prefixLength: 100", "/spec/prefixLength"),
        ("unknown field", "prefixLength: 4096", "prefixLenght: 4096", "prefixLenght"),
        ("wrong type", "intervalSeconds: 2", "intervalSeconds: soon", "/spec/load/intervalSeconds"),
        (
            "CEL rule",
            "strategy: PREFIX_AWARE",
            "strategy: RANDOM",
            "prefixLength applies only to strategy PREFIX_AWARE",
        ),
        ("bad failureMode", "failureMode: FailClosed", "failureMode: Sometimes", "/spec/failureMode"),
    ] {
        assert!(good.contains(from), "{what}: fixture changed");
        let (ok, err) = render(&good.replacen(from, to, 1));
        assert!(!ok, "{what} accepted");
        assert!(err.contains(needle), "{what}: {err}");
        assert!(err.contains("InferenceRoutingPolicy "), "{what}: the error names the object: {err}");
    }
}

/// The binary's `render -f case --wasm-sha256 SHA` with `extra` arguments.
fn render_with(case: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_warmpath-controller"))
        .args(["render", "-f"])
        .arg(case)
        .args(["--wasm-sha256", SHA])
        .args(extra)
        .output()
        .unwrap()
}

/// [`render_with`] of `text` written to a file of its own, without extra arguments.
fn render_text(text: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("input.yaml");
    std::fs::write(&file, text).unwrap();
    render_with(&file, &[])
}

/// `--cluster-domain` (env `WARMPATH_CLUSTER_DOMAIN`) replaces `cluster.local` in every Service
/// name rendered; a value that is no DNS name is refused.
#[test]
fn render_uses_the_configured_cluster_domain() {
    let case = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/render/istio-annotated.yaml");
    let run = |domain: &str| render_with(&case, &["--cluster-domain", domain]);
    let out = run("corp.example");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(!stdout.contains("cluster.local"), "{stdout}");
    for want in [
        "outbound|30000||sglang-qwen.llm.svc.corp.example",
        "service: sglang-qwen.llm.svc.corp.example",
        "http://warmpath-controller.warmpath-system.svc.corp.example:8080/wasm/",
    ] {
        assert!(stdout.contains(want), "{want} missing: {stdout}");
    }
    let out = run("Corp.Example.");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not a DNS name"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The settings rendered into the controller's own URLs and the provider are checked before anything is rendered:
/// an unknown provider, a namespace or Service name that is no DNS label, and port 0 are refused with a message
/// naming the flag, where they used to render as `auto`, `http://Bad_Name!.warmpath-system...` or `...:0/wasm/`.
#[test]
fn render_refuses_settings_that_cannot_be_rendered() {
    let case = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/render/istio-annotated.yaml");
    for (extra, want) in [
        (&["--provider", "foo"][..], "unknown provider \"foo\": expected auto, envoy-gateway or istio"),
        (&["--namespace", ""][..], "namespace \"\" is not a DNS label"),
        (&["--namespace", "Prod"][..], "namespace \"Prod\" is not a DNS label"),
        (&["--service", "Bad_Name!"][..], "service name \"Bad_Name!\" is not a DNS label"),
        (&["--service", "9controller"][..], "service name \"9controller\" is not a DNS label starting with a letter"),
        (&["--service-port", "0"][..], "--service-port"),
    ] {
        let out = render_with(&case, extra);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && out.stdout.is_empty(), "{extra:?} rendered:\n{stderr}");
        assert!(stderr.contains(want), "{extra:?}: {want:?} missing from:\n{stderr}");
    }
    // Each provider name, and valid names, still render.
    for extra in [
        &["--provider", "auto"][..],
        &["--provider", "istio"],
        &["--namespace", "ai-gateway", "--service", "warmpath", "--service-port", "9443"],
    ] {
        let out = render_with(&case, extra);
        assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let out = render_with(&case, &["--namespace", "ai-gateway", "--service", "warmpath", "--service-port", "9443"]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("http://warmpath.ai-gateway.svc.cluster.local:9443/wasm/"), "{stdout}");
}

/// Envoy Gateway's `XDSNameSchemeV2` names: the `EnvoyPatchPolicy` patches the xDS listener and route
/// configuration of port 80 as `tcp-80` and `http-80`, where v1 (the default) names both after the Gateway's
/// listener. The binary takes the scheme as `--envoy-gateway-xds-name-scheme` and refuses anything but v1 and v2.
#[tokio::test]
async fn envoy_gateway_resources_are_named_by_the_configured_scheme() {
    let case = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/render/envoy-gateway.yaml");
    let manifests = warmpath_controller::offline::parse_manifests(&std::fs::read_to_string(&case).unwrap()).unwrap();
    let patched = |objects: &[kube::core::DynamicObject], ty: &str| -> Vec<String> {
        let epp = objects.iter().find(|o| o.types.as_ref().is_some_and(|t| t.kind == "EnvoyPatchPolicy")).unwrap();
        let patches = epp.data["spec"]["jsonPatches"].as_array().unwrap();
        let mut names: Vec<String> =
            patches.iter().filter(|p| p["type"] == ty).map(|p| p["name"].as_str().unwrap().into()).collect();
        names.dedup();
        names
    };
    let listener = "type.googleapis.com/envoy.config.listener.v3.Listener";
    let route_config = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
    for (scheme, want_listener, want_route_config) in [
        (XdsNameScheme::V1, "gateways/inference-gateway/http", "gateways/inference-gateway/http"),
        (XdsNameScheme::V2, "tcp-80", "http-80"),
    ] {
        let config = ControllerConfig { xds_name_scheme: scheme, ..config() };
        let out = warmpath_controller::offline::render(manifests.clone(), config).await.unwrap();
        assert_eq!(patched(&out.objects, listener), [want_listener], "{scheme:?}");
        assert_eq!(patched(&out.objects, route_config), [want_route_config], "{scheme:?}");
    }
    let run = |scheme: &str| render_with(&case, &["--envoy-gateway-xds-name-scheme", scheme]);
    let out = run("v2");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("- name: tcp-80\n") && !stdout.contains("gateways/inference-gateway/http"), "{stdout}");
    let out = run("V2");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("expected v1") && err.contains("XDSNameSchemeV2"), "{err}");
}

/// docs/quickstart.md's manifests, taken from the page verbatim: `render` programs the annotated
/// route on Envoy Gateway (the offline part of the quickstart; the rest needs a cluster).
#[tokio::test]
async fn quickstart_manifests_render_and_program() {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/quickstart.md")).unwrap();
    let blocks: Vec<&str> = page.split("```yaml\n").skip(1).map(|b| b.split("```").next().unwrap()).collect();
    assert_eq!(blocks.len(), 1, "the quickstart has one manifest block");
    let manifests = warmpath_controller::offline::parse_manifests(blocks[0]).unwrap();
    let out = warmpath_controller::offline::render(manifests, config()).await.unwrap();
    assert_eq!(
        out.status,
        ["HTTPRoute llm/chat: Normal Programmed: strategy PREFIX_AWARE via annotations: 3 object(s)"],
        "{:?}",
        out.status
    );
    let kinds: Vec<(String, String)> = out
        .objects
        .iter()
        .map(|o| (o.types.as_ref().unwrap().kind.clone(), o.metadata.namespace.clone().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("BackendTrafficPolicy".into(), "llm".into()),
            ("EnvoyExtensionPolicy".into(), "llm".into()),
            ("EnvoyPatchPolicy".into(), "gateways".into())
        ]
    );
    let eep = &out.objects[1].data["spec"]["wasm"][0]["config"];
    assert_eq!(
        (eep["strategy"].as_str(), eep["prefix_length"].as_u64(), eep["debug_header"].as_bool()),
        (Some("PREFIX_AWARE"), Some(1024), Some(true))
    );
    assert_eq!(
        out.objects[0].data["spec"]["loadBalancer"]["endpointOverride"]["extractFrom"][0]["header"],
        "x-gateway-destination-endpoint"
    );
    let patches = out.objects[2].data["spec"]["jsonPatches"].to_string();
    assert!(
        patches.contains("allow_on_headers_stop_iteration") && patches.contains("gateways/inference-gateway/http"),
        "{patches}"
    );
}
