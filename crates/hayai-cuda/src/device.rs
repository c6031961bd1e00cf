//! The CUDA context, the embedded kernel module and raw device buffers.
//!
//! Buffers are plain `cuMemAlloc` allocations addressed by raw pointers: the decode plan bakes
//! those pointers into kernel parameters once, and a CUDA graph replays them.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaModule, CudaStream};

use crate::CudaError;

pub(crate) static FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hayai_kernels.fatbin"));

pub(crate) fn drv(e: result::DriverError) -> CudaError {
    CudaError::Driver(format!("{e:?}"))
}

/// A device allocation, freed on drop.
pub struct DevBuf {
    pub(crate) ptr: u64,
    ctx: Arc<CudaContext>,
}

impl DevBuf {
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    /// Pointer `elems` elements of `T` into the buffer.
    pub fn at<T>(&self, elems: usize) -> u64 {
        self.ptr + (elems * std::mem::size_of::<T>()) as u64
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if self.ptr != 0 && self.ctx.bind_to_thread().is_ok() {
            unsafe {
                let _ = result::free_sync(self.ptr);
            }
        }
    }
}

/// Pinned host slots for one `i32` each, and an event per slot: a decode loop copies step k's
/// token into a slot without waiting for the stream, launches step k + 1, and only then waits
/// for slot k's event (`Gpu::read` syncs the stream, so nothing could be queued behind it).
pub(crate) struct HostSlots {
    host: *mut i32,
    events: Vec<sys::CUevent>,
    ctx: Arc<CudaContext>,
}

impl HostSlots {
    /// Wait until slot `i`'s copy has landed, and read it.
    pub fn wait(&self, i: usize) -> Result<i32, CudaError> {
        unsafe { result::event::synchronize(self.events[i]) }.map_err(drv)?;
        // SAFETY: the slot is ours, in bounds, and its copy has completed.
        Ok(unsafe { std::ptr::read_volatile(self.host.add(i)) })
    }
}

impl Drop for HostSlots {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            unsafe {
                for &e in &self.events {
                    let _ = result::event::destroy(e);
                }
                let _ = result::free_host(self.host as *mut c_void);
            }
        }
    }
}

pub(crate) struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    _module: Arc<CudaModule>,
    funcs: HashMap<&'static str, CudaFunction>,
    pub name: String,
    pub sm_count: i32,
    /// Compute capability major version (9 on Hopper).
    pub cc_major: i32,
    /// Launch the decode kernels with programmatic dependent launch (needs `cc_major >= 9`).
    pub pdl: bool,
}

/// Every kernel of the fatbin, and whether it is written for programmatic dependent launch:
/// such a kernel calls `pdl_wait` (kernels/common.cuh) in every thread before it reads anything
/// an earlier kernel writes and before any global write. Only those get the launch attribute.
pub(crate) const KERNELS: &[(&str, bool)] = &[
    ("gemv", true),
    ("gemv_u8", true),
    ("gemv_a8", true),
    ("gemv_mma", true),
    ("gemv_mma_u4", true),
    ("gemv_mma_kw", true),
    ("gemv_mma_kw_u4", true),
    ("gemv_mma_a8", true),
    ("gemv_mma_kw_a8", true),
    ("gemv_mma_ring", true),
    ("gemv_persistent", true),
    ("gemv_pair", true),
    ("attn_split", true),
    ("attn_split_hd256", true),
    ("attn_split_hd512", true),
    ("attn_split_wv_hd256", true),
    ("attn_split_wv_hd512", true),
    ("attn_split_wv_hd256_k8", true),
    ("attn_split_wv_hd512_k8", true),
    ("attn_split_wv_hd256_k32", true),
    ("attn_split_wv_hd512_k32", true),
    ("attn_split_tile", true),
    ("argmax_stage1", true),
    ("argmax_stage2", true),
    ("ple_combine", true),
    ("read_bw", false),
    ("pf_rows", false),
    ("pf_act", false),
    ("pf_ple", false),
    ("pf_qkv", false),
    ("pf_attention", false),
    ("pf_gemm", false),
    ("decode_step_s6", false),
    ("decode_step_s3", false),
    ("decode_stream_r10", false),
    ("decode_stream_r2", false),
    ("decode_stream_w16_r5", false),
    ("decode_stream_w16_r2", false),
    ("decode_stream_w4_r10", false),
    ("decode_stream_w4_r2", false),
];

