//! The message precision at the GPU backend's transport boundary, written once over a
//! [`Transport`]: the GPU backend runs these steps with its conversion kernels and NCCL, the
//! recording backend of the tests with nothing behind them, so which regions are narrowed and
//! widened, and the bytes handed over, are checked on the CPU against the CPU engine's.
//!
//! The rule is the CPU engine's: an exchange narrows each send region into the region's 16-bit
//! copy just before handing the copies over and widens each received copy into its `f32`
//! region; a broadcast narrows at the root and widens at the other ranks. A device widens a
//! received region as soon as it has arrived (on the communication lane, before the exchange's
//! body), where the CPU widens it when the body first reads it: the same regions, since a
//! body reads every region it receives (the recorder checks it). In `f32` nothing is converted
//! and the regions themselves are handed over.
//!
//! Bytes are counted as they are handed over, with the plan's conventions: each message's
//! length in the transport's elements (`f32` values, or the bytes of 16-bit values) times the
//! element's size, a broadcast once per receiving rank on the root's side.

use crate::schedule::{Precision, Traffic};
use distspmm_sparse::kernel::convert::Half;

use crate::backend::{Exchange, Message, Region};
use crate::DistSpmmError;

/// One message as it is handed to the transport: its peer (a broadcast's root), its region of
/// the buffers, and its length in the transport's elements — the region's `f32` values, or the
/// bytes of its 16-bit copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Payload {
    pub(crate) peer: usize,
    pub(crate) region: Region,
    pub(crate) len: usize,
}

/// What one call moves values with: its precision, F, this rank and the rank count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WireCall {
    pub(crate) precision: Precision,
    pub(crate) f: usize,
    pub(crate) rank: usize,
    pub(crate) size: usize,
}

impl WireCall {
    /// The 16-bit format of the messages (`None`: `f32`).
    pub(crate) fn half(&self) -> Option<Half> {
        self.precision.half()
    }

    /// Bytes of one element of the transport: an `f32` value, or one byte of 16-bit values.
    pub(crate) fn element_bytes(&self) -> usize {
        match self.half() {
            None => size_of::<f32>(),
            Some(_) => 1,
        }
    }

    /// `region` sent to or received from `peer` as the transport sees it.
    fn payload(&self, peer: usize, region: Region) -> Payload {
        let values = region.rows * self.f;
        let len = match self.half() {
            None => values,
            // Two bytes per value.
            Some(_) => values * size_of::<u16>(),
        };
        Payload { peer, region, len }
    }

    fn bytes(&self, payloads: &[Payload]) -> u64 {
        payloads
            .iter()
            .map(|p| (p.len * self.element_bytes()) as u64)
            .sum()
    }
}

/// What a backend does to move values: convert a region on the communication lane and hand
/// messages to the transport. [`exchange`] and [`broadcast`] drive it.
pub(crate) trait Transport {
    /// The call's precision, F, rank and rank count.
    fn call(&self) -> WireCall;

    /// The bytes handed over so far in this program.
    fn moved(&mut self) -> &mut Traffic;

    /// Rounds the `f32` values of `region` into its 16-bit copy, on the communication lane.
    ///
    /// # Errors
    /// Device errors; an internal error when the region lies beyond its buffer.
    fn narrow(&mut self, fmt: Half, region: Region) -> Result<(), DistSpmmError>;

    /// Widens the 16-bit copy of `region` into its `f32` values, on the communication lane.
    ///
    /// # Errors
    /// As [`narrow`](Self::narrow).
    fn widen(&mut self, fmt: Half, region: Region) -> Result<(), DistSpmmError>;

    /// One grouped exchange of these messages: the `f32` regions themselves (`fmt` `None`) or
    /// the bytes of their 16-bit copies.
    ///
    /// # Errors
    /// Communication errors; an internal error when a region lies beyond its buffer.
    fn hand_over(
        &mut self,
        fmt: Option<Half>,
        sends: &[Payload],
        recvs: &[Payload],
    ) -> Result<(), DistSpmmError>;

    /// One broadcast of `payload` from its peer, the root, in the same forms.
    ///
    /// # Errors
    /// As [`hand_over`](Self::hand_over).
    fn hand_over_broadcast(
        &mut self,
        fmt: Option<Half>,
        payload: Payload,
    ) -> Result<(), DistSpmmError>;
}

/// The messages of `ex` moved in the call's precision: its send regions narrowed, handed over
/// with its receives, the received regions widened (before the exchange's body runs).
///
/// # Errors
/// What the transport fails at.
pub(crate) fn exchange<T: Transport>(t: &mut T, ex: &Exchange) -> Result<(), DistSpmmError> {
    let call = t.call();
    let payloads = |list: &[Message]| -> Vec<Payload> {
        list.iter()
            .map(|m| call.payload(m.peer, m.region))
            .collect()
    };
    let (sends, recvs) = (payloads(&ex.sends), payloads(&ex.recvs));
    let fmt = call.half();
    if let Some(fmt) = fmt {
        for m in &ex.sends {
            t.narrow(fmt, m.region)?;
        }
    }
    t.hand_over(fmt, &sends, &recvs)?;
    let moved = t.moved();
    moved.sent += call.bytes(&sends);
    moved.received += call.bytes(&recvs);
    if let Some(fmt) = fmt {
        for m in &ex.recvs {
            t.widen(fmt, m.region)?;
        }
    }
    Ok(())
}

/// `region` broadcast from `root` in the call's precision: narrowed at the root, widened at
/// the others.
///
/// # Errors
/// What the transport fails at.
pub(crate) fn broadcast<T: Transport>(
    t: &mut T,
    region: Region,
    root: usize,
) -> Result<(), DistSpmmError> {
    let call = t.call();
    let payload = call.payload(root, region);
    let (fmt, mine) = (call.half(), call.rank == root);
    if let (Some(fmt), true) = (fmt, mine) {
        t.narrow(fmt, region)?;
    }
    t.hand_over_broadcast(fmt, payload)?;
    let bytes = call.bytes(&[payload]);
    if mine {
        t.moved().sent += bytes * (call.size as u64).saturating_sub(1);
    } else {
        t.moved().received += bytes;
        if let Some(fmt) = fmt {
            t.widen(fmt, region)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Buf;

    #[test]
    fn a_payload_is_its_regions_values_or_their_bytes() {
        let region = Region::new(Buf::Packed, 2, 3);
        let call = |precision| WireCall {
            precision,
            f: 5,
            rank: 0,
            size: 2,
        };
        let f32 = call(Precision::F32);
        assert_eq!(f32.payload(1, region).len, 15);
        assert_eq!(f32.bytes(&[f32.payload(1, region)]), 60);
        for p in [Precision::Bf16, Precision::F16] {
            let c = call(p);
            assert_eq!(c.payload(1, region).len, 30);
            assert_eq!(c.bytes(&[c.payload(1, region)]), 30);
        }
    }
}
