//! The `local` backend: P ranks as threads of one process.
//!
//! All ranks share one [`Mutex`]-protected state and one [`Condvar`]. A collective is a
//! *round*: each rank deposits its contribution (a copy of its data and a signature of the call);
//! the last to arrive checks that the signatures agree and publishes the round; every rank then
//! reads what it needs outside the lock. Point-to-point messages are copied into the receiver's
//! mailbox at `isend` (so sends complete at once) and matched to receives in posting order.
//!
//! Failure: a rank that panics, or drops its handle while others still need it, marks itself
//! departed; any rank blocked on it (in a collective, or receiving from it) gets
//! [`CommError::PeerFailed`] instead of hanging, and a panic poisons the whole group.

use std::any::Any;
use std::cell::Cell;
use std::collections::VecDeque;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use crate::capability::{check_all_gather, check_rank, check_tag};
use crate::element::{reduce_in_order, Element, ElementKind, ReduceOp, Reducible};
use crate::{
    AllGather, AllReduce, AllToAllV, BlockLayout, Broadcast, CommError, Completion, Exchange,
    Group, PointToPoint, RequestId, Tag,
};

/// One rank's handle on a group of threads that communicate in memory.
///
/// Create a group with [`LocalComm::run`] (scoped threads, one per rank) or
/// [`LocalComm::group`] (handles you place on threads yourself). The handle is `Send` but not
/// `Sync`: one thread drives one rank. Dropping it tells the others this rank is gone.
pub struct LocalComm {
    rank: usize,
    shared: Arc<Shared>,
    _not_sync: PhantomData<Cell<()>>,
}

struct Shared {
    size: usize,
    state: Mutex<State>,
    changed: Condvar,
}

struct State {
    /// Set when the group is unusable (a rank panicked or a collective lost a rank).
    failure: Option<CommError>,
    /// The first rank that panicked, to report its panic from [`LocalComm::run`].
    first_panic: Option<usize>,
    departed: Vec<Option<Departure>>,
    /// Collective round being collected.
    generation: u64,
    slots: Vec<Option<Contribution>>,
    arrived: usize,
    /// The last completed round; kept until the next one completes, which needs every rank,
    /// so every rank has taken its reference by then.
    finished: Option<(u64, Arc<Round>)>,
    /// Point-to-point messages waiting for a receive, per destination, in arrival order.
    mailboxes: Vec<VecDeque<Message>>,
}

#[derive(Debug, Clone, Copy)]
enum Departure {
    Released,
    Panicked,
}

impl Departure {
    fn error(self, rank: usize) -> CommError {
        let reason = match self {
            Self::Released => "it released its communicator (returned or dropped the handle) while this rank still needed it",
            Self::Panicked => "it panicked",
        };
        CommError::PeerFailed {
            rank,
            reason: reason.to_owned(),
        }
    }
}

type Payload = Box<dyn Any + Send + Sync>;

struct Contribution {
    signature: Signature,
    data: Option<Payload>,
}

struct Round {
    contributions: Vec<Contribution>,
    verdict: Result<(), CommError>,
}

impl Round {
    /// Rank `r`'s data as the element type the signatures agreed on.
    fn data<T: Element>(&self, r: usize) -> Result<&[T], CommError> {
        self.contributions
            .get(r)
            .and_then(|c| c.data.as_ref())
            .and_then(|d| d.downcast_ref::<Vec<T>>())
            .map(Vec::as_slice)
            .ok_or_else(|| CommError::Mismatch(format!("rank {r} contributed no {} data", T::KIND)))
    }
}

struct Message {
    source: usize,
    tag: Tag,
    kind: ElementKind,
    payload: Payload,
}

