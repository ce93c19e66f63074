//! Scale-out timeline calculator: how long until a new model-server replica serves, with and without
//! the image cache and the weights cache, on warm and cold nodes, and for a whole scale-out.
//!
//! Model (all sizes in decimal GB = 10⁹ bytes, bandwidths in GB/s, times in seconds):
//! - image pull      = `image_gb / registry_gbps` (effective pull incl. extraction, per node)
//! - weights fetch   = `weights_gb / b`, `b = min(object_store_gbps, object_store_aggregate_gbps / k)`
//!   where `k` is the number of nodes fetching at the same time (aggregate cap off when unset)
//! - weights load    = `weights_gb / nvme_gbps` (reading node-local NVMe into the server; paid in every case)
//! - Without caches the pod does these in sequence (kubelet pulls, then the server downloads, then loads).
//! - A warm node holds whatever is cached: nothing to pull or fetch for that cache.
//! - A cold node with both caches on has the agent and the pre-pull DaemonSet working in parallel from
//!   the moment it joins, so it pays `max(pull, fetch)` instead of their sum.
//! - The fleet time is when the last of `nodes` replicas serves (`nodes - warm_nodes` are cold).
//! - Scale from zero: cold nodes are nodes that join for the scale-out, so they first wait
//!   `provision_s` (cluster autoscaler reaction + instance boot + kubelet ready). The controller creates
//!   the Deployment while no node matches, so the pending pod is what triggers the provisioning.
//! - Source outage (`source_down`): nothing can be fetched from the object store. A path that needs
//!   the weights from the source never serves (`f64::INFINITY`, printed `never`); a warm node with the
//!   weights cache serves from its verified copy without contacting the source.
//!
//! Bandwidth contention between a concurrent image pull and weights fetch on one NIC is not modelled;
//! SageMaker's container-caching post measured it (S3 fetch 168 s alone vs 77 s without a concurrent
//! image pull), so the parallel cold-node figure is optimistic when the NIC is the bottleneck.

use serde::Serialize;

/// Inputs of the calculator (see the module docs for the model).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimelineInputs {
    /// Compressed image size, GB.
    pub image_gb: f64,
    /// Model weights, GB.
    pub weights_gb: f64,
    /// Effective image pull throughput per node (registry → extracted layers), GB/s.
    pub registry_gbps: f64,
    /// Object-store (S3, HTTP, Hub) download throughput per node, GB/s.
    pub object_store_gbps: f64,
    /// Optional cap on the object store's total throughput across nodes fetching at once, GB/s.
    pub object_store_aggregate_gbps: Option<f64>,
    /// Node-local NVMe read throughput, GB/s.
    pub nvme_gbps: f64,
    /// Replicas (one per node) in the scale-out.
    pub nodes: u32,
    /// Nodes that already hold the caches.
    pub warm_nodes: u32,
    /// Seconds until a cold (new) node has joined and can run pods; 0 when the nodes already exist.
    pub provision_s: f64,
    /// The object store is unreachable (outage, throttling, no credentials) for the whole scale-out.
    pub source_down: bool,
}

/// Which caches are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Caches {
    /// Neither cache.
    None,
    /// Image pre-pull only.
    ImageOnly,
    /// Weights on node-local disk only.
    WeightsOnly,
    /// Both.
    Both,
}

impl Caches {
    /// All four, in table order.
    pub const ALL: [Caches; 4] = [Caches::None, Caches::ImageOnly, Caches::WeightsOnly, Caches::Both];
    /// Table label.
    pub fn label(self) -> &'static str {
        match self {
            Caches::None => "no cache",
            Caches::ImageOnly => "image cache",
            Caches::WeightsOnly => "weights cache",
            Caches::Both => "image + weights cache",
        }
    }
}

/// Time-to-serve of one configuration, seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Row {
    /// Caches on.
    pub caches: Caches,
    /// One replica on a warm node (`None` when no node is warm for this configuration's caches).
    pub warm_node_s: f64,
    /// One replica on a cold node, with the other cold nodes fetching at the same time.
    pub cold_node_s: f64,
    /// Until the first replica of the scale-out serves (a warm node's time when one exists).
    pub first_s: f64,
    /// Until every replica of the scale-out serves.
    pub fleet_s: f64,
}

/// Errors for inputs that make no sense.
pub fn validate(i: &TimelineInputs) -> Result<(), String> {
    for (name, v) in
        [("registry_gbps", i.registry_gbps), ("object_store_gbps", i.object_store_gbps), ("nvme_gbps", i.nvme_gbps)]
    {
        if v.is_nan() || v <= 0.0 {
            return Err(format!("{name} must be > 0 (got {v})"));
        }
    }
    if i.provision_s.is_nan() || i.provision_s < 0.0 {
        return Err(format!("provision_s must be >= 0 (got {})", i.provision_s));
    }
    if i.image_gb < 0.0 || i.weights_gb < 0.0 {
        return Err("sizes must be >= 0".into());
    }
    if i.object_store_aggregate_gbps.is_some_and(|a| a.is_nan() || a <= 0.0) {
        return Err("object_store_aggregate_gbps must be > 0".into());
    }
    if i.warm_nodes > i.nodes || i.nodes == 0 {
        return Err(format!("need 0 <= warm_nodes <= nodes and nodes >= 1 (got {} of {})", i.warm_nodes, i.nodes));
    }
    Ok(())
}

