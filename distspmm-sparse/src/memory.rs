//! Memory that a size taken from an input or an option would need, checked before it is
//! allocated: against the memory this process can still get (`MemAvailable`, the cgroup's
//! limit when there is one, and the address-space and data limits `ulimit -v`/`ulimit -d` set),
//! and through fallible allocation (`try_reserve_exact`), so that a
//! tiny file declaring two billion nodes, or an option asking for a ten-million-column matrix, is
//! an error that names the cause instead of an abort ("memory allocation of N bytes failed").

use std::string::String;
use std::vec::Vec;

/// A size from an input or an option needs more memory than there is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} needs {} but {}: {hint}",
    human_bytes(*bytes),
    match available {
        Some(a) => std::format!("only {} of memory is available", human_bytes(*a)),
        None => String::from("the allocation failed"),
    }
)]
pub struct MemoryError {
    /// What the memory is for, in the user's terms ("a graph of 2000000000 nodes").
    pub what: String,
    /// Bytes needed (saturating at `u64::MAX`).
    pub bytes: u64,
    /// Bytes available, when known.
    pub available: Option<u64>,
    /// What to do about it.
    pub hint: &'static str,
}

/// `bytes` in binary units ("1023 B", "1.50 KiB", "3.00 GiB"), as messages and `distspmm plan`
/// print sizes.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        std::format!("{bytes} B")
    } else {
        std::format!("{value:.2} {}", UNITS[unit])
    }
}

/// Memory this process can still allocate: `MemAvailable` of `/proc/meminfo`, capped by the
/// cgroup v2 limit (`memory.max` − `memory.current`) when one is set, and by the process's own
/// limits: `RLIMIT_AS` less the address space it already has (`VmSize`), and `RLIMIT_DATA` less
/// its data segment (`VmData`), as batch schedulers set them through `ulimit -v`. `None` where
/// none of these can be read (then only the allocations themselves can fail).
pub fn available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let system = meminfo
        .as_deref()
        .and_then(|text| kib_field(text, "MemAvailable:"));
    let cgroup = (|| {
        let read = |name: &str| std::fs::read_to_string(std::format!("/sys/fs/cgroup/{name}")).ok();
        let max = read("memory.max")?.trim().parse::<u64>().ok()?;
        let current = read("memory.current")?.trim().parse::<u64>().ok()?;
        Some(max.saturating_sub(current))
    })();
    [system, cgroup, process_limit()]
        .into_iter()
        .flatten()
        .min()
}

/// What the process's resource limits leave: the smaller of `RLIMIT_AS` − `VmSize` and
/// `RLIMIT_DATA` − `VmData` (`/proc/self/status`), `None` when neither limit is set.
fn process_limit() -> Option<u64> {
    // The soft limit of a resource in bytes, `None` when unlimited (or unreadable).
    let soft_limit = |resource| {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `getrlimit` writes one `rlimit` through the pointer, which points to a live,
        // writable `rlimit` of this frame.
        let status = unsafe { libc::getrlimit(resource, &raw mut limit) };
        (status == 0 && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
    };
    let address_space = soft_limit(libc::RLIMIT_AS);
    let data = soft_limit(libc::RLIMIT_DATA);
    if address_space.is_none() && data.is_none() {
        return None;
    }
    let status = std::fs::read_to_string("/proc/self/status").ok();
    let used = |field: &str| {
        status
            .as_deref()
            .and_then(|text| kib_field(text, field))
            .unwrap_or(0)
    };
    let left = |limit: Option<u64>, field: &str| limit.map(|l| l.saturating_sub(used(field)));
    [left(address_space, "VmSize:"), left(data, "VmData:")]
        .into_iter()
        .flatten()
        .min()
}

/// The value of a `NAME:   1234 kB` line of a `/proc` file, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .map(|kb| kb.saturating_mul(1024))
}

/// Checks that `bytes` (for `what`) fit in the [`available`] memory.
pub fn check(what: impl Into<String>, bytes: u64, hint: &'static str) -> Result<(), MemoryError> {
    check_against(what, bytes, available(), hint)
}

