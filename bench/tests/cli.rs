//! The `warmpath-bench` command line: bad arguments are refused before anything starts, and SIGTERM stops Envoy.
//!
//! The SIGTERM test needs `.venv/bin/envoy` and the release wasm module (scripts/test.d/40-bench.sh builds it).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use warmpath_harness::process::{alive, wait_exit, KillOnDrop};

const BENCH: &str = env!("CARGO_BIN_EXE_warmpath-bench");

/// The first child of `parent` whose executable name is `envoy`, with its command line.
fn envoy_child(parent: u32) -> Option<(u32, Vec<String>)> {
    let dir = std::fs::read_dir("/proc").ok()?;
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()).find_map(|pid| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (name, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
        let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
        if ppid != parent || name != "envoy" {
            return None;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let args = cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        Some((pid, args))
    })
}

fn bench(args: &[&str], out: &Path) -> KillOnDrop {
    KillOnDrop::spawn_for_stderr(Command::new(BENCH).args(args).arg("--out").arg(out)).expect("spawning warmpath-bench")
}

/// Runs the bench with `args` (a tiny workload, so a run that is wrongly accepted still ends), expects it to fail
/// within 60 s, and returns its stderr.
fn refused(args: &[&str]) -> String {
    let out = tempfile::tempdir().unwrap();
    // A tiny workload, each of its settings unless `args` sets it (clap refuses a flag given twice).
    let mut all: Vec<&str> = [["--requests", "2"], ["--max-wall-s", "2"], ["--time-scale", "0.01"]]
        .into_iter()
        .filter(|[flag, _]| !args.contains(flag))
        .flatten()
        .collect();
    all.extend_from_slice(args);
    let mut guard = bench(&all, out.path());
    let status = wait_exit(&mut guard.child, Duration::from_secs(60));
    // Read only once it exited: a process still running would hold the pipe open.
    let stderr = if status.is_some() { guard.stderr() } else { String::new() };
    let status = status.unwrap_or_else(|| panic!("warmpath-bench {args:?} still running after 60 s"));
    assert!(!status.success(), "warmpath-bench {args:?} succeeded; stderr:\n{stderr}");
    assert!(!out.path().join("table.md").exists(), "warmpath-bench {args:?} ran the comparison");
    stderr
}

#[test]
fn zero_or_negative_rate_is_refused() {
    for rate in ["0", "-1", "-0.5"] {
        let e = refused(&["--strategies", "SAGEMAKER_PREFIX", "--rate", rate]);
        assert!(e.contains("--rate") && e.contains("must be a number > 0"), "--rate {rate}: {e}");
    }
}

#[test]
fn zero_cache_blocks_is_refused() {
    let e = refused(&["--strategies", "SAGEMAKER_PREFIX", "--cache-blocks", "0"]);
    assert!(e.contains("--cache-blocks") && e.contains("must be at least 1"), "{e}");
}