fn fetch_s(i: &TimelineInputs, concurrent: u32) -> f64 {
    if i.source_down {
        return f64::INFINITY;
    }
    let per_node = match i.object_store_aggregate_gbps {
        Some(agg) if concurrent > 0 => i.object_store_gbps.min(agg / f64::from(concurrent)),
        _ => i.object_store_gbps,
    };
    i.weights_gb / per_node
}

/// Computes the four rows.
pub fn compute(i: &TimelineInputs) -> Result<Vec<Row>, String> {
    validate(i)?;
    let pull = i.image_gb / i.registry_gbps;
    let load = i.weights_gb / i.nvme_gbps;
    let cold = i.nodes - i.warm_nodes;
    Ok(Caches::ALL
        .iter()
        .map(|&c| {
            // Without a weights cache every replica fetches; with it, only cold nodes do.
            let fetchers = if matches!(c, Caches::WeightsOnly | Caches::Both) { cold } else { i.nodes };
            let fetch = fetch_s(i, fetchers.max(1));
            let (image_cached, weights_cached) = match c {
                Caches::None => (false, false),
                Caches::ImageOnly => (true, false),
                Caches::WeightsOnly => (false, true),
                Caches::Both => (true, true),
            };
            let warm = (if image_cached { 0.0 } else { pull }) + (if weights_cached { 0.0 } else { fetch }) + load;
            let cold_s = i.provision_s + if c == Caches::Both { pull.max(fetch) + load } else { pull + fetch + load };
            let fleet = if cold > 0 { cold_s.max(if i.warm_nodes > 0 { warm } else { 0.0 }) } else { warm };
            let first = if i.warm_nodes > 0 { warm.min(cold_s) } else { cold_s };
            Row { caches: c, warm_node_s: warm, cold_node_s: cold_s, first_s: first, fleet_s: fleet }
        })
        .collect())
}

/// Formats seconds as `12m 05s` / `41.2 s`.
pub fn human(s: f64) -> String {
    if s.is_infinite() {
        "never".into()
    } else if s < 60.0 {
        format!("{s:.1} s")
    } else {
        format!("{}m {:02}s", (s / 60.0).floor() as u64, (s % 60.0).round() as u64 % 60)
    }
}

/// Plain-text table of the rows (speedup: all-replicas time of "no cache" over this row's).
pub fn render_table(i: &TimelineInputs, rows: &[Row]) -> String {
    let mut out = format!(
        "inputs: image {} GB @ {} GB/s, weights {} GB @ {} GB/s object store{}{}, NVMe {} GB/s, {} nodes ({} warm){}\n",
        i.image_gb,
        i.registry_gbps,
        i.weights_gb,
        i.object_store_gbps,
        i.object_store_aggregate_gbps.map(|a| format!(" (aggregate cap {a} GB/s)")).unwrap_or_default(),
        if i.source_down { " DOWN" } else { "" },
        i.nvme_gbps,
        i.nodes,
        i.warm_nodes,
        if i.provision_s > 0.0 { format!(", cold nodes join after {}", human(i.provision_s)) } else { String::new() }
    );
    out.push_str(&format!(
        "image pull {} | weights fetch {} | weights load from NVMe {}\n",
        human(i.image_gb / i.registry_gbps),
        human(fetch_s(i, 1)),
        human(i.weights_gb / i.nvme_gbps)
    ));
    out.push_str(&format!(
        "{:<24}{:>12}{:>12}{:>14}{:>14}{:>10}\n",
        "caches", "warm node", "cold node", "first replica", "all replicas", "speedup"
    ));
    let base = rows[0].fleet_s;
    for r in rows {
        out.push_str(&format!(
            "{:<24}{:>12}{:>12}{:>14}{:>14}{:>9.1}x\n",
            r.caches.label(),
            human(r.warm_node_s),
            human(r.cold_node_s),
            human(r.first_s),
            human(r.fleet_s),
            if r.fleet_s.is_finite() { base / r.fleet_s } else { 0.0 }
        ));
    }
    out
}