/// What a rank called, compared across ranks before any data moves.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Signature {
    Barrier,
    Broadcast {
        kind: ElementKind,
        len: usize,
        root: usize,
    },
    AllReduce {
        kind: ElementKind,
        len: usize,
        op: ReduceOp,
    },
    AllGather {
        kind: ElementKind,
        len: usize,
    },
    AllToAllV {
        kind: ElementKind,
        send_counts: Vec<usize>,
        recv_counts: Vec<usize>,
    },
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Barrier => write!(f, "barrier"),
            Self::Broadcast { kind, len, root } => {
                write!(f, "broadcast of {len} {kind} from root {root}")
            }
            Self::AllReduce { kind, len, op } => write!(f, "all_reduce {op} of {len} {kind}"),
            Self::AllGather { kind, len } => write!(f, "all_gather of {len} {kind} per rank"),
            Self::AllToAllV { kind, .. } => write!(f, "all_to_all_v of {kind}"),
        }
    }
}

/// Checks that all ranks made compatible calls; the same message for every rank.
fn agree(signatures: &[&Signature]) -> Result<(), CommError> {
    let first = signatures[0];
    for (r, s) in signatures.iter().enumerate().skip(1) {
        let compatible = match (first, s) {
            (Signature::AllToAllV { kind: k0, .. }, Signature::AllToAllV { kind: kr, .. }) => {
                k0 == kr
            }
            _ => first == *s,
        };
        if !compatible {
            return Err(CommError::Mismatch(format!(
                "rank 0 called {first} but rank {r} called {s}"
            )));
        }
    }
    if let Signature::AllToAllV { .. } = first {
        for (r, s) in signatures.iter().enumerate() {
            let Signature::AllToAllV { send_counts, .. } = s else {
                continue;
            };
            for (q, &n) in send_counts.iter().enumerate() {
                let Some(Signature::AllToAllV { recv_counts, .. }) = signatures.get(q) else {
                    continue;
                };
                if recv_counts[r] != n {
                    return Err(CommError::Mismatch(format!(
                        "all_to_all_v: rank {r} sends {n} elements to rank {q}, which expects {}",
                        recv_counts[r]
                    )));
                }
            }
        }
    }
    Ok(())
}

impl LocalComm {
    /// Handles for a new group of `size` ranks, in rank order; give each to its own thread.
    pub fn group(size: usize) -> Vec<LocalComm> {
        let shared = Arc::new(Shared {
            size,
            state: Mutex::new(State {
                failure: None,
                first_panic: None,
                departed: vec![None; size],
                generation: 0,
                slots: (0..size).map(|_| None).collect(),
                arrived: 0,
                finished: None,
                mailboxes: (0..size).map(|_| VecDeque::new()).collect(),
            }),
            changed: Condvar::new(),
        });
        (0..size)
            .map(|rank| LocalComm {
                rank,
                shared: Arc::clone(&shared),
                _not_sync: PhantomData,
            })
            .collect()
    }

    /// Runs `f` on `size` scoped threads, one per rank, and returns the results in rank order.
    ///
    /// # Panics
    /// If a rank panics, the others get [`CommError::PeerFailed`] from their next blocking call;
    /// once all threads have finished, the panic of the first rank that panicked is resumed here.
    /// Also panics if the OS cannot spawn a thread; [`LocalComm::try_run`] returns that as an
    /// error instead.
    pub fn run<R, F>(size: usize, f: F) -> Vec<R>
    where
        R: Send,
        F: Fn(LocalComm) -> R + Sync,
    {
        Self::try_run(size, f).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`LocalComm::run`], with a thread the OS refuses to start reported as
    /// [`CommError::Spawn`]: the ranks that did start see the missing ranks as released (a
    /// collective with them fails with [`CommError::PeerFailed`]) and are joined before this
    /// returns. A rank's panic is still resumed here.
    pub fn try_run<R, F>(size: usize, f: F) -> Result<Vec<R>, CommError>
    where
        R: Send,
        F: Fn(LocalComm) -> R + Sync,
    {
        Self::try_run_refusing(size, f, None)
    }

