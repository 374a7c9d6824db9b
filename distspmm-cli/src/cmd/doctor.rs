//! `distspmm doctor`: the pre-flight checklist of a distributed run, performed rather than read.
//!
//! Chunks: the directory exists, its manifest is valid, there is one chunk file per part and P
//! equals the rank count, every chunk validates (checksums, one partition run, consistency).
//! MPI: `mpirun` is on `PATH` and is Open MPI, and it can start the ranks on this machine (a
//! probe that launches this binary's `--version` under a timeout, with the root and
//! oversubscription settings the real run will need). Hosts (`--hostfile`): every listed host
//! resolves and accepts TCP connections on the ssh port; what cannot be checked without
//! launching on them (the same distspmm everywhere, the chunks visible at the same path) is
//! printed as the command that checks it.
//!
//! Each check ends ok, warn, fail or skip, with a plain-words fix; any fail makes the exit
//! status non-zero.

use std::io::Read;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::bail;
use chunk_format::dir::{chunk_file_name, ChunkDir};
use distspmm_prep::chunk::VerifyDir;
use serde::Serialize;

/// Check a chunk directory, the MPI installation and the hosts of a run before launching it.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The chunk directory the run will load (written by `distspmm partition`).
    #[arg(long)]
    chunks: Option<PathBuf>,
    /// The hostfile the run will pass to `mpirun --hostfile` (Open MPI format: `host [slots=N]`).
    #[arg(long)]
    hostfile: Option<PathBuf>,
    /// The rank count the run will use (`mpirun -n N`); default: the directory's part count.
    #[arg(short = 'n', long)]
    ranks: Option<u32>,
    /// Seconds to wait for the local `mpirun` probe (1 to 86400).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=MAX_TIMEOUT_S))]
    launch_timeout: u64,
    /// Seconds to wait for each host's TCP connection (1 to 86400).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=MAX_TIMEOUT_S))]
    connect_timeout: u64,
    /// Print one JSON object instead of the checklist.
    #[arg(long)]
    json: bool,
}

/// The longest timeout the options accept: a day.
const MAX_TIMEOUT_S: u64 = 86_400;

/// The largest hostfile read: a hostfile lists hosts, one short line each.
const MAX_HOSTFILE_BYTES: u64 = 16 << 20;

/// How a check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    Ok,
    Warn,
    Fail,
    Skip,
}

/// One line of the checklist.
#[derive(Debug, Serialize)]
struct Check {
    name: String,
    status: Status,
    detail: String,
    /// What to do about a warn or fail (or how to check by hand, for a skip).
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
}

#[derive(Debug, Default)]
struct Report {
    checks: Vec<Check>,
}

impl Report {
    fn push(&mut self, name: &str, status: Status, detail: String, fix: Option<String>) {
        self.checks.push(Check {
            name: name.into(),
            status,
            detail,
            fix,
        });
    }
    fn ok(&mut self, name: &str, detail: String) {
        self.push(name, Status::Ok, detail, None);
    }
    fn warn(&mut self, name: &str, detail: String, fix: String) {
        self.push(name, Status::Warn, detail, Some(fix));
    }
    fn fail(&mut self, name: &str, detail: String, fix: String) {
        self.push(name, Status::Fail, detail, Some(fix));
    }
    fn skip(&mut self, name: &str, detail: String, fix: Option<String>) {
        self.push(name, Status::Skip, detail, fix);
    }
    fn count(&self, status: Status) -> usize {
        self.checks.iter().filter(|c| c.status == status).count()
    }
}

/// Runs `distspmm doctor`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let mut report = Report::default();
    let parts = args
        .chunks
        .as_deref()
        .and_then(|dir| check_chunks(dir, args.ranks, &mut report));
    let ranks = args.ranks.or(parts).unwrap_or(2).max(1);
    let as_root = running_as_root();
    let mpirun = check_mpirun(&mut report);
    if let Some(mpirun) = &mpirun {
        let local_only = args.hostfile.is_none();
        check_local_launch(
            mpirun,
            ranks,
            as_root,
            local_only,
            args.launch_timeout,
            &mut report,
        );
    }
    if let Some(hostfile) = &args.hostfile {
        check_hosts(hostfile, ranks, args, &mut report);
    }

    let failed = report.count(Status::Fail);
    if args.json {
        let line = serde_json::json!({
            "ok": failed == 0,
            "ranks": ranks,
            "failed": failed,
            "warnings": report.count(Status::Warn),
            "checks": report.checks,
        });
        println!("{line}");
    } else {
        print!("{}", render(&report));
    }
    if failed > 0 {
        let see = if args.json {
            "each failed check's `fix`"
        } else {
            "the `fix:` lines above"
        };
        bail!("{failed} check(s) failed; fix them before launching (see {see})");
    }
    Ok(())
}