impl Gpu {
    pub fn new(ordinal: usize) -> Result<Gpu, CudaError> {
        if FATBIN.is_empty() {
            return Err(CudaError::NotBuilt);
        }
        if crate::probe_ordinal(ordinal).is_none() {
            return Err(CudaError::NoDevice(format!("no CUDA device {ordinal}")));
        }
        let ctx = CudaContext::new(ordinal).map_err(drv)?;
        // One stream, ordered by construction: the slices' event tracking is not needed and
        // would break graph capture.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv)?;
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(FATBIN.to_vec()))
            .map_err(drv)?;
        let mut funcs = HashMap::new();
        for &(k, _) in KERNELS {
            funcs.insert(k, module.load_function(k).map_err(drv)?);
        }
        let name = ctx.name().map_err(drv)?;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(drv)?;
        let cc_major = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
            .map_err(drv)?;
        Ok(Gpu {
            ctx,
            stream,
            _module: module,
            funcs,
            name,
            sm_count,
            cc_major,
            pdl: false,
        })
    }

    /// Use programmatic dependent launch where the GPU has it (sm_90+), the kernels were
    /// compiled with its waits (SASS for sm_90: a PTX-only build's kernels take their sm_80
    /// paths, where `pdl_wait` is a no-op) and `on` asks for it.
    pub fn with_pdl(mut self, on: bool) -> Gpu {
        let waits = env!("HAYAI_CUDA_ARCHS").split(',').any(|a| a == "sm_90");
        self.pdl = on && self.cc_major >= 9 && waits;
        self
    }

    pub fn bind(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(drv)
    }

    pub fn func(&self, name: &str) -> sys::CUfunction {
        self.funcs[name].cu_function()
    }

    /// Raise a kernel's dynamic shared-memory limit (needed above 48 KB).
    pub fn set_max_dynamic_smem(&self, name: &str, bytes: usize) -> Result<(), CudaError> {
        unsafe {
            result::function::set_function_attribute(
                self.func(name),
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
            .map_err(drv)
        }
    }

    /// Dynamic shared memory one block of kernel `name` can have: the GPU's opt-in limit less
    /// the kernel's static shared memory (the two share the limit).
    pub fn max_dynamic_smem(&self, name: &str) -> Result<usize, CudaError> {
        let static_bytes = unsafe {
            result::function::get_function_attribute(
                self.func(name),
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
            )
        }
        .map_err(drv)?;
        Ok(self
            .max_smem_optin()?
            .saturating_sub(static_bytes.max(0) as usize))
    }

    pub fn max_smem_optin(&self) -> Result<usize, CudaError> {
        Ok(self
            .ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(drv)? as usize)
    }

    pub fn alloc(&self, bytes: usize) -> Result<DevBuf, CudaError> {
        self.bind()?;
        let bytes = bytes.max(16);
        let ptr = unsafe { result::malloc_sync(bytes) }.map_err(|e| {
            CudaError::Driver(format!("allocating {bytes} bytes on the GPU: {e:?}"))
        })?;
        unsafe { result::memset_d8_sync(ptr, 0, bytes) }.map_err(drv)?;
        Ok(DevBuf {
            ptr,
            ctx: self.ctx.clone(),
        })
    }

    pub fn upload<T: Copy>(&self, data: &[T]) -> Result<DevBuf, CudaError> {
        let b = self.alloc(std::mem::size_of_val(data))?;
        if !data.is_empty() {
            unsafe { result::memcpy_htod_sync(b.ptr, data) }.map_err(drv)?;
        }
        Ok(b)
    }

    /// Copy `data` into device memory at `ptr`, ordered on the stream.
    pub fn write<T: Copy>(&self, ptr: u64, data: &[T]) -> Result<(), CudaError> {
        unsafe { result::memcpy_htod_async(ptr, data, self.stream.cu_stream()) }.map_err(drv)
    }

    /// Copy device memory at `ptr` into `out` after the stream's pending work.
    pub fn read<T: Copy>(&self, ptr: u64, out: &mut [T]) -> Result<(), CudaError> {
        unsafe { result::memcpy_dtoh_async(out, ptr, self.stream.cu_stream()) }.map_err(drv)?;
        self.sync()
    }

    /// `n` pinned token slots (see [`HostSlots`]).
    pub fn host_slots(&self, n: usize) -> Result<HostSlots, CudaError> {
        self.bind()?;
        let host = unsafe { result::malloc_host(n.max(1) * 4, 0) }.map_err(drv)? as *mut i32;
        let mut slots = HostSlots {
            host,
            events: Vec::with_capacity(n),
            ctx: self.ctx.clone(),
        };
        for _ in 0..n {
            let e =
                result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(drv)?;
            slots.events.push(e);
        }
        Ok(slots)
    }

    /// Copy the `i32` at `src` into slot `i` after the stream's pending work, without waiting.
    pub fn read_async(&self, slots: &HostSlots, i: usize, src: u64) -> Result<(), CudaError> {
        assert!(i < slots.events.len());
        // SAFETY: slot i is pinned host memory of this context, in bounds.
        let dst = unsafe { std::slice::from_raw_parts_mut(slots.host.add(i), 1) };
        unsafe {
            result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()).map_err(drv)?;
            result::event::record(slots.events[i], self.stream.cu_stream()).map_err(drv)
        }
    }

    pub fn sync(&self) -> Result<(), CudaError> {
        self.stream.synchronize().map_err(drv)
    }

    /// Launch `name` with one by-value parameter struct.
    pub fn launch<P: Copy>(
        &self,
        f: sys::CUfunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        params: &P,
    ) -> Result<(), CudaError> {
        let mut args = [params as *const P as *mut c_void];
        unsafe {
            result::launch_kernel(
                f,
                grid,
                (block, 1, 1),
                smem,
                self.stream.cu_stream(),
                &mut args,
            )
        }
        .map_err(drv)
    }
}
