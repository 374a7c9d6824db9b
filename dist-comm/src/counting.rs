//! [`Counting`]: a layer around any communicator that counts the bytes handed to it, per kind
//! of call, so that programs report the traffic they caused as measured at the transport, not
//! as recomputed from a formula.
//!
//! The conventions are the schedules' (`distspmm_op::schedule`): payload bytes between two
//! *different* ranks (a message to oneself is not counted); a broadcast counts its buffer once
//! per receiving rank on the root's sent side and once on each receiver's received side; an
//! all-reduce counts its buffer once each way, an all-gather its contribution once per other
//! rank each way, an all-to-all every block to and from another rank. On one rank every count
//! stays 0. Point-to-point bytes are counted when a send or receive is posted.

use std::cell::Cell;

use crate::capability::{
    AllGather, AllReduce, AllToAllV, Broadcast, Completion, Exchange, Group, PointToPoint,
    RequestId, Tag,
};
use crate::element::{Element, ReduceOp, Reducible};
use crate::layout::BlockLayout;
use crate::CommError;

/// Bytes sent and received.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bytes {
    /// Bytes handed to the transport to go to other ranks.
    pub sent: u64,
    /// Bytes received from other ranks.
    pub received: u64,
}

impl Bytes {
    fn add(&mut self, sent: u64, received: u64) {
        self.sent += sent;
        self.received += received;
    }

    fn minus(self, earlier: Bytes) -> Bytes {
        Bytes {
            sent: self.sent - earlier.sent,
            received: self.received - earlier.received,
        }
    }
}

/// What a [`Counting`] communicator has counted so far, per kind of call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrafficCounts {
    /// Nonblocking sends and receives ([`PointToPoint`]).
    pub point_to_point: Bytes,
    /// [`Broadcast`].
    pub broadcast: Bytes,
    /// [`AllReduce`].
    pub all_reduce: Bytes,
    /// [`AllGather`].
    pub all_gather: Bytes,
    /// [`AllToAllV`].
    pub all_to_all: Bytes,
}

impl TrafficCounts {
    /// What was counted after `earlier` (a snapshot of the same communicator).
    pub fn since(&self, earlier: &TrafficCounts) -> TrafficCounts {
        TrafficCounts {
            point_to_point: self.point_to_point.minus(earlier.point_to_point),
            broadcast: self.broadcast.minus(earlier.broadcast),
            all_reduce: self.all_reduce.minus(earlier.all_reduce),
            all_gather: self.all_gather.minus(earlier.all_gather),
            all_to_all: self.all_to_all.minus(earlier.all_to_all),
        }
    }

    /// Point-to-point and broadcast bytes together: what a distributed SpMM's schedule moves
    /// (its agreement uses the all-gather and all-reduce).
    pub fn schedule(&self) -> Bytes {
        Bytes {
            sent: self.point_to_point.sent + self.broadcast.sent,
            received: self.point_to_point.received + self.broadcast.received,
        }
    }
}

fn bytes<T>(len: usize) -> u64 {
    (len as u64).saturating_mul(size_of::<T>() as u64)
}

/// A communicator that counts the bytes handed to `C` (see the [module docs](self)). It has
/// the capabilities `C` has.
///
/// ```
/// use dist_comm::{AllReduce, Broadcast, Counting, Group, LocalComm};
///
/// let counts = LocalComm::run(3, |comm| {
///     let comm = Counting::new(&comm);
///     let mut x = [1.0f32; 4];
///     comm.broadcast(&mut x, 0).unwrap();
///     comm.all_reduce_sum(&mut x).unwrap();
///     comm.counts()
/// });
/// assert_eq!(counts[0].broadcast.sent, 2 * 16); // to ranks 1 and 2
/// assert_eq!(counts[1].broadcast.received, 16);
/// assert!(counts.iter().all(|c| c.all_reduce.sent == 16 && c.all_reduce.received == 16));
/// ```
#[derive(Debug)]
pub struct Counting<'c, C> {
    inner: &'c C,
    counts: Cell<TrafficCounts>,
    /// The innermost exchange scope running now (0: none) and the last id handed out.
    scope: Cell<u64>,
    last_scope: Cell<u64>,
}

impl<'c, C> Counting<'c, C> {
    /// Counts what is handed to `inner` through this layer from now on.
    pub fn new(inner: &'c C) -> Self {
        Self {
            inner,
            counts: Cell::new(TrafficCounts::default()),
            scope: Cell::new(0),
            last_scope: Cell::new(0),
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> TrafficCounts {
        self.counts.get()
    }

    /// The wrapped communicator (calls made on it directly are not counted).
    pub fn inner(&self) -> &'c C {
        self.inner
    }

    fn count(&self, f: impl FnOnce(&mut TrafficCounts)) {
        let mut c = self.counts.get();
        f(&mut c);
        self.counts.set(c);
    }
}

impl<C: Group> Group for Counting<'_, C> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.inner.barrier()
    }
}