    /// [`LocalComm::try_run`], where the thread of rank `refuse` (if any) is refused as the OS
    /// would refuse it, so that tests can reach that path without exhausting a process limit.
    fn try_run_refusing<R, F>(size: usize, f: F, refuse: Option<usize>) -> Result<Vec<R>, CommError>
    where
        R: Send,
        F: Fn(LocalComm) -> R + Sync,
    {
        let comms = LocalComm::group(size);
        let shared = comms.first().map(|c| Arc::clone(&c.shared));
        let f = &f;
        let (outcomes, refused) = std::thread::scope(|s| {
            let mut handles = Vec::with_capacity(size);
            let mut refused = None;
            let mut comms = comms.into_iter();
            for comm in comms.by_ref() {
                let rank = comm.rank;
                let builder = std::thread::Builder::new().name(format!("local-rank-{rank}"));
                // On a refusal the closure, and with it this rank's handle, is dropped: the
                // started ranks see it as released.
                let started = if refuse == Some(rank) {
                    drop(comm);
                    Err(std::io::Error::from(std::io::ErrorKind::WouldBlock))
                } else {
                    builder.spawn_scoped(s, move || f(comm))
                };
                match started {
                    Ok(handle) => handles.push(handle),
                    Err(e) => {
                        refused = Some((rank, e.to_string()));
                        break;
                    }
                }
            }
            drop(comms.collect::<Vec<_>>());
            let outcomes: Vec<std::thread::Result<R>> =
                handles.into_iter().map(|h| h.join()).collect();
            (outcomes, refused)
        });
        let first_panic = shared.and_then(|s| s.lock().first_panic);
        let mut results = Vec::with_capacity(size);
        let mut panics = Vec::new();
        for (rank, outcome) in outcomes.into_iter().enumerate() {
            match outcome {
                Ok(r) => results.push(r),
                Err(payload) => panics.push((rank, payload)),
            }
        }
        if !panics.is_empty() {
            let pick = panics
                .iter()
                .position(|(r, _)| Some(*r) == first_panic)
                .unwrap_or(0);
            std::panic::resume_unwind(panics.swap_remove(pick).1);
        }
        if let Some((rank, reason)) = refused {
            return Err(CommError::Spawn { rank, size, reason });
        }
        Ok(results)
    }

    /// Runs one collective round: deposits this rank's contribution, waits for every rank,
    /// checks that the calls agree, and returns the round.
    fn round(&self, signature: Signature, data: Option<Payload>) -> Result<Arc<Round>, CommError> {
        let size = self.shared.size;
        let mut st = self.shared.lock();
        if let Some(e) = &st.failure {
            return Err(e.clone());
        }
        let generation = st.generation;
        st.slots[self.rank] = Some(Contribution { signature, data });
        st.arrived += 1;
        if st.arrived == size {
            let contributions: Vec<Contribution> =
                st.slots.iter_mut().filter_map(Option::take).collect();
            let signatures: Vec<&Signature> = contributions.iter().map(|c| &c.signature).collect();
            let verdict = agree(&signatures);
            st.finished = Some((
                generation,
                Arc::new(Round {
                    contributions,
                    verdict,
                }),
            ));
            st.generation += 1;
            st.arrived = 0;
            self.shared.changed.notify_all();
        } else {
            while st.generation == generation {
                if let Some(e) = &st.failure {
                    return Err(e.clone());
                }
                let missing = (0..size).find_map(|r| {
                    st.departed[r]
                        .filter(|_| st.slots[r].is_none())
                        .map(|d| (r, d))
                });
                if let Some((r, departure)) = missing {
                    let e = departure.error(r);
                    st.failure = Some(e.clone());
                    self.shared.changed.notify_all();
                    return Err(e);
                }
                st = self.shared.wait(st);
            }
        }
        let round = match &st.finished {
            Some((g, round)) if *g == generation => Arc::clone(round),
            _ => {
                return Err(CommError::Mismatch(
                    "internal: collective round was overwritten before this rank read it".into(),
                ))
            }
        };
        drop(st);
        round.verdict.clone()?;
        Ok(round)
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // No code panics while holding the lock; recover the state if a bug ever does.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'g>(&self, guard: MutexGuard<'g, State>) -> MutexGuard<'g, State> {
        self.changed
            .wait(guard)
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for LocalComm {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        let mut st = self.shared.lock();
        let departure = if panicking {
            Departure::Panicked
        } else {
            Departure::Released
        };
        st.departed[self.rank] = Some(departure);
        if panicking {
            st.first_panic.get_or_insert(self.rank);
            if st.failure.is_none() {
                st.failure = Some(departure.error(self.rank));
            }
        }
        self.shared.changed.notify_all();
    }
}

impl fmt::Debug for LocalComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalComm")
            .field("rank", &self.rank)
            .field("size", &self.shared.size)
            .finish()
    }
}

