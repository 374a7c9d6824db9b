//! Multi-host for real: two "hosts" that are network namespaces of this machine joined by a veth
//! pair (scripts/netns-hosts.sh), OpenMPI's rsh launcher pointed at scripts/netns-rsh.sh (which
//! starts the remote daemon inside the other namespace, as ssh would on a second machine), a
//! hostfile, and the TCP transport restricted to the link. Cora trains across them; then the
//! link is taken down mid-run and the job must end by itself, non-zero, with nothing left
//! running on either host.
//!
//! Needs root and `ip netns`; skipped otherwise, unless `CI=true` (then it fails). Only the
//! addresses 10.213.77.1 and 10.213.77.2, inside the two namespaces, are used.

mod launch;

use launch::{as_root_with_one_thread, cora, mpirun_available, partition, require, s, Job, BIN};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The link's subnet, as OpenMPI's interface selection takes it.
const SUBNET: &str = "10.213.77.0/30";
/// The veth device's name in both namespaces.
const VETH: &str = "dsp0";

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scripts")
        .join(name)
}

/// Whether this process may create network namespaces (root with iproute2).
fn netns_possible() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    let ip = Command::new("ip")
        .args(["netns", "list"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    require(root, "network namespaces need root") && require(ip, "`ip netns` (iproute2) is missing")
}

/// The two namespace hosts `PREFIX-h1` (10.213.77.1) and `PREFIX-h2` (10.213.77.2); deleted
/// when dropped, with whatever still runs inside them killed first, even if the test failed.
struct Hosts {
    prefix: &'static str,
    hostfile: tempfile::NamedTempFile,
}

impl Hosts {
    fn up(prefix: &'static str) -> Self {
        let hosts = Self {
            prefix,
            hostfile: tempfile::NamedTempFile::new().unwrap(),
        };
        hosts.script(&["up"]);
        let list = hosts.script(&["hostfile"]);
        std::fs::write(hosts.hostfile.path(), &list.stdout).unwrap();
        hosts
    }

    fn script(&self, args: &[&str]) -> Output {
        let out = Command::new(script("netns-hosts.sh"))
            .args(args)
            .arg(self.prefix)
            .output()
            .expect("run scripts/netns-hosts.sh");
        assert!(
            out.status.success(),
            "netns-hosts.sh {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn ns(&self, host: usize) -> String {
        format!("{}-h{host}", self.prefix)
    }

    /// Processes inside host `host`'s namespace.
    fn pids(&self, host: usize) -> Vec<u32> {
        let out = Command::new("ip")
            .args(["netns", "pids", &self.ns(host)])
            .output()
            .expect("ip netns pids");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }

    /// Bytes sent plus received on host 1's end of the link.
    fn link_bytes(&self) -> u64 {
        let stat = |name: &str| {
            let out = Command::new("ip")
                .args(["netns", "exec", &self.ns(1), "cat"])
                .arg(format!("/sys/class/net/{VETH}/statistics/{name}"))
                .output()
                .expect("read the veth counters");
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<u64>()
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        stat("tx_bytes") + stat("rx_bytes")
    }

    /// `mpirun` started on host 1 over both hosts: the documented recipe (docs/cluster.md).
    fn mpirun(&self) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns(1), "mpirun"])
            .args(["--hostfile", s(self.hostfile.path()), "-n", "2"])
            .args(["--mca", "plm_rsh_agent", s(&script("netns-rsh.sh"))])
            .args(["--mca", "btl", "tcp,self"])
            .args(["--mca", "btl_tcp_if_include", SUBNET])
            .args(["--mca", "oob_tcp_if_include", SUBNET])
            // Notice a dead link between mpirun and a remote daemon within ~5 s
            // (defaults: 300 s idle + 9 probes × 20 s).
            .args(["--mca", "oob_tcp_keepalive_time", "2"])
            .args(["--mca", "oob_tcp_keepalive_intvl", "1"])
            .args(["--mca", "oob_tcp_keepalive_probes", "3"])
            // The remote host's environment comes from its "login shell" (netns-rsh.sh passes
            // only PATH, LD_LIBRARY_PATH and HOME), so what the ranks need is forwarded.
            .args(["-x", "RAYON_NUM_THREADS"])
            .env("NETNS_HOSTS_PREFIX", self.prefix);
        as_root_with_one_thread(&mut cmd);
        cmd
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for host in [1, 2] {
            for pid in self.pids(host) {
                launch::kill9(pid);
            }
        }
        let _ = Command::new(script("netns-hosts.sh"))
            .args(["down", self.prefix])
            .status();
    }
}