impl<C: Broadcast> Broadcast for Counting<'_, C> {
    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), CommError> {
        self.inner.broadcast(buf, root)?;
        let (others, b) = (self.size() as u64 - 1, bytes::<T>(buf.len()));
        if others > 0 {
            let rank = self.rank();
            self.count(|c| {
                if rank == root {
                    c.broadcast.add(b * others, 0);
                } else {
                    c.broadcast.add(0, b);
                }
            });
        }
        Ok(())
    }
}

impl<C: AllReduce> AllReduce for Counting<'_, C> {
    fn all_reduce<T: Reducible>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), CommError> {
        self.inner.all_reduce(buf, op)?;
        if self.size() > 1 {
            let b = bytes::<T>(buf.len());
            self.count(|c| c.all_reduce.add(b, b));
        }
        Ok(())
    }
}

impl<C: AllGather> AllGather for Counting<'_, C> {
    fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<(), CommError> {
        self.inner.all_gather(send, recv)?;
        let b = bytes::<T>(send.len()) * (self.size() as u64 - 1);
        self.count(|c| c.all_gather.add(b, b));
        Ok(())
    }
}

impl<C: AllToAllV> AllToAllV for Counting<'_, C> {
    fn all_to_all_v<T: Element>(
        &self,
        send: &[T],
        send_layout: &BlockLayout,
        recv: &mut [T],
        recv_layout: &BlockLayout,
    ) -> Result<(), CommError> {
        self.inner
            .all_to_all_v(send, send_layout, recv, recv_layout)?;
        let me = self.rank();
        let others = |l: &BlockLayout| -> u64 {
            let n: usize = (l.counts().iter().enumerate())
                .filter(|&(r, _)| r != me)
                .map(|(_, &c)| c)
                .sum();
            bytes::<T>(n)
        };
        let (s, r) = (others(send_layout), others(recv_layout));
        self.count(|c| c.all_to_all.add(s, r));
        Ok(())
    }
}

/// The request set of an exchange on a [`Counting`] communicator: the wrapped communicator's,
/// counting what is posted.
pub struct CountingExchange<'a, C: PointToPoint, T: Element> {
    /// The wrapped request set, alive while `scope` is the innermost running scope of `owner`
    /// (checked before every use).
    inner: std::ptr::NonNull<C::Exchange<'a, T>>,
    owner: &'a Counting<'a, C>,
    scope: u64,
}

impl<C: PointToPoint, T: Element> std::fmt::Debug for CountingExchange<'_, C, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingExchange")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl<'a, C: PointToPoint + 'a, T: Element> CountingExchange<'a, C, T> {
    /// The wrapped request set, if this handle belongs to the scope running now.
    fn inner(&mut self) -> Result<&mut C::Exchange<'a, T>, CommError> {
        if self.owner.scope.get() != self.scope {
            // Only reachable by swapping the handles of two nested scopes.
            return Err(CommError::InvalidRequest { id: usize::MAX });
        }
        // SAFETY: `inner` points to the request set the wrapped communicator lent to the
        // closure of scope `self.scope`, which lives until that closure returns; the scope
        // stays the innermost running one only until then (`Counting::exchange` restores the
        // outer scope before the request set is dropped), and scope ids are never reused. We
        // hold `&mut self`, the only handle of the scope, so the reborrow is unique.
        Ok(unsafe { self.inner.as_mut() })
    }
}

impl<'a, C: PointToPoint + 'a, T: Element> Exchange<'a, T> for CountingExchange<'a, C, T> {
    fn isend(&mut self, dest: usize, tag: Tag, buf: &'a [T]) -> Result<RequestId, CommError> {
        let id = self.inner()?.isend(dest, tag, buf)?;
        if dest != self.owner.rank() {
            let b = bytes::<T>(buf.len());
            self.owner.count(|c| c.point_to_point.add(b, 0));
        }
        Ok(id)
    }

    fn irecv(&mut self, source: usize, tag: Tag, buf: &'a mut [T]) -> Result<RequestId, CommError> {
        let b = bytes::<T>(buf.len());
        let id = self.inner()?.irecv(source, tag, buf)?;
        if source != self.owner.rank() {
            self.owner.count(|c| c.point_to_point.add(0, b));
        }
        Ok(id)
    }

