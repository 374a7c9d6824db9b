//! Checks that need no GPU: setup agreement on machines without a device, the NCCL library
//! loader (missing file, a library without NCCL's entry points, the real library when one is
//! installed), the pure helpers. The GPU paths are checked by `nccl-selftest`.

use proptest::prelude::*;

use super::ffi::{decode_version, NcclLibrary};
use super::*;
use crate::LocalComm;

/// Whether a CUDA device is usable here (then the no-device tests do not apply).
fn has_device() -> bool {
    matches!(probe::device_count(), Ok(n) if n > 0)
}

#[test]
fn setup_without_a_device_fails_on_every_rank_without_hanging() {
    if has_device() {
        println!("skipping: a CUDA device is present (nccl-selftest checks the GPU path)");
        return;
    }
    for p in 1..=3 {
        let results = LocalComm::run(p, |comm| {
            NcclComm::new(&comm, DeviceSelect::LocalRank).map(|c| c.rank())
        });
        for (rank, r) in results.into_iter().enumerate() {
            match r {
                Err(CommError::NoDevice(msg)) => assert!(!msg.is_empty(), "rank {rank}"),
                other => panic!("P={p} rank {rank}: expected NoDevice, got {other:?}"),
            }
        }
    }
}

#[test]
fn joining_by_id_without_a_device_is_an_error() {
    if has_device() {
        println!("skipping: a CUDA device is present (nccl-selftest checks the GPU path)");
        return;
    }
    let id = NcclUniqueId::from_bytes([7; NcclUniqueId::BYTES]);
    assert!(matches!(
        NcclComm::from_unique_id(&id, 0, 1, 0),
        Err(CommError::NoDevice(_))
    ));
    assert!(matches!(
        NcclComm::from_unique_id(&id, 2, 2, 0),
        Err(CommError::InvalidRank {
            what: "rank",
            rank: 2,
            size: 2
        })
    ));
}

#[test]
fn a_missing_library_file_is_named_in_the_error() {
    let missing = std::env::temp_dir().join("distspmm-no-such-dir/libnccl.so.2");
    let missing = missing.to_str().unwrap();
    let err = NcclLibrary::open(missing).unwrap_err();
    assert!(err.contains(missing), "{err}");
}

/// Builds a shared library from C source with `cc`; `None` without a C compiler.
fn build_shared(dir: &std::path::Path, name: &str, source: &str) -> Option<std::path::PathBuf> {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let lib = dir.join(name);
    let built = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status();
    built.is_ok_and(|s| s.success()).then_some(lib)
}

#[test]
fn a_library_without_the_entry_points_is_an_error_naming_the_first_missing() {
    let dir = tempfile::tempdir().unwrap();
    // Has ncclGetVersion, lacks ncclGetUniqueId (the next one resolved).
    let Some(lib) = build_shared(
        dir.path(),
        "libnccl.so.2",
        "int ncclGetVersion(int *v) { *v = 22803; return 0; }\n",
    ) else {
        println!("skipping: no C compiler to build a stub libnccl");
        return;
    };
    let err = NcclLibrary::open(lib.to_str().unwrap()).unwrap_err();
    assert!(err.contains("ncclGetUniqueId"), "{err}");
    assert!(!err.contains("ncclGetVersion"), "{err}");
}

/// libnccl.so.2 of the `nvidia-nccl-*` wheel visible to `python3`, with the wheel's version.
fn installed_wheel() -> Option<(String, String)> {
    let script = "import glob, os, nvidia\n\
        for base in nvidia.__path__:\n\
        \x20   lib = os.path.join(base, 'nccl', 'lib', 'libnccl.so.2')\n\
        \x20   meta = glob.glob(os.path.join(os.path.dirname(base), 'nvidia_nccl_cu*.dist-info'))\n\
        \x20   if os.path.isfile(lib) and meta:\n\
        \x20       print(lib)\n\
        \x20       print(os.path.basename(meta[0])[:-len('.dist-info')].split('-')[1])\n\
        \x20       break\n";
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let mut lines = text.lines();
    Some((lines.next()?.to_owned(), lines.next()?.to_owned()))
}

#[test]
fn the_installed_library_reports_the_version_of_its_wheel() {
    let Some((file, wheel_version)) = installed_wheel() else {
        println!("skipping: no nvidia-nccl wheel visible to python3");
        return;
    };
    let lib = NcclLibrary::open(&file).unwrap_or_else(|e| panic!("{e}"));
    let (major, minor, patch) = decode_version(lib.version().unwrap());
    assert_eq!(format!("{major}.{minor}.{patch}"), wheel_version, "{file}");
    // An unknown code still yields a message, and failures carry the call's name.
    let err = lib
        .check(5, "ncclCommInitRank", std::ptr::null_mut())
        .unwrap_err();
    match err {
        CommError::Nccl {
            call,
            code,
            message,
        } => {
            assert_eq!((call, code), ("ncclCommInitRank", 5));
            assert!(!message.is_empty());
        }
        other => panic!("{other:?}"),
    }
    assert!(lib.check(0, "ncclGroupEnd", std::ptr::null_mut()).is_ok());
}

