//! `distspmm doctor` on a good and on broken chunk directories, with a stand-in `mpirun` (a
//! shell script on `PATH`, so the MPI checks are deterministic: one that works, one that hangs,
//! none at all), and once with the real `mpirun` where it is installed.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs `distspmm` with `PATH` set to `path` (and nothing else changed).
fn distspmm_with_path(args: &[&str], path: Option<&Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_distspmm"));
    cmd.args(args);
    if let Some(path) = path {
        cmd.env("PATH", path);
    }
    cmd.output().expect("run distspmm")
}

fn ok(args: &[&str]) {
    let out = distspmm_with_path(args, None);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A 200-node CSBM graph in 2 parts under `root/chunks`.
fn partitioned(root: &Path) -> PathBuf {
    let graph = root.join("g.npz");
    let dir = root.join("chunks");
    ok(&[
        "generate",
        "csbm",
        "--nodes",
        "200",
        "--features",
        "4",
        "--out",
        s(&graph),
    ]);
    ok(&[
        "partition",
        "--input",
        s(&graph),
        "--parts",
        "2",
        "--out",
        s(&dir),
    ]);
    dir
}

/// A directory holding an executable `mpirun` with `body` (POSIX sh).
fn fake_mpirun(root: &Path, name: &str, body: &str) -> PathBuf {
    let bin = root.join(name);
    std::fs::create_dir_all(&bin).unwrap();
    let script = bin.join("mpirun");
    std::fs::write(&script, format!("#!/bin/sh\nPATH=/usr/bin:/bin\n{body}\n")).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

/// An Open MPI look-alike: `--version`, and `-n N --oversubscribe PROGRAM ARGS` runs PROGRAM
/// N times.
fn working_mpirun(root: &Path) -> PathBuf {
    fake_mpirun(
        root,
        "good-mpi",
        r#"if [ "$1" = --version ]; then echo "mpirun (Open MPI) 4.1.4"; exit 0; fi
n=$2; shift 3
i=0; while [ $i -lt $n ]; do "$@" || exit $?; i=$((i+1)); done"#,
    )
}

/// Runs `distspmm doctor ARGS --json` with `PATH=path`; returns (exit code, the JSON report).
fn doctor(args: &[&str], path: &Path) -> (i32, serde_json::Value) {
    let mut all = vec!["doctor"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = distspmm_with_path(&all, Some(path));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {stdout}\n{stderr}"));
    (out.status.code().expect("exited"), report)
}

/// The check called `name`: (status, detail, fix).
fn check(report: &serde_json::Value, name: &str) -> (String, String, String) {
    let c = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name:?} in {report}"));
    let text = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    (text("status"), text("detail"), text("fix"))
}

#[test]
fn a_good_directory_passes_every_check() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = partitioned(tmp.path());
    let bin = working_mpirun(tmp.path());
    let (code, report) = doctor(&["--chunks", s(&dir), "-n", "2"], &bin);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["ok"], true);
    assert_eq!(report["failed"], 0);
    for name in [
        "chunk directory",
        "manifest",
        "chunk files",
        "rank count",
        "chunk contents",
        "mpirun",
        "local launch",
    ] {
        assert_eq!(check(&report, name).0, "ok", "{name}: {report}");
    }
    let (_, launch, _) = check(&report, "local launch");
    assert!(launch.contains("all 2 ranks"), "{launch}");

    // The plain-text checklist says the same.
    let out = distspmm_with_path(&["doctor", "--chunks", s(&dir)], Some(&bin));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{text}");
    assert!(text.contains("[ ok ] chunk contents"), "{text}");
    assert!(text.contains("launch with `mpirun -n 2`"), "{text}");
}

#[test]
fn broken_directories_fail_with_the_file_and_a_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = partitioned(tmp.path());
    let bin = working_mpirun(tmp.path());
    let chunk = dir.join("part-00001.chunk");
    let original = std::fs::read(&chunk).unwrap();

    // A flipped byte inside a section.
    let mut bytes = original.clone();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x10;
    std::fs::write(&chunk, &bytes).unwrap();
    let (code, report) = doctor(&["--chunks", s(&dir)], &bin);
    assert_eq!(code, 1);
    assert_eq!(report["ok"], false);
    let (status, detail, fix) = check(&report, "chunk contents");
    assert_eq!(status, "fail");
    assert!(
        detail.contains("part-00001.chunk") && detail.contains("section"),
        "{detail}"
    );
    assert!(fix.contains("distspmm partition"), "{fix}");
    // The MPI checks still run: one report lists everything that is wrong.
    assert_eq!(check(&report, "local launch").0, "ok");
    std::fs::write(&chunk, &original).unwrap();

    // Rank count differs from the part count.
    let (code, report) = doctor(&["--chunks", s(&dir), "-n", "3"], &bin);
    assert_eq!(code, 1);
    let (status, detail, fix) = check(&report, "rank count");
    assert_eq!(status, "fail");
    assert!(
        detail.contains("3 ranks") && detail.contains("2 parts"),
        "{detail}"
    );
    assert!(fix.contains("mpirun -n 2"), "{fix}");

    // A stray chunk from an earlier run with more parts is a warning only.
    std::fs::copy(&chunk, dir.join("part-00002.chunk")).unwrap();
    let (code, report) = doctor(&["--chunks", s(&dir)], &bin);
    assert_eq!(code, 0, "{report}");
    let (status, detail, _) = check(&report, "chunk files");
    assert_eq!(status, "warn");
    assert!(detail.contains("part-00002.chunk"), "{detail}");
    std::fs::remove_file(dir.join("part-00002.chunk")).unwrap();

    // A missing chunk.
    std::fs::remove_file(&chunk).unwrap();
    let (code, report) = doctor(&["--chunks", s(&dir)], &bin);
    assert_eq!(code, 1);
    let (status, detail, _) = check(&report, "chunk files");
    assert_eq!(status, "fail");
    assert!(detail.contains("part-00001.chunk"), "{detail}");
    std::fs::write(&chunk, &original).unwrap();

    // A corrupted manifest.
    let manifest = dir.join("manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(
        &manifest,
        text.replacen("\"edge_cut\": ", "\"edge_cut\": 1", 1),
    )
    .unwrap();
    let (code, report) = doctor(&["--chunks", s(&dir)], &bin);
    assert_eq!(code, 1);
    let (status, detail, _) = check(&report, "manifest");
    assert_eq!(status, "fail");
    assert!(
        detail.contains("manifest.json") && detail.contains("checksum"),
        "{detail}"
    );

    // No directory at all.
    let (code, report) = doctor(&["--chunks", s(&tmp.path().join("nowhere"))], &bin);
    assert_eq!(code, 1);
    assert_eq!(check(&report, "chunk directory").0, "fail");
}

