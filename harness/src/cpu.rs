//! CPU accounting for benchmarks, from Linux procfs (the `procfs` crate): the CPU time a process and its
//! descendants used, and how busy the whole machine was between two samples.
//!
//! A benchmark on a small machine runs its proxies, its model-server stand-ins and its client on the same cores.
//! When those cores are saturated, latencies include time spent waiting for a core, so a latency table then
//! measures the machine as much as what it compares. [`MachineCpu`] says how busy the cores were; [`tree_cpu_seconds`]
//! says how much of that one proxy took.

use anyhow::{Context as _, Result};
use procfs::process::{all_processes, Process};
use procfs::{ticks_per_second, CpuTime, CurrentSI, KernelStats};

/// User + system CPU time of process `pid` and of every live descendant, seconds (all threads included).
///
/// Descendants count because a router may run as a launcher process with the proxy in a child. Children that
/// already exited and were reaped are in their parent's `cutime`/`cstime`, which is not added: what is measured is
/// the live process tree, sampled before and after a run.
pub fn tree_cpu_seconds(pid: u32) -> Result<f64> {
    let per_second = ticks_per_second() as f64;
    let root = i32::try_from(pid).context("pid out of range")?;
    let stat = Process::new(root).with_context(|| format!("process {pid}"))?.stat()?;
    // (pid, parent, CPU ticks) of every process, read once, then a walk down from `root`.
    let procs: Vec<(i32, i32, u64)> =
        all_processes()?.flatten().filter_map(|p| p.stat().ok()).map(|s| (s.pid, s.ppid, s.utime + s.stime)).collect();
    let mut total = stat.utime + stat.stime;
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for &(child, _, t) in procs.iter().filter(|(c, pp, _)| *pp == parent && *c != root) {
            total += t;
            frontier.push(child);
        }
    }
    Ok(total as f64 / per_second)
}

/// One reading of the machine's CPU counters (all cores, since boot, in clock ticks).
#[derive(Debug, Clone, Copy)]
pub struct MachineCpu {
    busy: u64,
    total: u64,
}

impl MachineCpu {
    /// Reads `/proc/stat`.
    pub fn sample() -> Result<MachineCpu> {
        let t = KernelStats::current()?.total;
        Ok(MachineCpu { busy: busy_ticks(&t), total: busy_ticks(&t) + t.idle + t.iowait.unwrap_or(0) })
    }

    /// The share of all cores' time that was busy between `earlier` and this sample, 0–1 (`None` when no
    /// clock tick passed).
    pub fn busy_since(&self, earlier: &MachineCpu) -> Option<f64> {
        let total = self.total.checked_sub(earlier.total).filter(|t| *t > 0)?;
        Some(self.busy.saturating_sub(earlier.busy) as f64 / total as f64)
    }
}

/// Ticks spent running anything: user, nice, system, interrupts and time stolen by the hypervisor (guest time is
/// already inside user and nice).
fn busy_ticks(t: &CpuTime) -> u64 {
    t.user + t.nice + t.system + t.irq.unwrap_or(0) + t.softirq.unwrap_or(0) + t.steal.unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    /// Spins until `f` reports more than `floor`, for at most 10 s; returns the last reading.
    fn spin_until_above(floor: f64, f: impl Fn() -> f64) -> f64 {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut x = 0u64;
        loop {
            for i in 0..1_000_000u64 {
                x = x.wrapping_mul(31).wrapping_add(i);
            }
            std::hint::black_box(x);
            let v = f();
            if v > floor || Instant::now() > deadline {
                return v;
            }
        }
    }

    #[test]
    fn own_cpu_time_grows_with_work_and_the_machine_was_busy_meanwhile() {
        let me = std::process::id();
        let before = tree_cpu_seconds(me).expect("own stat");
        let machine = MachineCpu::sample().expect("/proc/stat");
        let after = spin_until_above(before, || tree_cpu_seconds(me).expect("own stat"));
        assert!(after > before, "CPU time {before} s did not grow while spinning");
        let busy = MachineCpu::sample().expect("/proc/stat").busy_since(&machine).expect("ticks passed");
        assert!(busy > 0.0 && busy <= 1.0, "busy share {busy}");
    }

    #[test]
    fn a_busy_child_counts_for_its_parent() {
        // A shell whose child spins: the shell itself only waits.
        let mut sh = Command::new("sh")
            .args(["-c", "sh -c 'while :; do :; done' & wait"])
            .stdin(Stdio::null())
            .spawn()
            .expect("sh");
        let pid = sh.id();
        let tree = spin_until_above(0.05, || tree_cpu_seconds(pid).unwrap_or(0.0));
        let own = Process::new(pid as i32).and_then(|p| p.stat()).map(|s| (s.utime + s.stime) as f64).unwrap_or(0.0)
            / ticks_per_second() as f64;
        // Stop the spinning child by its pid, then the shell.
        for p in all_processes().expect("procs").flatten() {
            if p.stat().map(|s| s.ppid == pid as i32).unwrap_or(false) {
                let _ = Command::new("kill").arg("-9").arg(p.pid.to_string()).status();
            }
        }
        let _ = sh.kill();
        let _ = sh.wait();
        assert!(tree > 0.05, "tree CPU {tree} s: the child's time is missing");
        assert!(own < tree, "the shell alone ({own} s) should account for less than its tree ({tree} s)");
    }
}
