//! Partitions a graph with PT-Scotch under `mpirun` and prints one JSON line per rank: the
//! quality (edge cut, part weights), a digest of the rank's parts, the time of the call and the
//! rank's peak RSS, or the error. Each rank builds only its contiguous range of vertices.
//!
//! ```text
//! mpirun -n P ptscotch-selftest --graph GRAPH --parts K [--imbalance X] [--seed S]
//!        [--strategy auto|quality|balance|speed|default|skewed] [--vertex-weights]
//!        [--bad KIND [--bad-rank R]]
//! GRAPH: grid:RxC (5-point mesh) | powerlaw:N:SEED (skewed random graph, symmetric)
//!        | metis:FILE (a METIS .graph without weights, as `distspmm partition
//!        --write-metis-graph` writes it; every rank reads only its lines)
//! KIND:  offsets | id | self-loop | duplicate | asymmetric | zero-weight | parts0 | disagree
//!        (spoils rank R's input, the last rank by default)
//! ```
//!
//! Exits 0 when the call returned (Ok or an error, printed), 1 on bad usage.

use std::io::{BufRead, BufReader};
use std::time::Instant;

use dist_comm::{Group, MpiComm};
use distspmm_ptscotch::{
    choose_strategy, evaluate, partition, DistGraph, Options, PtScotchError, Strategy,
};

/// This rank's rows of the graph.
struct Rows {
    vtxdist: Vec<u64>,
    xadj: Vec<u64>,
    adjncy: Vec<u64>,
}

/// Contiguous near-equal vertex ranges.
fn ranges(n: u64, ranks: usize) -> Vec<u64> {
    (0..=ranks as u64).map(|r| n * r / ranks as u64).collect()
}

fn grid(rows: u64, cols: u64, rank: usize, ranks: usize) -> Rows {
    let vtxdist = ranges(rows * cols, ranks);
    let (mut xadj, mut adjncy) = (vec![0u64], Vec::new());
    for u in vtxdist[rank]..vtxdist[rank + 1] {
        let (r, c) = (u / cols, u % cols);
        if r > 0 {
            adjncy.push(u - cols);
        }
        if c > 0 {
            adjncy.push(u - 1);
        }
        if c + 1 < cols {
            adjncy.push(u + 1);
        }
        if r + 1 < rows {
            adjncy.push(u + cols);
        }
        xadj.push(adjncy.len() as u64);
    }
    Rows {
        vtxdist,
        xadj,
        adjncy,
    }
}

/// splitmix64.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A skewed random graph: every vertex draws 4 ends, low ids far likelier (id = N·x³), plus a
/// path through all vertices so the graph is connected; symmetrised, without loops or
/// duplicates. Every rank draws all edges (small test graphs) and keeps its rows.
fn powerlaw(n: u64, seed: u64, rank: usize, ranks: usize) -> Rows {
    let vtxdist = ranges(n, ranks);
    let (first, end) = (vtxdist[rank], vtxdist[rank + 1]);
    let at = |a: u64| usize::try_from(a - first).unwrap_or(usize::MAX);
    let mut lists: Vec<Vec<u64>> = vec![Vec::new(); at(end)];
    let mut add = |u: u64, v: u64| {
        if u != v {
            for (a, b) in [(u, v), (v, u)] {
                if (first..end).contains(&a) {
                    lists[at(a)].push(b);
                }
            }
        }
    };
    let mut state = seed;
    for u in 0..n {
        if u + 1 < n {
            add(u, u + 1);
        }
        for _ in 0..4 {
            let x = (next(&mut state) >> 11) as f64 / (1u64 << 53) as f64;
            #[allow(clippy::cast_possible_truncation, reason = "x³·n is in [0, n)")]
            let v = ((x * x * x) * n as f64) as u64;
            add(u, v.min(n - 1));
        }
    }
    let (mut xadj, mut adjncy) = (vec![0u64], Vec::new());
    for mut list in lists {
        list.sort_unstable();
        list.dedup();
        adjncy.extend_from_slice(&list);
        xadj.push(adjncy.len() as u64);
    }
    Rows {
        vtxdist,
        xadj,
        adjncy,
    }
}

