//! CUDA backend of hayai: kernels compiled at build time into one embedded fatbin, the decode
//! step captured once as a CUDA graph and replayed per token.
//!
//! The driver is loaded dynamically, so a binary built with kernels still runs where no GPU or
//! driver exists: [`probe`] then returns `None` and callers fall back to the CPU backend.

pub mod bench;
pub mod check;
mod device;
pub mod quant;
mod runner;
pub mod step_streams;
pub mod stream_layout;
pub mod synth;

pub use bench::{bench_engine, BenchOptions, BenchReport, KernelTime};
pub use quant::{quantize_model_int4, round_model_bf16};
pub use runner::OpTime;
pub use runner::{
    check_supported, load_runner, CudaOptions, CudaRunner, LmHead, Quant, StreamedStep,
    PREFILL_CHUNK,
};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CudaError {
    #[error("this binary was built without CUDA kernels (HAYAI_NO_CUDA=1)")]
    NotBuilt,
    #[error("no usable CUDA device: {0}")]
    NoDevice(String),
    #[error("CUDA driver error: {0}")]
    Driver(String),
    #[error("unsupported on the GPU backend: {0}")]
    Unsupported(String),
    #[error(transparent)]
    Model(#[from] hayai_model::ModelError),
}

impl From<CudaError> for hayai_model::ModelError {
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::Model(m) => m,
            other => hayai_model::ModelError::Backend(other.to_string()),
        }
    }
}

/// Facts fixed when the binary was built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildInfo {
    /// Targets in the embedded fatbin (`sm_80`, ..., `compute_80` for PTX); empty when none.
    pub cuda_archs: Vec<&'static str>,
    /// Number of kernels compiled into the fatbin.
    pub cuda_kernels: usize,
    /// Bytes of the embedded fatbin.
    pub fatbin_bytes: usize,
}

pub fn build_info() -> BuildInfo {
    let archs = env!("HAYAI_CUDA_ARCHS");
    BuildInfo {
        cuda_archs: archs.split(',').filter(|s| !s.is_empty()).collect(),
        cuda_kernels: env!("HAYAI_CUDA_KERNELS").parse().unwrap_or(0),
        fatbin_bytes: device::FATBIN.len(),
    }
}

/// A GPU found at run time.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub total_mem_bytes: usize,
    pub sm_count: i32,
    /// CUDA version the driver supports, e.g. 13000 for 13.0.
    pub driver_version: i32,
}

/// The first CUDA device, or `None` when there is no driver, no device, or the driver fails.
/// Never panics.
pub fn probe() -> Option<GpuInfo> {
    probe_ordinal(0)
}

pub fn probe_ordinal(ordinal: usize) -> Option<GpuInfo> {
    std::panic::catch_unwind(|| probe_inner(ordinal))
        .ok()
        .flatten()
}

fn probe_inner(ordinal: usize) -> Option<GpuInfo> {
    use cudarc::driver::{result, sys};
    if !unsafe { sys::is_culib_present() } {
        return None;
    }
    result::init().ok()?;
    let n = result::device::get_count().ok()?;
    if ordinal as i32 >= n {
        return None;
    }
    let dev = result::device::get(ordinal as i32).ok()?;
    let name = result::device::get_name(dev).ok()?;
    let attr = |a| unsafe { result::device::get_attribute(dev, a) }.ok();
    let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let sm_count = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    let total_mem_bytes = unsafe { result::device::total_mem(dev) }.ok()?;
    let mut driver_version = 0i32;
    unsafe { sys::cuDriverGetVersion(&mut driver_version) }
        .result()
        .ok()?;
    Some(GpuInfo {
        ordinal,
        name,
        compute_capability: (major, minor),
        total_mem_bytes,
        sm_count,
        driver_version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_info_matches_the_build() {
        let b = build_info();
        if b.fatbin_bytes == 0 {
            assert!(b.cuda_archs.is_empty());
            assert_eq!(b.cuda_kernels, 0);
        } else {
            assert_eq!(
                b.cuda_archs,
                vec!["sm_80", "sm_86", "sm_89", "sm_90", "compute_80"]
            );
            assert_eq!(b.cuda_kernels, device::KERNELS.len());
        }
    }

    #[test]
    fn probe_never_panics() {
        // On machines without a driver this is None; with one, the fields are sane.
        if let Some(g) = probe() {
            assert!(g.sm_count > 0 && g.total_mem_bytes > 0);
        }
    }
}
