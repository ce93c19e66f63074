//! Turns strategy runs into the comparison table, CSV files and the check that counters balance.
//!
//! Latencies are reported in **simulated milliseconds**, so numbers do not depend on how fast the run was played:
//! the server's own share of a request's time, as each simulated server reports it, divided by the time scale,
//! plus the rest (client, proxy, network) at wall speed ([`crate::client::simulated_ms`]). Hit ratios are server
//! truth: `vllm:prefix_cache_hits_total / prefix_cache_queries_total` summed over the fleet.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use warmpath_harness::timing::ProxyTiming;

use crate::harness::StrategyRun;
use crate::kvcost::CostKind;

/// One row of the comparison table.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Strategy label.
    pub label: String,
    /// The path column ([`crate::harness::Strategy::path`]).
    pub path: &'static str,
    /// Requests sent.
    pub requests: usize,
    /// Requests that failed (non-2xx, broken stream) plus requests not sent within the wall budget.
    pub errors: usize,
    /// Server-truth token hit ratio, 0–1.
    pub hit_ratio: f64,
    /// TTFT percentiles p50/p90/p99, simulated ms.
    pub ttft_ms: [f64; 3],
    /// Median of the part of each TTFT outside the server's own account
    /// ([`crate::client::Outcome::ttft_outside_server_ms`]): what the path (client, proxies, the router's pick)
    /// adds at wall speed, ms; `None` without the servers' timing.
    pub outside_ms: Option<f64>,
    /// End-to-end latency p50/p99, simulated ms.
    pub e2e_ms: [f64; 2],
    /// Largest share of requests served by one endpoint (server truth), 0–1.
    pub max_share: f64,
    /// Overflow decisions.
    pub overflows: u64,
    /// Completed requests per simulated second.
    pub throughput: f64,
    /// Requests the servers report finishing (sum of `vllm:request_success_total`).
    pub server_requests: u64,
    /// Requests the client saw complete.
    pub client_ok: usize,
    /// Requests the harness routed itself that a server other than its pick answered (0 unless the hop to the
    /// servers ignored the pick).
    pub misrouted: usize,
    /// Answered requests whose last chunk did not carry the server's timing (a router on the way dropped it), whose
    /// latencies were therefore scaled whole.
    pub untimed: usize,
    /// CPU time of the proxies on the request path per request sent, µs ([`StrategyRun::proxy_cpu_s`]).
    pub proxy_cpu_us: Option<f64>,
    /// Share of the machine's cores busy during the replay, 0–1 ([`StrategyRun::machine_busy`]).
    pub cpu_busy: Option<f64>,
    /// Medians of Envoy's own timing ([`StrategyRun::envoy_timing`]), µs: last request byte in → last byte out to
    /// the server, and the server's first response byte → first byte to the client; `None` without an Envoy on the
    /// path.
    pub envoy_us: Option<[f64; 2]>,
}

/// The medians of each part of Envoy's timing, µs (`None` when a part was never logged).
fn envoy_medians(timing: &[ProxyTiming]) -> Option<[f64; 2]> {
    let mut request: Vec<f64> = timing.iter().filter_map(|t| t.request_us).map(|us| us as f64).collect();
    let mut first_byte: Vec<f64> = timing.iter().filter_map(|t| t.first_byte_us).map(|us| us as f64).collect();
    (!request.is_empty() && !first_byte.is_empty())
        .then(|| [percentile(&mut request, 0.5), percentile(&mut first_byte, 0.5)])
}

/// A replay during which the machine's cores were at least this busy (share, 0–1) is flagged under the table: its
/// requests waited for a core as well as for their server, so its latencies measure the machine too.
pub const SATURATED_BUSY: f64 = 0.9;

/// The `q`-quantile (0–1) of `v` by nearest rank; 0 for an empty slice.
pub fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