fn render(report: &Report) -> String {
    let mut out = String::new();
    for c in &report.checks {
        let tag = match c.status {
            Status::Ok => " ok ",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
        };
        out.push_str(&format!("[{tag}] {}: {}\n", c.name, c.detail));
        if let Some(fix) = &c.fix {
            out.push_str(&format!("       fix: {fix}\n"));
        }
    }
    out.push_str(&format!(
        "{} ok, {} warnings, {} failed, {} skipped\n",
        report.count(Status::Ok),
        report.count(Status::Warn),
        report.count(Status::Fail),
        report.count(Status::Skip)
    ));
    out
}

const REPARTITION: &str = "re-run `distspmm partition --input GRAPH --parts P --out DIR`";

/// The chunk checks; returns P when the manifest could be read.
fn check_chunks(dir: &Path, ranks: Option<u32>, report: &mut Report) -> Option<u32> {
    if !dir.is_dir() {
        report.fail(
            "chunk directory",
            format!("{} does not exist or is not a directory", dir.display()),
            format!("pass the directory `distspmm partition --out` wrote, or {REPARTITION}"),
        );
        return None;
    }
    report.ok("chunk directory", format!("{} exists", dir.display()));
    let chunk_dir = match ChunkDir::open(dir) {
        Ok(d) => d,
        Err(e) => {
            report.fail(
                "manifest",
                format!("{:#}", anyhow::Error::new(e)),
                REPARTITION.into(),
            );
            return None;
        }
    };
    let m = chunk_dir.manifest();
    let parts = m.parts;
    report.ok(
        "manifest",
        format!(
            "{parts} parts, {} nodes, {} non-zeros, partition {} (fingerprint {})",
            m.nodes, m.nnz, m.partition_method, m.fingerprint
        ),
    );
    let ours = env!("CARGO_PKG_VERSION");
    if m.distspmm_version != ours {
        report.warn(
            "writer version",
            format!(
                "the directory was written by distspmm {}, this is {ours}",
                m.distspmm_version
            ),
            format!("if loading fails, {REPARTITION} with this version"),
        );
    }

    let listed: Vec<&str> = m.chunks.iter().map(|c| c.file.as_str()).collect();
    let missing: Vec<&str> = listed
        .iter()
        .copied()
        .filter(|f| !dir.join(f).is_file())
        .collect();
    let stray = stray_chunk_files(dir, parts);
    if !missing.is_empty() {
        report.fail(
            "chunk files",
            format!(
                "{} of {parts} chunk files are missing: {}",
                missing.len(),
                abbreviate(&missing)
            ),
            format!(
                "copy the whole directory again (the manifest lists every file), or {REPARTITION}"
            ),
        );
    } else if !stray.is_empty() {
        report.warn(
            "chunk files",
            format!(
                "{parts} chunk files as the manifest lists, plus {} not in it: {}",
                stray.len(),
                abbreviate(&stray.iter().map(String::as_str).collect::<Vec<_>>())
            ),
            "they are ignored; delete them to avoid confusion (`distspmm partition` removes \
             them when it rewrites the directory)"
                .into(),
        );
    } else {
        report.ok("chunk files", format!("{parts} chunk files, one per part"));
    }

    match ranks {
        Some(n) if n != parts => report.fail(
            "rank count",
            format!("the run asks for {n} ranks but the directory has {parts} parts"),
            format!(
                "launch with `mpirun -n {parts}`, or partition again with `--parts {n}` into \
                 another directory"
            ),
        ),
        Some(n) => report.ok("rank count", format!("{n} ranks for {parts} parts")),
        None => report.ok(
            "rank count",
            format!("{parts} parts: launch with `mpirun -n {parts}`"),
        ),
    }

    if missing.is_empty() {
        let started = Instant::now();
        match chunk_dir.validate_all() {
            Ok(chunks) => {
                let bytes: usize = chunks.iter().map(|c| c.len()).sum();
                report.ok(
                    "chunk contents",
                    format!(
                        "all {parts} chunks and the partition map validate (checksums, one \
                         partition run, halo lists agree); {:.1} MiB in {:.2} s",
                        bytes as f64 / (1 << 20) as f64,
                        started.elapsed().as_secs_f64()
                    ),
                );
            }
            Err(e) => report.fail(
                "chunk contents",
                format!("{:#}", anyhow::Error::new(e)),
                format!(
                    "the named file is corrupted or from another partition run: copy it again \
                     from the original directory, or {REPARTITION}"
                ),
            ),
        }
    }
    Some(parts)
}

