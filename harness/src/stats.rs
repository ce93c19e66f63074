//! Envoy admin `/stats` text, parsed into counters and gauges.

use std::collections::BTreeMap;

/// Counters and gauges by full stat name (histogram lines are skipped).
#[derive(Debug, Clone, Default)]
pub struct Stats {
    values: BTreeMap<String, u64>,
}

impl Stats {
    /// Parses the `name: value` lines of `/stats`; lines whose value is not an unsigned integer are skipped.
    pub fn parse(text: &str) -> Self {
        let values = text
            .lines()
            .filter_map(|l| {
                let (name, value) = l.split_once(": ")?;
                Some((name.trim().to_string(), value.trim().parse::<u64>().ok()?))
            })
            .collect();
        Stats { values }
    }

    /// The value of `name`, 0 when Envoy has not created that stat.
    pub fn get(&self, name: &str) -> u64 {
        self.values.get(name).copied().unwrap_or(0)
    }

    /// The value of the filter metric `metric` (name without the `wasmcustom.warmpath.` prefix).
    pub fn filter(&self, metric: &str) -> u64 {
        self.get(&format!("{}{metric}", crate::config::FILTER_STAT_PREFIX))
    }

    /// Sum of all stats whose name starts with `prefix`.
    pub fn sum_prefix(&self, prefix: &str) -> u64 {
        self.values.range(prefix.to_string()..).take_while(|(k, _)| k.starts_with(prefix)).map(|(_, v)| v).sum()
    }

    /// Connections each Envoy worker accepted on the harness's listener at `listener_port` (Envoy's per-worker
    /// `downstream_cx_total`), by worker index; workers that accepted none may be missing from the end.
    pub fn worker_connections(&self, listener_port: u16) -> Vec<u64> {
        let prefix = format!("listener.127.0.0.1_{listener_port}.worker_");
        let mut per_worker = Vec::new();
        for (name, v) in self.with_prefix(&prefix) {
            let Some(w) = name[prefix.len()..].strip_suffix(".downstream_cx_total") else { continue };
            let Ok(w) = w.parse::<usize>() else { continue };
            if per_worker.len() <= w {
                per_worker.resize(w + 1, 0);
            }
            per_worker[w] = v;
        }
        per_worker
    }

    /// `(name, value)` pairs whose name starts with `prefix`.
    pub fn with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, u64)> + 'a {
        self.values
            .range(prefix.to_string()..)
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.as_str(), *v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_counters_and_skips_histograms() {
        let s = Stats::parse("a.b: 3\nwasmcustom.warmpath.x: 7\nh: P0(nan,1) P25(nan,2)\n");
        assert_eq!(s.get("a.b"), 3);
        assert_eq!(s.filter("x"), 7);
        assert_eq!(s.get("h"), 0);
        assert_eq!(s.sum_prefix("a"), 3);
    }

    #[test]
    fn connections_are_read_per_worker() {
        let s = Stats::parse(
            "listener.127.0.0.1_80.worker_0.downstream_cx_total: 4\n\
             listener.127.0.0.1_80.worker_0.downstream_cx_active: 1\n\
             listener.127.0.0.1_80.worker_2.downstream_cx_total: 5\n\
             listener.127.0.0.1_8080.worker_1.downstream_cx_total: 9\n",
        );
        assert_eq!(s.worker_connections(80), vec![4, 0, 5]);
        assert_eq!(s.worker_connections(81), Vec::<u64>::new());
    }
}