impl Summary {
    /// Summarizes one run.
    pub fn of(run: &StrategyRun) -> Summary {
        let ok: Vec<_> = run.outcomes.iter().filter(|o| o.ok).collect();
        let mut ttft: Vec<f64> = ok.iter().map(|o| o.sim_ttft_ms(run.time_scale)).collect();
        let mut e2e: Vec<f64> = ok.iter().map(|o| o.sim_e2e_ms(run.time_scale)).collect();
        let mut outside: Vec<f64> = ok.iter().filter_map(|o| o.ttft_outside_server_ms()).collect();
        let queries: f64 = run.servers.iter().map(|(_, m)| m.prefix_queries).sum();
        let hits: f64 = run.servers.iter().map(|(_, m)| m.prefix_hits).sum();
        let per: Vec<f64> = run.servers.iter().map(|(_, m)| m.requests).collect();
        let total: f64 = per.iter().sum();
        let sim_s = run.wall_s / run.time_scale.max(1e-9);
        Summary {
            label: run.label.clone(),
            path: run.path,
            requests: run.outcomes.len(),
            errors: run.outcomes.len() - ok.len() + run.not_sent,
            hit_ratio: if queries > 0.0 { hits / queries } else { 0.0 },
            ttft_ms: [percentile(&mut ttft, 0.5), percentile(&mut ttft, 0.9), percentile(&mut ttft, 0.99)],
            outside_ms: (!outside.is_empty()).then(|| percentile(&mut outside, 0.5)),
            e2e_ms: [percentile(&mut e2e, 0.5), percentile(&mut e2e, 0.99)],
            max_share: if total > 0.0 { per.iter().cloned().fold(0.0, f64::max) / total } else { 0.0 },
            overflows: run.overflows,
            throughput: if sim_s > 0.0 { ok.len() as f64 / sim_s } else { 0.0 },
            server_requests: total as u64,
            client_ok: ok.len(),
            misrouted: ok.iter().filter(|o| o.picked.is_some() && o.picked != o.endpoint).count(),
            untimed: ok.iter().filter(|o| o.server.is_none()).count(),
            proxy_cpu_us: run
                .proxy_cpu_s
                .filter(|_| !run.outcomes.is_empty())
                .map(|c| c * 1e6 / run.outcomes.len() as f64),
            cpu_busy: run.machine_busy,
            envoy_us: envoy_medians(&run.envoy_timing),
        }
    }

    /// True when the client's completed count equals the servers' finished count, every request was answered,
    /// every pick of the harness's own routers reached the server it named, and every answer carried the server's
    /// timing (so every router's latencies are scaled the same way).
    pub fn balanced(&self) -> bool {
        self.server_requests == self.client_ok as u64 && self.errors == 0 && self.misrouted == 0 && self.untimed == 0
    }
}

/// What the table's units and path column mean, printed under every table.
const LEGEND: &str = "latencies in simulated ms (the servers' own share of each request's time divided by the \
    time scale, the client's and proxies' at wall speed); hit ratio = server-side cached prompt tokens / prompt tokens; \
    outside server = median part of TTFT outside the server's own account (client, proxies, the router's pick, network), \
    wall ms, included in the TTFT columns; Envoy µs = Envoy's own medians, wall µs: last request byte received → \
    last byte sent to the server (the filter's pick, for the filter), and the server's first response byte → first \
    byte to the client; \
    path: envoy = Envoy + the filter; envoy-pick = routed client-side by the harness, its pick through Envoy without \
    the filter; direct = routed client-side, no proxy hop; smg / vllm-router = the peer's real router process; \
    proxy CPU = user + system CPU time of the proxy processes on the request path per request, µs of real time \
    (the harness's own routers decide inside the harness, not counted there); CPU busy = share of all the \
    machine's cores busy during the replay; errors = failed or unanswered requests; max share = the largest share \
    of requests one server finished (fair: 1/N); overflow = decisions that left the preferred endpoint for load (the \
    filter's own count for the filter, each baseline's by its own rule: compare within a strategy); req/s = \
    completed requests per simulated second. One run's TTFT p50 varies by about 10 % between seeds: compare means \
    over several (--runs). docs/demo.md, \"How to read the table\", explains every column.";

/// `x` with `digits` decimals, or `-` when absent.
fn opt(x: Option<f64>, digits: usize) -> String {
    x.map_or_else(|| "-".to_string(), |v| format!("{v:.digits$}"))
}

/// [`mean_range`] of the values present, or `-` when no run has one.
fn mean_range_opt(v: &[Option<f64>], digits: usize) -> String {
    let present: Vec<f64> = v.iter().flatten().copied().collect();
    if present.is_empty() {
        "-".to_string()
    } else {
        mean_range(&present, digits)
    }
}

