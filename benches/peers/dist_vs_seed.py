#!/usr/bin/env python3
"""Runs the distributed SpMM side by side with the seed's schedule in Python, in one go, and prints
the docs/performance.md table.

For every P: partition the graph with METIS (once, kept in --work), then in each round run
`distspmm bench dist --schedule broadcast`, `... --schedule halo` and `seed_bcast.py` one after
another under `mpirun -n P --oversubscribe`, so that drifting machine load hits all three alike.
Reported: the median over rounds of each command's own median time per forward call, the
speed-ups over the seed, and the bytes a rank receives per forward call.

Fair timing on a small machine: every rank runs max(1, cores // P) kernel threads
(RAYON_NUM_THREADS for distspmm; the seed's SciPy products are single-threaded, and
OMP_NUM_THREADS/OPENBLAS_NUM_THREADS are set to 1 for it).

usage: python benches/peers/dist_vs_seed.py --graph rmat18.npz --parts 2 4 --features 64 \
           [--work DIR] [--reps 10] [--rounds 3] [--distspmm target/release/distspmm] [--python .venv/bin/python]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def run(cmd, env=None):
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(map(str, cmd))}\n{out.stdout}{out.stderr}")
    return out.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", required=True, type=Path)
    ap.add_argument("--parts", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--work", type=Path, default=Path("run/dist-vs-seed"))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--distspmm", type=Path, default=ROOT / "target/release/distspmm")
    ap.add_argument("--python", type=Path, default=ROOT / ".venv/bin/python")
    args = ap.parse_args()

    cores = os.cpu_count() or 1
    args.work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    rows = []
    for p in args.parts:
        chunks = args.work / f"{args.graph.stem}-{p}"
        if not (chunks / "manifest.json").is_file():
            run([args.distspmm, "partition", "--input", args.graph, "--parts", str(p),
                 "--out", chunks, "--json"])
        threads = max(1, cores // p)
        mpirun = ["mpirun", "-n", str(p), "--oversubscribe", "--mca", "btl", "self,vader",
                  "-x", f"RAYON_NUM_THREADS={threads}", "-x", "OMP_NUM_THREADS=1",
                  "-x", "OPENBLAS_NUM_THREADS=1"]
        common = ["--chunks", chunks, "--features", str(args.features), "--reps", str(args.reps)]
        results = {"seed": [], "broadcast": [], "halo": []}
        for _ in range(args.rounds):
            for name in ("seed", "broadcast", "halo"):
                if name == "seed":
                    cmd = mpirun + [args.python, HERE / "seed_bcast.py"] + common
                else:
                    cmd = mpirun + [args.distspmm, "bench", "dist", "--schedule", name, "--json"] + common
                line = json.loads(run(cmd, env).strip().splitlines()[-1])
                print(json.dumps(line), flush=True)
                results[name].append(line)
        med = {k: statistics.median(r["seconds"] for r in v) for k, v in results.items()}
        recv = {k: v[0]["max_recv_bytes_per_rank"] for k, v in results.items()}
        rows.append((p, threads, med, recv))

    print()
    print("| graph | P | threads/rank | seed ms | broadcast ms | halo ms | broadcast × | halo × "
          "| recv MiB/rank seed / broadcast / halo | halo/broadcast bytes |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for p, threads, med, recv in rows:
        ms = lambda k: f"{med[k] * 1e3:.3g}"
        mib = lambda k: f"{recv[k] / 2**20:.2f}"
        print(f"| {args.graph.stem} | {p} | {threads} | {ms('seed')} | {ms('broadcast')} "
              f"| {ms('halo')} | {med['seed'] / med['broadcast']:.2f} "
              f"| {med['seed'] / med['halo']:.2f} | {mib('seed')} / {mib('broadcast')} "
              f"/ {mib('halo')} | {recv['halo'] / recv['broadcast']:.3f} |")

if __name__ == "__main__":
    main()
