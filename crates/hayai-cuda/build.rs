//! Compiles `kernels/*.cu` into one fatbin (SASS for sm_80/86/89/90 plus compute_80 PTX) that the
//! crate embeds with `include_bytes!`. nvcc is looked up in `HAYAI_NVCC`, then in the workspace's
//! `.venv` (made by `scripts/setup-cuda.sh`), then on `PATH`. `HAYAI_NO_CUDA=1` builds without
//! kernels (CPU-only binary). `HAYAI_CUDA_PTX_ONLY=1` embeds only the compute_80 PTX, which the
//! driver compiles for whatever GPU runs it: on an H200 the kernels then take their sm_80-89
//! code paths (no bulk copies, no PDL), the ones the A10G runs — a check of those paths on the
//! GPU we have (`scripts/gpu-session.sh`, stage `ptx`). `HAYAI_CUDA_DEFINES` adds `-D` switches
//! for measurement builds (kernels' experimental options, off by default).

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const ARCHS: &[&str] = &["sm_80", "sm_86", "sm_89", "sm_90"];
const PTX_ARCH: &str = "compute_80";

fn main() {
    println!("cargo::rustc-check-cfg=cfg(hayai_no_cuda)");
    println!("cargo::rerun-if-env-changed=HAYAI_NVCC");
    println!("cargo::rerun-if-env-changed=HAYAI_NO_CUDA");
    println!("cargo::rerun-if-env-changed=HAYAI_CUDA_PTX_ONLY");
    println!("cargo::rerun-if-env-changed=HAYAI_CUDA_DEFINES");
    println!("cargo::rerun-if-changed=kernels");
    println!("cargo::rerun-if-changed=build.rs");

    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let fatbin = out.join("hayai_kernels.fatbin");

    let mut sources: Vec<PathBuf> = fs::read_dir(manifest.join("kernels"))
        .expect("kernels/ directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    sources.sort();
    for s in &sources {
        println!("cargo::rerun-if-changed={}", s.display());
    }

    if env::var("HAYAI_NO_CUDA").is_ok_and(|v| v == "1") {
        println!("cargo::rustc-cfg=hayai_no_cuda");
        fs::write(&fatbin, []).unwrap();
        println!("cargo::rustc-env=HAYAI_CUDA_ARCHS=");
        println!("cargo::rustc-env=HAYAI_CUDA_KERNELS=0");
        println!("cargo::rustc-env=HAYAI_CUDA_DEFINES_BUILT=");
        println!("cargo::rustc-env=HAYAI_STREAM_WARPS={DEFAULT_STREAM_WARPS}");
        return;
    }

    let nvcc = find_nvcc(&manifest).unwrap_or_else(|| {
        panic!(
            "\n\nhayai-cuda: nvcc (CUDA 13.0) not found.\n  Run `scripts/setup-cuda.sh` (installs it into ./.venv), or set HAYAI_NVCC=/path/to/nvcc,\n  or build a CPU-only binary with HAYAI_NO_CUDA=1.\n\n"
        )
    });

    // One translation unit including every kernel file, so the fatbin is a single module.
    let mut unit = String::new();
    let mut kernels = 0usize;
    for s in &sources {
        unit.push_str(&format!("#include \"{}\"\n", s.display()));
        let text = fs::read_to_string(s).unwrap();
        kernels += text.matches("__global__").count();
    }
    let unit_path = out.join("hayai_kernels.cu");
    fs::write(&unit_path, unit).unwrap();

    let mut cmd = Command::new(&nvcc);
    cmd.arg("-fatbin")
        .arg("-O3")
        .arg("-std=c++17")
        .arg("--threads")
        .arg("0")
        .arg("-I")
        .arg(manifest.join("kernels"));
    // Measurement builds: extra `-D` switches of the kernels (e.g. `-DSS_PRE_CST=1`), off by
    // default; a binary built so is for A/B runs only.
    let defines = env::var("HAYAI_CUDA_DEFINES").unwrap_or_default();
    for d in defines.split_whitespace() {
        cmd.arg(d);
    }
    // The host asks for what some switches build (`-DSS_NW=N`: the streamed step's warps).
    println!(
        "cargo::rustc-env=HAYAI_CUDA_DEFINES_BUILT={}",
        defines.split_whitespace().collect::<Vec<_>>().join(" ")
    );
    // The streamed step's consumer warps (`-DSS_NW=N`, a measurement build), which the host's
    // layout and launch must match (runner/launch.rs `STREAM_WARPS`).
    let warps = stream_warps(&defines);
    println!("cargo::rustc-env=HAYAI_STREAM_WARPS={warps}");
    let ptx_only = env::var("HAYAI_CUDA_PTX_ONLY").is_ok_and(|v| v == "1");
    let sass: &[&str] = if ptx_only { &[] } else { ARCHS };
    for a in sass {
        let num = &a[3..];
        cmd.arg(format!("-gencode=arch=compute_{num},code={a}"));
    }
    cmd.arg(format!("-gencode=arch={PTX_ARCH},code={PTX_ARCH}"));
    cmd.arg("-o").arg(&fatbin).arg(&unit_path);
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("hayai-cuda: running {}: {e}", nvcc.display()));
    if !status.success() {
        panic!("hayai-cuda: nvcc failed ({status}) compiling kernels/*.cu");
    }
    let mut archs: Vec<String> = sass.iter().map(|s| s.to_string()).collect();
    archs.push(PTX_ARCH.to_string());
    println!("cargo::rustc-env=HAYAI_CUDA_ARCHS={}", archs.join(","));
    println!("cargo::rustc-env=HAYAI_CUDA_KERNELS={kernels}");
}

/// kernels/stream_step.cu `SS_NW` without a define.
const DEFAULT_STREAM_WARPS: usize = 11;

/// `SS_NW` as the defines set it: 3-31 consumer warps (threads 32-79 stage the next record and
/// share before a wait; with the producer warp a block is at most 1,024 threads, and the
/// producer polls one done word per consumer warp with its 32 lanes).
fn stream_warps(defines: &str) -> usize {
    let mut warps = DEFAULT_STREAM_WARPS;
    for d in defines.split_whitespace() {
        if let Some(v) = d.strip_prefix("-DSS_NW=") {
            warps = match v.parse::<usize>() {
                Ok(n) if (3..=31).contains(&n) => n,
                _ => panic!("hayai-cuda: HAYAI_CUDA_DEFINES: {d}: SS_NW must be 3-31"),
            };
        }
    }
    warps
}

fn find_nvcc(manifest: &Path) -> Option<PathBuf> {
    if let Some(p) = env::var("HAYAI_NVCC").ok().filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    let root = manifest.parent()?.parent()?;
    let lib = root.join(".venv").join("lib");
    if let Ok(entries) = fs::read_dir(&lib) {
        let mut dirs: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        dirs.sort();
        for d in dirs {
            let p = d.join("site-packages/nvidia/cu13/bin/nvcc");
            if p.is_file() {
                return Some(p);
            }
        }
    }
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|d| d.join("nvcc"))
        .find(|p| p.is_file())
}