fn metis(path: &str, rank: usize, ranks: usize) -> Result<Rows, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open {path}: {e}"))?;
    let mut lines = BufReader::with_capacity(1 << 20, file)
        .lines()
        .map(|l| l.map_err(|e| format!("cannot read {path}: {e}")))
        .filter(|l| l.as_ref().map_or(true, |l| !l.starts_with('%')));
    let header = lines.next().ok_or("empty METIS file")??;
    let fields: Vec<u64> = header
        .split_whitespace()
        .map(|f| f.parse().map_err(|_| format!("bad header {header:?}")))
        .collect::<Result<_, _>>()?;
    if fields.len() > 2 && fields[2] != 0 {
        return Err(format!(
            "{path}: weighted METIS graphs (fmt {}) are not read here",
            fields[2]
        ));
    }
    let n = *fields.first().ok_or("bad header")?;
    let vtxdist = ranges(n, ranks);
    let (first, end) = (vtxdist[rank], vtxdist[rank + 1]);
    let (mut xadj, mut adjncy) = (vec![0u64], Vec::new());
    for (u, line) in (0..end).zip(lines) {
        let line = line?;
        if u < first {
            continue;
        }
        for f in line.split_whitespace() {
            let v: u64 = f
                .parse()
                .map_err(|_| format!("bad id {f:?} on vertex {u}"))?;
            adjncy.push(v.checked_sub(1).ok_or("METIS ids start at 1")?);
        }
        xadj.push(adjncy.len() as u64);
    }
    if xadj.len() as u64 != end - first + 1 {
        return Err(format!("{path} ends before vertex {end}"));
    }
    Ok(Rows {
        vtxdist,
        xadj,
        adjncy,
    })
}

/// Peak resident set of this process (VmHWM), in KiB.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

