//! Launch helpers of the failure and multi-host tests: `mpirun` jobs run in the background with
//! their output in files and a deadline, the rank processes under a job found through `/proc`,
//! and skips on a machine without Cora or `mpirun` (failures instead when `CI=true`).
//!
//! Also the plain runs of the binary every integration test makes (`distspmm`, `ok`, `fails`,
//! `one_json`), and the same under a deadline with the exit checks of the hostile-input tests
//! (`run_one`, `succeeds`, `error_of`, `refused`, `csbm`).

#![allow(dead_code)] // each test binary uses a part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// The `distspmm` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_distspmm");

/// Whether missing prerequisites must fail the test instead of skipping it.
pub fn ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// Skips (returns false after a message) or, under `CI=true`, fails.
pub fn require(ok: bool, what: &str) -> bool {
    if !ok {
        assert!(!ci(), "CI=true but {what}");
        eprintln!("skipping: {what}");
    }
    ok
}

/// `../shared/datasets/cora.npz` relative to the repository root, if present.
pub fn cora() -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/datasets/cora.npz");
    require(path.exists(), &format!("{} is missing", path.display())).then_some(path)
}

/// Whether `mpirun` can be started.
pub fn mpirun_available() -> bool {
    let found = Command::new("mpirun")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    require(found, "mpirun is not installed")
}

/// Runs `distspmm ARGS…` to completion (one rayon thread: tests run side by side).
pub fn distspmm(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("RAYON_NUM_THREADS", "1")
        .output()
        .expect("run distspmm")
}

/// Runs a command that must succeed; returns its stdout.
pub fn ok(args: &[&str]) -> String {
    stdout_of_success(args, distspmm(args))
}

/// The stdout of the run `distspmm ARGS…`, which must have succeeded.
fn stdout_of_success(args: &[&str], out: Output) -> String {
    assert!(
        out.status.success(),
        "distspmm {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// Runs a command that must fail; returns its stderr.
pub fn fails(args: &[&str]) -> String {
    let out = distspmm(args);
    assert!(
        !out.status.success(),
        "distspmm {args:?} succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr).expect("UTF-8 output")
}

/// The one JSON line a `--json` command printed.
pub fn one_json(text: &str) -> serde_json::Value {
    assert_eq!(text.trim().lines().count(), 1, "not one line: {text}");
    serde_json::from_str(text.trim()).expect("a JSON line")
}

/// How long one run of the binary under `run_one` may take on a loaded two-core machine before
/// it counts as a hang.
pub const DEADLINE: Duration = Duration::from_secs(120);

/// Runs `distspmm ARGS…` in one process (one rayon thread, OpenMPI allowed as root), killed
/// after `DEADLINE`.
pub fn run_one(args: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    as_root_with_one_thread(&mut cmd);
    run(cmd, DEADLINE)
}

/// `ok` under `DEADLINE`: runs a command that must succeed; returns its stdout.
pub fn succeeds(args: &[&str]) -> String {
    stdout_of_success(args, run_one(args))
}

/// The stderr of a run that must end with exit status `code` (1: an error of the command, 2: a
/// command-line error), not a crash; `what` names the run in a failure.
pub fn stderr_of_exit(out: &Output, code: i32, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: expected exit status {code}, got {:?}: {stderr}",
        out.status
    );
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    stderr
}

/// The stderr of a run that must end with exit status 1 (an error, not a crash).
pub fn error_of(out: &Output, what: &str) -> String {
    stderr_of_exit(out, 1, what)
}

/// Runs `distspmm ARGS…` (`run_one`), which must end with exit status `code`; returns its stderr.
pub fn refused(args: &[&str], code: i32) -> String {
    stderr_of_exit(&run_one(args), code, &format!("distspmm {args:?}"))
}

/// `distspmm generate csbm` of `nodes` nodes with `features` features, 3 classes and average
/// degree 6 from `seed`, written as `dir/name`.
pub fn csbm(dir: &Path, name: &str, nodes: usize, features: usize, seed: u64) -> PathBuf {
    let path = dir.join(name);
    succeeds(&[
        "generate",
        "csbm",
        "--nodes",
        &nodes.to_string(),
        "--features",
        &features.to_string(),
        "--classes",
        "3",
        "--avg-degree",
        "6",
        "--seed",
        &seed.to_string(),
        "--out",
        s(&path),
    ]);
    path
}

/// A path as `&str` for an argument list.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 temporary path")
}

/// `distspmm partition --input INPUT --parts P --out OUT --force EXTRA…`, which must succeed.
pub fn partition(input: &Path, parts: usize, out: &Path, extra: &[&str]) {
    let out = Command::new(BIN)
        .args([
            "partition",
            "--input",
            s(input),
            "--parts",
            &parts.to_string(),
        ])
        .args(["--out", s(out), "--force"])
        .args(extra)
        .output()
        .expect("run distspmm partition");
    assert!(
        out.status.success(),
        "partition failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `mpirun -n RANKS` on this machine over shared memory, as root if need be, one kernel thread
/// per rank (the test machines have two cores); the program and its arguments follow.
pub fn mpirun(ranks: usize) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args([
        "-n",
        &ranks.to_string(),
        "--oversubscribe",
        "--bind-to",
        "none",
    ])
    .args(["--mca", "btl", "self,vader"]);
    as_root_with_one_thread(&mut cmd);
    cmd
}

/// The environment every launch needs: OpenMPI's consent to run as root (CI containers) and
/// one rayon thread per rank.
pub fn as_root_with_one_thread(cmd: &mut Command) {
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("RAYON_NUM_THREADS", "1");
}

/// Polls `done` every `every` until it holds or `limit` has passed; returns whether it held.
pub fn wait_for(limit: Duration, every: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if done() {
            return true;
        }
        if start.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(every);
    }
}

/// `kill -9 PID`.
pub fn kill9(pid: u32) {
    let _ = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// `(parent pid, state letter)` of a process, from `/proc/PID/stat`.
fn stat(pid: u32) -> Option<(u32, char)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: read after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((ppid, state))
}

/// Whether a process exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    stat(pid).is_some_and(|(_, state)| state != 'Z' && state != 'X')
}