#[test]
fn filter_config_may_not_set_strategy_or_endpoints() {
    let e = refused(&["--strategies", "RANDOM", "--filter-config", r#"{"strategy": "PREFIX_AWARE"}"#]);
    assert!(e.contains("--filter-config may not set `strategy`"), "{e}");
    let e = refused(&["--strategies", "PREFIX_AWARE", "--filter-config", r#"{"endpoints": ["127.0.0.1:9"]}"#]);
    assert!(e.contains("--filter-config may not set `endpoints`"), "{e}");
}

#[test]
fn filter_config_the_filter_rejects_is_refused_with_its_message() {
    let e = refused(&["--strategies", "PREFIX_AWARE", "--filter-config", r#"{"prefix_length": 10}"#]);
    assert!(e.contains("`prefix_length` = 10 is out of range"), "{e}");
    assert_eq!(e.lines().filter(|l| !l.trim().is_empty()).count(), 1, "one-line error expected:\n{e}");
}

#[test]
fn sigterm_stops_envoy_and_removes_its_directory() {
    let out = tempfile::tempdir().unwrap();
    // Long enough (2000 arrivals at 1 req/s, real time) that the first strategy is still running when signalled;
    // the wall budget bounds it if the signal is lost.
    let args = [
        "--strategies",
        "PREFIX_AWARE",
        "--requests",
        "2000",
        "--rate",
        "1",
        "--time-scale",
        "1",
        "--max-wall-s",
        "60",
    ];
    let mut guard = bench(&args, out.path());
    let start = Instant::now();
    let cmdline = loop {
        if let Some((pid, cmdline)) = envoy_child(guard.child.id()) {
            guard.envoy = Some(pid);
            break cmdline;
        }
        assert!(guard.child.try_wait().unwrap().is_none(), "warmpath-bench exited before starting Envoy");
        assert!(start.elapsed() < Duration::from_secs(60), "no Envoy child after 60 s");
        std::thread::sleep(Duration::from_millis(100));
    };
    let envoy = guard.envoy.unwrap();
    let bootstrap = cmdline.iter().skip_while(|a| *a != "-c").nth(1).expect("envoy -c PATH").clone();
    let envoy_dir = Path::new(&bootstrap).parent().unwrap().to_path_buf();
    // Let the run get going (Envoy ready, requests flowing) so the signal lands mid-run.
    std::thread::sleep(Duration::from_secs(2));

    let sent = Command::new("kill").args(["-TERM", &guard.child.id().to_string()]).status().unwrap();
    assert!(sent.success(), "kill -TERM failed");
    let status =
        wait_exit(&mut guard.child, Duration::from_secs(15)).expect("warmpath-bench running 15 s after SIGTERM");
    let start = Instant::now();
    while alive(envoy) && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(envoy), "Envoy (pid {envoy}) still running 10 s after warmpath-bench got SIGTERM");
    assert!(!envoy_dir.exists(), "Envoy's directory {} left behind", envoy_dir.display());
    assert_eq!(status.code(), Some(143), "exit status after SIGTERM: {status:?}");
}

#[test]
fn runs_repeat_the_comparison_and_the_table_shows_each_columns_range() {
    let out = tempfile::tempdir().unwrap();
    let args = [
        "--strategies",
        "SAGEMAKER_PREFIX,ORACLE",
        "--workload",
        "rag",
        "--requests",
        "12",
        "--runs",
        "2",
        "--time-scale",
        "0.01",
        "--max-wall-s",
        "20",
        "--check",
    ];
    let mut guard = bench(&args, out.path());
    let status = wait_exit(&mut guard.child, Duration::from_secs(60)).expect("warmpath-bench --runs 2 within 60 s");
    let stderr = guard.stderr();
    assert!(status.success(), "{stderr}");
    for k in ["run1", "run2"] {
        assert!(out.path().join(k).join("summary.csv").exists(), "{k}/summary.csv missing; stderr:\n{stderr}");
    }
    assert!(stderr.contains("seed 42") && stderr.contains("seed 43"), "runs use successive seeds:\n{stderr}");
    let table = std::fs::read_to_string(out.path().join("table.md")).unwrap();
    for label in ["SAGEMAKER_PREFIX", "ORACLE"] {
        let row = table.lines().find(|l| l.starts_with(&format!("| {label} |"))).unwrap_or_else(|| panic!("{table}"));
        assert!(row.contains("| 2 | 12 | 0 |"), "2 runs of 12 requests, no errors: {row}");
    }
    assert!(table.contains("mean (min–max) over 2 runs"), "{table}");
}

#[test]
fn counts_and_times_out_of_range_are_refused() {
    for (args, want) in [
        (&["--requests", "0"][..], "must be at least 1"),
        (&["--requests", "100000000"][..], "at most 100000"),
        (&["--runs", "1000"][..], "at most 100"),
        (&["--block-tokens", "0"][..], "must be at least 1"),
        (&["--max-num-seqs", "0"][..], "must be at least 1"),
        (&["--prefix-length", "0"][..], "must be at least 1"),
        (&["--envoy-concurrency", "0"][..], "--envoy-concurrency"),
        (&["--prefill-ms-per-token", "-1"][..], "must be a number ≥ 0"),
        (&["--max-wall-s", "0"][..], "must be a number > 0"),
    ] {
        let mut all = vec!["--strategies", "SAGEMAKER_PREFIX"];
        all.extend_from_slice(args);
        let e = refused(&all);
        assert!(e.contains(args[0]) && e.contains(want), "{args:?}: {e}");
    }
}

#[test]
fn an_output_folder_that_cannot_be_written_is_refused_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"").unwrap();
    let start = Instant::now();
    let mut guard =
        bench(&["--strategies", "SAGEMAKER_PREFIX", "--requests", "2", "--time-scale", "0.01"], &file.join("sub"));
    let status = wait_exit(&mut guard.child, Duration::from_secs(60)).expect("warmpath-bench ended within 60 s");
    let stderr = guard.stderr();
    assert!(!status.success() && stderr.contains("creating the output folder"), "{stderr}");
    assert!(
        start.elapsed() < Duration::from_secs(30) && !stderr.contains("SAGEMAKER"),
        "ran before checking: {stderr}"
    );
}
