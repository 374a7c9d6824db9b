//! Memory that a size taken from an input or an option would need, checked before it is
//! allocated: against the memory this process can still get (`MemAvailable`, and the cgroup's
//! limit when there is one), and through fallible allocation (`try_reserve_exact`), so that a
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
/// cgroup v2 limit (`memory.max` − `memory.current`) when one is set. `None` where neither can
/// be read (then only the allocations themselves can fail).
pub fn available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let system = meminfo.as_deref().and_then(|text| {
        text.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .and_then(|kb| kb.trim().parse::<u64>().ok())
            .map(|kb| kb.saturating_mul(1024))
    });
    let cgroup = (|| {
        let read = |name: &str| std::fs::read_to_string(std::format!("/sys/fs/cgroup/{name}")).ok();
        let max = read("memory.max")?.trim().parse::<u64>().ok()?;
        let current = read("memory.current")?.trim().parse::<u64>().ok()?;
        Some(max.saturating_sub(current))
    })();
    match (system, cgroup) {
        (Some(s), Some(c)) => Some(s.min(c)),
        (s, c) => s.or(c),
    }
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
    fn impossible_allocations_are_errors() {
        let err = try_filled(usize::MAX / 2, 0u64, "a huge table", "use less").unwrap_err();
        assert!(err.to_string().starts_with("a huge table needs"), "{err}");
        assert_eq!(try_filled(3, 7u8, "x", "").unwrap(), [7, 7, 7]);
    }
}
