//! `nccl-selftest`: checks dist-comm's NCCL backend on GPUs — broadcast from every root,
//! all-reduce (sum, max, min) and the grouped send/receive of the halo exchange (separate
//! blocks through the safe API, one contiguous halo buffer through the raw API, repeated
//! rounds, empty blocks, sends to self) on f32 and f64 device buffers, against values
//! computed on the host.
//!
//! ```text
//! mpirun -n 2 nccl-selftest           # feature `mpi`: NcclComm::new over MPI_COMM_WORLD
//! nccl-selftest --spawn 2             # no MPI: starts 2 copies of itself, the id in their env
//! nccl-selftest --spawn 2 --device 0  # every rank on device 0 (default: local rank mod count)
//! nccl-selftest --spawn 2 --timeout 60  # stop the ranks after 60 s (default 240)
//! ```
//!
//! Every rank prints `nccl-selftest: rank R of P: N checks passed (...)`, or
//! `skipping: no CUDA device (...)` and exits 0 when there is no driver, device or NCCL
//! library — exit 1 instead when `DISTSPMM_REQUIRE_GPU` is set. Any failed check exits 1.
//!
//! NCCL refuses two ranks of one communicator on one GPU of one host. With fewer GPUs than
//! ranks, `--spawn` gives each rank its own `NCCL_HOSTID` (NCCL then connects them through
//! its socket transport, on the interface it picks or `NCCL_SOCKET_IFNAME`: correct, not
//! fast); under `mpirun`, set it per rank in the launch (`distspmm-cuda/gpu-check.sh` does).

use std::fmt::Debug;
use std::process::{Child, Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};
use dist_comm::nccl::nccl_version;
use dist_comm::{CommError, NcclComm, NcclUniqueId, RawDeviceBuffer, ReduceOp, Reducible};

/// Environment of a `--spawn` child: `RANK,SIZE,HEX-ID`.
const CHILD_ENV: &str = "DISTSPMM_NCCL_SELFTEST_CHILD";
/// How long `--spawn` waits for its children unless `--timeout` says otherwise.
const SPAWN_TIMEOUT: Duration = Duration::from_secs(240);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match Options::parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("nccl-selftest: {e}\nusage: nccl-selftest [--spawn P [--timeout SECS]] [--device N]   (or under mpirun with the `mpi` feature)");
            return ExitCode::from(2);
        }
    };
    if let Ok(child) = std::env::var(CHILD_ENV) {
        return run_child(&child, options.device);
    }
    match options.spawn {
        Some(p) => spawn(p, options.device, options.timeout),
        None => run_mpi(options.device),
    }
}

struct Options {
    spawn: Option<usize>,
    device: Option<usize>,
    timeout: Duration,
}

