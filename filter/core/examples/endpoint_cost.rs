//! The PREFIX_AWARE decision against the endpoint count, timed as the least of many short batches: the fleets of
//! criterion's `endpoints/route` and `endpoints/route_slow` (`benches/fleet`), each decision a warm conversation's
//! turn. On a shared host another tenant's work lengthens some batches, never shortens one, so the least batch
//! mean holds still where criterion's medians of whole seconds move by 10 % between invocations.
//!
//! `cargo run --release -p warmpath-core --example endpoint_cost -- [BATCHES]` prints, per case and endpoint
//! count, the least, 10th-percentile and median batch mean in ns per decision (256 decisions a batch; 3,000
//! batches unless given), and the 1,000 ÷ 8 ratio of the least.

use std::hint::black_box;
use std::time::Instant;

#[path = "../benches/chat_body/mod.rs"]
#[allow(dead_code)] // the DOM baseline is the decision bench's
mod chat_body;
#[path = "../benches/fleet/mod.rs"]
mod fleet;

/// Decisions per timed batch: long enough for the clock, short enough that most batches see no interruption.
const BATCH: usize = 256;

fn main() {
    let batches = std::env::args().nth(1).and_then(|s| s.parse::<usize>().ok()).unwrap_or(3000).max(1);
    let keys = fleet::keys(256);
    for slow in [false, true] {
        let case = if slow { "route_slow" } else { "route" };
        let mut least = Vec::new();
        for n in [8usize, 64, 256, 1000] {
            let (mut r, loads) = fleet::fleet(n);
            if slow {
                r.set_prefill_fits(&fleet::fits_with_slow_quarter(&r.settings().endpoints));
                assert!(!r.slowdowns().is_empty(), "no endpoint told apart as slower");
            }
            for k in &keys {
                r.route_key(k, 0, &loads);
            }
            let mut i = 0usize;
            let mut means: Vec<f64> = (0..batches)
                .map(|_| {
                    let t = Instant::now();
                    for _ in 0..BATCH {
                        i = (i + 1) % keys.len();
                        black_box(r.route_key(black_box(&keys[i]), i as u64, &loads));
                    }
                    t.elapsed().as_nanos() as f64 / BATCH as f64
                })
                .collect();
            means.sort_by(f64::total_cmp);
            println!(
                "{case}/{n}: least {:.0} ns, p10 {:.0}, median {:.0}",
                means[0],
                means[batches / 10],
                means[batches / 2]
            );
            least.push(means[0]);
        }
        println!("{case}: 1,000 ÷ 8 = {:.2}×", least[3] / least[0]);
    }
}
