//! The processes a test or a tool starts: whether one still runs, its exit awaited with a deadline, and a guard that
//! kills it, and the Envoy it started, when a test ends. Process state comes from procfs (the `procfs` crate).

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use procfs::process::Process;

/// True while `pid` exists and has not exited (a zombie, exited and not yet reaped by its parent, is not alive).
pub fn alive(pid: u32) -> bool {
    i32::try_from(pid)
        .ok()
        .and_then(|pid| Process::new(pid).ok())
        .and_then(|p| p.stat().ok())
        .is_some_and(|stat| stat.state != 'Z')
}

/// `child`'s exit status once it has exited, looked at every 50 ms for at most `timeout`; `None` while it runs.
pub fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if start.elapsed() >= timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A spawned process, and the Envoy it started once the test has found it, killed (SIGKILL) when dropped: at the end
/// of a test, passed or failed, nothing it started keeps running.
pub struct KillOnDrop {
    /// The guarded process.
    pub child: Child,
    /// The process id of the Envoy `child` started, once known.
    pub envoy: Option<u32>,
}

impl KillOnDrop {
    /// Guards `child` (no Envoy known yet).
    pub fn new(child: Child) -> KillOnDrop {
        KillOnDrop { child, envoy: None }
    }

    /// Spawns `command` for a test that reads what it says on stderr: stdin and stdout null, stderr piped, and
    /// without the backtrace variables (anyhow appends a backtrace to an error when they are set; the tests check
    /// the bare message).
    pub fn spawn_for_stderr(command: &mut Command) -> std::io::Result<KillOnDrop> {
        let child = command
            .env_remove("RUST_BACKTRACE")
            .env_remove("RUST_LIB_BACKTRACE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        Ok(KillOnDrop::new(child))
    }

    /// What the process wrote to stderr, read to its end: call it once the process exited (these tools write a
    /// few lines, so the pipe never fills and blocks them). Empty when stderr was not piped.
    pub fn stderr(&mut self) -> String {
        let mut out = String::new();
        if let Some(pipe) = self.child.stderr.as_mut() {
            let _ = pipe.read_to_string(&mut out);
        }
        out
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(pid) = self.envoy.filter(|&pid| alive(pid)) {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;

    #[test]
    fn a_process_is_alive_until_it_exits_and_the_guard_kills_it() {
        let child = Command::new("sleep").arg("30").stdin(Stdio::null()).spawn().expect("sleep");
        let pid = child.id();
        let mut guard = KillOnDrop::new(child);
        assert!(alive(pid), "a running process");
        assert_eq!(wait_exit(&mut guard.child, Duration::from_millis(120)), None, "still running");
        let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
        // Exited but not reaped: a zombie, not alive.
        let start = Instant::now();
        while alive(pid) && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!alive(pid), "a process that exited is not alive before its parent reaps it");
        let status = wait_exit(&mut guard.child, Duration::from_secs(10)).expect("exited");
        assert!(!status.success());

        let mut said = KillOnDrop::spawn_for_stderr(Command::new("sh").args(["-c", "echo oops >&2; exit 3"])).unwrap();
        let status = wait_exit(&mut said.child, Duration::from_secs(10)).expect("exited");
        assert_eq!((status.code(), said.stderr().as_str()), (Some(3), "oops\n"));

        let sleeper = Command::new("sleep").arg("30").stdin(Stdio::null()).spawn().expect("sleep");
        let other = Command::new("sleep").arg("30").stdin(Stdio::null()).spawn().expect("sleep");
        let (pid, other_pid) = (sleeper.id(), other.id());
        let mut other = other;
        let mut guard = KillOnDrop::new(sleeper);
        guard.envoy = Some(other_pid);
        drop(guard);
        assert!(!alive(pid), "the guarded process is killed and reaped");
        let status = wait_exit(&mut other, Duration::from_secs(10)).expect("the process named as its Envoy is killed");
        assert!(!status.success());
        assert!(!alive(u32::MAX), "no such process");
    }
}