impl Options {
    fn parse(args: &[String]) -> Result<Options, String> {
        let mut o = Options {
            spawn: None,
            device: None,
            timeout: SPAWN_TIMEOUT,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut number = |what: &str| -> Result<usize, String> {
                it.next()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| format!("{what} needs a number"))
            };
            match a.as_str() {
                "--spawn" => o.spawn = Some(number("--spawn")?).filter(|&p| p > 0),
                "--device" => o.device = Some(number("--device")?),
                "--timeout" => o.timeout = Duration::from_secs(number("--timeout")? as u64),
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(o)
    }
}

/// Reports a missing device: a skip, or a failure when the GPU check requires one.
fn no_device(rank: &str, e: &CommError) -> ExitCode {
    if std::env::var_os("DISTSPMM_REQUIRE_GPU").is_some() {
        eprintln!("nccl-selftest: {rank}: DISTSPMM_REQUIRE_GPU is set but: {e}");
        return ExitCode::FAILURE;
    }
    println!("nccl-selftest: {rank}: skipping: no CUDA device ({e})");
    ExitCode::SUCCESS
}

/// Runs the checks on a joined communicator and reports.
fn report(comm: &NcclComm, mode: &str) -> ExitCode {
    let who = format!("rank {} of {}", comm.rank(), comm.size());
    let version = nccl_version().map_or_else(|e| e.to_string(), |(a, b, c)| format!("{a}.{b}.{c}"));
    let mut checks = Checks::default();
    if let Err(e) = run_checks(comm, &mut checks) {
        eprintln!("nccl-selftest: {who}: FAILED ({mode}): {e}");
        return ExitCode::FAILURE;
    }
    for f in &checks.failures {
        eprintln!("nccl-selftest: {who}: FAILED ({mode}): {f}");
    }
    if !checks.failures.is_empty() {
        return ExitCode::FAILURE;
    }
    println!(
        "nccl-selftest: {who}: {} checks passed ({mode}, device {}, NCCL {version}, {})",
        checks.passed,
        comm.ordinal(),
        comm.library()
    );
    ExitCode::SUCCESS
}

#[cfg(feature = "mpi")]
fn run_mpi(device: Option<usize>) -> ExitCode {
    use dist_comm::{DeviceSelect, Group, MpiComm};
    let mpi = match MpiComm::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("nccl-selftest: cannot start MPI: {e}");
            return ExitCode::FAILURE;
        }
    };
    let who = format!("rank {} of {}", mpi.rank(), mpi.size());
    let select = device.map_or(DeviceSelect::LocalRank, DeviceSelect::Ordinal);
    match NcclComm::new(&mpi, select) {
        Ok(comm) => report(&comm, "mpi"),
        Err(e @ CommError::NoDevice(_)) => no_device(&who, &e),
        Err(e) => {
            eprintln!("nccl-selftest: {who}: cannot set up NCCL: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_device: Option<usize>) -> ExitCode {
    eprintln!("nccl-selftest: built without the `mpi` feature: use --spawn P");
    ExitCode::from(2)
}

/// Starts `p` copies of this program as ranks of one communicator and waits for them.
fn spawn(p: usize, device: Option<usize>, timeout: Duration) -> ExitCode {
    let count = match cuda_probe::device_count() {
        Ok(n) if n > 0 => n,
        Ok(_) => {
            return no_device(
                "launcher",
                &CommError::NoDevice("the driver reports no device".into()),
            )
        }
        Err(e) => return no_device("launcher", &e.into()),
    };
    let id = match NcclUniqueId::new() {
        Ok(id) => id,
        Err(e @ CommError::NoDevice(_)) => return no_device("launcher", &e),
        Err(e) => {
            eprintln!("nccl-selftest: launcher: {e}");
            return ExitCode::FAILURE;
        }
    };
    let hex: String = id.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
    let shared = device.is_some() || count < p;
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("nccl-selftest: launcher: cannot find its own executable: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut children: Vec<Child> = Vec::with_capacity(p);
    for rank in 0..p {
        let mut cmd = Command::new(&exe);
        cmd.env(CHILD_ENV, format!("{rank},{p},{hex}"));
        if let Some(d) = device {
            cmd.args(["--device", &d.to_string()]);
        }
        if shared && std::env::var_os("NCCL_HOSTID").is_none() {
            // One GPU for several ranks: NCCL must see them as separate hosts.
            cmd.env("NCCL_HOSTID", format!("nccl-selftest-rank-{rank}"));
        }
        match cmd.spawn() {
            Ok(c) => children.push(c),
            Err(e) => {
                eprintln!("nccl-selftest: launcher: cannot start rank {rank}: {e}");
                kill_all(&mut children);
                return ExitCode::FAILURE;
            }
        }
    }
    let start = Instant::now();
    let mut pending: Vec<usize> = (0..p).collect();
    let mut ok = true;
    while !pending.is_empty() {
        let mut still = Vec::with_capacity(pending.len());
        for r in pending {
            match children[r].try_wait() {
                Ok(Some(status)) if status.success() => {}
                Ok(Some(status)) => {
                    eprintln!("nccl-selftest: launcher: rank {r} exited with {status}");
                    ok = false;
                }
                Ok(None) => still.push(r),
                Err(e) => {
                    eprintln!("nccl-selftest: launcher: waiting for rank {r}: {e}");
                    ok = false;
                }
            }
        }
        pending = still;
        if !ok || start.elapsed() > timeout {
            if !pending.is_empty() {
                eprintln!(
                    "nccl-selftest: launcher: stopping ranks {pending:?} ({})",
                    if ok { "timed out" } else { "a rank failed" }
                );
            }
            kill_all(&mut children);
            return ExitCode::FAILURE;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ExitCode::SUCCESS
}

fn kill_all(children: &mut [Child]) {
    for c in children.iter_mut() {
        if matches!(c.try_wait(), Ok(None)) {
            // Best effort: the child may exit on its own between the two calls.
            let _ = c.kill();
        }
        let _ = c.wait();
    }
}

/// A `--spawn` child: joins with the id from its environment.
fn run_child(spec: &str, device: Option<usize>) -> ExitCode {
    let parsed = (|| {
        let mut parts = spec.splitn(3, ',');
        let rank: usize = parts.next()?.parse().ok()?;
        let size: usize = parts.next()?.parse().ok()?;
        let hex = parts.next()?;
        if hex.len() != 2 * NcclUniqueId::BYTES {
            return None;
        }
        let mut bytes = [0u8; NcclUniqueId::BYTES];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some((rank, size, NcclUniqueId::from_bytes(bytes)))
    })();
    let Some((rank, size, id)) = parsed else {
        eprintln!("nccl-selftest: malformed {CHILD_ENV}");
        return ExitCode::from(2);
    };
    let who = format!("rank {rank} of {size}");
    let ordinal = match device {
        Some(d) => d,
        None => match cuda_probe::device_count() {
            Ok(n) if n > 0 => rank % n,
            Ok(_) => {
                return no_device(
                    &who,
                    &CommError::NoDevice("the driver reports no device".into()),
                )
            }
            Err(e) => return no_device(&who, &e.into()),
        },
    };
    match NcclComm::from_unique_id(&id, rank, size, ordinal) {
        Ok(comm) => report(&comm, "spawn"),
        Err(e @ CommError::NoDevice(_)) => no_device(&who, &e),
        Err(e) => {
            eprintln!("nccl-selftest: {who}: cannot join NCCL: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Passed checks and the descriptions of failed ones.
#[derive(Default)]
struct Checks {
    passed: usize,
    failures: Vec<String>,
}

impl Checks {
    fn expect<T: Value>(&mut self, what: &str, got: &[T], want: &[f64], tolerance: &[f64]) {
        if got.len() != want.len() {
            self.failures.push(format!(
                "{what}: {} elements, expected {}",
                got.len(),
                want.len()
            ));
            return;
        }
        let bad = got
            .iter()
            .zip(want)
            .zip(tolerance.iter().chain(std::iter::repeat(&0.0)))
            .position(|((g, w), tol)| (g.to_f64() - w).abs() > *tol);
        match bad {
            None => self.passed += 1,
            Some(i) => self.failures.push(format!(
                "{what}: element {i} is {:?}, expected {} (±{})",
                got[i],
                want[i],
                tolerance.get(i).copied().unwrap_or(0.0)
            )),
        }
    }
}

/// The element types checked.
trait Value: Reducible + DeviceRepr + ValidAsZeroBits + Debug {
    const NAME: &'static str;
    const EPSILON: f64;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
}

impl Value for f32 {
    const NAME: &'static str = "f32";
    const EPSILON: f64 = f32::EPSILON as f64;
    #[allow(
        clippy::cast_possible_truncation,
        reason = "deliberate: rounding an f64 test value to the nearest f32"
    )]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
}

impl Value for f64 {
    const NAME: &'static str = "f64";
    const EPSILON: f64 = f64::EPSILON;
    fn from_f64(v: f64) -> Self {
        v
    }
    fn to_f64(self) -> f64 {
        self
    }
}

/// Exactly representable in f32 (below 2^24): distinct per (tag, i).
fn pattern(tag: usize, i: usize) -> f64 {
    ((tag * 7919 + i * 13) % 1_000_003) as f64
}

/// Deterministic uniform values in [-1, 1) per (rank, i) (splitmix64).
fn noise(rank: usize, i: usize) -> f64 {
    let mut z = (rank as u64) << 40 ^ i as u64 ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// Halo block length from `src` to `dst`: some empty, some long, self-sends included.
fn block_len(src: usize, dst: usize) -> usize {
    ((src * 5 + dst * 3 + 1) % 4) * 333 + (src + dst) % 3
}

const LENGTHS: [usize; 3] = [1, 1007, (1 << 20) + 3];

fn upload<T: Value>(stream: &Arc<CudaStream>, host: &[f64]) -> Result<CudaSlice<T>, CommError> {
    let host: Vec<T> = host.iter().map(|&v| T::from_f64(v)).collect();
    // A zero-length device allocation is refused; keep one padding element.
    let host = if host.is_empty() {
        vec![T::from_f64(0.0)]
    } else {
        host
    };
    stream.clone_htod(&host).map_err(cuda("cuMemcpyHtoDAsync"))
}

fn download<T: Value>(comm: &NcclComm, buf: &impl DevicePtr<T>) -> Result<Vec<T>, CommError> {
    comm.synchronize()?;
    comm.stream().clone_dtoh(buf).map_err(cuda("cuMemcpyDtoH"))
}

fn cuda(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> CommError {
    move |e| CommError::Cuda {
        call,
        message: e.to_string(),
    }
}

fn run_checks(comm: &NcclComm, checks: &mut Checks) -> Result<(), CommError> {
    check_type::<f32>(comm, checks)?;
    check_type::<f64>(comm, checks)?;
    // Argument errors are reported before anything is queued.
    let mut one = upload::<f32>(comm.stream(), &[1.0])?;
    match comm.broadcast(&mut one, comm.size()) {
        Err(CommError::InvalidRank { what: "root", .. }) => checks.passed += 1,
        other => checks
            .failures
            .push(format!("broadcast from root P: {other:?}")),
    }
    let peer = comm.size();
    match comm.halo_exchange::<f32, CudaSlice<f32>, CudaSlice<f32>>(&[(peer, &one)], &mut []) {
        Err(CommError::InvalidRank {
            what: "destination",
            ..
        }) => checks.passed += 1,
        other => checks.failures.push(format!("send to rank P: {other:?}")),
    }
    Ok(())
}

fn check_type<T: Value>(comm: &NcclComm, checks: &mut Checks) -> Result<(), CommError> {
    let (me, p) = (comm.rank(), comm.size());
    let stream = comm.stream().clone();
    let name = T::NAME;

    // Broadcast from every root, safe API.
    for root in 0..p {
        for len in LENGTHS {
            let mine: Vec<f64> = (0..len).map(|i| pattern(me, i)).collect();
            let mut buf = upload::<T>(&stream, &mine)?;
            comm.broadcast(&mut buf, root)?;
            let want: Vec<f64> = (0..len).map(|i| pattern(root, i)).collect();
            checks.expect(
                &format!("{name} broadcast root {root} len {len}"),
                &download(comm, &buf)?,
                &want,
                &[],
            );
        }
    }

    // Broadcast through the raw API, into the middle of a larger buffer.
    let len = 4099;
    let mine: Vec<f64> = (0..len + 2).map(|i| pattern(me + 100, i)).collect();
    let mut buf = upload::<T>(&stream, &mine)?;
    let root = p - 1;
    {
        let (base, _guard) = buf.device_ptr_mut(&stream);
        let inner = RawDeviceBuffer {
            ptr: base + size_of::<T>() as u64,
            len,
        };
        // SAFETY: `inner` lies inside `buf` (len + 2 elements), which is alive and used only
        // on the communicator's stream until the download below synchronises.
        unsafe { comm.broadcast_raw::<T>(inner, root)? };
    }
    let mut want = mine.clone();
    for (i, w) in want.iter_mut().enumerate().take(len + 1).skip(1) {
        *w = pattern(root + 100, i);
    }
    checks.expect(
        &format!("{name} raw broadcast"),
        &download(comm, &buf)?,
        &want,
        &[],
    );

    // All-reduce: exact integer-valued sums, max and min, and a random sum.
    let total: usize = (1..=p).sum();
    for len in LENGTHS {
        let mine: Vec<f64> = (0..len).map(|i| ((me + 1) * (i % 251)) as f64).collect();
        let mut buf = upload::<T>(&stream, &mine)?;
        comm.all_reduce_sum(&mut buf)?;
        let want: Vec<f64> = (0..len).map(|i| (total * (i % 251)) as f64).collect();
        checks.expect(
            &format!("{name} all-reduce sum len {len}"),
            &download(comm, &buf)?,
            &want,
            &[],
        );
    }
    for (op, pick) in [
        (ReduceOp::Max, f64::max as fn(f64, f64) -> f64),
        (ReduceOp::Min, f64::min),
    ] {
        let len = 10_007;
        let mine: Vec<f64> = (0..len).map(|i| pattern(me, i)).collect();
        let mut buf = upload::<T>(&stream, &mine)?;
        comm.all_reduce(&mut buf, op)?;
        let want: Vec<f64> = (0..len)
            .map(|i| (0..p).map(|r| pattern(r, i)).reduce(pick).unwrap_or(0.0))
            .collect();
        checks.expect(
            &format!("{name} all-reduce {op:?}"),
            &download(comm, &buf)?,
            &want,
            &[],
        );
    }
    let len = 65_537;
    let mine: Vec<f64> = (0..len)
        .map(|i| T::from_f64(noise(me, i)).to_f64())
        .collect();
    let mut buf = upload::<T>(&stream, &mine)?;
    comm.all_reduce_sum(&mut buf)?;
    let inputs = |i: usize| (0..p).map(move |r| T::from_f64(noise(r, i)).to_f64());
    let want: Vec<f64> = (0..len).map(|i| inputs(i).sum()).collect();
    // Any summation order is within (P - 1) roundings of the exact sum of |x|.
    let tol: Vec<f64> = (0..len)
        .map(|i| p as f64 * T::EPSILON * inputs(i).map(f64::abs).sum::<f64>())
        .collect();
    checks.expect(
        &format!("{name} all-reduce sum of random values"),
        &download(comm, &buf)?,
        &want,
        &tol,
    );

    // Halo exchange, safe API: one block per peer (self included), empty blocks too.
    let sent = |src: usize, dst: usize, round: usize| -> Vec<f64> {
        (0..block_len(src, dst))
            .map(|i| pattern(src * p + dst + round * 1000, i))
            .collect()
    };
    let send_bufs = (0..p)
        .map(|dst| upload::<T>(&stream, &sent(me, dst, 0)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut recv_bufs = (0..p)
        .map(|src| upload::<T>(&stream, &vec![-1.0; block_len(src, me)]))
        .collect::<Result<Vec<_>, _>>()?;
    {
        let send_views: Vec<_> = send_bufs
            .iter()
            .enumerate()
            .map(|(dst, b)| b.slice(..block_len(me, dst)))
            .collect();
        let mut recv_views: Vec<_> = recv_bufs
            .iter_mut()
            .enumerate()
            .map(|(src, b)| b.slice_mut(..block_len(src, me)))
            .collect();
        let sends: Vec<_> = send_views.iter().enumerate().collect();
        let mut recvs: Vec<_> = recv_views.iter_mut().enumerate().collect();
        comm.halo_exchange(&sends, &mut recvs)?;
    }
    for (src, b) in recv_bufs.iter().enumerate() {
        let got = download(comm, b)?;
        let n = block_len(src, me);
        checks.expect(
            &format!("{name} halo block from {src}"),
            &got[..n],
            &sent(src, me, 0),
            &[],
        );
    }

    // Halo exchange, raw API: one contiguous halo buffer (blocks by source, the SpMM layout),
    // reused for three rounds with new contents.
    let offsets: Vec<usize> = std::iter::once(0)
        .chain((0..p).scan(0, |acc, src| {
            *acc += block_len(src, me);
            Some(*acc)
        }))
        .collect();
    let mut halo = upload::<T>(&stream, &vec![-1.0; offsets[p]])?;
    for round in 1..=3 {
        let outgoing: Vec<f64> = (0..p).flat_map(|dst| sent(me, dst, round)).collect();
        let out = upload::<T>(&stream, &outgoing)?;
        {
            let size = size_of::<T>() as u64;
            let (out_ptr, _r) = out.device_ptr(&stream);
            let (halo_ptr, _w) = halo.device_ptr_mut(&stream);
            let mut at = 0u64;
            let sends: Vec<(usize, RawDeviceBuffer)> = (0..p)
                .map(|dst| {
                    let len = block_len(me, dst);
                    let block = RawDeviceBuffer {
                        ptr: out_ptr + at * size,
                        len,
                    };
                    at += len as u64;
                    (dst, block)
                })
                .collect();
            let recvs: Vec<(usize, RawDeviceBuffer)> = (0..p)
                .map(|src| {
                    let block = RawDeviceBuffer {
                        ptr: halo_ptr + offsets[src] as u64 * size,
                        len: block_len(src, me),
                    };
                    (src, block)
                })
                .collect();
            // SAFETY: every block lies inside `out` or `halo` (offsets from the same lengths);
            // receive blocks are disjoint ranges of `halo`, which no send block touches; both
            // buffers stay alive and on this stream until the download synchronises.
            unsafe { comm.halo_exchange_raw::<T>(&sends, &recvs)? };
        }
        let want: Vec<f64> = (0..p).flat_map(|src| sent(src, me, round)).collect();
        let got = download(comm, &halo)?;
        checks.expect(
            &format!("{name} raw halo round {round}"),
            &got[..offsets[p]],
            &want,
            &[],
        );
    }
    Ok(())
}
