//! Heap held by the prefix index at a given capacity: what one Envoy worker's copy of the index costs (every
//! worker VM keeps its own copy, kept equal by the exchange between workers).
//!
//! Fills a [`PrefixIndex`] to capacity with distinct blocks, each held by [`MAX_HOLDERS`] endpoints, then evicts
//! as many again, and reads the bytes live from dhat's heap statistics, so the figure includes the hash map's
//! buckets and the slot array as allocated, not a `size_of` estimate.
//!
//! `cargo run --release -p warmpath-core --example index_memory [-- CAPACITY...]` (default: 16384 65536 131072
//! 262144 blocks). The entries hold no pointers, so the filter's wasm build lays them out the same way.

#[cfg(not(target_arch = "wasm32"))]
#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

#[cfg(not(target_arch = "wasm32"))]
fn main() {
    use warmpath_core::index::MAX_HOLDERS;
    use warmpath_core::PrefixIndex;

    let _profiler = dhat::Profiler::builder().testing().build();
    let live = || dhat::HeapStats::get().curr_bytes;
    let caps: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("capacity in blocks")).collect();
    let caps = if caps.is_empty() { vec![16384, 65536, 131072, 262144] } else { caps };
    println!("| index_capacity (blocks) | heap | bytes per block |");
    println!("|---:|---:|---:|");
    for cap in caps {
        let before = live();
        let mut index = PrefixIndex::new(cap);
        // Distinct hashes (a multiplicative sequence), each recorded by every holder slot: the map fills, then
        // goes through one sweep of evictions, its steady state.
        for i in 0..(cap as u64 * 2) {
            let h = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            for id in 0..MAX_HOLDERS as u32 {
                index.record(h, id, |_| true);
            }
        }
        assert_eq!(index.len(), cap);
        let bytes = live() - before;
        println!("| {cap} | {:.1} MiB | {:.0} |", bytes as f64 / (1 << 20) as f64, bytes as f64 / cap as f64);
    }
}

/// The example measures the native build only (dhat is not built for wasm).
#[cfg(target_arch = "wasm32")]
fn main() {}
