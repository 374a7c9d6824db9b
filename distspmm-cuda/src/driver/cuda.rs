//! The CUDA driver primitives, through cudarc: context, stream, module, buffers, launches.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    DriverError, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;

use super::{Arg, RawStream};
use crate::edge_softmax::SOFTMAX_KERNELS;
use crate::edges::EDGE_KERNELS;
use crate::error::{CudaError, Result};
pub(crate) use crate::probe::device_count;
use crate::probe::guarded;
use crate::rows::ROW_KERNELS;
use crate::strategy::{BLOCK_THREADS, KERNELS};
use crate::train::TRAIN_KERNELS;

/// The fatbins that build.rs compiled from `kernels/*.cu` (SASS sm_80, sm_90, PTX compute_90),
/// each with the kernels the launcher takes from it.
static MODULES: [(&[u8], &[&str]); 5] = [
    (
        include_bytes!(concat!(env!("OUT_DIR"), "/spmm.fatbin")),
        &KERNELS,
    ),
    (
        include_bytes!(concat!(env!("OUT_DIR"), "/rows.fatbin")),
        &ROW_KERNELS,
    ),
    (
        include_bytes!(concat!(env!("OUT_DIR"), "/sddmm.fatbin")),
        &EDGE_KERNELS,
    ),
    (
        include_bytes!(concat!(env!("OUT_DIR"), "/edge_softmax.fatbin")),
        &SOFTMAX_KERNELS,
    ),
    (
        include_bytes!(concat!(env!("OUT_DIR"), "/train.fatbin")),
        &TRAIN_KERNELS,
    ),
];

/// Element types that can live in device buffers.
pub(crate) trait Elem: DeviceRepr + ValidAsZeroBits + Copy + Default {}
impl<T: DeviceRepr + ValidAsZeroBits + Copy + Default> Elem for T {}

fn driver(call: &'static str) -> impl FnOnce(DriverError) -> CudaError {
    move |e| CudaError::Driver {
        call,
        message: e.to_string(),
    }
}

/// One device's context, the stream all work of this crate runs on, and the kernels.
pub(crate) struct Context {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    _modules: Vec<Arc<CudaModule>>,
    functions: HashMap<&'static str, CudaFunction>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("ordinal", &self.ctx.ordinal())
            .finish_non_exhaustive()
    }
}

/// A device allocation of `len` elements of `T`, freed in stream order on drop.
#[derive(Debug)]
pub(crate) struct Buffer<T> {
    slice: CudaSlice<T>,
}

impl<T> Buffer<T> {
    pub(crate) fn len(&self) -> usize {
        self.slice.len()
    }
}