/// The note printed under a table for the strategies whose replays ran on saturated cores: `rows` pairs each label
/// with the busy share of its replay (of its busiest run, over repeated runs); empty when none reached
/// [`SATURATED_BUSY`].
fn saturation_note(rows: &[(&str, Option<f64>)]) -> String {
    let hot: Vec<String> = rows
        .iter()
        .filter_map(|(l, b)| b.filter(|b| *b >= SATURATED_BUSY).map(|b| format!("{l} {:.0} %", b * 100.0)))
        .collect();
    if hot.is_empty() {
        return String::new();
    }
    format!(
        "note: the machine's cores were at least {:.0} % busy during the replay of {} (busiest run): requests also \
         waited for a core, and a server's wall millisecond counts 1 / time scale simulated ones, so these \
         latencies measure the machine as well as the routing; a larger --time-scale lowers the load\n",
        SATURATED_BUSY * 100.0,
        hot.join(", ")
    )
}

/// The comparison table as Markdown (also readable in a terminal), with the pooled-cache bound below it.
pub fn table(rows: &[Summary], pooled: Option<f64>) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| strategy | path | requests | errors | hit ratio | TTFT p50 | TTFT p90 | TTFT p99 | outside server | Envoy µs | E2E p50 | E2E p99 | max share | overflow | req/s | proxy CPU µs/req | CPU busy % |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.3} | {:.0} | {:.0} | {:.0} | {} | {} | {:.0} | {:.0} | {:.3} | {} | {:.2} | {} | {} |",
            r.label,
            r.path,
            r.requests,
            r.errors,
            r.hit_ratio,
            r.ttft_ms[0],
            r.ttft_ms[1],
            r.ttft_ms[2],
            opt(r.outside_ms, 1),
            r.envoy_us.map_or_else(|| "-".to_string(), |[a, b]| format!("{a:.0} / {b:.0}")),
            r.e2e_ms[0],
            r.e2e_ms[1],
            r.max_share,
            r.overflows,
            r.throughput,
            opt(r.proxy_cpu_us, 0),
            opt(r.cpu_busy.map(|b| b * 100.0), 0),
        );
    }
    if let Some(p) = pooled {
        let _ = writeln!(s, "\npooled-cache bound (one cache holding the whole fleet's capacity): hit ratio {p:.3}");
    }
    s.push_str(&best_per_column(&[rows.iter().collect()]));
    let _ = writeln!(s, "{LEGEND}");
    s.push_str(&saturation_note(&rows.iter().map(|r| (r.label.as_str(), r.cpu_busy)).collect::<Vec<_>>()));
    s
}

/// Which router leads each column a user picks a router by (TTFT p50, TTFT p90, hit ratio), by its mean over
/// `runs` (`runs[k]`: run k's rows, same strategies in the same order), with the runner-up and the leader's ratio to
/// it, or the routers level with the best as printed. The exact-state references ([`CostKind::is_reference`]) are
/// yardsticks, not routers, and a strategy that lost requests in any run is left out (its percentiles cover fewer
/// requests). Empty with fewer than two routers left.
pub fn best_per_column(runs: &[Vec<&Summary>]) -> String {
    let Some(first) = runs.first() else { return String::new() };
    let mut left_out = Vec::new();
    // (label, [p50, p90, hit ratio]) means over the runs.
    let mut routers: Vec<(&str, [f64; 3])> = Vec::new();
    for (i, r) in first.iter().enumerate() {
        if CostKind::ALL.iter().any(|k| k.is_reference() && k.label() == r.label) {
            continue;
        }
        let rows: Vec<&Summary> = runs.iter().filter_map(|run| run.get(i).copied()).collect();
        if rows.iter().any(|r| r.errors > 0) {
            left_out.push(r.label.as_str());
            continue;
        }
        let col = |f: fn(&Summary) -> f64| mean(&rows.iter().map(|r| f(r)).collect::<Vec<_>>());
        routers.push((&r.label, [col(|r| r.ttft_ms[0]), col(|r| r.ttft_ms[1]), col(|r| r.hit_ratio)]));
    }
    if routers.len() < 2 {
        return String::new();
    }
    let over = match runs.len() {
        1 => "one run: a lead under about 10 % needs --runs".to_string(),
        n => format!("means of {n} runs"),
    };
    let mut s = format!("best router per column (the exact-state references left out; {over}):\n");
    // (column, index, lower is better, decimals)
    for (name, c, lower, digits) in [("TTFT p50", 0, true, 0), ("TTFT p90", 1, true, 0), ("hit ratio", 2, false, 3)] {
        let mut order: Vec<(&str, f64)> = routers.iter().map(|(l, v)| (*l, v[c])).collect();
        order.sort_by(|a, b| if lower { a.1.total_cmp(&b.1) } else { b.1.total_cmp(&a.1) });
        let shown = |v: f64| format!("{v:.digits$}");
        let level: Vec<&str> =
            order.iter().take_while(|(_, v)| shown(*v) == shown(order[0].1)).map(|(l, _)| *l).collect();
        if level.len() > 1 {
            let _ = writeln!(s, "  {name}: level at {} ({})", shown(order[0].1), level.join(", "));
            continue;
        }
        let ((best, b), (next, n)) = (order[0], order[1]);
        let ratio = if n > 0.0 { format!(", {:.2}×", b / n) } else { String::new() };
        let _ = writeln!(s, "  {name}: {best} {} (next {next} {}{ratio})", shown(b), shown(n));
    }
    if !left_out.is_empty() {
        let _ = writeln!(s, "  left out for lost requests: {}", left_out.join(", "));
    }
    s
}