/// `part-NNNNN.chunk` files in `dir` that are not among the first `parts`.
fn stray_chunk_files(dir: &Path, parts: u32) -> Vec<String> {
    let expected: std::collections::HashSet<String> = (0..parts).map(chunk_file_name).collect();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut stray: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("part-") && n.ends_with(".chunk") && !expected.contains(n))
        .collect();
    stray.sort();
    stray
}

fn abbreviate(names: &[&str]) -> String {
    const SHOWN: usize = 4;
    let mut text = names[..names.len().min(SHOWN)].join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}

/// Open MPI refuses to start as root unless told it may.
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the process's effective user.
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn root_allowed() -> bool {
    std::env::var_os("OMPI_ALLOW_RUN_AS_ROOT").is_some_and(|v| v == "1")
        && std::env::var_os("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM").is_some_and(|v| v == "1")
}

/// What a command printed, or why it did not finish.
#[derive(Debug)]
enum Outcome {
    Exited {
        success: bool,
        code: Option<i32>,
        stdout: String,
        stderr: String,
    },
    TimedOut,
    NotStarted(std::io::Error),
}

/// Runs `cmd` to completion or kills it after `timeout`, draining its output meanwhile.
fn run_with_timeout(mut cmd: Command, timeout: Duration) -> Outcome {
    let mut child = match cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return Outcome::NotStarted(e),
    };
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut p) = pipe {
                let mut bytes = Vec::new();
                let _ = p.read_to_end(&mut bytes);
                text = String::from_utf8_lossy(&bytes).into_owned();
            }
            text
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    // A timeout past the end of the clock's range waits without a deadline.
    let deadline = Instant::now().checked_add(timeout);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if deadline.is_none_or(|d| Instant::now() < d) => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    // mpirun's daemons may keep the pipes open briefly after a kill; the threads end with them.
    let (stdout, stderr) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    match status {
        Some(s) => Outcome::Exited {
            success: s.success(),
            code: s.code(),
            stdout,
            stderr,
        },
        None => Outcome::TimedOut,
    }
}

/// Finds `mpirun` on `PATH` and reads its version; returns its path.
fn check_mpirun(report: &mut Report) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("mpirun"))
            .find(|p| p.is_file())
    });
    let Some(mpirun) = found else {
        report.fail(
            "mpirun",
            "mpirun is not on PATH".into(),
            "install Open MPI (Debian/Ubuntu: `apt install openmpi-bin libopenmpi-dev`) or add \
             its bin directory to PATH"
                .into(),
        );
        return None;
    };
    let mut cmd = Command::new(&mpirun);
    cmd.arg("--version");
    match run_with_timeout(cmd, Duration::from_secs(10)) {
        Outcome::Exited { stdout, .. } if stdout.contains("Open MPI") => {
            let version = stdout.lines().next().unwrap_or_default().trim().to_string();
            report.ok("mpirun", format!("{} ({version})", mpirun.display()));
            Some(mpirun)
        }
        Outcome::Exited { stdout, stderr, .. } => {
            let first = stdout.lines().chain(stderr.lines()).next().unwrap_or("");
            report.warn(
                "mpirun",
                format!(
                    "{} is not Open MPI ({first:?}); distspmm is built and tested with Open MPI",
                    mpirun.display()
                ),
                "use Open MPI's mpirun, or translate the Open MPI flags in the docs \
                 (--oversubscribe, --mca btl ...) for your MPI"
                    .into(),
            );
            Some(mpirun)
        }
        Outcome::TimedOut => {
            report.fail(
                "mpirun",
                format!("`{} --version` did not answer in 10 s", mpirun.display()),
                "check the MPI installation (a wrapper script waiting for input?)".into(),
            );
            None
        }
        Outcome::NotStarted(e) => {
            report.fail(
                "mpirun",
                format!("cannot run {}: {e}", mpirun.display()),
                "check its permissions, or reinstall Open MPI".into(),
            );
            None
        }
    }
}