impl TimelineInputs {
    /// The HyperPod example (145 GB weights, >20 min from S3, ~7 GB/s NVMe, 5–7 min image pulls); image
    /// 17.7 GB at 0.053 GB/s from SageMaker's container-caching post (17.7 GB LMI image, 333 s pull). Four nodes,
    /// none warm, no provisioning delay, source up: the calculator's default preset.
    pub fn hyperpod() -> TimelineInputs {
        TimelineInputs {
            image_gb: 17.7,
            weights_gb: 145.0,
            registry_gbps: 0.053,
            object_store_gbps: 0.12,
            object_store_aggregate_gbps: None,
            nvme_gbps: 7.0,
            nodes: 4,
            warm_nodes: 0,
            provision_s: 0.0,
            source_down: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hyperpod(nodes: u32, warm: u32) -> TimelineInputs {
        TimelineInputs { nodes, warm_nodes: warm, ..TimelineInputs::hyperpod() }
    }

    #[test]
    fn hyperpod_example_is_reproduced() {
        let i = hyperpod(4, 4);
        let rows = compute(&i).unwrap();
        let pull = i.image_gb / i.registry_gbps;
        assert!((300.0..=420.0).contains(&pull), "image pull within the published 5–7 min: {pull}");
        assert!(i.weights_gb / i.object_store_gbps > 20.0 * 60.0, "over 20 min from S3");
        let none = rows[0];
        assert!((none.warm_node_s - (pull + 145.0 / 0.12 + 145.0 / 7.0)).abs() < 1e-6);
        let both = rows[3];
        assert!((both.warm_node_s - 145.0 / 7.0).abs() < 1e-9, "warm node with both caches: NVMe load only");
        assert!(none.fleet_s / both.fleet_s > 70.0);
        // Each cache alone removes its own term.
        assert!((rows[1].warm_node_s - (none.warm_node_s - pull)).abs() < 1e-6);
        assert!((rows[2].warm_node_s - (none.warm_node_s - 145.0 / 0.12)).abs() < 1e-6);
    }

    #[test]
    fn cold_nodes_pay_the_parallel_max_with_both_caches() {
        let rows = compute(&hyperpod(4, 0)).unwrap();
        let (pull, fetch, load): (f64, f64, f64) = (17.7 / 0.053, 145.0 / 0.12, 145.0 / 7.0);
        assert!((rows[3].cold_node_s - (pull.max(fetch) + load)).abs() < 1e-6);
        assert!((rows[0].cold_node_s - (pull + fetch + load)).abs() < 1e-6);
        assert_eq!(rows[3].fleet_s, rows[3].cold_node_s);
    }

    #[test]
    fn aggregate_cap_slows_simultaneous_fetches() {
        let mut i = hyperpod(8, 0);
        i.weights_gb = 600.0;
        let alone = compute(&i).unwrap()[0].cold_node_s;
        i.object_store_aggregate_gbps = Some(0.48); // 8 nodes share 0.48 GB/s → 0.06 GB/s each
        let capped = compute(&i).unwrap()[0].cold_node_s;
        assert!((capped - alone - (600.0 / 0.06 - 600.0 / 0.12)).abs() < 1e-6);
        // With the weights cache and 6 of 8 nodes warm, only 2 nodes fetch: the cap bites less.
        i.warm_nodes = 6;
        let r = compute(&i).unwrap();
        assert!((r[2].cold_node_s - (17.7 / 0.053 + 600.0 / 0.12 + 600.0 / 7.0)).abs() < 1e-6);
    }

    #[test]
    fn scale_from_zero_adds_the_node_provisioning_to_cold_nodes() {
        let base = compute(&hyperpod(2, 0)).unwrap();
        let mut i = hyperpod(2, 0);
        i.provision_s = 180.0;
        let r = compute(&i).unwrap();
        for (a, b) in base.iter().zip(&r) {
            assert!((b.cold_node_s - a.cold_node_s - 180.0).abs() < 1e-9, "{:?}", b.caches);
            assert_eq!(b.first_s, b.cold_node_s, "no warm node: the first replica is a cold one");
        }
        assert!(render_table(&i, &r).contains("cold nodes join after 3m 00s"));
    }

    #[test]
    fn source_outage_leaves_only_warm_weights_caches_serving() {
        let mut i = hyperpod(4, 2);
        i.source_down = true;
        let r = compute(&i).unwrap();
        for row in &r[..2] {
            assert!(row.warm_node_s.is_infinite() && row.fleet_s.is_infinite(), "{:?} needs the source", row.caches);
        }
        assert!((r[3].warm_node_s - 145.0 / 7.0).abs() < 1e-9, "warm node with both caches serves from NVMe");
        assert!((r[2].warm_node_s - (17.7 / 0.053 + 145.0 / 7.0)).abs() < 1e-6);
        assert!(r[3].cold_node_s.is_infinite(), "a cold node cannot fetch");
        assert_eq!(r[3].first_s, r[3].warm_node_s);
        let t = render_table(&i, &r);
        assert!(t.contains("never") && t.contains("DOWN"), "{t}");
    }

    #[test]
    fn bad_inputs_are_refused() {
        let mut i = hyperpod(2, 3);
        assert!(compute(&i).unwrap_err().contains("warm_nodes"));
        i.warm_nodes = 1;
        i.nvme_gbps = 0.0;
        assert!(compute(&i).unwrap_err().contains("nvme_gbps"));
    }

    #[test]
    fn table_names_every_configuration() {
        let i = hyperpod(4, 2);
        let t = render_table(&i, &compute(&i).unwrap());
        for c in Caches::ALL {
            assert!(t.contains(c.label()), "{t}");
        }
        assert_eq!(human(20.7), "20.7 s");
        assert_eq!(human(1208.3), "20m 08s");
    }
}
