//! Shared by the C ABI's integration tests: where things are, the installed prefix
//! (`capi/install.sh`), test graphs and chunk directories, and running commands (mpirun
//! included) with a timeout so a hang fails.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use chunk_format::dir::WriteOptions;

use distspmm_prep::chunk::{write_chunk_dir, ChunkBuilder};
use distspmm_prep::graph::Graph;
use distspmm_prep::normalize::{self, Normalization};
use distspmm_prep::partition::{self, Adjacency, Method, MetisOptions};
use distspmm_prep::prep::{self, Build, PrepConfig};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("capi sits in the workspace")
        .to_path_buf()
}

fn in_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// Skips (returns `None` with a message) when something the test needs is missing, except in
/// CI (`CI=true`), where it fails.
pub fn require<T>(what: Option<T>, missing: &str) -> Option<T> {
    if what.is_none() {
        assert!(!in_ci(), "{missing}");
        eprintln!("skipping: {missing}");
    }
    what
}

/// A program on `PATH` (skips or fails as [`require`]).
pub fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    });
    require(
        found,
        &format!("`{name}` is not on PATH (see scripts/ensure-deps.sh)"),
    )
}

/// Cora (`../shared/datasets/cora.npz`), if present.
pub fn cora() -> Option<PathBuf> {
    let path = repo_root().join("../shared/datasets/cora.npz");
    require(
        path.is_file().then_some(path),
        "../shared/datasets/cora.npz is absent",
    )
}

/// The directory cargo built this test into (`target/<profile>`), which holds
/// `libdistspmm.so` and `libdistspmm.a`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// A scratch directory for this test binary, kept between runs (build trees are reused).
pub fn scratch() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let name = exe
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.rsplit_once('-').map(|(name, _)| name.to_owned()))
        .unwrap_or_else(|| "capi".into());
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("capi-{name}"));
    std::fs::create_dir_all(&dir).expect("create the scratch directory");
    dir
}

/// Makes sure `libdistspmm.so` and `libdistspmm.a` in [`profile_dir`] are current: the C tests
/// link them, and a test binary run on its own (or after `cargo test --test X` built only what
/// X needs) may find them stale or missing.
/// Runs cargo on the same target directory and profile (cargo releases the build lock
/// before it runs tests; nothing is rebuilt when they are current).
pub fn build_library() {
    let profile_dir = profile_dir();
    let target_dir = profile_dir.parent().expect("target/<profile>");
    // `cargo test` builds into target/debug with the `test` profile (and `--release` into
    // target/release with `release`): building with the same profile reuses its dependencies.
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "test".to_owned(),
        Some(name) => name.to_owned(),
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    // Under `scripts/asan-capi.sh` the tests are built with `--target <triple>` (so that the
    // sanitizer flags reach the library but not build scripts and proc macros): build the
    // library the same way, into the same target directory.
    let target_dir = match sanitizer_target() {
        Some(triple) => {
            command.args(["--config", &format!("build.target=\"{triple}\"")]);
            target_dir.parent().expect("target/<triple>/<profile>")
        }
        None => target_dir,
    };
    let out = run(
        command
            .current_dir(repo_root())
            // `--tests` keeps the dev-dependency feature set of the test build, so the
            // dependencies it compiled are reused rather than built a second time.
            .args([
                "build",
                "--quiet",
                "-p",
                "distspmm-capi",
                "--lib",
                "--tests",
                "--profile",
                &profile,
            ])
            .env("CARGO_TARGET_DIR", target_dir),
        Duration::from_secs(900),
    );
    assert_success("cargo build -p distspmm-capi --lib", &out);
}

/// The target triple the tests were built for under `scripts/asan-capi.sh`
/// (`DISTSPMM_SANITIZER_TARGET`); `None` in ordinary runs.
pub fn sanitizer_target() -> Option<String> {
    std::env::var("DISTSPMM_SANITIZER_TARGET")
        .ok()
        .filter(|t| !t.is_empty())
}