impl Context {
    pub(crate) fn open(ordinal: usize) -> Result<Context> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(CudaError::NoDevice(format!(
                "device {ordinal} requested but the driver reports {count} device(s)"
            )));
        }
        guarded("opening the device", || {
            let ctx = CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain"))?;
            // SAFETY: every buffer and launch of this crate uses `stream` alone (raw launches
            // on a caller's stream are ordered by the caller, as documented on spmm_raw), so
            // cudarc's cross-stream event tracking has nothing to order.
            unsafe { ctx.disable_event_tracking() };
            let stream = ctx.new_stream().map_err(driver("cuStreamCreate"))?;
            let mut modules = Vec::with_capacity(MODULES.len());
            let mut functions =
                HashMap::with_capacity(MODULES.iter().map(|(_, names)| names.len()).sum());
            for (image, names) in MODULES {
                let module = ctx
                    .load_module(Ptx::from_binary(image.to_vec()))
                    .map_err(driver("cuModuleLoadData"))?;
                for &name in names {
                    let f = module
                        .load_function(name)
                        .map_err(|_| CudaError::MissingKernel(name))?;
                    functions.insert(name, f);
                }
                modules.push(module);
            }
            Ok(Context {
                ctx,
                stream,
                _modules: modules,
                functions,
            })
        })
    }

    pub(crate) fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    pub(crate) fn name(&self) -> Result<String> {
        self.ctx.name().map_err(driver("cuDeviceGetName"))
    }

    pub(crate) fn compute_capability(&self) -> Result<(u32, u32)> {
        let (major, minor) = self
            .ctx
            .compute_capability()
            .map_err(driver("cuDeviceGetAttribute"))?;
        Ok((major.unsigned_abs(), minor.unsigned_abs()))
    }

    pub(crate) fn upload<T: Elem>(&self, data: &[T]) -> Result<Buffer<T>> {
        let slice = self
            .stream
            .clone_htod(data)
            .map_err(driver("cuMemcpyHtoDAsync"))?;
        Ok(Buffer { slice })
    }

    pub(crate) fn zeros<T: Elem>(&self, len: usize) -> Result<Buffer<T>> {
        let slice = self
            .stream
            .alloc_zeros(len)
            .map_err(driver("cuMemAllocAsync"))?;
        Ok(Buffer { slice })
    }

    pub(crate) fn download<T: Elem>(&self, buf: &Buffer<T>) -> Result<Vec<T>> {
        let host = self
            .stream
            .clone_dtoh(&buf.slice)
            .map_err(driver("cuMemcpyDtoHAsync"))?;
        self.synchronize()?;
        Ok(host)
    }

    pub(crate) fn device_ptr<T>(&self, buf: &Buffer<T>) -> u64 {
        // Event tracking is off, so the guard records nothing and can drop at once.
        let (ptr, _guard) = buf.slice.device_ptr(&self.stream);
        ptr
    }

    /// This context's own stream as a raw handle.
    pub(crate) fn raw_stream(&self) -> RawStream {
        RawStream(self.stream.cu_stream() as u64)
    }

    /// Makes `waiter` wait for the work queued on `signaller` so far (an event recorded on
    /// `signaller`); `None` is this context's stream. Nothing to do when both are the same.
    ///
    /// # Safety
    /// Both handles must be live streams of this context.
    pub(crate) unsafe fn join(
        &self,
        waiter: Option<RawStream>,
        signaller: Option<RawStream>,
    ) -> Result<()> {
        let own = self.raw_stream();
        let (waiter, signaller) = (waiter.unwrap_or(own), signaller.unwrap_or(own));
        if waiter == signaller {
            return Ok(());
        }
        // SAFETY: the caller guarantees live streams of this context; the wrappers do not
        // destroy them on drop.
        let (w, s) = unsafe {
            (
                self.ctx.wrap_borrowed_stream(waiter.0 as sys::CUstream),
                self.ctx.wrap_borrowed_stream(signaller.0 as sys::CUstream),
            )
        };
        // The event is destroyed when `w` no longer needs it (CUDA defers the release).
        w.join(&s).map_err(driver("cuStreamWaitEvent"))
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))
    }

    /// Launches `kernel` with `blocks` blocks of `BLOCK_THREADS` threads on `stream` (this
    /// context's stream when `None`).
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list in type and order, and every pointer in
    /// them must address device memory of this context that is large enough for the launch
    /// and stays alive until the kernel has finished on its stream.
    pub(crate) unsafe fn launch(
        &self,
        kernel: &'static str,
        blocks: u64,
        args: &[Arg],
        stream: Option<RawStream>,
    ) -> Result<()> {
        let function = self
            .functions
            .get(kernel)
            .ok_or(CudaError::MissingKernel(kernel))?;
        let grid = u32::try_from(blocks)
            .ok()
            .filter(|&b| b <= i32::MAX as u32)
            .ok_or_else(|| CudaError::Shape {
                op: kernel,
                reason: format!("{blocks} blocks exceed the grid limit"),
            })?;
        let borrowed;
        let stream: &CudaStream = match stream {
            Some(RawStream(handle)) => {
                // SAFETY: the caller of spmm_raw guarantees that the handle is a live stream of
                // this context; the wrapper does not destroy it on drop.
                borrowed = unsafe { self.ctx.wrap_borrowed_stream(handle as sys::CUstream) };
                &borrowed
            }
            None => &self.stream,
        };
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut builder = stream.launch_builder(function);
        for arg in args {
            match arg {
                Arg::U32(v) => builder.arg(v),
                Arg::U64(v) => builder.arg(v),
                Arg::F32(v) => builder.arg(v),
                Arg::F64(v) => builder.arg(v),
            };
        }
        // SAFETY: the caller guarantees that the arguments match the kernel's signature and
        // that the pointers are valid for the launch (see this function's contract).
        unsafe { builder.launch(cfg) }.map_err(driver("cuLaunchKernel"))?;
        Ok(())
    }
}
