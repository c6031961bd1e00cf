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

/// Two pinned host slots for one `i32` each, mapped into the device's address space: the
/// argmax stores a step's token into slot `position & 1` itself (kernels/sample.cu
/// `emit_token`), so nothing sits in the stream between two steps. The host clears a slot
/// before it queues the step that fills it and spins on it (`wait`); a token is never negative.
pub(crate) struct TokenSlots {
    host: *mut i32,
    dev: u64,
    ctx: Arc<CudaContext>,
}

/// What a cleared slot holds.
const SLOT_EMPTY: i32 = -1;

impl TokenSlots {
    /// The slots' device address (the argmax's `host_tok`).
    pub fn dev(&self) -> u64 {
        self.dev
    }

    /// Mark slot `i` empty. Only while no queued step writes it.
    pub fn clear(&self, i: usize) {
        assert!(i < 2);
        // SAFETY: the slot is ours and in bounds; the device writes it only from a step the
        // caller has not queued yet.
        unsafe { std::ptr::write_volatile(self.host.add(i), SLOT_EMPTY) }
    }

    /// Spin until slot `i` holds a token. The stream is asked now and then, so a failed step
    /// surfaces as its error, and a stream drained without the token as an error of its own.
    pub fn wait(&self, i: usize, stream: sys::CUstream) -> Result<i32, CudaError> {
        assert!(i < 2);
        // SAFETY: in bounds; the device writes the slot with one aligned 4-byte store.
        let read = || unsafe { std::ptr::read_volatile(self.host.add(i)) };
        let mut spins = 0u32;
        loop {
            let v = read();
            if v != SLOT_EMPTY {
                return Ok(v);
            }
            spins = spins.wrapping_add(1);
            if spins % 1024 == 0 {
                match unsafe { sys::cuStreamQuery(stream) } {
                    sys::CUresult::CUDA_ERROR_NOT_READY => {}
                    sys::CUresult::CUDA_SUCCESS => {
                        let v = read();
                        if v != SLOT_EMPTY {
                            return Ok(v);
                        }
                        return Err(CudaError::Driver(
                            "the decode step finished without storing its token".into(),
                        ));
                    }
                    e => return Err(drv(result::DriverError(e))),
                }
            }
            std::hint::spin_loop();
        }
    }
}

impl Drop for TokenSlots {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            unsafe {
                // A step still queued may store into the slots.
                let _ = result::ctx::synchronize();
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
    ("pf_gemm_w", false),
    ("pf_dequant", false),
    ("decode_step_s6", false),
    ("decode_step_s3", false),
    ("decode_stream_r10", false),
    ("decode_stream_r2", false),
    ("decode_stream_w16_r5", false),
    ("decode_stream_w16_r2", false),
    ("decode_stream_w16q8_r5", false),
    ("decode_stream_w16q8_r2", false),
    ("decode_stream_w4_r10", false),
    ("decode_stream_w4_r2", false),
    ("gemv_q8", false),
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

    fn attribute(&self, a: sys::CUdevice_attribute) -> Result<usize, CudaError> {
        Ok(self.ctx.attribute(a).map_err(drv)? as usize)
    }

    /// Shared memory an SM holds for all its resident blocks (each block also takes 1 KB of it
    /// for the system).
    pub fn max_smem_per_sm(&self) -> Result<usize, CudaError> {
        self.attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
        )
    }

    pub fn max_smem_optin(&self) -> Result<usize, CudaError> {
        self.attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )
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

    /// The decode step's token slots (see [`TokenSlots`]), both empty.
    pub fn token_slots(&self) -> Result<TokenSlots, CudaError> {
        self.bind()?;
        let host = unsafe { result::malloc_host(8, sys::CU_MEMHOSTALLOC_DEVICEMAP) }.map_err(drv)?
            as *mut i32;
        let mut slots = TokenSlots {
            host,
            dev: 0,
            ctx: self.ctx.clone(),
        };
        let mut dev = 0;
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host as *mut c_void, 0) }
            .result()
            .map_err(drv)?;
        slots.dev = dev;
        slots.clear(0);
        slots.clear(1);
        Ok(slots)
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
