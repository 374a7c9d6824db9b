//! What the workspace's tests share: child processes under a deadline. A test that launches
//! `mpirun` (or spawns ranks itself) must never hang the suite: [`run`] starts the command in a
//! process group of its own, collects its output on reader threads (so a full pipe cannot
//! block it), and on the deadline kills the whole group — `mpirun` and every rank it started —
//! and panics with what the command printed so far. [`wait_until`] and [`kill_group`] are the
//! pieces, for tests that hold several children at once.
//!
//! Used as a dev-dependency by dist-comm, distspmm-op, the C ABI and the CLI tests.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// How often a waiting test polls its children.
const POLL: Duration = Duration::from_millis(20);

/// Polls `child` until it ends or `limit` has passed; `None` if it is still running.
///
/// # Panics
/// If the child's status cannot be read (a bug of the test).
pub fn wait_until(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("poll a child process") {
            return Some(status);
        }
        if start.elapsed() >= limit {
            return None;
        }
        std::thread::sleep(POLL.min(limit.saturating_sub(start.elapsed())));
    }
}

/// Kills `child`'s process group (everything it started, when it was spawned with
/// [`in_own_group`]) and the child itself, and reaps it.
pub fn kill_group(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let _ = child.kill();
    let _ = child.wait();
}

/// Makes `command` start in a process group of its own, so that [`kill_group`] reaches every
/// process below it (the ranks under `mpirun`).
pub fn in_own_group(command: &mut Command) -> &mut Command {
    command.process_group(0)
}

/// Runs `command` to its end, at most `limit`, with no stdin, and returns its output. On the
/// deadline kills its process group and panics with what it printed.
///
/// # Panics
/// If the command cannot start or does not finish within `limit`.
pub fn run(command: &mut Command, limit: Duration) -> Output {
    let described = format!("{command:?}");
    let mut child = in_own_group(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {described}: {e}"));
    let reader = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = reader(Box::new(child.stdout.take().expect("piped stdout")));
    let stderr = reader(Box::new(child.stderr.take().expect("piped stderr")));
    let status = wait_until(&mut child, limit);
    if status.is_none() {
        kill_group(&mut child);
    }
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    match status {
        Some(status) => Output {
            status,
            stdout,
            stderr,
        },
        None => panic!(
            "{described} did not finish within {limit:?} (killed with its process group)\n\
             stdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_command_returns_its_output() {
        let out = run(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(30),
        );
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
    }

    #[test]
    fn a_command_past_its_deadline_is_killed_with_its_group() {
        let marker = std::env::temp_dir().join(format!("test-support-{}", std::process::id()));
        let script = format!(
            "echo started; (sleep 1; touch '{}') & sleep 30",
            marker.display()
        );
        let started = Instant::now();
        let panicked = std::panic::catch_unwind(|| {
            run(
                Command::new("sh").args(["-c", &script]),
                Duration::from_millis(300),
            )
        })
        .expect_err("the deadline must panic");
        assert!(started.elapsed() < Duration::from_secs(1));
        let message = panicked
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(message.contains("did not finish within"), "{message}");
        assert!(message.contains("started"), "{message}");
        // The background child of the shell was in the group: it never touches the marker.
        std::thread::sleep(Duration::from_millis(1500));
        assert!(!marker.exists(), "a process of the group survived");
    }
}