struct Args {
    graph: String,
    options: Options,
    vertex_weights: bool,
    bad: Option<String>,
    bad_rank: Option<usize>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        graph: String::new(),
        options: Options::new(0),
        vertex_weights: false,
        bad: None,
        bad_rank: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let number = |v: String| v.parse::<usize>().map_err(|_| format!("bad number {v:?}"));
        match flag.as_str() {
            "--graph" => args.graph = value()?,
            "--parts" => args.options.parts = number(value()?)?,
            "--seed" => args.options.seed = number(value()?)? as u64,
            "--imbalance" => {
                let v = value()?;
                args.options.imbalance = v.parse().map_err(|_| format!("bad imbalance {v:?}"))?;
            }
            "--strategy" => {
                args.options.strategy = match value()?.as_str() {
                    "quality" => Strategy::Quality,
                    "balance" => Strategy::Balance,
                    "speed" => Strategy::Speed,
                    "default" => Strategy::Default,
                    "skewed" => Strategy::Skewed,
                    "auto" => Strategy::Auto,
                    other => return Err(format!("unknown strategy {other:?}")),
                }
            }
            "--vertex-weights" => args.vertex_weights = true,
            "--bad" => args.bad = Some(value()?),
            "--bad-rank" => args.bad_rank = Some(number(value()?)?),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.graph.is_empty() {
        return Err("--graph is required".into());
    }
    Ok(args)
}

fn load(graph: &str, rank: usize, ranks: usize) -> Result<Rows, String> {
    let spec: Vec<&str> = graph.split(':').collect();
    let number = |s: &str| {
        s.parse::<u64>()
            .map_err(|_| format!("bad number {s:?} in {graph}"))
    };
    match spec.as_slice() {
        ["grid", dims] => {
            let (r, c) = dims.split_once('x').ok_or("grid:RxC")?;
            Ok(grid(number(r)?, number(c)?, rank, ranks))
        }
        ["powerlaw", n, seed] => Ok(powerlaw(number(n)?, number(seed)?, rank, ranks)),
        ["metis", path] => metis(path, rank, ranks),
        _ => Err(format!("unknown graph {graph:?}")),
    }
}

/// Spoils this rank's input the way `kind` says.
fn spoil(kind: &str, rank: usize, rows: &mut Rows, weights: &mut Vec<u64>, options: &mut Options) {
    let n = rows.vtxdist[rows.vtxdist.len() - 1];
    let first = rows.vtxdist[rank];
    match kind {
        "offsets" => {
            let m = rows.xadj.len();
            rows.xadj.swap(1, m - 2);
        }
        "id" => rows.adjncy[0] = n,
        "self-loop" => rows.adjncy[0] = first,
        "duplicate" => rows.adjncy[1] = rows.adjncy[0],
        "asymmetric" => {
            // Re-aim vertex `first`'s first arc at a vertex far away that it does not list.
            let degree = usize::try_from(rows.xadj[1]).unwrap_or(0);
            let own = &rows.adjncy[..degree];
            let far = (0..n)
                .map(|k| (first + n / 2 + k) % n)
                .find(|v| *v != first && !own.contains(v))
                .unwrap_or(0);
            rows.adjncy[0] = far;
            let list = &mut rows.adjncy[..degree];
            list.sort_unstable();
        }
        "zero-weight" => {
            if weights.is_empty() {
                weights.resize(rows.xadj.len() - 1, 1);
            }
            weights[0] = 0;
        }
        "parts0" => options.parts = 0,
        "disagree" => options.seed ^= 1,
        _ => {}
    }
}

fn json_error(rank: usize, ranks: usize, e: &PtScotchError) -> String {
    let kind = match e {
        PtScotchError::Input { kind, .. } => format!("{kind:?}"),
        PtScotchError::Partitioner { .. } => "Partitioner".into(),
        PtScotchError::NumSize { .. } => "NumSize".into(),
        PtScotchError::Comm(_) => "Comm".into(),
    };
    let message = e.to_string().replace('\\', "\\\\").replace('"', "\\\"");
    format!(r#"{{"rank":{rank},"ranks":{ranks},"ok":false,"kind":"{kind}","error":"{message}"}}"#)
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("error: {e}");
            }
            eprintln!("usage: mpirun -n P ptscotch-selftest --graph grid:RxC|powerlaw:N:SEED|metis:FILE --parts K [--imbalance X] [--seed S] [--strategy auto|quality|balance|speed|default|skewed] [--vertex-weights] [--bad KIND [--bad-rank R]]");
            std::process::exit(1);
        }
    };
    let comm = match MpiComm::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let (rank, ranks) = (comm.rank(), comm.size());
    let mut rows = match load(&args.graph, rank, ranks) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: rank {rank}: {e}");
            comm.abort(1);
        }
    };
    let mut weights: Vec<u64> = if args.vertex_weights {
        rows.xadj.windows(2).map(|w| w[1] - w[0] + 1).collect()
    } else {
        Vec::new()
    };
    let mut options = args.options;
    if let Some(kind) = &args.bad {
        if args.bad_rank.unwrap_or(ranks - 1) == rank {
            spoil(kind, rank, &mut rows, &mut weights, &mut options);
        }
    }
    let mut graph = DistGraph::new(&rows.vtxdist, &rows.xadj, &rows.adjncy);
    if !weights.is_empty() {
        graph = graph.with_vertex_weights(&weights);
    }
    let chosen = choose_strategy(&comm, &graph, options.strategy).unwrap_or(options.strategy);
    let start = Instant::now();
    let result = partition(&comm, &graph, &options);
    let seconds = start.elapsed().as_secs_f64();
    let line = match result.and_then(|parts| {
        let quality = evaluate(&comm, &graph, &parts, options.parts)?;
        Ok((parts, quality))
    }) {
        Ok((parts, quality)) => {
            let digest = xxhash_rust::xxh3::xxh3_64(
                &parts
                    .iter()
                    .flat_map(|p| p.to_le_bytes())
                    .collect::<Vec<u8>>(),
            );
            let max_vertex_weight = reduce(
                &comm,
                weights.iter().copied().max().unwrap_or(1),
                dist_comm::ReduceOp::Max,
            );
            let edges = reduce(&comm, rows.adjncy.len() as u64, dist_comm::ReduceOp::Sum) / 2;
            format!(
                r#"{{"rank":{rank},"ranks":{ranks},"ok":true,"vertices":{},"edges":{edges},"local_vertices":{},"parts":{},"edge_cut":{},"part_weights":{:?},"imbalance":{:.5},"max_vertex_weight":{max_vertex_weight},"digest":"{digest:016x}","strategy":"{chosen:?}","seconds":{seconds:.3},"peak_rss_kib":{},"scotch_version":"{:?}"}}"#,
                rows.vtxdist[ranks],
                parts.len(),
                options.parts,
                quality.edge_cut,
                quality.part_weights,
                quality.imbalance(),
                peak_rss_kib(),
                distspmm_ptscotch::version(),
            )
        }
        Err(e) => json_error(rank, ranks, &e),
    };
    println!("{line}");
}

/// `value` reduced over all ranks (0 on a communicator error).
fn reduce(comm: &MpiComm, value: u64, op: dist_comm::ReduceOp) -> u64 {
    let mut v = [value];
    match dist_comm::AllReduce::all_reduce(comm, &mut v, op) {
        Ok(()) => v[0],
        Err(_) => 0,
    }
}
