//! Hostile output paths (issue 24): `partition` must only create, replace or remove the files a
//! chunk directory is made of (user files in `--out` are refused and left alone, stale work
//! directories lose only the tool's own files, a `kill -9` leaves the previous directory), a
//! symbolic link or `nd/.` as `--out` is written through, and the one atomic write never
//! replaces anything but a regular file (`plan --svg` onto a FIFO, a device, a directory;
//! `--checkpoint` naming a file). Every failure is exit status 1 with a plain message.

mod launch;

use std::collections::BTreeMap;
use std::os::unix::fs::{symlink, FileTypeExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use launch::{csbm, error_of, ok, run_one, s, BIN};

/// The stderr of a run that must succeed.
fn stderr_of_success(out: &Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{what} failed: {stderr}");
    stderr
}

/// `partition --input GRAPH --parts P --method contiguous --out OUT EXTRA…`.
fn partition(graph: &Path, parts: usize, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "partition",
        "--input",
        s(graph),
        "--method",
        "contiguous",
        "--out",
        s(out),
    ];
    let parts = parts.to_string();
    args.extend(["--parts", &parts]);
    args.extend(extra);
    run_one(&args)
}

/// Every entry under `dir` (recursively, not following links) with its contents ("<dir>" for a
/// directory, "-> target" for a link).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut all = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let kind = std::fs::symlink_metadata(&path).unwrap().file_type();
            let contents = if kind.is_symlink() {
                format!("-> {}", std::fs::read_link(&path).unwrap().display()).into_bytes()
            } else if kind.is_dir() {
                todo.push(path.clone());
                b"<dir>".to_vec()
            } else {
                std::fs::read(&path).unwrap()
            };
            all.insert(path.strip_prefix(dir).unwrap().to_path_buf(), contents);
        }
    }
    all
}

/// The names in `dir` that contain `part`.
fn names_with(dir: &Path, part: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains(part))
        .collect();
    names.sort();
    names
}

