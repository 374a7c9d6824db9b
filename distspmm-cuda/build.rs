//! The only place nvcc runs. With the feature `cuda`, compiles every `kernels/*.cu` (the SpMM
//! kernels `spmm.cu`, the row gather/scatter and message conversion kernels `rows.cu`, the
//! per-edge kernels `sddmm.cu`, the edge softmax `edge_softmax.cu`, the training kernels
//! `train.cu`) into one fatbin each (SASS
//! sm_80 and sm_90, PTX compute_90) in OUT_DIR for `include_bytes!`, captures the `ptxas -v`
//! report of all of them, and fails the build on any register spill. Without the feature it does
//! nothing, so default builds need no CUDA.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

#[allow(dead_code)]
#[path = "src/ptxas.rs"]
mod ptxas;

/// Kernel sources under `kernels/`, by stem; each becomes `<stem>.fatbin` in OUT_DIR.
const SOURCES: [&str; 5] = ["spmm", "rows", "sddmm", "edge_softmax", "train"];
/// SASS for Ampere and Hopper, plus Hopper PTX for anything newer.
const GENCODES: [&str; 3] = [
    "arch=compute_80,code=sm_80",
    "arch=compute_90,code=sm_90",
    "arch=compute_90,code=compute_90",
];
/// Architectures whose ptxas report must be present and spill-free.
const CHECKED_ARCHS: [&str; 2] = ["sm_80", "sm_90"];
/// The CUDA version of the device machines' driver (580): PTX from a newer nvcc is refused.
const DRIVER_CUDA: (u32, u32) = (13, 0);

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/ptxas.rs");
    if env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    println!("cargo:rerun-if-changed=kernels");
    for var in ["NVCC", "CUDA_HOME", "CUDA_PATH", "NVCC_CCBIN"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    if let Err(message) = build() {
        eprintln!("error: distspmm-cuda (feature `cuda`): {message}");
        std::process::exit(1);
    }
}

fn build() -> Result<(), String> {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let out = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);
    check_sources_listed(&manifest.join("kernels"))?;
    let nvcc = find_nvcc().ok_or(
        "nvcc not found: set NVCC or CUDA_HOME, put nvcc on PATH, or `pip install \
         nvidia-cuda-nvcc==13.0.*` (distspmm-cuda/ci-check.sh does this)",
    )?;
    let version = nvcc_version(&nvcc)?;
    fs::write(out.join("nvcc-version.txt"), &version).map_err(|e| e.to_string())?;
    if let Some((major, minor)) = release(&version) {
        if (major, minor) > DRIVER_CUDA {
            println!(
                "cargo:warning=nvcc {major}.{minor} is newer than CUDA {}.{} (driver 580): its compute_90 PTX \
                 cannot be JIT-compiled there; the sm_80/sm_90 SASS still runs. Pin nvidia-cuda-nvcc==13.0.*",
                DRIVER_CUDA.0, DRIVER_CUDA.1
            );
        }
    }

    let mut log = String::new();
    for stem in SOURCES {
        let src = manifest.join("kernels").join(format!("{stem}.cu"));
        let fatbin = out.join(format!("{stem}.fatbin"));
        let mut cmd = Command::new(&nvcc);
        cmd.args(["-fatbin", "-O3", "-lineinfo", "-std=c++17", "-Xptxas", "-v"]);
        for g in GENCODES {
            cmd.arg("-gencode").arg(g);
        }
        if let Some(ccbin) = env::var_os("NVCC_CCBIN") {
            cmd.arg("-ccbin").arg(ccbin);
        }
        cmd.arg("-o").arg(&fatbin).arg(&src);
        let output = cmd
            .output()
            .map_err(|e| format!("running {}: {e}", nvcc.display()))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        if !output.status.success() {
            return Err(format!(
                "{} failed on {}:\n{text}",
                nvcc.display(),
                src.display()
            ));
        }
        log.push_str(&text);
    }
    fs::write(out.join("ptxas.log"), &log).map_err(|e| e.to_string())?;

    let entries = ptxas::parse(&log).map_err(|e| format!("unreadable ptxas -v output: {e}"))?;
    fs::write(out.join("ptxas-report.md"), ptxas::table(&entries)).map_err(|e| e.to_string())?;
    for arch in CHECKED_ARCHS {
        if !entries.iter().any(|e| e.arch == arch) {
            return Err(format!("ptxas reported no kernel for {arch}"));
        }
    }
    let spills: Vec<String> = entries
        .iter()
        .filter(|e| e.spills())
        .map(|e| {
            format!(
                "{} ({}): {} registers, {} bytes spill stores, {} bytes spill loads",
                e.kernel, e.arch, e.registers, e.spill_store_bytes, e.spill_load_bytes
            )
        })
        .collect();
    if !spills.is_empty() {
        return Err(format!(
            "register spills in the CUDA kernels:\n  {}",
            spills.join("\n  ")
        ));
    }
    Ok(())
}

/// Every `.cu` file under `kernels/` must be compiled; a new one must be added to SOURCES.
fn check_sources_listed(dir: &Path) -> Result<(), String> {
    let entries = fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().is_some_and(|x| x == "cu") {
            let stem = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default();
            if !SOURCES.contains(&stem) {
                return Err(format!(
                    "{} is not listed in build.rs SOURCES",
                    path.display()
                ));
            }
        }
    }
    Ok(())
}

/// nvcc from `NVCC`, `CUDA_HOME`/`CUDA_PATH`, `PATH`, or the `nvidia-cuda-nvcc` PyPI wheel.
fn find_nvcc() -> Option<PathBuf> {
    if let Some(p) = env::var_os("NVCC")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
    {
        return Some(p);
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(p) = env::var_os(var)
            .map(|h| Path::new(&h).join("bin").join("nvcc"))
            .filter(|p| p.is_file())
        {
            return Some(p);
        }
    }
    if let Some(p) = env::var_os("PATH").and_then(|path| {
        env::split_paths(&path)
            .map(|d| d.join("nvcc"))
            .find(|p| p.is_file())
    }) {
        return Some(p);
    }
    // The wheel installs into the `nvidia` namespace package: nvidia/cu13/bin/nvcc (CUDA 13)
    // or nvidia/cuda_nvcc/bin/nvcc (CUDA 12).
    let script = "import nvidia\nfor p in nvidia.__path__: print(p)";
    for python in ["python3", "python"] {
        let Ok(out) = Command::new(python).args(["-c", script]).output() else {
            continue;
        };
        if !out.status.success() {
            continue;
        }
        for dir in String::from_utf8_lossy(&out.stdout).lines() {
            for sub in ["cu13/bin/nvcc", "cuda_nvcc/bin/nvcc"] {
                let p = Path::new(dir.trim()).join(sub);
                if p.is_file() {
                    return Some(p);
                }
            }
        }
    }
    None
}

fn nvcc_version(nvcc: &Path) -> Result<String, String> {
    let out = Command::new(nvcc)
        .arg("--version")
        .output()
        .map_err(|e| format!("running {}: {e}", nvcc.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.contains("release"))
        .map(|l| l.trim().to_owned())
        .ok_or_else(|| {
            format!(
                "{} --version printed no release line:\n{text}",
                nvcc.display()
            )
        })
}

/// (major, minor) from "Cuda compilation tools, release 13.0, V13.0.88".
fn release(version: &str) -> Option<(u32, u32)> {
    let rel = version.split("release ").nth(1)?.split(',').next()?;
    let (major, minor) = rel.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}