/// Extra flags for compiling the C and C++ test programs (`DISTSPMM_TEST_CFLAGS`, e.g.
/// `-fsanitize=address` so they carry the sanitizer runtime the instrumented library needs).
pub fn extra_cflags() -> Vec<String> {
    std::env::var("DISTSPMM_TEST_CFLAGS")
        .map(|f| f.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The library, header, pkg-config and CMake files installed by `capi/install.sh` into a
/// prefix under [`scratch`], once per test binary (after [`build_library`]).
pub fn prefix() -> &'static Path {
    static PREFIX: OnceLock<PathBuf> = OnceLock::new();
    PREFIX.get_or_init(|| {
        build_library();
        let prefix = scratch().join("prefix");
        let _ = std::fs::remove_dir_all(&prefix);
        let out = run(
            Command::new("bash")
                .arg(repo_root().join("capi/install.sh"))
                .arg("--prefix")
                .arg(&prefix)
                .arg("--from")
                .arg(profile_dir()),
            Duration::from_secs(60),
        );
        assert_success("capi/install.sh", &out);
        prefix
    })
}

/// Builds Â (GCN normalisation), partitions with METIS (seed 1) and writes a chunk directory
/// with the graph's edge weights: `distspmm partition --parts P --method metis` on `graph`
/// (`distspmm_prep::prep::run_graph`).
pub fn write_chunks(graph: &Graph, parts: u32, out: &Path) {
    let config = PrepConfig {
        method: Method::Metis(MetisOptions::default()),
        build: Build::InMemory,
        force: true,
        ..PrepConfig::new("the test graph", parts, out)
    };
    prep::run_graph(&config, graph.clone(), &|_| {}).expect("write chunks");
}

/// [`write_chunks`] without the edge weights (chunk format 1.0, as written before they were
/// recorded): the builder called directly, which `prep::run` never does without them.
pub fn write_chunks_without_edge_weights(graph: &Graph, parts: u32, out: &Path) {
    let a_hat = normalize::adjacency(
        graph.num_nodes,
        &graph.src,
        &graph.dst,
        graph.weights.as_deref(),
        Normalization::Gcn,
    )
    .expect("normalise");
    let adjacency =
        Adjacency::from_edges(graph.num_nodes, &graph.src, &graph.dst).expect("adjacency");
    let partition =
        partition::partition(&adjacency, parts, &Method::Metis(MetisOptions::default()))
            .expect("partition");
    let builder = ChunkBuilder::new(graph, a_hat.view(), &partition).expect("chunk builder");
    let options = WriteOptions {
        force: true,
        ..WriteOptions::default()
    };
    write_chunk_dir(out, &builder, &options).expect("write chunks");
}

/// A small labelled, featured graph (CSBM: 240 nodes, 4 classes, 6 features).
pub fn small_graph() -> Graph {
    distspmm_prep::graph::generate::csbm(&distspmm_prep::graph::generate::CsbmParams {
        nodes: 240,
        classes: 4,
        features: 6,
        avg_degree: 6.0,
        seed: 3,
        ..Default::default()
    })
    .expect("csbm")
}

/// Runs a command with a timeout; on timeout kills its whole process group (mpirun and its
/// ranks) and panics with what it printed (the workspace's `test_support::run`).
pub use test_support::run;

/// Panics with the output unless the command succeeded.
pub fn assert_success(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed ({})\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One `mpirun` at a time per test binary: oversubscribed ranks of parallel launches would
/// crowd two cores.
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `program args…` as `ranks` MPI processes (OpenMPI flags as in dist-comm's tests), with
/// `env` set, killed after `timeout`. Skips (`None`) without `mpirun` outside CI.
pub fn mpirun(
    ranks: usize,
    program: &Path,
    args: &[&std::ffi::OsStr],
    env: &[(&str, &std::ffi::OsStr)],
    timeout: Duration,
) -> Option<Output> {
    let mpirun = tool("mpirun")?;
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut command = Command::new(mpirun);
    command
        .args([
            "-n",
            &ranks.to_string(),
            "--oversubscribe",
            "--mca",
            "btl",
            "self,vader",
        ])
        .arg(program)
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        // Oversubscribed ranks must not spin while they wait, and one kernel thread per rank
        // is all two cores hold: otherwise a run is several times slower on a busy machine.
        .env("OMPI_MCA_mpi_yield_when_idle", "1")
        .env("RAYON_NUM_THREADS", "1");
    for (k, v) in env {
        command.env(k, v);
    }
    Some(run(&mut command, timeout))
}

/// The repository's `.venv/bin/python` if `import {modules}` works there with `env` (timed and
/// printed: it is the CI cost of heavy frameworks); skips or fails as [`require`].
pub fn venv_python(
    modules: &str,
    env: &[(&str, std::ffi::OsString)],
    timeout: Duration,
) -> Option<PathBuf> {
    let python = repo_root().join(".venv/bin/python");
    let python = require(
        python.is_file().then_some(python),
        ".venv/bin/python is missing (DISTSPMM_PY_EXTRAS=1 scripts/ensure-deps.sh)",
    )?;
    let started = Instant::now();
    let out = run(
        Command::new(&python)
            .args(["-c", &format!("import {modules}")])
            .envs(env.iter().map(|(k, v)| (k, v))),
        timeout,
    );
    let python = require(
        out.status.success().then_some(python),
        &format!(
            "`import {modules}` fails in .venv (DISTSPMM_PY_EXTRAS=1 scripts/ensure-deps.sh):\n{}",
            String::from_utf8_lossy(&out.stderr)
        ),
    )?;
    eprintln!("import {modules}: {:.1} s", started.elapsed().as_secs_f64());
    Some(python)
}

/// A random directed, weighted graph with features, labels and a split: RMAT's undirected
/// edges kept in one direction, so Ahat is not symmetric and a transposition mistake shows.
pub fn directed_graph() -> Graph {
    use distspmm_prep::graph::generate;
    let mut graph = generate::rmat(8, 6, 11).expect("rmat");
    let (src, dst): (Vec<u32>, Vec<u32>) = graph
        .src
        .iter()
        .zip(&graph.dst)
        .filter(|(s, d)| s < d)
        .map(|(&s, &d)| (s, d))
        .unzip();
    graph.weights = Some(
        (0..src.len())
            .map(|i| 0.5 + (i * 37 % 11) as f32 / 10.0)
            .collect(),
    );
    graph.src = src;
    graph.dst = dst;
    generate::random_node_data(&mut graph, 6, 4, 5).expect("node data");
    graph
}

/// Panics unless the command succeeded and exactly `ranks` lines of its stdout end in `: ok`
/// (the check scripts' one line per rank); prints stdout.
pub fn assert_every_rank_ok(what: &str, out: &Output, ranks: usize) {
    assert_success(what, out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{what}:\n{stdout}");
    assert_eq!(
        stdout.lines().filter(|l| l.ends_with(": ok")).count(),
        ranks,
        "{what}: every rank must report ok:\n{stdout}"
    );
}

/// The value of the last `test_acc=` on stdout (the trainers' and examples' final line).
pub fn test_accuracy(stdout: &str) -> f64 {
    let value = stdout
        .lines()
        .filter_map(|l| l.split("test_acc=").nth(1))
        .next_back()
        .unwrap_or_else(|| panic!("no test_acc= line in:\n{stdout}"));
    value
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("unparsable test_acc in:\n{stdout}"))
}

/// Runs a Python check script on [`directed_graph`] partitioned for P = 1 (without `mpirun`,
/// then with it) and P = 2: `python script_args… --chunks DIR --graph NPZ` with `env`, under
/// `scratch()/name`; every rank must report ok ([`assert_every_rank_ok`]).
pub fn check_on_directed_graph(
    name: &str,
    python: &Path,
    script_args: &[std::ffi::OsString],
    env: &[(&str, std::ffi::OsString)],
    timeout: Duration,
) {
    use std::ffi::{OsStr, OsString};
    let dir = scratch().join(name);
    std::fs::create_dir_all(&dir).expect("create the scratch directory");
    let npz = dir.join("graph.npz");
    let _ = std::fs::remove_file(&npz);
    distspmm_prep::graph::npz::write_npz(&npz, &directed_graph()).expect("write .npz");
    let graph = distspmm_prep::graph::load(&npz).expect("read .npz");
    let script = script_args
        .first()
        .map(|s| Path::new(s).file_name().unwrap_or(s.as_os_str()))
        .unwrap_or(OsStr::new("python"))
        .to_string_lossy()
        .into_owned();
    let env_refs: Vec<(&str, &OsStr)> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    for parts in [1usize, 2] {
        let chunks = dir.join(format!("chunks-{parts}"));
        write_chunks(&graph, u32::try_from(parts).unwrap(), &chunks);
        let mut args: Vec<OsString> = script_args.to_vec();
        args.extend([
            "--chunks".into(),
            chunks.into_os_string(),
            "--graph".into(),
            npz.clone().into_os_string(),
        ]);
        if parts == 1 {
            // Without mpirun: the library's communicator starts a one-rank MPI itself.
            let out = run(
                Command::new(python)
                    .args(&args)
                    .envs(env.iter().map(|(k, v)| (k, v))),
                timeout,
            );
            assert_every_rank_ok(&format!("python {script} (no mpirun)"), &out, 1);
        }
        let args: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
        let Some(out) = mpirun(parts, python, &args, &env_refs, timeout) else {
            return;
        };
        assert_every_rank_ok(&format!("mpirun -n {parts} {script}"), &out, parts);
    }
}