fn is_symlink(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

#[test]
fn user_files_in_out_are_refused_and_left_exactly_as_they_were() {
    let tmp = tempfile::tempdir().unwrap();
    let graph = csbm(tmp.path(), "g.npz", 300, 4, 1);
    let out = tmp.path().join("photos");
    std::fs::create_dir(&out).unwrap();
    for i in 0..20 {
        std::fs::write(out.join(format!("img-{i:02}.jpg")), format!("picture {i}")).unwrap();
    }
    std::fs::create_dir(out.join("album")).unwrap();
    std::fs::write(out.join("album/cover.jpg"), b"cover").unwrap();
    let before = snapshot(&out);
    for extra in [
        &[][..],
        &["--force"][..],
        &["--build", "bounded", "--force"][..],
    ] {
        let stderr = error_of(&partition(&graph, 2, &out, extra), "partition into photos");
        assert!(
            stderr
                .contains("album (and 20 more entries), which `distspmm partition` did not write")
                && stderr.contains("give a new or empty directory as --out"),
            "{extra:?}: {stderr}"
        );
        assert_eq!(
            snapshot(&out),
            before,
            "{extra:?}: the user's files changed"
        );
        assert_eq!(names_with(tmp.path(), "staging"), Vec::<String>::new());
        assert_eq!(names_with(tmp.path(), "buckets"), Vec::<String>::new());
    }
}

#[test]
fn force_replaces_a_previous_chunk_directory_but_never_a_foreign_file() {
    let tmp = tempfile::tempdir().unwrap();
    let graph = csbm(tmp.path(), "g.npz", 300, 4, 1);
    let out = tmp.path().join("chunks");
    stderr_of_success(&partition(&graph, 2, &out, &[]), "the first partition");
    // Files beside the directory are never the writer's business.
    std::fs::write(tmp.path().join("notes.txt"), b"beside").unwrap();
    std::fs::write(out.join("README"), b"inside").unwrap();
    let before = snapshot(&out);
    let stderr = error_of(
        &partition(&graph, 3, &out, &["--force"]),
        "--force over a user file",
    );
    assert!(
        stderr.contains("README, which `distspmm partition` did not write"),
        "{stderr}"
    );
    assert_eq!(snapshot(&out), before);
    std::fs::remove_file(out.join("README")).unwrap();
    stderr_of_success(&partition(&graph, 3, &out, &["--force"]), "--force");
    let inspected = ok(&["inspect", s(&out)]);
    assert!(
        inspected.contains("valid chunk directory: 3 parts"),
        "{inspected}"
    );
    assert_eq!(
        std::fs::read(tmp.path().join("notes.txt")).unwrap(),
        b"beside"
    );
    assert_eq!(names_with(tmp.path(), "staging"), Vec::<String>::new());
}

#[test]
fn stale_work_directories_lose_only_the_files_the_tool_wrote() {
    let tmp = tempfile::tempdir().unwrap();
    let graph = csbm(tmp.path(), "g.npz", 300, 4, 1);
    let out = tmp.path().join("chunks");
    // What killed runs left beside --out, plus a user's files that ended up inside.
    let staging = tmp.path().join(".chunks.staging-4000000");
    std::fs::create_dir(&staging).unwrap();
    for name in [
        "part-00000.chunk",
        "partition.map",
        "manifest.json.tmp-4000000-3",
    ] {
        std::fs::write(staging.join(name), b"ours").unwrap();
    }
    std::fs::write(staging.join("thesis.pdf"), b"yours").unwrap();
    std::fs::create_dir(staging.join("data")).unwrap();
    std::fs::write(staging.join("data/x.npy"), b"yours").unwrap();
    let buckets = tmp.path().join(".chunks.buckets-4000000");
    std::fs::create_dir(&buckets).unwrap();
    for name in ["bucket-00000", "rows-00001", "edges-src.u32"] {
        std::fs::write(buckets.join(name), b"ours").unwrap();
    }
    std::fs::write(buckets.join("keep.txt"), b"yours").unwrap();
    let clean = tmp.path().join(".chunks.staging-4000001");
    std::fs::create_dir(&clean).unwrap();
    std::fs::write(clean.join("part-00001.chunk"), b"ours").unwrap();

    let out_run = partition(&graph, 2, &out, &["--build", "bounded"]);
    let stderr = stderr_of_success(&out_run, "partition");
    assert_eq!(
        snapshot(&staging).into_keys().collect::<Vec<_>>(),
        [
            PathBuf::from("data"),
            PathBuf::from("data/x.npy"),
            PathBuf::from("thesis.pdf")
        ]
    );
    assert_eq!(std::fs::read(staging.join("thesis.pdf")).unwrap(), b"yours");
    assert_eq!(
        snapshot(&buckets).into_keys().collect::<Vec<_>>(),
        [PathBuf::from("keep.txt")]
    );
    assert!(!clean.exists(), "a stale directory of our own files stays");
    assert!(
        stderr.contains(&format!(
            "{} holds 2 entries that distspmm did not write",
            staging.display()
        )) && stderr.contains("left as it is"),
        "{stderr}"
    );
    ok(&["inspect", s(&out)]);
}

#[test]
fn kill_9_during_a_partition_leaves_the_previous_directory_intact() {
    let tmp = tempfile::tempdir().unwrap();
    // Large enough that writing the chunks (each fsynced) takes a while.
    let graph = csbm(tmp.path(), "g.npz", 60_000, 64, 1);
    let mut hits = 0;
    for attempt in 0..6 {
        let name = format!("chunks{attempt}");
        let out = tmp.path().join(&name);
        stderr_of_success(&partition(&graph, 2, &out, &[]), "the previous partition");
        let before = snapshot(&out);
        let mut child = Command::new(BIN)
            .args(["partition", "--input", s(&graph), "--method", "random"])
            .args(["--parts", "8", "--force", "--out", s(&out)])
            .env("RAYON_NUM_THREADS", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let staging = tmp.path().join(format!(".{name}.staging-{}", child.id()));
        let seen = launch::wait_for(Duration::from_secs(120), Duration::from_millis(1), || {
            staging.exists() || child.try_wait().unwrap().is_some()
        });
        launch::kill9(child.id());
        let status = child.wait().unwrap();
        assert!(
            seen,
            "attempt {attempt}: the partition neither staged nor ended"
        );
        if status.code().is_some() || snapshot(&out) != before {
            // It finished, or was killed after the exchange: the new directory is whole.
            ok(&["inspect", s(&out)]);
            continue;
        }
        hits += 1;
        // Killed while staging: the previous directory, byte for byte.
        assert_eq!(snapshot(&out), before, "attempt {attempt}");
        ok(&["inspect", s(&out)]);
        // The next run removes what the killed one staged and replaces the directory; a file
        // someone saved into the leftover staging directory meanwhile is not the tool's to
        // delete.
        let stray = staging.join("saved-here.txt");
        std::fs::write(&stray, b"yours").unwrap();
        let stderr = stderr_of_success(
            &partition(&graph, 3, &out, &["--force"]),
            "the next partition",
        );
        assert!(
            stderr.contains(&format!(
                "{} holds 1 entry that distspmm did not write",
                staging.display()
            )),
            "{stderr}"
        );
        assert_eq!(
            snapshot(&staging).into_keys().collect::<Vec<_>>(),
            [PathBuf::from("saved-here.txt")]
        );
        std::fs::remove_dir_all(&staging).unwrap();
        assert!(ok(&["inspect", s(&out)]).contains("valid chunk directory: 3 parts"));
        if hits == 2 {
            break;
        }
    }
    assert!(
        hits > 0,
        "no kill landed while the chunks were being staged"
    );
}

#[test]
fn a_symlinked_out_is_written_through_and_stays_a_link() {
    let tmp = tempfile::tempdir().unwrap();
    let graph = csbm(tmp.path(), "g.npz", 300, 4, 1);
    // The target on another file system where there is one (/dev/shm), else beside.
    let shm = Path::new("/dev/shm");
    let elsewhere = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let target = elsewhere.path().join("real");
    std::fs::create_dir(&target).unwrap();
    let link = tmp.path().join("chunks");
    symlink(&target, &link).unwrap();
    for parts in [2, 3] {
        stderr_of_success(
            &partition(&graph, parts, &link, &["--force"]),
            "partition through the link",
        );
        assert!(is_symlink(&link), "the link was replaced");
        assert_eq!(std::fs::read_link(&link).unwrap(), target);
        assert!(target.join("manifest.json").is_file());
        assert!(target
            .join(format!("part-{:05}.chunk", parts - 1))
            .is_file());
        ok(&["inspect", s(&link)]);
        assert_eq!(names_with(tmp.path(), "staging"), Vec::<String>::new());
        assert_eq!(
            names_with(elsewhere.path(), "staging"),
            Vec::<String>::new()
        );
        // The lock sits beside the directory written.
        assert!(elsewhere.path().join(".real.lock").exists());
    }
    // A dangling link and a link to a file are refused, and stay.
    let dangling = tmp.path().join("dangling");
    symlink(tmp.path().join("absent"), &dangling).unwrap();
    let stderr = error_of(&partition(&graph, 2, &dangling, &[]), "a dangling --out");
    assert!(stderr.contains("which does not exist"), "{stderr}");
    assert!(is_symlink(&dangling) && !tmp.path().join("absent").exists());
    let to_file = tmp.path().join("to-file");
    symlink(&graph, &to_file).unwrap();
    let stderr = error_of(
        &partition(&graph, 2, &to_file, &[]),
        "a --out link to a file",
    );
    assert!(stderr.contains("which is not a directory"), "{stderr}");
    assert!(is_symlink(&to_file));
}

#[test]
fn out_with_a_trailing_dot_or_slash_names_the_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let graph = csbm(tmp.path(), "g.npz", 300, 4, 1);
    let dotted = format!("{}/nd/.", tmp.path().display());
    let slashed = format!("{}/nd/", tmp.path().display());
    for (out, parts) in [(&dotted, 2), (&dotted, 3), (&slashed, 2)] {
        stderr_of_success(
            &partition(&graph, parts, Path::new(out), &["--force"]),
            &format!("--out {out}"),
        );
        assert!(
            ok(&["inspect", out]).contains(&format!("valid chunk directory: {parts} parts")),
            "{out}"
        );
    }
    assert_eq!(names_with(tmp.path(), "staging"), Vec::<String>::new());
    assert_eq!(names_with(tmp.path(), "lock"), [".nd.lock"]);
}

#[test]
fn plan_svg_never_replaces_a_fifo_a_device_or_a_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let graph = csbm(tmp.path(), "g.npz", 300, 4, 1);
    let chunks = tmp.path().join("chunks");
    stderr_of_success(&partition(&graph, 2, &chunks, &[]), "partition");
    let plan = |svg: &Path| run_one(&["plan", "--chunks", s(&chunks), "--svg", s(svg)]);

    let fifo = tmp.path().join("heat.svg");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let stderr = error_of(&plan(&fifo), "--svg FIFO");
    assert!(
        stderr.contains(&format!(
            "{}: it is a FIFO (named pipe), not a regular file",
            fifo.display()
        )),
        "{stderr}"
    );
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());

    let null = tmp.path().join("null.svg");
    symlink("/dev/null", &null).unwrap();
    let stderr = error_of(&plan(&null), "--svg link to /dev/null");
    assert!(stderr.contains("/dev/null, which is a device"), "{stderr}");
    assert!(is_symlink(&null));
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());

    // A device node of our own, where this test may make one (root with CAP_MKNOD).
    let node = tmp.path().join("node.svg");
    let made = Command::new("mknod")
        .args([s(&node), "c", "1", "3"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|st| st.success());
    if made {
        let stderr = error_of(&plan(&node), "--svg device node");
        assert!(
            stderr.contains("it is a device, not a regular file"),
            "{stderr}"
        );
        assert!(std::fs::symlink_metadata(&node)
            .unwrap()
            .file_type()
            .is_char_device());
    }

    let dir = tmp.path().join("figures");
    std::fs::create_dir(&dir).unwrap();
    let stderr = error_of(&plan(&dir), "--svg DIR");
    assert!(
        stderr.contains(&format!("{}: it is a directory", dir.display()))
            && !stderr.contains(".tmp-"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    let stderr = error_of(&plan(Path::new("/tmp")), "--svg /tmp");
    assert!(
        stderr.contains("/tmp: it is a directory") && !stderr.contains(".tmp-"),
        "{stderr}"
    );
}

#[test]
fn checkpoint_naming_a_file_is_a_plain_error() {
    let tmp = tempfile::tempdir().unwrap();
    let graph = csbm(tmp.path(), "g.npz", 300, 4, 1);
    let chunks = tmp.path().join("chunks");
    stderr_of_success(&partition(&graph, 1, &chunks, &[]), "partition");
    let file = tmp.path().join("ckpt");
    std::fs::write(&file, b"mine").unwrap();
    let stderr = error_of(
        &run_one(&[
            "train",
            "--chunks",
            s(&chunks),
            "--epochs",
            "1",
            "--checkpoint",
            s(&file),
        ]),
        "--checkpoint FILE",
    );
    assert!(
        stderr.contains("is a regular file, not a directory") && !stderr.contains("os error"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"mine");
}