/// Launches `ranks` copies of this binary's `--version` on this machine. `local_only`: the run
/// will use only this machine (no hostfile), so more ranks than cores is oversubscription.
fn check_local_launch(
    mpirun: &Path,
    ranks: u32,
    as_root: bool,
    local_only: bool,
    timeout_s: u64,
    report: &mut Report,
) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if as_root && !root_allowed() {
        report.warn(
            "running as root",
            "Open MPI refuses to start as root unless allowed".into(),
            "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (or pass \
             --allow-run-as-root to mpirun); better, run as an ordinary user"
                .into(),
        );
    }
    if local_only && ranks as usize > cores {
        report.warn(
            "oversubscription",
            format!("{ranks} ranks on {cores} cores of this machine"),
            "mpirun refuses more ranks than slots: add --oversubscribe (fine for testing; for \
             speed, use more hosts or fewer ranks)"
                .into(),
        );
    }
    let Ok(exe) = std::env::current_exe() else {
        report.skip(
            "local launch",
            "cannot find this program's path to launch it".into(),
            None,
        );
        return;
    };
    let mut cmd = Command::new(mpirun);
    cmd.args(["-n", &ranks.to_string(), "--oversubscribe"])
        .arg(&exe)
        .arg("--version");
    if as_root {
        cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    }
    let probe = format!(
        "mpirun -n {ranks} --oversubscribe {} --version",
        exe.display()
    );
    let want = format!("distspmm {}", env!("CARGO_PKG_VERSION"));
    match run_with_timeout(cmd, Duration::from_secs(timeout_s)) {
        Outcome::Exited {
            success: true,
            stdout,
            ..
        } => {
            let answered = stdout.lines().filter(|l| l.trim() == want).count();
            if answered == ranks as usize {
                report.ok(
                    "local launch",
                    format!("`{probe}`: all {ranks} ranks started and answered `{want}`"),
                );
            } else {
                report.fail(
                    "local launch",
                    format!("`{probe}`: {answered} of {ranks} ranks answered `{want}`"),
                    "check that mpirun starts the program it is given (an mpirun alias or \
                     wrapper?)"
                        .into(),
                );
            }
        }
        Outcome::Exited { code, stderr, .. } => {
            let first = stderr
                .lines()
                .find(|l| !l.trim().is_empty() && !l.starts_with("---"))
                .unwrap_or("")
                .trim()
                .to_string();
            report.fail(
                "local launch",
                format!("`{probe}` exited with {code:?}: {first}"),
                "run the command above by hand and read Open MPI's message; typical causes: \
                 running as root without OMPI_ALLOW_RUN_AS_ROOT, no network interface usable \
                 by the TCP transport (try --mca btl self,vader), a broken installation"
                    .into(),
            );
        }
        Outcome::TimedOut => report.fail(
            "local launch",
            format!("`{probe}` did not finish in {timeout_s} s (killed)"),
            "mpirun hangs on this machine: check `mpirun -n 1 true`, the hostname resolution \
             (`getent hosts $(hostname)`) and firewall rules for loopback"
                .into(),
        ),
        Outcome::NotStarted(e) => report.fail(
            "local launch",
            format!("cannot start mpirun: {e}"),
            "check the MPI installation".into(),
        ),
    }
}

/// A host line of an Open MPI hostfile.
#[derive(Debug, PartialEq)]
struct Host {
    name: String,
    slots: Option<u32>,
    line: usize,
}

/// Parses an Open MPI hostfile: `host [slots=N] [max_slots=N]`, `#` comments.
fn parse_hostfile(text: &str) -> Result<Vec<Host>, String> {
    let mut hosts = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut fields = line.split_whitespace();
        let name = fields.next().unwrap_or_default().to_string();
        let mut slots = None;
        for field in fields {
            let (key, value) = field
                .split_once('=')
                .ok_or_else(|| format!("line {}: {field:?} is not key=value", i + 1))?;
            let number = || {
                value
                    .parse::<u32>()
                    .map_err(|_| format!("line {}: {key}={value:?} is not a number", i + 1))
            };
            match key {
                "slots" | "count" | "cpu" => slots = Some(number()?),
                "max_slots" | "max-slots" => {
                    number()?;
                }
                _ => return Err(format!("line {}: unknown attribute {key:?}", i + 1)),
            }
        }
        hosts.push(Host {
            name,
            slots,
            line: i + 1,
        });
    }
    if hosts.is_empty() {
        return Err("no hosts listed".into());
    }
    Ok(hosts)
}

