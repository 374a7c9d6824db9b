//! `distspmm partition` is `distspmm_prep::prep::run` plus its bars and summary: on the same
//! input and options, the command and the library call write byte-identical chunks and partition
//! maps, and manifests that differ only in the command line that made them (and so in their
//! checksum). Cora and a generated graph, in memory and bounded, METIS and KaMinPar on one
//! thread (its result repeats only then).
//!
//! One test: METIS's random state is process-wide, so no other METIS run of this binary may
//! interleave with the library's.

mod launch;

use std::path::Path;

use chunk_format::dir::{chunk_file_name, MANIFEST_FILE, PARTITION_MAP_FILE};
use distspmm_prep::partition::{KaminparOptions, Method, MetisOptions};
use distspmm_prep::prep::{self, Build, PrepConfig};
use launch::{cora, csbm, one_json, s, succeeds};

/// A run of both on `input` at `parts` parts: the command with `flags`, the library with
/// `method` and `build`.
struct Case<'a> {
    input: &'a Path,
    parts: u32,
    flags: &'a [&'a str],
    method: Method,
    build: Build,
}

/// `manifest.json` without what describes the run rather than its output.
fn manifest_without_run(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join(MANIFEST_FILE)).unwrap();
    let mut manifest: serde_json::Value = serde_json::from_str(&text).unwrap();
    let fields = manifest.as_object_mut().unwrap();
    for run in ["command_line", "checksum"] {
        assert!(fields.remove(run).is_some(), "the manifest has no {run}");
    }
    manifest
}

fn same_output(tmp: &Path, name: &str, case: &Case<'_>) {
    let (cli, lib) = (
        tmp.join(format!("{name}-cli")),
        tmp.join(format!("{name}-lib")),
    );
    let parts = case.parts.to_string();
    let mut args = vec![
        "partition",
        "--input",
        s(case.input),
        "--parts",
        &parts,
        "--out",
        s(&cli),
        "--build",
        match case.build {
            Build::Auto => "auto",
            Build::InMemory => "in-memory",
            Build::Bounded => "bounded",
        },
        "--json",
    ];
    args.extend_from_slice(case.flags);
    let summary = one_json(&succeeds(&args));
    let config = PrepConfig {
        method: case.method,
        build: case.build,
        ..PrepConfig::new(case.input, case.parts, &lib)
    };
    let report = prep::run(&config, &|_| {}).unwrap();
    assert_eq!(summary["build"], report.build.name(), "{name}");
    assert_eq!(
        summary["method"], report.manifest.partition_method,
        "{name}"
    );
    let files = (0..case.parts)
        .map(chunk_file_name)
        .chain([PARTITION_MAP_FILE.to_owned()]);
    for file in files {
        let (a, b) = (
            std::fs::read(cli.join(&file)).unwrap(),
            std::fs::read(lib.join(&file)).unwrap(),
        );
        assert!(
            a == b,
            "{name}: {file} differs between the command and the library"
        );
    }
    assert_eq!(
        manifest_without_run(&cli),
        manifest_without_run(&lib),
        "{name}: the manifests differ"
    );
}

#[test]
fn the_command_and_the_library_write_the_same_chunks() {
    let tmp = tempfile::tempdir().unwrap();
    let generated = csbm(tmp.path(), "csbm.npz", 2_000, 8, 4);
    let metis = Method::Metis(MetisOptions::default());
    let kaminpar = Method::Kaminpar(KaminparOptions {
        threads: 1,
        ..KaminparOptions::default()
    });
    let mut cases = vec![
        (
            "generated-metis-bounded",
            Case {
                input: &generated,
                parts: 4,
                flags: &["--method", "metis"],
                method: metis,
                build: Build::Bounded,
            },
        ),
        (
            "generated-kaminpar-in-memory",
            Case {
                input: &generated,
                parts: 3,
                flags: &["--method", "kaminpar", "--threads", "1"],
                method: kaminpar,
                build: Build::InMemory,
            },
        ),
    ];
    let cora = cora();
    if let Some(cora) = &cora {
        cases.extend([
            (
                "cora-metis-in-memory",
                Case {
                    input: cora,
                    parts: 4,
                    flags: &["--method", "metis"],
                    method: metis,
                    build: Build::InMemory,
                },
            ),
            (
                "cora-kaminpar-bounded",
                Case {
                    input: cora,
                    parts: 2,
                    flags: &["--method", "kaminpar", "--threads", "1"],
                    method: kaminpar,
                    build: Build::Bounded,
                },
            ),
        ]);
    }
    for (name, case) in &cases {
        same_output(tmp.path(), name, case);
    }
}
