//! Parsing `ptxas -v` resource reports (registers, stack, spills per kernel and architecture).
//!
//! `build.rs` includes this file too (`#[path]`), so it depends on nothing but `std`: the build
//! uses it to fail on any register spill, and the crate uses it to expose the report of the
//! kernels it embeds.

use std::fmt::Write as _;

/// Resources that ptxas reported for one kernel on one architecture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelResources {
    /// The kernel's (unmangled, `extern "C"`) name.
    pub kernel: String,
    /// The target, e.g. `sm_90`.
    pub arch: String,
    /// Registers per thread.
    pub registers: u32,
    /// Stack frame bytes per thread.
    pub stack_bytes: u32,
    /// Bytes spilled to local memory (stores).
    pub spill_store_bytes: u32,
    /// Bytes reloaded from local memory.
    pub spill_load_bytes: u32,
}

impl KernelResources {
    /// Whether ptxas spilled registers of this kernel to local memory.
    pub fn spills(&self) -> bool {
        self.spill_store_bytes != 0 || self.spill_load_bytes != 0
    }
}

/// Extracts the number that directly precedes `suffix` in `line` (`"12 bytes spill stores"`).
fn number_before(line: &str, suffix: &str) -> Option<u32> {
    let end = line.find(suffix)?;
    line[..end].split_whitespace().last()?.parse().ok()
}

/// Parses the stderr of `nvcc -Xptxas -v` into one entry per (kernel, architecture).
///
/// Fails when a kernel's block is incomplete (an entry line without its properties or register
/// lines), so that a changed ptxas output format cannot silently pass the spill check.
pub fn parse(log: &str) -> Result<Vec<KernelResources>, String> {
    /// The entry being read: kernel, arch, and (stack, spill stores, spill loads) once seen.
    struct Pending {
        kernel: String,
        arch: String,
        props: Option<(u32, u32, u32)>,
    }
    let mut out = Vec::new();
    let mut current: Option<Pending> = None;
    for (lineno, line) in log.lines().enumerate() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            if let Some(Pending { kernel, .. }) = &current {
                return Err(format!(
                    "line {}: entry `{kernel}` has no register count",
                    lineno + 1
                ));
            }
            let mut parts = rest.split('\'');
            let kernel = parts.next().unwrap_or_default().to_owned();
            let arch = parts.nth(1).unwrap_or_default().to_owned();
            if kernel.is_empty() || arch.is_empty() {
                return Err(format!(
                    "line {}: unreadable entry line `{line}`",
                    lineno + 1
                ));
            }
            current = Some(Pending {
                kernel,
                arch,
                props: None,
            });
        } else if line.contains("bytes stack frame") {
            let Some(Pending { props, .. }) = current.as_mut() else {
                continue;
            };
            let read = |suffix: &str| {
                number_before(line, suffix)
                    .ok_or_else(|| format!("line {}: no `{suffix}` count in `{line}`", lineno + 1))
            };
            *props = Some((
                read("bytes stack frame")?,
                read("bytes spill stores")?,
                read("bytes spill loads")?,
            ));
        } else if line.contains("Used ") && line.contains(" registers") {
            let Some(Pending {
                kernel,
                arch,
                props,
            }) = current.take()
            else {
                continue;
            };
            let (stack_bytes, spill_store_bytes, spill_load_bytes) = props.ok_or_else(|| {
                format!(
                    "line {}: entry `{kernel}` has no stack/spill line",
                    lineno + 1
                )
            })?;
            let registers = number_before(line, " registers").ok_or_else(|| {
                format!("line {}: unreadable register count `{line}`", lineno + 1)
            })?;
            out.push(KernelResources {
                kernel,
                arch,
                registers,
                stack_bytes,
                spill_store_bytes,
                spill_load_bytes,
            });
        }
    }
    if let Some(Pending { kernel, .. }) = current {
        return Err(format!(
            "entry `{kernel}` at the end of the log has no register count"
        ));
    }
    Ok(out)
}

/// Formats entries as a Markdown table sorted by kernel and architecture.
pub fn table(entries: &[KernelResources]) -> String {
    let mut sorted: Vec<&KernelResources> = entries.iter().collect();
    sorted.sort_by(|a, b| (&a.kernel, &a.arch).cmp(&(&b.kernel, &b.arch)));
    let mut s = String::from(
        "| kernel | arch | registers | stack bytes | spill stores | spill loads |\n|---|---|---:|---:|---:|---:|\n",
    );
    for e in sorted {
        // Writing to a String cannot fail.
        let _ = writeln!(
            s,
            "| `{}` | {} | {} | {} | {} | {} |",
            e.kernel, e.arch, e.registers, e.stack_bytes, e.spill_store_bytes, e.spill_load_bytes
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'dsp_a' for 'sm_80'
ptxas info    : Function properties for dsp_a
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers, 420 bytes cmem[0]
ptxas info    : Compile time = 22.910 ms
ptxas info    : Compiling entry function 'dsp_b' for 'sm_90'
ptxas info    : Function properties for dsp_b
    16 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 16 bytes cumulative stack size
";

    #[test]
    fn parses_registers_and_spills() {
        let got = parse(SAMPLE).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[0],
            KernelResources {
                kernel: "dsp_a".into(),
                arch: "sm_80".into(),
                registers: 40,
                stack_bytes: 0,
                spill_store_bytes: 0,
                spill_load_bytes: 0
            }
        );
        assert!(!got[0].spills());
        assert_eq!((got[1].registers, got[1].stack_bytes), (32, 16));
        assert_eq!((got[1].spill_store_bytes, got[1].spill_load_bytes), (12, 8));
        assert!(got[1].spills());
    }

    #[test]
    fn incomplete_entry_is_an_error() {
        let truncated = "ptxas info    : Compiling entry function 'k' for 'sm_90'\n";
        assert!(parse(truncated).unwrap_err().contains("`k`"));
        let no_props = "ptxas info    : Compiling entry function 'k' for 'sm_90'\nptxas info    : Used 8 registers\n";
        assert!(parse(no_props).unwrap_err().contains("stack/spill"));
    }

    #[test]
    fn table_lists_every_entry_sorted() {
        let t = table(&parse(SAMPLE).unwrap());
        let a = t.find("`dsp_a`").unwrap();
        let b = t.find("`dsp_b`").unwrap();
        assert!(a < b);
        assert!(t.contains("| `dsp_b` | sm_90 | 32 | 16 | 12 | 8 |"));
    }
}