fn is_local(name: &str) -> bool {
    let own = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    name == "localhost"
        || name == own.trim()
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Port of the remote shell Open MPI starts remote daemons with.
const SSH_PORT: u16 = 22;

/// Reads a hostfile: a regular file (a FIFO or a device is refused before a byte is read) of
/// at most [`MAX_HOSTFILE_BYTES`], as text.
fn read_hostfile(path: &Path) -> std::io::Result<String> {
    let file = chunk_format::open_regular(path)?;
    let mut bytes = Vec::new();
    file.take(MAX_HOSTFILE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_HOSTFILE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "it is larger than {} MiB, far more than a list of hosts",
                MAX_HOSTFILE_BYTES >> 20
            ),
        ));
    }
    String::from_utf8(bytes)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "it is not UTF-8 text"))
}

fn check_hosts(hostfile: &Path, ranks: u32, args: &Args, report: &mut Report) {
    let text = match read_hostfile(hostfile) {
        Ok(t) => t,
        Err(e) => {
            report.fail(
                "hostfile",
                format!("cannot read {}: {e}", hostfile.display()),
                "pass the hostfile you give mpirun --hostfile: a regular text file listing one \
                 host per line"
                    .into(),
            );
            return;
        }
    };
    let hosts = match parse_hostfile(&text) {
        Ok(h) => h,
        Err(e) => {
            report.fail(
                "hostfile",
                format!("{}: {e}", hostfile.display()),
                "one host per line: `name [slots=N]`; `#` starts a comment".into(),
            );
            return;
        }
    };
    let declared: Option<u32> = hosts.iter().map(|h| h.slots).sum();
    report.ok(
        "hostfile",
        format!(
            "{}: {} hosts{}",
            hostfile.display(),
            hosts.len(),
            declared.map_or(String::new(), |s| format!(", {s} slots"))
        ),
    );
    if let Some(slots) = declared.filter(|&s| s < ranks) {
        report.warn(
            "slots",
            format!("the hostfile offers {slots} slots for {ranks} ranks"),
            "add hosts or raise slots=, or pass --oversubscribe to mpirun".into(),
        );
    }
    let custom_agent = std::env::var("OMPI_MCA_plm_rsh_agent").ok();
    let timeout = Duration::from_secs(args.connect_timeout);
    for host in &hosts {
        let name = format!("host {}", host.name);
        if is_local(&host.name) {
            report.skip(&name, "this machine: no network check needed".into(), None);
            continue;
        }
        let addrs: Vec<SocketAddr> = match (host.name.as_str(), SSH_PORT).to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => {
                report.fail(
                    &name,
                    format!(
                        "{}:{}: cannot resolve {:?}: {e}",
                        hostfile.display(),
                        host.line,
                        host.name
                    ),
                    "fix the name, add it to /etc/hosts or DNS, or write its IP address in the \
                     hostfile"
                        .into(),
                );
                continue;
            }
        };
        let reached = addrs
            .iter()
            .find(|a| TcpStream::connect_timeout(a, timeout).is_ok());
        match (reached, &custom_agent) {
            (Some(a), _) => report.ok(&name, format!("resolves to {a}, port {SSH_PORT} answers")),
            (None, Some(agent)) => report.warn(
                &name,
                format!(
                    "resolves to {}, but port {SSH_PORT} does not answer within {} s",
                    addrs[0].ip(),
                    args.connect_timeout
                ),
                format!(
                    "remote ranks start through OMPI_MCA_plm_rsh_agent={agent:?}, not ssh: make \
                     sure it reaches this host"
                ),
            ),
            (None, None) => report.fail(
                &name,
                format!(
                    "resolves to {}, but port {SSH_PORT} (ssh) does not answer within {} s",
                    addrs[0].ip(),
                    args.connect_timeout
                ),
                "Open MPI starts remote ranks over ssh: check that the host is up, sshd runs, \
                 no firewall blocks port 22, and `ssh HOST true` works without a password"
                    .into(),
            ),
        }
    }
    let version = format!(
        "mpirun --hostfile {} -n {ranks} distspmm --version",
        hostfile.display()
    );
    report.skip(
        "same version everywhere",
        "needs a launch on every host; run the command in `fix`".into(),
        Some(format!(
            "`{version}` must print `distspmm {}` {ranks} times",
            env!("CARGO_PKG_VERSION")
        )),
    );
    if let Some(dir) = &args.chunks {
        report.skip(
            "chunks on every host",
            "needs a launch on every host; run the command in `fix`".into(),
            Some(format!(
                "`mpirun --hostfile {} -n {ranks} ls {}` must list the manifest on every host \
                 (a shared filesystem, or the same copy at the same path)",
                hostfile.display(),
                std::path::absolute(dir)
                    .unwrap_or_else(|_| dir.clone())
                    .join(chunk_format::dir::MANIFEST_FILE)
                    .display()
            )),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostfiles_parse_with_slots_and_comments() {
        let hosts =
            parse_hostfile("# cluster\nnode1 slots=4\n\n node2   max_slots=8 # x\n").unwrap();
        assert_eq!(
            hosts,
            vec![
                Host {
                    name: "node1".into(),
                    slots: Some(4),
                    line: 2
                },
                Host {
                    name: "node2".into(),
                    slots: None,
                    line: 4
                },
            ]
        );
        assert!(parse_hostfile("# nothing\n").is_err());
        let err = parse_hostfile("a slots=four\n").unwrap_err();
        assert!(err.contains("line 1") && err.contains("slots"), "{err}");
        assert!(parse_hostfile("a colour=red\n").is_err());
    }

    #[test]
    fn loopback_names_are_local() {
        assert!(is_local("localhost"));
        assert!(is_local("127.0.0.1"));
        assert!(is_local("::1"));
        assert!(!is_local("192.0.2.1"));
    }

    #[test]
    fn timeouts_kill_and_report() {
        let mut sleeper = Command::new("sleep");
        sleeper.arg("5");
        let started = Instant::now();
        assert!(matches!(
            run_with_timeout(sleeper, Duration::from_millis(200)),
            Outcome::TimedOut
        ));
        assert!(started.elapsed() < Duration::from_secs(4));
        let mut echo = Command::new("sh");
        echo.args(["-c", "echo out; echo err >&2; exit 3"]);
        match run_with_timeout(echo, Duration::from_secs(10)) {
            Outcome::Exited {
                success,
                code,
                stdout,
                stderr,
            } => {
                assert!(!success);
                assert_eq!(code, Some(3));
                assert_eq!((stdout.as_str(), stderr.as_str()), ("out\n", "err\n"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            run_with_timeout(Command::new("/nonexistent/program"), Duration::from_secs(1)),
            Outcome::NotStarted(_)
        ));
        // A timeout past the clock's range is no deadline, not a panic.
        assert!(matches!(
            run_with_timeout(Command::new("true"), Duration::MAX),
            Outcome::Exited { success: true, .. }
        ));
    }

    #[test]
    fn unreachable_and_unresolvable_hosts_fail_with_a_fix() {
        let tmp = tempfile::tempdir().unwrap();
        let hostfile = tmp.path().join("hosts");
        // 192.0.2.0/24 is TEST-NET-1 (never routed); `.invalid` never resolves (RFC 6761).
        std::fs::write(
            &hostfile,
            "localhost slots=1\n192.0.2.1 slots=1\nnode.invalid\n",
        )
        .unwrap();
        let args = Args {
            chunks: None,
            hostfile: Some(hostfile.clone()),
            ranks: Some(3),
            launch_timeout: 5,
            connect_timeout: 1,
            json: false,
        };
        let mut report = Report::default();
        check_hosts(&hostfile, 3, &args, &mut report);
        let status = |name: &str| {
            report
                .checks
                .iter()
                .find(|c| c.name == name)
                .unwrap_or_else(|| panic!("no check {name}"))
                .status
        };
        assert_eq!(status("hostfile"), Status::Ok);
        assert_eq!(status("host localhost"), Status::Skip);
        assert_ne!(status("host 192.0.2.1"), Status::Ok);
        assert_eq!(status("host node.invalid"), Status::Fail);
        assert_eq!(status("same version everywhere"), Status::Skip);
        // One host does not declare slots, so no total (and no slots warning) is claimed.
        assert!(report.checks.iter().all(|c| c.name != "slots"));
        let text = render(&report);
        assert!(text.contains("fix: "), "{text}");
        assert!(text.contains("mpirun --hostfile"), "{text}");
    }
}