/// The mean of `v` (0 when empty).
fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// `mean (min–max)` of `v` with `digits` decimals; just the value when all are equal.
fn mean_range(v: &[f64], digits: usize) -> String {
    let mean = mean(v);
    let (lo, hi) = v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
    if v.len() <= 1 || format!("{lo:.digits$}") == format!("{hi:.digits$}") {
        format!("{mean:.digits$}")
    } else {
        format!("{mean:.digits$} ({lo:.digits$}–{hi:.digits$})")
    }
}

/// The "Envoy µs" cell over runs: the mean of each run's medians (`-` when no run had an Envoy on the path).
fn envoy_means(rows: &[&Summary]) -> String {
    let present: Vec<[f64; 2]> = rows.iter().filter_map(|r| r.envoy_us).collect();
    if present.is_empty() {
        return "-".to_string();
    }
    let mean = |i: usize| present.iter().map(|v| v[i]).sum::<f64>() / present.len() as f64;
    format!("{:.0} / {:.0}", mean(0), mean(1))
}

/// The comparison table over repeated runs: `runs[k]` holds run k's rows (same strategies in the same order), and
/// `pooled[k]` its pooled-cache bound. Each cell is the mean over runs with the min–max range; `errors` is the
/// total over runs.
pub fn table_runs(runs: &[Vec<Summary>], pooled: &[f64]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| strategy | path | runs | requests | errors | hit ratio | TTFT p50 | TTFT p90 | TTFT p99 | outside server | Envoy µs | E2E p50 | E2E p99 | max share | overflow | req/s | proxy CPU µs/req | CPU busy % |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut busiest = Vec::new();
    let Some(first) = runs.first() else { return s };
    for (i, r) in first.iter().enumerate() {
        let rows: Vec<&Summary> = runs.iter().filter_map(|run| run.get(i)).collect();
        let col = |f: &dyn Fn(&Summary) -> f64, d: usize| mean_range(&rows.iter().map(|r| f(r)).collect::<Vec<_>>(), d);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.label,
            r.path,
            rows.len(),
            col(&|r| r.requests as f64, 0),
            rows.iter().map(|r| r.errors).sum::<usize>(),
            col(&|r| r.hit_ratio, 3),
            col(&|r| r.ttft_ms[0], 0),
            col(&|r| r.ttft_ms[1], 0),
            col(&|r| r.ttft_ms[2], 0),
            mean_range_opt(&rows.iter().map(|r| r.outside_ms).collect::<Vec<_>>(), 1),
            envoy_means(&rows),
            col(&|r| r.e2e_ms[0], 0),
            col(&|r| r.e2e_ms[1], 0),
            col(&|r| r.max_share, 3),
            col(&|r| r.overflows as f64, 0),
            col(&|r| r.throughput, 2),
            mean_range_opt(&rows.iter().map(|r| r.proxy_cpu_us).collect::<Vec<_>>(), 0),
            mean_range_opt(&rows.iter().map(|r| r.cpu_busy.map(|b| b * 100.0)).collect::<Vec<_>>(), 0),
        );
        let max_busy = rows.iter().filter_map(|r| r.cpu_busy).reduce(f64::max);
        busiest.push((r.label.as_str(), max_busy));
    }
    if !pooled.is_empty() {
        let _ = writeln!(
            s,
            "\npooled-cache bound (one cache holding the whole fleet's capacity): hit ratio {}",
            mean_range(pooled, 3)
        );
    }
    s.push_str(&best_per_column(&runs.iter().map(|run| run.iter().collect()).collect::<Vec<_>>()));
    let _ = writeln!(s, "mean (min–max) over {} runs; {LEGEND}", runs.len());
    s.push_str(&saturation_note(&busiest));
    s
}

