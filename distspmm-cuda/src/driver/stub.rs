//! The driver primitives of a build without the `cuda` feature: every entry point answers
//! `CudaError::NotBuilt`, and the types that only an open device could create are uninhabited.

use std::convert::Infallible;
use std::marker::PhantomData;

use super::{Arg, RawStream};
use crate::error::{CudaError, Result};

/// Element types that can live in device buffers.
pub(crate) trait Elem: Copy + Default {}
impl<T: Copy + Default> Elem for T {}

/// Number of CUDA devices: none can be used without the `cuda` feature.
pub(crate) fn device_count() -> Result<usize> {
    Err(CudaError::NotBuilt)
}

/// Never constructed: `open` always fails.
#[derive(Debug)]
pub(crate) struct Context {
    never: Infallible,
}

/// Never constructed: only an open context allocates.
#[derive(Debug)]
pub(crate) struct Buffer<T> {
    never: Infallible,
    _elem: PhantomData<T>,
}

impl<T> Buffer<T> {
    pub(crate) fn len(&self) -> usize {
        match self.never {}
    }
}

impl Context {
    pub(crate) fn open(_ordinal: usize) -> Result<Context> {
        Err(CudaError::NotBuilt)
    }

    pub(crate) fn ordinal(&self) -> usize {
        match self.never {}
    }

    pub(crate) fn name(&self) -> Result<String> {
        match self.never {}
    }

    pub(crate) fn compute_capability(&self) -> Result<(u32, u32)> {
        match self.never {}
    }

    pub(crate) fn upload<T: Elem>(&self, _data: &[T]) -> Result<Buffer<T>> {
        match self.never {}
    }

    pub(crate) fn zeros<T: Elem>(&self, _len: usize) -> Result<Buffer<T>> {
        match self.never {}
    }

    pub(crate) fn download<T: Elem>(&self, _buf: &Buffer<T>) -> Result<Vec<T>> {
        match self.never {}
    }

    pub(crate) fn device_ptr<T>(&self, _buf: &Buffer<T>) -> u64 {
        match self.never {}
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        match self.never {}
    }

    pub(crate) fn raw_stream(&self) -> RawStream {
        match self.never {}
    }

    /// # Safety
    /// Same contract as the CUDA build's `join`; unreachable here.
    pub(crate) unsafe fn join(
        &self,
        _waiter: Option<RawStream>,
        _signaller: Option<RawStream>,
    ) -> Result<()> {
        match self.never {}
    }

    /// # Safety
    /// Same contract as the CUDA build's `launch`; unreachable here.
    pub(crate) unsafe fn launch(
        &self,
        _kernel: &'static str,
        _blocks: u64,
        _args: &[Arg],
        _stream: Option<RawStream>,
    ) -> Result<()> {
        match self.never {}
    }
}