#[test]
fn a_missing_or_hanging_mpirun_fails_without_hanging_doctor() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = partitioned(tmp.path());

    let empty = tmp.path().join("empty-bin");
    std::fs::create_dir(&empty).unwrap();
    let (code, report) = doctor(&["--chunks", s(&dir)], &empty);
    assert_eq!(code, 1);
    let (status, _, fix) = check(&report, "mpirun");
    assert_eq!(status, "fail");
    assert!(fix.contains("Open MPI"), "{fix}");
    assert_eq!(check(&report, "chunk contents").0, "ok");

    let hanging = fake_mpirun(
        tmp.path(),
        "hanging-mpi",
        r#"if [ "$1" = --version ]; then echo "mpirun (Open MPI) 4.1.4"; exit 0; fi
exec sleep 30"#,
    );
    let started = std::time::Instant::now();
    let (code, report) = doctor(&["--chunks", s(&dir), "--launch-timeout", "1"], &hanging);
    assert!(
        started.elapsed().as_secs() < 20,
        "doctor waited for the hung mpirun"
    );
    assert_eq!(code, 1);
    let (status, detail, _) = check(&report, "local launch");
    assert_eq!(status, "fail");
    assert!(detail.contains("did not finish in 1 s"), "{detail}");

    let refusing = fake_mpirun(
        tmp.path(),
        "refusing-mpi",
        r#"if [ "$1" = --version ]; then echo "mpirun (Open MPI) 4.1.4"; exit 0; fi
echo "There are not enough slots available in the system" >&2; exit 1"#,
    );
    let (code, report) = doctor(&["--chunks", s(&dir)], &refusing);
    assert_eq!(code, 1);
    let (status, detail, _) = check(&report, "local launch");
    assert_eq!(status, "fail");
    assert!(detail.contains("not enough slots"), "{detail}");
}

#[test]
fn a_hostfile_of_this_machine_skips_network_checks_and_prints_the_remote_commands() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = partitioned(tmp.path());
    let bin = working_mpirun(tmp.path());
    let hosts = tmp.path().join("hosts");
    std::fs::write(
        &hosts,
        "# this machine twice\nlocalhost slots=1\n127.0.0.1 slots=1\n",
    )
    .unwrap();
    let (code, report) = doctor(&["--chunks", s(&dir), "--hostfile", s(&hosts)], &bin);
    assert_eq!(code, 0, "{report}");
    assert_eq!(check(&report, "hostfile").0, "ok");
    assert_eq!(check(&report, "host localhost").0, "skip");
    assert_eq!(check(&report, "host 127.0.0.1").0, "skip");
    let (status, _, fix) = check(&report, "same version everywhere");
    assert_eq!(status, "skip");
    assert!(
        fix.contains(&format!(
            "mpirun --hostfile {} -n 2 distspmm --version",
            s(&hosts)
        )),
        "{fix}"
    );

    std::fs::write(&hosts, "node1 slots=lots\n").unwrap();
    let (code, report) = doctor(&["--hostfile", s(&hosts)], &bin);
    assert_eq!(code, 1);
    let (status, detail, _) = check(&report, "hostfile");
    assert_eq!(status, "fail");
    assert!(detail.contains("line 1"), "{detail}");
}

#[test]
fn the_real_mpirun_launches_two_ranks() {
    let found = Command::new("mpirun")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "mpirun is required when CI=true"
        );
        eprintln!("skipping: mpirun not found");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = partitioned(tmp.path());
    let path = std::env::var_os("PATH").unwrap();
    let (code, report) = doctor(&["--chunks", s(&dir)], Path::new(&path));
    assert_eq!(code, 0, "{report}");
    let (status, detail, _) = check(&report, "local launch");
    assert_eq!(status, "ok", "{detail}");
    assert!(check(&report, "mpirun").1.contains("Open MPI"));
}