/// Writes `summary.csv`, `requests.csv`, `endpoints.csv` and `filter_stats.csv` (the filter's counters and gauges as
/// Envoy reported them at the end of each replay, and the connections each Envoy worker accepted, summed over the
/// gateways) into `dir`.
pub fn write_csv(dir: &Path, runs: &[StrategyRun], rows: &[Summary]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut w = csv::Writer::from_path(dir.join("summary.csv"))?;
    w.write_record([
        "strategy",
        "path",
        "requests",
        "errors",
        "hit_ratio",
        "ttft_p50_ms",
        "ttft_p90_ms",
        "ttft_p99_ms",
        "ttft_outside_server_p50_ms",
        "envoy_request_p50_us",
        "envoy_first_byte_p50_us",
        "e2e_p50_ms",
        "e2e_p99_ms",
        "max_share",
        "overflow",
        "throughput_rps",
        "server_requests",
        "proxy_cpu_us_per_request",
        "machine_cpu_busy",
    ])?;
    for r in rows {
        w.write_record([
            r.label.clone(),
            r.path.to_string(),
            r.requests.to_string(),
            r.errors.to_string(),
            format!("{:.4}", r.hit_ratio),
            format!("{:.1}", r.ttft_ms[0]),
            format!("{:.1}", r.ttft_ms[1]),
            format!("{:.1}", r.ttft_ms[2]),
            r.outside_ms.map(|m| format!("{m:.2}")).unwrap_or_default(),
            r.envoy_us.map(|v| format!("{:.0}", v[0])).unwrap_or_default(),
            r.envoy_us.map(|v| format!("{:.0}", v[1])).unwrap_or_default(),
            format!("{:.1}", r.e2e_ms[0]),
            format!("{:.1}", r.e2e_ms[1]),
            format!("{:.4}", r.max_share),
            r.overflows.to_string(),
            format!("{:.3}", r.throughput),
            r.server_requests.to_string(),
            r.proxy_cpu_us.map(|c| format!("{c:.1}")).unwrap_or_default(),
            r.cpu_busy.map(|b| format!("{b:.3}")).unwrap_or_default(),
        ])?;
    }
    w.flush()?;
    let mut w = csv::Writer::from_path(dir.join("requests.csv"))?;
    w.write_record([
        "strategy",
        "id",
        "sent_ms",
        "ok",
        "status",
        "ttft_ms",
        "ttft_outside_server_ms",
        "e2e_ms",
        "prompt_tokens",
        "cached_tokens",
        "endpoint",
        "error",
    ])?;
    for run in runs {
        let sim = |ms: f64| format!("{:.1}", ms / run.time_scale);
        for o in &run.outcomes {
            w.write_record([
                run.label.clone(),
                o.id.to_string(),
                sim(o.sent_ms),
                o.ok.to_string(),
                o.status.to_string(),
                format!("{:.1}", o.sim_ttft_ms(run.time_scale)),
                o.ttft_outside_server_ms().map(|m| format!("{m:.2}")).unwrap_or_default(),
                format!("{:.1}", o.sim_e2e_ms(run.time_scale)),
                o.usage.prompt_tokens.to_string(),
                o.usage.prompt_tokens_details.cached_tokens.to_string(),
                o.endpoint.clone().unwrap_or_default(),
                o.error.clone().unwrap_or_default(),
            ])?;
        }
    }
    w.flush()?;
    let mut w = csv::Writer::from_path(dir.join("endpoints.csv"))?;
    w.write_record(["strategy", "endpoint", "requests", "prompt_tokens", "cached_tokens"])?;
    for run in runs {
        for (a, m) in &run.servers {
            w.write_record([
                run.label.clone(),
                a.clone(),
                format!("{}", m.requests),
                format!("{}", m.prefix_queries),
                format!("{}", m.prefix_hits),
            ])?;
        }
    }
    w.flush()?;
    let mut w = csv::Writer::from_path(dir.join("filter_stats.csv"))?;
    w.write_record(["strategy", "stat", "value"])?;
    for run in runs {
        for (k, v) in &run.filter_stats {
            w.write_record([run.label.as_str(), k.as_str(), &v.to_string()])?;
        }
    }
    w.flush()?;
    Ok(())
}