/// [`check`] against a given amount of available memory (`None`: unknown, always fine).
pub fn check_against(
    what: impl Into<String>,
    bytes: u64,
    available: Option<u64>,
    hint: &'static str,
) -> Result<(), MemoryError> {
    match available {
        Some(a) if bytes > a => Err(MemoryError {
            what: what.into(),
            bytes,
            available: Some(a),
            hint,
        }),
        _ => Ok(()),
    }
}

/// `count` elements of `T` in bytes, saturating.
pub fn bytes_of<T>(count: u64) -> u64 {
    count.saturating_mul(size_of::<T>() as u64)
}

/// A vector of `len` copies of `value`, allocated fallibly: an allocation the system refuses is
/// a [`MemoryError`] for `what`, not an abort.
pub fn try_filled<T: Clone>(
    len: usize,
    value: T,
    what: impl Into<String>,
    hint: &'static str,
) -> Result<Vec<T>, MemoryError> {
    let mut v = try_with_capacity(len, what, hint)?;
    v.resize(len, value);
    Ok(v)
}

/// An empty vector with room for `len` elements, allocated fallibly (see [`try_filled`]).
pub fn try_with_capacity<T>(
    len: usize,
    what: impl Into<String>,
    hint: &'static str,
) -> Result<Vec<T>, MemoryError> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| MemoryError {
        what: what.into(),
        bytes: bytes_of::<T>(len as u64),
        available: None,
        hint,
    })?;
    Ok(v)
}

/// Makes room in `v` for `additional` more elements, growing it geometrically as `push` would,
/// but checked against the [`available`] memory and fallibly: for arrays that grow with an
/// input whose size is not known in advance (an edge list, a compressed file). `what` names
/// the memory in an error.
pub fn try_grow<T>(
    v: &mut Vec<T>,
    additional: usize,
    what: impl FnOnce() -> String,
    hint: &'static str,
) -> Result<(), MemoryError> {
    if v.capacity() - v.len() >= additional {
        return Ok(());
    }
    let needed = v.len().saturating_add(additional);
    let target = needed.max(v.capacity().saturating_mul(2)).max(64);
    // Growing copies the old elements into the new allocation: both are held for a moment.
    let bytes = bytes_of::<T>((target as u64).saturating_add(v.capacity() as u64));
    let available = available();
    let failed = |available| MemoryError {
        what: what(),
        bytes,
        available,
        hint,
    };
    if available.is_some_and(|a| bytes > a) {
        return Err(failed(available));
    }
    v.try_reserve_exact(target - v.len())
        .map_err(|_| failed(None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::ToString;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(3 << 30), "3.00 GiB");
        assert_eq!(human_bytes(u64::MAX), "16.00 EiB");
    }

    #[test]
    fn a_check_names_the_cause_and_the_fix() {
        let err = check_against(
            "a graph of 2000000000 nodes",
            1 << 40,
            Some(1 << 30),
            "fix it",
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "a graph of 2000000000 nodes needs 1.00 TiB but only 1.00 GiB of memory is \
             available: fix it"
        );
        check_against("small", 10, Some(1 << 30), "").unwrap();
        check_against("unknown", u64::MAX, None, "").unwrap();
        assert!(
            available().is_some_and(|a| a > 0),
            "Linux reports MemAvailable"
        );
    }

    #[test]
    fn growth_is_checked_and_fallible() {
        let mut v: Vec<u32> = Vec::new();
        try_grow(&mut v, 10, || "ids".into(), "").unwrap();
        assert!(v.capacity() >= 10);
        v.extend([1, 2, 3]);
        let err = try_grow(&mut v, usize::MAX / 8, || "ids".into(), "fix").unwrap_err();
        assert!(err.to_string().starts_with("ids needs"), "{err}");
        assert_eq!(v, [1, 2, 3], "a failed growth keeps the contents");
        assert_eq!(
            kib_field("VmSize:\t  2048 kB\nVmData: 4 kB\n", "VmData:"),
            Some(4096)
        );
        assert_eq!(kib_field("VmSize: 1\n", "VmSize:"), None);
    }

    #[test]
    fn impossible_allocations_are_errors() {
        let err = try_filled(usize::MAX / 2, 0u64, "a huge table", "use less").unwrap_err();
        assert!(err.to_string().starts_with("a huge table needs"), "{err}");
        assert_eq!(try_filled(3, 7u8, "x", "").unwrap(), [7, 7, 7]);
    }
}