    fn wait(&mut self, id: RequestId) -> Result<Completion<'a, T>, CommError> {
        self.inner()?.wait(id)
    }

    fn test(&mut self, id: RequestId) -> Result<Option<Completion<'a, T>>, CommError> {
        self.inner()?.test(id)
    }

    fn wait_any(&mut self) -> Result<Option<Completion<'a, T>>, CommError> {
        self.inner()?.wait_any()
    }

    fn pending(&self) -> usize {
        if self.owner.scope.get() != self.scope {
            return 0;
        }
        // SAFETY: as in `inner`: the scope is running, so the request set is alive; a shared
        // reborrow while we hold `&self`.
        unsafe { self.inner.as_ref() }.pending()
    }
}

/// Restores the enclosing scope when an exchange closure returns or unwinds.
struct ScopeGuard<'a> {
    scope: &'a Cell<u64>,
    outer: u64,
}

impl Drop for ScopeGuard<'_> {
    fn drop(&mut self) {
        self.scope.set(self.outer);
    }
}

impl<C: PointToPoint> PointToPoint for Counting<'_, C> {
    type Exchange<'a, T: Element>
        = CountingExchange<'a, C, T>
    where
        Self: 'a;

    fn exchange<'a, T, R, F>(&'a self, f: F) -> Result<R, CommError>
    where
        T: Element,
        F: FnOnce(&mut Self::Exchange<'a, T>) -> Result<R, CommError>,
    {
        self.inner.exchange(|inner: &mut C::Exchange<'a, T>| {
            let id = self.last_scope.get() + 1;
            self.last_scope.set(id);
            let _guard = ScopeGuard {
                scope: &self.scope,
                outer: self.scope.replace(id),
            };
            let mut ex = CountingExchange {
                inner: std::ptr::NonNull::from(inner),
                owner: self,
                scope: id,
            };
            f(&mut ex)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalComm;

    #[test]
    fn every_kind_of_call_is_counted_with_the_schedules_conventions() {
        let counts = LocalComm::run(3, |comm| {
            let comm = Counting::new(&comm);
            let (me, p) = (comm.rank(), comm.size());
            let mut x = [0u64; 5];
            comm.broadcast(&mut x, 1).unwrap();
            comm.all_gather_vec(&[1u32, 2]).unwrap();
            let mut inbox = vec![vec![0f32; 3]; p];
            let mine = vec![me as f32; 3];
            comm.exchange(|ex| {
                for (q, buf) in inbox.iter_mut().enumerate() {
                    ex.irecv(q, 1, buf)?;
                }
                for q in 0..p {
                    ex.isend(q, 1, &mine)?;
                }
                ex.wait_all()
            })
            .unwrap();
            let layout = BlockLayout::packed(vec![2; p]);
            let mut recv = vec![0i32; 2 * p];
            comm.all_to_all_v(&vec![7i32; 2 * p], &layout, &mut recv, &layout)
                .unwrap();
            comm.counts()
        });
        for (r, c) in counts.iter().enumerate() {
            let bcast = if r == 1 {
                Bytes {
                    sent: 2 * 40,
                    received: 0,
                }
            } else {
                Bytes {
                    sent: 0,
                    received: 40,
                }
            };
            assert_eq!(c.broadcast, bcast, "rank {r}");
            assert_eq!(
                c.all_gather,
                Bytes {
                    sent: 16,
                    received: 16
                }
            );
            // Three f32 to and from each of the two others; the message to self is not counted.
            assert_eq!(
                c.point_to_point,
                Bytes {
                    sent: 24,
                    received: 24
                }
            );
            assert_eq!(
                c.all_to_all,
                Bytes {
                    sent: 16,
                    received: 16
                }
            );
            assert_eq!(c.all_reduce, Bytes::default());
            assert_eq!(c.schedule().sent, c.point_to_point.sent + c.broadcast.sent);
        }
        // One rank moves nothing.
        let one = LocalComm::run(1, |comm| {
            let comm = Counting::new(&comm);
            let mut x = [1f32; 8];
            comm.all_reduce_sum(&mut x).unwrap();
            comm.broadcast(&mut x, 0).unwrap();
            comm.counts()
        });
        assert_eq!(one[0], TrafficCounts::default());
    }

    #[test]
    fn a_handle_swapped_out_of_its_scope_is_refused_not_used() {
        let out = LocalComm::run(1, |comm| {
            let comm = Counting::new(&comm);
            let mut buf = [0f32; 2];
            comm.exchange(|outer: &mut CountingExchange<'_, LocalComm, f32>| {
                let r = comm.exchange(|inner: &mut CountingExchange<'_, LocalComm, f32>| {
                    std::mem::swap(outer, inner);
                    // `inner` now holds the outer scope's handle: refused.
                    Ok(inner.isend(0, 1, &[1.0]).is_err())
                })?;
                // `outer` holds the finished inner scope's handle: refused, not dereferenced.
                Ok(r && outer.irecv(0, 1, &mut buf).is_err() && outer.pending() == 0)
            })
        });
        assert_eq!(out, vec![Ok(true)]);
    }
}