/// Requests per endpoint as the client saw them (`x-sim-endpoint`), for cross-checking server counters.
pub fn client_counts(run: &StrategyRun) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for o in run.outcomes.iter().filter(|o| o.ok) {
        *m.entry(o.endpoint.clone().unwrap_or_default()).or_insert(0) += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(label: &str, hit: f64, p50: f64, errors: usize) -> Summary {
        Summary {
            label: label.into(),
            path: "envoy",
            requests: 10,
            errors,
            hit_ratio: hit,
            ttft_ms: [p50, 2.0 * p50, 3.0 * p50],
            outside_ms: Some(0.5),
            e2e_ms: [100.0, 200.0],
            max_share: 0.5,
            overflows: 0,
            throughput: 1.0,
            server_requests: 10,
            client_ok: 10,
            misrouted: 0,
            untimed: 0,
            proxy_cpu_us: None,
            cpu_busy: None,
            envoy_us: None,
        }
    }

    #[test]
    fn the_best_router_per_column_leaves_out_the_references_and_lost_requests() {
        let runs = vec![
            vec![row("A", 0.5, 100.0, 0), row("B", 0.7, 90.0, 0), row("ORACLE", 0.9, 10.0, 0), row("C", 0.9, 1.0, 1)],
            vec![row("A", 0.5, 100.0, 0), row("B", 0.5, 130.0, 0), row("ORACLE", 0.9, 10.0, 0), row("C", 0.9, 1.0, 0)],
        ];
        let t = table_runs(&runs, &[]);
        // Means: A 100 / 200 / 0.5, B 110 / 220 / 0.6; ORACLE is a yardstick, C lost a request in run 1.
        assert!(t.contains("best router per column (the exact-state references left out; means of 2 runs):"), "{t}");
        assert!(t.contains("  TTFT p50: A 100 (next B 110, 0.91×)\n"), "{t}");
        assert!(t.contains("  TTFT p90: A 200 (next B 220, 0.91×)\n"), "{t}");
        assert!(t.contains("  hit ratio: B 0.600 (next A 0.500, 1.20×)\n"), "{t}");
        assert!(t.contains("  left out for lost requests: C\n"), "{t}");

        let one = table(&[row("A", 0.5, 100.0, 0), row("B", 0.7, 90.0, 0)], None);
        assert!(
            one.contains("one run: a lead under about 10 % needs --runs")
                && one.contains("  TTFT p50: B 90 (next A 100"),
            "{one}"
        );
        let tied = table(&[row("A", 0.5, 100.0, 0), row("B", 0.5, 90.0, 0), row("C", 0.4, 80.0, 0)], None);
        assert!(tied.contains("  hit ratio: level at 0.500 (A, B)\n"), "equal as printed: no leader: {tied}");
        let alone = table(&[row("A", 0.5, 100.0, 0), row("ORACLE_TTFT", 0.5, 1.0, 0)], None);
        assert!(!alone.contains("best router"), "one router: nothing to compare: {alone}");
    }

    #[test]
    fn an_answer_without_the_servers_timing_fails_the_check() {
        assert!(row("A", 0.5, 100.0, 0).balanced());
        // A router on the way that dropped the servers' timing: its latencies were scaled whole, unlike the others'.
        let untimed = Summary { untimed: 1, ..row("A", 0.5, 100.0, 0) };
        assert!(!untimed.balanced());
    }

    #[test]
    fn repeated_runs_print_mean_and_range_per_strategy() {
        let runs = vec![
            vec![row("A", 0.5, 100.0, 0), row("B", 0.1, 300.0, 1)],
            vec![row("A", 0.7, 200.0, 0), row("B", 0.1, 300.0, 2)],
            vec![row("A", 0.6, 600.0, 0), row("B", 0.1, 300.0, 0)],
        ];
        let t = table_runs(&runs, &[0.8, 0.9, 1.0]);
        let line = |l: &str| t.lines().find(|x| x.starts_with(&format!("| {l} |"))).unwrap().to_string();
        // A: hit mean 0.6 (0.5–0.7), p50 mean 300 (100–600), p90 600 (200–1200); B is constant, errors summed.
        assert!(line("A").contains("| 3 | 10 | 0 | 0.600 (0.500–0.700) | 300 (100–600) | 600 (200–1200) |"), "{t}");
        assert!(line("B").contains("| 3 | 10 | 3 | 0.100 | 300 | 600 |"), "{t}");
        assert!(t.contains("hit ratio 0.900 (0.800–1.000)"), "{t}");
    }

    #[test]
    fn cpu_columns_show_means_or_a_dash_and_saturated_replays_are_flagged() {
        let with = |label: &str, cpu: Option<f64>, busy: Option<f64>| Summary {
            proxy_cpu_us: cpu,
            cpu_busy: busy,
            ..row(label, 0.5, 100.0, 0)
        };
        let runs = vec![
            vec![with("PROXIED", Some(300.0), Some(0.5)), with("DIRECT", None, Some(0.95))],
            vec![with("PROXIED", Some(500.0), Some(0.7)), with("DIRECT", None, Some(0.85))],
        ];
        let t = table_runs(&runs, &[]);
        let line = |l: &str| t.lines().find(|x| x.starts_with(&format!("| {l} |"))).unwrap().to_string();
        assert!(line("PROXIED").ends_with("| 400 (300–500) | 60 (50–70) |"), "{t}");
        assert!(line("DIRECT").ends_with("| - | 90 (85–95) |"), "{t}");
        // The busiest run decides: DIRECT had one run at 95 %, PROXIED none at 90 % or more.
        let note = t.lines().find(|x| x.starts_with("note:")).expect("saturation note");
        assert!(note.contains("DIRECT 95 %") && !note.contains("PROXIED"), "{note}");

        let one = table(&[with("PROXIED", Some(250.0), Some(0.4))], None);
        assert!(one.lines().any(|x| x.starts_with("| PROXIED |") && x.ends_with("| 250 | 40 |")), "{one}");
        assert!(!one.contains("note:"), "no replay was saturated: {one}");
    }

    #[test]
    fn the_part_outside_the_server_follows_the_ttft_columns() {
        let with = |outside: Option<f64>| Summary { outside_ms: outside, ..row("A", 0.5, 100.0, 0) };
        let t = table_runs(&[vec![with(Some(0.4))], vec![with(Some(0.6))], vec![with(None)]], &[]);
        // p99 300, then the mean of the runs that had the servers' timing.
        assert!(t.contains("| 300 | 0.5 (0.4–0.6) | - | 100 |"), "{t}");
        let one = table(&[with(None)], None);
        assert!(one.contains("| 300 | - | - | 100 |"), "{one}");
    }

    #[test]
    fn envoy_s_timing_shows_its_medians_and_their_mean_over_runs() {
        let timing = |request: &[u64], first_byte: &[u64]| -> Vec<ProxyTiming> {
            let (r, f) = (request.iter().map(|v| Some(*v)), first_byte.iter().map(|v| Some(*v)));
            r.zip(f).map(|(request_us, first_byte_us)| ProxyTiming { request_us, first_byte_us }).collect()
        };
        assert_eq!(envoy_medians(&timing(&[90, 60, 70], &[20, 10, 30])), Some([70.0, 20.0]));
        let reset = ProxyTiming { request_us: Some(5), first_byte_us: None };
        assert_eq!(envoy_medians(&[reset]), None, "a part never logged: no figure");
        assert_eq!(envoy_medians(&[]), None);
        let with = |us: Option<[f64; 2]>| Summary { envoy_us: us, ..row("A", 0.5, 100.0, 0) };
        let t = table_runs(&[vec![with(Some([60.0, 14.0]))], vec![with(Some([80.0, 16.0]))], vec![with(None)]], &[]);
        assert!(t.contains("| 0.5 | 70 / 15 | 100 |"), "{t}");
        let one = table(&[with(Some([64.4, 13.6]))], None);
        assert!(one.contains("| 0.5 | 64 / 14 | 100 |"), "{one}");
    }

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&mut v, 0.5), 50.0);
        assert_eq!(percentile(&mut v, 0.99), 99.0);
        assert_eq!(percentile(&mut v, 1.0), 100.0);
        assert_eq!(percentile(&mut [], 0.5), 0.0);
    }
}
