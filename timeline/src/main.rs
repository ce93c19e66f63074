//! `warmpath-timeline`: prints time-to-serve of a scale-out with and without the image and weights
//! caches (model in the `warmpath_timeline` library). Presets: `--preset hyperpod` (145 GB) and
//! `--preset hyperpod-600gb`; every input can be overridden.

use clap::Parser;
use warmpath_timeline::{compute, render_table, TimelineInputs};

#[derive(Parser)]
#[command(name = "warmpath-timeline", about = "Scale-out time-to-serve with/without image and weights caches")]
struct Args {
    /// Start from a preset: `hyperpod` (145 GB weights, S3 0.12 GB/s, NVMe 7 GB/s, 17.7 GB image at 0.053 GB/s)
    /// or `hyperpod-600gb` (same, 600 GB weights).
    #[arg(long)]
    preset: Option<String>,
    /// Compressed image size, GB (10^9 bytes).
    #[arg(long)]
    image_gb: Option<f64>,
    /// Model weights, GB.
    #[arg(long)]
    weights_gb: Option<f64>,
    /// Effective image pull throughput per node, GB/s.
    #[arg(long)]
    registry_gbps: Option<f64>,
    /// Object-store download throughput per node, GB/s.
    #[arg(long)]
    object_store_gbps: Option<f64>,
    /// Cap on total object-store throughput across nodes fetching at once, GB/s.
    #[arg(long)]
    object_store_aggregate_gbps: Option<f64>,
    /// Node-local NVMe read throughput, GB/s.
    #[arg(long)]
    nvme_gbps: Option<f64>,
    /// Nodes (one replica each) in the scale-out.
    #[arg(long)]
    nodes: Option<u32>,
    /// Nodes already holding the caches.
    #[arg(long)]
    warm_nodes: Option<u32>,
    /// Seconds until a cold (new) node joins, for a scale-out from zero (cluster autoscaler + boot).
    #[arg(long)]
    provision_s: Option<f64>,
    /// The object store is unreachable for the whole scale-out (outage, throttling, no credentials).
    #[arg(long)]
    source_down: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

fn main() -> std::process::ExitCode {
    let a = Args::parse();
    let mut i = TimelineInputs { source_down: a.source_down, ..TimelineInputs::hyperpod() };
    match a.preset.as_deref() {
        None | Some("hyperpod") => {}
        Some("hyperpod-600gb") => i.weights_gb = 600.0,
        Some(other) => {
            eprintln!("unknown preset {other:?} (hyperpod, hyperpod-600gb)");
            return std::process::ExitCode::from(2);
        }
    }
    macro_rules! set {
        ($($f:ident),*) => { $( if let Some(v) = a.$f { i.$f = v; } )* };
    }
    set!(image_gb, weights_gb, registry_gbps, object_store_gbps, nvme_gbps, nodes, warm_nodes, provision_s);
    if a.object_store_aggregate_gbps.is_some() {
        i.object_store_aggregate_gbps = a.object_store_aggregate_gbps;
    }
    match compute(&i) {
        Ok(rows) if a.json => {
            println!("{}", serde_json::json!({ "inputs": i, "rows": rows }));
            std::process::ExitCode::SUCCESS
        }
        Ok(rows) => {
            print!("{}", render_table(&i, &rows));
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("invalid inputs: {e}");
            std::process::ExitCode::from(2)
        }
    }
}
