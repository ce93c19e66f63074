//! `warmpath-sim`: run one simulated OpenAI model server on loopback.

use std::net::SocketAddr;

use clap::Parser;
use warmpath_sim::{LatencyProfile, SimConfig, SimServer};

/// Simulated OpenAI-compatible model server with a vLLM-style prefix cache (see `docs/demo.md`).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Listen address (loopback only).
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: SocketAddr,
    /// Prefix-cache capacity in blocks.
    #[arg(long, default_value_t = 8192)]
    cache_blocks: usize,
    /// Tokens per block.
    #[arg(long, default_value_t = 16)]
    block_tokens: usize,
    /// Per-request overhead, simulated ms.
    #[arg(long, default_value_t = 30.0)]
    overhead_ms: f64,
    /// Prefill per uncached prompt token, simulated ms.
    #[arg(long, default_value_t = 0.2)]
    prefill_ms_per_token: f64,
    /// Inter-token latency, simulated ms.
    #[arg(long, default_value_t = 12.0)]
    itl_ms: f64,
    /// Batch limit (requests running at once).
    #[arg(long, default_value_t = 64)]
    max_num_seqs: usize,
    /// Prefills running at once (0 = unlimited).
    #[arg(long, default_value_t = 1)]
    prefill_lanes: usize,
    /// Wall seconds per simulated second (0.1 = ten times faster than real).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Model name.
    #[arg(long, default_value = "sim-model")]
    model: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let a = Args::parse();
    anyhow::ensure!(a.time_scale > 0.0, "--time-scale must be > 0, got {}", a.time_scale);
    let cfg = SimConfig {
        cache_blocks: a.cache_blocks,
        block_tokens: a.block_tokens,
        latency: LatencyProfile {
            overhead_ms: a.overhead_ms,
            prefill_ms_per_token: a.prefill_ms_per_token,
            itl_ms: a.itl_ms,
            max_num_seqs: a.max_num_seqs,
            prefill_lanes: a.prefill_lanes,
            time_scale: a.time_scale,
        },
        model: a.model,
        default_max_tokens: 16,
    };
    let server = SimServer::start(cfg, a.listen).await?;
    tracing::info!(addr = %server.addr(), "warmpath-sim listening");
    println!("warmpath-sim listening on {}", server.addr());
    tokio::signal::ctrl_c().await?;
    server.stop().await;
    Ok(())
}