impl Group for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.round(Signature::Barrier, None).map(drop)
    }
}

impl Broadcast for LocalComm {
    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), CommError> {
        check_rank("root", root, self.size())?;
        let signature = Signature::Broadcast {
            kind: T::KIND,
            len: buf.len(),
            root,
        };
        let is_root = self.rank == root;
        let data = is_root.then(|| Box::new(buf.to_vec()) as Payload);
        let round = self.round(signature, data)?;
        if !is_root {
            buf.copy_from_slice(round.data::<T>(root)?);
        }
        Ok(())
    }
}

impl AllReduce for LocalComm {
    fn all_reduce<T: Reducible>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), CommError> {
        let signature = Signature::AllReduce {
            kind: T::KIND,
            len: buf.len(),
            op,
        };
        let round = self.round(signature, Some(Box::new(buf.to_vec())))?;
        let parts = (0..self.size())
            .map(|r| round.data::<T>(r))
            .collect::<Result<Vec<_>, _>>()?;
        reduce_in_order(op, buf, parts.into_iter());
        Ok(())
    }
}

impl AllGather for LocalComm {
    fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<(), CommError> {
        check_all_gather(send.len(), recv.len(), self.size())?;
        let signature = Signature::AllGather {
            kind: T::KIND,
            len: send.len(),
        };
        let round = self.round(signature, Some(Box::new(send.to_vec())))?;
        if !send.is_empty() {
            for (r, chunk) in recv.chunks_exact_mut(send.len()).enumerate() {
                chunk.copy_from_slice(round.data::<T>(r)?);
            }
        }
        Ok(())
    }
}

/// A rank's all-to-all contribution: its send blocks packed in destination order.
struct PackedBlocks<T> {
    data: Vec<T>,
    starts: Vec<usize>,
}

impl AllToAllV for LocalComm {
    fn all_to_all_v<T: Element>(
        &self,
        send: &[T],
        send_layout: &BlockLayout,
        recv: &mut [T],
        recv_layout: &BlockLayout,
    ) -> Result<(), CommError> {
        let size = self.size();
        send_layout.check("all_to_all_v send", size, send.len(), false)?;
        recv_layout.check("all_to_all_v receive", size, recv.len(), true)?;
        let mut packed = PackedBlocks {
            data: Vec::with_capacity(send_layout.total()),
            starts: Vec::with_capacity(size),
        };
        for q in 0..size {
            packed.starts.push(packed.data.len());
            packed.data.extend_from_slice(&send[send_layout.block(q)]);
        }
        let signature = Signature::AllToAllV {
            kind: T::KIND,
            send_counts: send_layout.counts().to_vec(),
            recv_counts: recv_layout.counts().to_vec(),
        };
        let round = self.round(signature, Some(Box::new(packed)))?;
        for r in 0..size {
            let from = round.contributions[r]
                .data
                .as_ref()
                .and_then(|d| d.downcast_ref::<PackedBlocks<T>>())
                .ok_or_else(|| {
                    CommError::Mismatch(format!("rank {r} contributed no {} blocks", T::KIND))
                })?;
            let start = from.starts[self.rank];
            let n = recv_layout.counts()[r];
            recv[recv_layout.block(r)].copy_from_slice(&from.data[start..start + n]);
        }
        Ok(())
    }
}

/// The request set of a [`LocalComm`] exchange scope; see [`Exchange`].
pub struct LocalExchange<'a, T: Element> {
    comm: &'a LocalComm,
    requests: Vec<LocalRequest<'a, T>>,
    pending: usize,
}

