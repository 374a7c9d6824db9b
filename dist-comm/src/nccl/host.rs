//! [`NcclHost`]: the host-buffer collectives the distributed SpMM agrees with, carried over an
//! [`NcclComm`] alone, for launchers that have no host communicator (ranks started as plain
//! processes with an [`NcclUniqueId`](super::NcclUniqueId) in their environment).
//!
//! Every call stages the host buffer through device memory on the communicator's stream and
//! waits for it: meant for the few words of an agreement, not for bulk data.

use cudarc::driver::DevicePtrMut;

use super::{driver, NcclComm, RawDeviceBuffer};
use crate::capability::check_rank;
use crate::{AllGather, AllReduce, Broadcast, CommError, Element, Group, ReduceOp, Reducible};

/// Host collectives ([`Group`], [`AllReduce`], [`AllGather`], [`Broadcast`]) over an
/// [`NcclComm`]: an all-reduce is `ncclAllReduce` on a staged copy, an all-gather is one
/// `ncclBroadcast` per rank (exact for every element type), a broadcast one `ncclBroadcast`, a
/// barrier is a one-word all-reduce. Each call
/// synchronises the communicator's stream.
#[derive(Debug, Clone, Copy)]
pub struct NcclHost<'a> {
    nccl: &'a NcclComm,
}

impl<'a> NcclHost<'a> {
    /// The host collectives of `nccl`.
    pub fn new(nccl: &'a NcclComm) -> Self {
        Self { nccl }
    }

    /// The NCCL communicator underneath.
    pub fn nccl(&self) -> &'a NcclComm {
        self.nccl
    }

    /// Copies `data` to the device, runs `queue` on it, waits, and copies it back.
    fn staged<T: Element>(
        &self,
        data: &mut [T],
        queue: impl FnOnce(RawDeviceBuffer) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(data);
        if bytes.is_empty() {
            return Ok(());
        }
        let stream = self.nccl.stream();
        let mut staged = stream
            .clone_htod(&*bytes)
            .map_err(driver("cuMemcpyHtoDAsync"))?;
        let (ptr, guard) = staged.device_ptr_mut(stream);
        let queued = queue(RawDeviceBuffer {
            ptr,
            len: data_len::<T>(bytes.len()),
        });
        drop(guard);
        let waited = self.nccl.synchronize();
        queued?;
        waited?;
        stream
            .memcpy_dtoh(&staged, bytes)
            .map_err(driver("cuMemcpyDtoHAsync"))?;
        stream.synchronize().map_err(driver("cuStreamSynchronize"))
    }
}

fn data_len<T>(bytes: usize) -> usize {
    bytes / size_of::<T>()
}

impl Group for NcclHost<'_> {
    fn rank(&self) -> usize {
        self.nccl.rank()
    }

    fn size(&self) -> usize {
        self.nccl.size()
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.all_reduce(&mut [0u32], ReduceOp::Sum)
    }
}

impl AllReduce for NcclHost<'_> {
    fn all_reduce<T: Reducible>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), CommError> {
        self.staged(buf, |dev| {
            // SAFETY: `dev` addresses the staged copy of `buf` (its length in T) on this
            // communicator's device, alive until `staged` has synchronised.
            unsafe { self.nccl.all_reduce_raw::<T>(dev, op) }
        })
    }
}

impl AllGather for NcclHost<'_> {
    fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<(), CommError> {
        let (n, size) = (send.len(), self.size());
        let expected = n.checked_mul(size).ok_or(CommError::CountOverflow {
            what: "all-gather receive length",
            value: n,
        })?;
        if recv.len() != expected {
            return Err(CommError::BufferSize {
                what: "all_gather receive buffer",
                expected,
                actual: recv.len(),
            });
        }
        let me = self.rank();
        recv[me * n..(me + 1) * n].copy_from_slice(send);
        self.staged(recv, |dev| {
            for root in 0..size {
                let slot = RawDeviceBuffer {
                    ptr: dev.ptr + (root * n * size_of::<T>()) as u64,
                    len: n,
                };
                // SAFETY: `slot` is root's part of the staged receive buffer on this device,
                // alive until `staged` has synchronised.
                unsafe { self.nccl.broadcast_raw::<T>(slot, root)? };
            }
            Ok(())
        })
    }
}

impl Broadcast for NcclHost<'_> {
    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), CommError> {
        check_rank("broadcast root", root, self.size())?;
        self.staged(buf, |dev| {
            // SAFETY: `dev` addresses the staged copy of `buf` on this communicator's device,
            // alive until `staged` has synchronised.
            unsafe { self.nccl.broadcast_raw::<T>(dev, root) }
        })
    }
}

// The same narrow capabilities on the communicator itself, so code generic over them (an
// agreement, a trainer's reductions) runs on an `NcclComm` as on `LocalComm` or `MpiComm`.
// Host buffers are staged through the device as in `NcclHost`; the device-buffer calls of the
// same names are `NcclComm`'s inherent methods.

impl Group for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn barrier(&self) -> Result<(), CommError> {
        NcclHost::new(self).barrier()
    }
}

impl AllReduce for NcclComm {
    fn all_reduce<T: Reducible>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), CommError> {
        NcclHost::new(self).all_reduce(buf, op)
    }
}

impl AllGather for NcclComm {
    fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<(), CommError> {
        NcclHost::new(self).all_gather(send, recv)
    }
}

impl Broadcast for NcclComm {
    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), CommError> {
        NcclHost::new(self).broadcast(buf, root)
    }
}