/// All processes below `root` (children, grandchildren, …).
pub fn descendants(root: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        {
            if let Some((ppid, _)) = stat(pid) {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(
            parent_of
                .iter()
                .filter(|&&(_, pp)| pp == p)
                .map(|&(c, _)| c),
        );
        i += 1;
    }
    found.remove(0);
    found
}

/// The MPI rank of a process (its `OMPI_COMM_WORLD_RANK`), if it is an OpenMPI rank.
pub fn rank_of(pid: u32) -> Option<usize> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(b"OMPI_COMM_WORLD_RANK="))
        .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
}

/// A background job whose stdout and stderr go to files; killed with everything under it when
/// dropped unfinished.
#[derive(Debug)]
pub struct Job {
    child: Child,
    logs: tempfile::TempDir,
    status: Option<ExitStatus>,
}

impl Job {
    /// Starts `cmd`.
    pub fn spawn(mut cmd: Command) -> Self {
        let logs = tempfile::tempdir().expect("log directory");
        let file = |name: &str| std::fs::File::create(logs.path().join(name)).expect("log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file("stdout"))
            .stderr(file("stderr"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Self {
            child,
            logs,
            status: None,
        }
    }

    /// The launched process (mpirun).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its standard output so far.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(self.logs.path().join("stdout")).unwrap_or_default()
    }

    /// Its standard error so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.logs.path().join("stderr")).unwrap_or_default()
    }

    /// Whether it has ended (and its status, kept).
    pub fn finished(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("try_wait");
        }
        self.status
    }

    /// Waits up to `limit` for the end; `None` if it is still running.
    pub fn wait_until(&mut self, limit: Duration) -> Option<ExitStatus> {
        wait_for(limit, Duration::from_millis(20), || {
            self.finished().is_some()
        });
        self.status
    }

    /// The rank processes below the job, as `pid` indexed by rank, once all `ranks` have started
    /// (waits up to a minute).
    pub fn ranks(&mut self, ranks: usize) -> Vec<u32> {
        let mut pids = vec![0; ranks];
        let started = wait_for(Duration::from_secs(60), Duration::from_millis(50), || {
            for pid in descendants(self.pid()) {
                if let Some(r) = rank_of(pid).filter(|&r| r < ranks) {
                    pids[r] = pid;
                }
            }
            pids.iter().all(|&p| p != 0) || self.finished().is_some()
        });
        assert!(
            started && pids.iter().all(|&p| p != 0),
            "the {ranks} rank processes did not all appear under mpirun (found {pids:?}); stderr: {}",
            self.stderr()
        );
        pids
    }

    /// Waits up to `limit` and returns the output; kills the job and fails on a timeout.
    pub fn output(mut self, limit: Duration) -> Output {
        let Some(status) = self.wait_until(limit) else {
            panic!(
                "still running after {limit:?}; stderr so far: {}",
                self.stderr()
            )
        };
        Output {
            status,
            stdout: self.stdout().into_bytes(),
            stderr: self.stderr().into_bytes(),
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if self.finished().is_none() {
            // The ranks first (by their ids), then mpirun itself.
            for pid in descendants(self.pid()) {
                kill9(pid);
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `cmd` to the end (at most `limit`) and returns its output (`test_support::run`: on the
/// deadline its process group is killed and the test fails with what it printed).
pub fn run(mut cmd: Command, limit: Duration) -> Output {
    test_support::run(&mut cmd, limit)
}

/// The final `--json` line of a successful `distspmm train`.
pub fn summary(out: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "train failed: {stderr}");
    let line = stdout
        .lines()
        .last()
        .unwrap_or_else(|| panic!("no output; stderr: {stderr}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("bad JSON line {line:?}: {e}"))
}

/// `mpirun -n RANKS distspmm ARGS…` to its end, at most 5 minutes.
pub fn mpi(ranks: usize, args: &[&str]) -> Output {
    let mut cmd = mpirun(ranks);
    cmd.arg(BIN).args(args);
    run(cmd, Duration::from_secs(300))
}

/// `mpirun -n RANKS distspmm ARGS…` started in the background.
pub fn mpi_job(ranks: usize, args: &[&str]) -> Job {
    let mut cmd = mpirun(ranks);
    cmd.arg(BIN).args(args);
    Job::spawn(cmd)
}

/// An `.npy` file's header and data bytes (format 1.0, C order, as predict writes them).
pub fn npy(path: &Path) -> (String, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00", "{}", path.display());
    let len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = String::from_utf8(bytes[10..10 + len].to_vec()).unwrap();
    (header, bytes[10 + len..].to_vec())
}

/// A number of a `--json` summary.
pub fn f64_of(v: &serde_json::Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("no {key} in {v}"))
}