/// Cora in 2 chunks (in a temporary directory) and the hosts `PREFIX-h1`, `PREFIX-h2`; `None`
/// to skip.
fn setup(prefix: &'static str) -> Option<(tempfile::TempDir, PathBuf, Hosts)> {
    let cora = cora()?;
    if !(mpirun_available() && netns_possible()) {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let chunks = dir.path().join("c");
    partition(&cora, 2, &chunks, &[]);
    Some((dir, chunks, Hosts::up(prefix)))
}

#[test]
fn cora_trains_across_two_namespace_hosts_over_tcp() {
    let Some((_dir, chunks, hosts)) = setup("dspt") else {
        return;
    };

    // Where the two ranks run: one in each namespace.
    let mut cmd = hosts.mpirun();
    cmd.args(["sh", "-c", "ip netns identify $$"]);
    let out = launch::run(cmd, Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut seen: Vec<&str> = stdout.split_whitespace().collect();
    seen.sort_unstable();
    assert_eq!(
        seen,
        ["dspt-h1", "dspt-h2"],
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let epochs = 80u64;
    let before = hosts.link_bytes();
    let started = Instant::now();
    let mut cmd = hosts.mpirun();
    cmd.args([BIN, "train", "--chunks", s(&chunks), "--json"])
        .args(["--epochs", &epochs.to_string()]);
    let out = launch::run(cmd, Duration::from_secs(300));
    let sum = launch::summary(&out);
    let crossed = hosts.link_bytes() - before;
    let per_epoch = sum["comm_bytes_per_epoch"].as_u64().unwrap();
    eprintln!(
        "{epochs} epochs across the namespaces in {:?}: test accuracy {}, {per_epoch} B/epoch counted, {crossed} B crossed the link",
        started.elapsed(),
        sum["test_acc"]
    );
    assert_eq!(sum["ranks"].as_u64(), Some(2));
    let acc = sum["test_acc"].as_f64().unwrap();
    assert!(acc >= 0.78, "test accuracy {acc} after {epochs} epochs");
    // The exchanges went over the veth link, not a shortcut: every counted payload byte
    // crossed it (plus TCP/IP headers and OpenMPI's own traffic).
    assert!(
        crossed >= epochs * per_epoch,
        "only {crossed} B crossed the link for {epochs} × {per_epoch} B"
    );
}

/// Starts a practically endless training across the hosts and waits until it runs on both
/// and a few epochs are done.
fn endless_training(hosts: &Hosts, chunks: &Path) -> Job {
    let mut cmd = hosts.mpirun();
    cmd.args([BIN, "train", "--chunks", s(chunks), "--epochs", "100000"]);
    let mut job = Job::spawn(cmd);
    let running = launch::wait_for(Duration::from_secs(180), Duration::from_millis(100), || {
        job.stdout().matches("epoch ").count() >= 3 || job.finished().is_some()
    });
    assert!(
        running && job.finished().is_none(),
        "training did not get going: {}",
        job.stderr()
    );
    assert!(!hosts.pids(2).is_empty(), "nothing runs on the second host");
    job
}

/// Waits (at most 60 s) for the job to end after `what`; it must fail, and nothing may be left
/// running on either host (a daemon cut off from mpirun takes its ranks down too).
fn ends_cleanly(hosts: &Hosts, job: &mut Job, what: &str) -> String {
    let since = Instant::now();
    let status = job.wait_until(Duration::from_secs(60)).unwrap_or_else(|| {
        panic!(
            "mpirun still running 60 s after {what}; stderr: {}",
            job.stderr()
        )
    });
    eprintln!("mpirun ended {:?} after {what}: {status}", since.elapsed());
    assert!(!status.success(), "the job succeeded after {what}");
    let gone = launch::wait_for(Duration::from_secs(20), Duration::from_millis(100), || {
        hosts.pids(1).is_empty() && hosts.pids(2).is_empty()
    });
    assert!(
        gone,
        "processes left after {what}: host 1 {:?}, host 2 {:?}",
        hosts.pids(1),
        hosts.pids(2)
    );
    job.stderr()
}

#[test]
fn taking_the_link_down_mid_run_ends_the_job_cleanly() {
    let Some((_dir, chunks, hosts)) = setup("dspl") else {
        return;
    };
    let mut job = endless_training(&hosts, &chunks);
    hosts.script(&["link-down"]);
    let stderr = ends_cleanly(&hosts, &mut job, "the link went down");
    assert!(
        stderr.contains("lost communication with a remote daemon"),
        "OpenMPI names the lost host: {stderr}"
    );
}

#[test]
fn a_rank_killed_on_the_remote_host_ends_the_job() {
    let Some((_dir, chunks, hosts)) = setup("dspk") else {
        return;
    };
    let mut job = endless_training(&hosts, &chunks);
    let remote_rank = hosts
        .pids(2)
        .into_iter()
        .find(|&p| launch::rank_of(p) == Some(1))
        .expect("rank 1 runs on the second host");
    launch::kill9(remote_rank);
    let stderr = ends_cleanly(&hosts, &mut job, "rank 1 was killed on the second host");
    assert!(
        stderr.contains("rank 1") && stderr.contains("signal 9"),
        "mpirun names the dead rank and the signal: {stderr}"
    );
}

#[test]
fn cora_is_partitioned_on_the_two_namespace_hosts() {
    let Some((dir, _chunks, hosts)) = setup("dspp") else {
        return;
    };
    let Some(cora) = cora() else { return };
    let out = dir.path().join("d");
    let before = hosts.link_bytes();
    let mut cmd = hosts.mpirun();
    cmd.args([BIN, "partition", "--distributed", "--input", s(&cora)])
        .args(["--parts", "2", "--out", s(&out), "--json"]);
    let run = launch::run(cmd, Duration::from_secs(300));
    assert!(run.status.success(), "{run:?}");
    let json = launch::one_json(&String::from_utf8_lossy(&run.stdout));
    assert_eq!(
        (json["ranks"].as_u64(), json["parts"].as_u64()),
        (Some(2), Some(2))
    );
    // The edges and node rows crossed the link between the hosts.
    let crossed = hosts.link_bytes() - before;
    assert!(crossed > 10_556 * 4, "only {crossed} B crossed the link");
    // The single-machine builder, given the partition, writes the same chunks.
    let again = dir.path().join("s");
    partition(
        &cora,
        2,
        &again,
        &["--partition-map", s(&out.join("partition.map"))],
    );
    for p in 0..2 {
        let name = format!("part-{p:05}.chunk");
        assert!(
            std::fs::read(out.join(&name)).unwrap() == std::fs::read(again.join(&name)).unwrap(),
            "{name} differs"
        );
    }
    // And the ranks on both hosts train on them.
    let mut cmd = hosts.mpirun();
    cmd.args([BIN, "train", "--chunks", s(&out), "--epochs", "5", "--json"]);
    assert!(launch::run(cmd, Duration::from_secs(300)).status.success());
}