enum LocalRequest<'a, T> {
    /// Sent (sends complete at posting); not yet reported.
    Sent {
        peer: usize,
        tag: Tag,
        data: &'a [T],
    },
    /// Posted, waiting for its message.
    Receiving {
        peer: usize,
        tag: Tag,
        buf: &'a mut [T],
    },
    /// Filled; not yet reported.
    Arrived {
        peer: usize,
        tag: Tag,
        buf: &'a mut [T],
    },
    /// Returned to the caller (or failed).
    Done,
}

impl<T> LocalRequest<'_, T> {
    fn is_ready(&self) -> bool {
        matches!(self, Self::Sent { .. } | Self::Arrived { .. })
    }
}

impl<T: Element> fmt::Debug for LocalExchange<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalExchange")
            .field("rank", &self.comm.rank)
            .field("element", &T::KIND)
            .field("posted", &self.requests.len())
            .field("pending", &self.pending)
            .finish()
    }
}

impl<'a, T: Element> LocalExchange<'a, T> {
    /// Hands request `i` to the caller if it is ready.
    fn take_ready(&mut self, i: usize) -> Option<Completion<'a, T>> {
        let id = RequestId(i);
        let slot = self.requests.get_mut(i)?;
        if !slot.is_ready() {
            return None;
        }
        self.pending -= 1;
        match std::mem::replace(slot, LocalRequest::Done) {
            LocalRequest::Sent { peer, tag, data } => Some(Completion::Sent {
                id,
                peer,
                tag,
                data,
            }),
            LocalRequest::Arrived { peer, tag, buf } => Some(Completion::Received {
                id,
                peer,
                tag,
                data: buf,
            }),
            LocalRequest::Receiving { .. } | LocalRequest::Done => None,
        }
    }

    /// Blocks until at least one posted receive has matched a message (or fails), then copies
    /// the matched messages into their buffers outside the lock.
    fn progress(&mut self) -> Result<(), CommError> {
        let me = self.comm.rank;
        let shared = &self.comm.shared;
        let mut matched: Vec<(usize, Message)> = Vec::new();
        let mut st = shared.lock();
        loop {
            for (i, req) in self.requests.iter().enumerate() {
                if let LocalRequest::Receiving { peer, tag, .. } = *req {
                    let mailbox = &mut st.mailboxes[me];
                    if let Some(pos) = mailbox
                        .iter()
                        .position(|m| m.source == peer && m.tag == tag)
                    {
                        if let Some(m) = mailbox.remove(pos) {
                            matched.push((i, m));
                        }
                    }
                }
            }
            if !matched.is_empty() {
                break;
            }
            if let Some(e) = &st.failure {
                return Err(e.clone());
            }
            let gone = self.requests.iter().find_map(|req| match *req {
                LocalRequest::Receiving { peer, .. } => st.departed[peer].map(|d| d.error(peer)),
                _ => None,
            });
            if let Some(e) = gone {
                return Err(e);
            }
            st = shared.wait(st);
        }
        drop(st);
        let mut first_error = None;
        for (i, message) in matched {
            if let Err(e) = self.fill(i, message) {
                self.pending -= 1;
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Copies a matched message into request `i`'s buffer, marking it arrived (or done on error).
    fn fill(&mut self, i: usize, message: Message) -> Result<(), CommError> {
        let LocalRequest::Receiving { peer, tag, buf } =
            std::mem::replace(&mut self.requests[i], LocalRequest::Done)
        else {
            return Err(CommError::InvalidRequest { id: i });
        };
        if message.kind != T::KIND {
            return Err(CommError::MessageType {
                peer,
                tag,
                expected: T::KIND,
                actual: message.kind,
            });
        }
        let data = message
            .payload
            .downcast_ref::<Vec<T>>()
            .ok_or(CommError::MessageType {
                peer,
                tag,
                expected: T::KIND,
                actual: message.kind,
            })?;
        if data.len() != buf.len() {
            return Err(CommError::MessageLength {
                peer,
                tag,
                expected: buf.len(),
                actual: data.len(),
            });
        }
        buf.copy_from_slice(data);
        self.requests[i] = LocalRequest::Arrived { peer, tag, buf };
        Ok(())
    }

    fn check_id(&self, id: RequestId) -> Result<(), CommError> {
        match self.requests.get(id.0) {
            Some(LocalRequest::Done) | None => Err(CommError::InvalidRequest { id: id.0 }),
            Some(_) => Ok(()),
        }
    }
}

impl<'a, T: Element> Exchange<'a, T> for LocalExchange<'a, T> {
    fn isend(&mut self, dest: usize, tag: Tag, buf: &'a [T]) -> Result<RequestId, CommError> {
        check_rank("destination", dest, self.comm.size())?;
        check_tag(tag)?;
        let message = Message {
            source: self.comm.rank,
            tag,
            kind: T::KIND,
            payload: Box::new(buf.to_vec()),
        };
        let shared = &self.comm.shared;
        let mut st = shared.lock();
        if let Some(e) = &st.failure {
            return Err(e.clone());
        }
        st.mailboxes[dest].push_back(message);
        drop(st);
        shared.changed.notify_all();
        self.requests.push(LocalRequest::Sent {
            peer: dest,
            tag,
            data: buf,
        });
        self.pending += 1;
        Ok(RequestId(self.requests.len() - 1))
    }

    fn irecv(&mut self, source: usize, tag: Tag, buf: &'a mut [T]) -> Result<RequestId, CommError> {
        check_rank("source", source, self.comm.size())?;
        check_tag(tag)?;
        self.requests.push(LocalRequest::Receiving {
            peer: source,
            tag,
            buf,
        });
        self.pending += 1;
        Ok(RequestId(self.requests.len() - 1))
    }

    fn wait(&mut self, id: RequestId) -> Result<Completion<'a, T>, CommError> {
        self.check_id(id)?;
        loop {
            if let Some(done) = self.take_ready(id.0) {
                return Ok(done);
            }
            match self.requests.get(id.0) {
                Some(LocalRequest::Receiving { .. }) => self.progress()?,
                _ => return Err(CommError::InvalidRequest { id: id.0 }),
            }
        }
    }

    fn test(&mut self, id: RequestId) -> Result<Option<Completion<'a, T>>, CommError> {
        self.check_id(id)?;
        if !self.requests[id.0].is_ready() {
            // Match whatever has arrived, without blocking: progress() returns at once when
            // a message is there, so only call it in that case.
            let me = self.comm.rank;
            let has_message = {
                let st = self.comm.shared.lock();
                self.requests.iter().any(|req| match *req {
                    LocalRequest::Receiving { peer, tag, .. } => st.mailboxes[me]
                        .iter()
                        .any(|m| m.source == peer && m.tag == tag),
                    _ => false,
                })
            };
            if has_message {
                self.progress()?;
            }
        }
        if let Some(done) = self.take_ready(id.0) {
            return Ok(Some(done));
        }
        match self.requests.get(id.0) {
            Some(LocalRequest::Receiving { .. }) => Ok(None),
            _ => Err(CommError::InvalidRequest { id: id.0 }),
        }
    }

    fn wait_any(&mut self) -> Result<Option<Completion<'a, T>>, CommError> {
        loop {
            if let Some(i) = self.requests.iter().position(LocalRequest::is_ready) {
                return Ok(self.take_ready(i));
            }
            if self.pending == 0 {
                return Ok(None);
            }
            self.progress()?;
        }
    }

    fn pending(&self) -> usize {
        self.pending
    }
}

impl PointToPoint for LocalComm {
    type Exchange<'a, T: Element> = LocalExchange<'a, T>;

    fn exchange<'a, T, R, F>(&'a self, f: F) -> Result<R, CommError>
    where
        T: Element,
        F: FnOnce(&mut LocalExchange<'a, T>) -> Result<R, CommError>,
    {
        let mut ex = LocalExchange {
            comm: self,
            requests: Vec::new(),
            pending: 0,
        };
        // Sends were copied at posting and receives only hold borrows, so nothing is in flight
        // that could outlive the buffers: an error or panic simply drops the pending receives.
        let out = f(&mut ex)?;
        ex.wait_all()?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