#[test]
fn version_codes_decode_in_both_schemes() {
    // NCCL_VERSION_CODE: major*1000+minor*100+patch before 2.9, major*10000+minor*100+patch after.
    for (major, minor, patch) in [(2, 4, 8), (2, 8, 4)] {
        assert_eq!(
            decode_version(major * 1000 + minor * 100 + patch),
            (major, minor, patch)
        );
    }
    for (major, minor, patch) in [(2, 9, 6), (2, 28, 3), (2, 32, 13)] {
        assert_eq!(
            decode_version(major * 10000 + minor * 100 + patch),
            (major, minor, patch)
        );
    }
}

#[test]
fn unique_ids_round_trip_through_bytes() {
    let bytes: [u8; NcclUniqueId::BYTES] =
        std::array::from_fn(|i| u8::try_from(i * 37 % 256).unwrap());
    let id = NcclUniqueId::from_bytes(bytes);
    assert_eq!(id.as_bytes(), &bytes);
    let raw = id.raw();
    assert!(raw.internal.iter().zip(bytes).all(|(&c, b)| c as u8 == b));
    assert_eq!(format!("{id:?}"), "NcclUniqueId(..)");
}

#[test]
fn a_missing_driver_is_no_device() {
    let e: CommError = NoDevice("no libcuda".into()).into();
    assert_eq!(e, CommError::NoDevice("no libcuda".into()));
}

#[test]
fn the_duplicate_gpu_refusal_gets_the_way_out() {
    let refused = CommError::Nccl {
        call: "ncclCommInitRank",
        code: 5,
        message:
            "invalid usage (Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000)"
                .into(),
    };
    let CommError::Nccl { message, .. } = duplicate_gpu_hint(refused) else {
        panic!("variant changed");
    };
    assert!(message.contains("NCCL_HOSTID"), "{message}");
    let other = CommError::Nccl {
        call: "ncclSend",
        code: 2,
        message: "unhandled system error".into(),
    };
    assert_eq!(duplicate_gpu_hint(other.clone()), other);
}

#[test]
fn halo_peers_outside_the_group_are_rejected() {
    assert!(check_peers([0, 1, 2].into_iter(), [2, 0].into_iter(), 3).is_ok());
    assert_eq!(
        check_peers([0, 3].into_iter(), [].into_iter(), 3),
        Err(CommError::InvalidRank {
            what: "destination",
            rank: 3,
            size: 3
        })
    );
    assert_eq!(
        check_peers([].into_iter(), [1, 5].into_iter(), 3),
        Err(CommError::InvalidRank {
            what: "source",
            rank: 5,
            size: 3
        })
    );
}

#[test]
fn the_host_hash_follows_nccl_hostid() {
    // Only the hash function is checked here: the environment is process-wide.
    assert_ne!(fnv1a(b"node-a"), fnv1a(b"node-b"));
    assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(host_hash(), host_hash());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn local_rank_counts_the_lower_ranks_of_the_same_host(
        hosts in proptest::collection::vec(0u64..4, 1..12),
    ) {
        let all: Vec<u64> = hosts.iter().flat_map(|&h| [1, h, 2]).collect();
        for rank in 0..hosts.len() {
            let expected = hosts[..rank].iter().filter(|&&h| h == hosts[rank]).count();
            prop_assert_eq!(local_rank(&all, rank), expected);
        }
        // Ranks of one host get distinct local ranks 0, 1, 2, …
        for h in 0..4 {
            let locals: Vec<usize> = (0..hosts.len())
                .filter(|&r| hosts[r] == h)
                .map(|r| local_rank(&all, r))
                .collect();
            prop_assert_eq!(locals, (0..hosts.iter().filter(|&&x| x == h).count()).collect::<Vec<_>>());
        }
    }

    #[test]
    fn first_failed_is_the_lowest_false(flags in proptest::collection::vec(any::<bool>(), 0..16)) {
        let expected = flags.iter().position(|&ok| !ok);
        prop_assert_eq!(first_failed(flags.iter().copied()), expected);
    }
}

/// The capabilities generic code asks for hold for the NCCL communicator as for the host
/// backends (a compile-time check: constructing one needs a GPU).
#[test]
fn the_nccl_communicator_has_the_host_capabilities() {
    fn agree<C: crate::Group + AllGather + crate::AllReduce + Broadcast>() {}
    agree::<NcclComm>();
    agree::<NcclHost<'_>>();
    agree::<LocalComm>();
}
