#!/usr/bin/env python3
"""The seed's distributed SpMM (its DistSpmm: CAGNET's 1D broadcast/accumulate schedule) in
Python, as the comparison peer of `distspmm bench dist`: mpi4py buffer Bcast + SciPy CSR products.

Every rank reads its own chunk file written by `distspmm partition` (the byte layout of
docs/chunk-format.md), so the matrix and the partition are exactly the ones the Rust operator
runs on. The seed holds each block A[p][q] over all n_q rows of X_q, so the compacted column ids
of an off-diagonal block are mapped to q-local ids through the halo receive list from q.

One forward call (the seed's loop):

    for q in 0..P-1:
        comm.Bcast(X_q, root=q)          # rank q sends its rows to every rank
        Y_p += A[p][q] @ X_q             # SciPy CSR times a dense float32 matrix

Timing as `bench dist` does it: barrier, one call, maximum over ranks, median over repetitions
(after one untimed warm-up call). Prints one JSON line at rank 0.

usage: mpirun -n P python benches/peers/seed_bcast.py --chunks DIR --features F [--reps R] [--check]
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import scipy.sparse as sp
from mpi4py import MPI

MAGIC = b"\x89DSPCHK\n"
# Section kinds (docs/chunk-format.md).
PART_OFFSETS, BLOCK_SRC, BLOCK_COL_OFFSETS, BLOCK_NNZ_OFFSETS = 0x01, 0x02, 0x03, 0x04
CSR_ROWPTR, CSR_COLS, CSR_VALS = 0x05, 0x06, 0x07
HALO_RECV_OFFSETS, HALO_RECV = 0x0B, 0x0C
ELEM_TYPES = {1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.uint64, 5: np.float32}


def read_chunk(path):
    """The header fields and sections of a chunk file, as NumPy views of a memory map."""
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    if bytes(raw[:8]) != MAGIC:
        sys.exit(f"{path}: not a distspmm chunk file")

    def u32(at):
        return int(raw[at : at + 4].view(np.uint32)[0])

    def u64(at):
        return int(raw[at : at + 8].view(np.uint64)[0])

    header = {"parts": u32(16), "part": u32(20), "nodes": u64(24), "rows": u64(32)}
    count, table = u32(80), u64(88)
    sections = {}
    for i in range(count):
        entry = table + 48 * i
        kind, elem, offset, length = u32(entry), u32(entry + 8), u64(entry + 16), u64(entry + 24)
        if elem in ELEM_TYPES:
            sections[kind] = raw[offset : offset + length].view(ELEM_TYPES[elem])
    return header, sections


def blocks_with_local_columns(header, sections):
    """{q: A[p][q] as a SciPy CSR matrix over q's n_q local columns}."""
    p, n_p = header["part"], header["rows"]
    offsets = sections[PART_OFFSETS].astype(np.int64)
    col_offsets = sections[BLOCK_COL_OFFSETS]
    nnz_offsets = sections[BLOCK_NNZ_OFFSETS].astype(np.int64)
    rowptr, cols, vals = sections[CSR_ROWPTR], sections[CSR_COLS], sections[CSR_VALS]
    recv_offsets, recv = sections[HALO_RECV_OFFSETS].astype(np.int64), sections[HALO_RECV]
    blocks = {}
    for b, q in enumerate(sections[BLOCK_SRC].astype(np.int64)):
        z0, z1 = nnz_offsets[b], nnz_offsets[b + 1]
        ptr = rowptr[b * (n_p + 1) : (b + 1) * (n_p + 1)].astype(np.int64)
        c = cols[z0:z1].astype(np.int64)
        if q != p:
            c = recv[recv_offsets[q] : recv_offsets[q + 1]].astype(np.int64)[c]
        n_q = offsets[q + 1] - offsets[q]
        if col_offsets[b + 1] - col_offsets[b] > 0 and z1 > z0:
            blocks[int(q)] = sp.csr_matrix(
                (np.asarray(vals[z0:z1]), c.astype(np.int32), ptr), shape=(n_p, n_q)
            )
    return offsets, blocks


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", required=True, help="chunk directory from distspmm partition")
    parser.add_argument("--features", type=int, required=True)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--check", action="store_true",
                        help="compare Y with a single-process product of the blocks at rank 0")
    args = parser.parse_args()

    comm = MPI.COMM_WORLD
    me, ranks = comm.Get_rank(), comm.Get_size()
    with open(os.path.join(args.chunks, "manifest.json")) as f:
        manifest = json.load(f)
    if manifest["parts"] != ranks:
        sys.exit(f"{args.chunks} was made for {manifest['parts']} parts but {ranks} ranks were started")
    header, sections = read_chunk(os.path.join(args.chunks, manifest["chunks"][me]["file"]))
    offsets, blocks = blocks_with_local_columns(header, sections)
    f, n_p = args.features, header["rows"]
    sizes = np.diff(offsets)

    rng = np.random.default_rng(me)
    x = rng.uniform(-1, 1, size=(n_p, f)).astype(np.float32)
    y = np.zeros((n_p, f), dtype=np.float32)
    panel = np.empty((int(sizes.max()), f), dtype=np.float32)

    def forward():
        y.fill(0)
        for q in range(ranks):
            x_q = x if q == me else panel[: sizes[q]]
            comm.Bcast(x_q, root=q)
            if q in blocks:
                y[...] += blocks[q] @ x_q

    forward()
    seconds = []
    for _ in range(args.reps):
        comm.Barrier()
        started = time.perf_counter()
        forward()
        seconds.append(comm.allreduce(time.perf_counter() - started, op=MPI.MAX))
    received = comm.allreduce(int(sizes.sum() - sizes[me]) * f * 4, op=MPI.MAX)

    check = None
    if args.check:
        gathered = comm.gather((x, y, blocks), root=0)
        if me == 0:
            rows = [sp.hstack([g[2].get(q, sp.csr_matrix((sizes[p], sizes[q]), dtype=np.float32))
                               for q in range(ranks)]) for p, g in enumerate(gathered)]
            a = sp.vstack(rows).tocsr()
            want = a @ np.vstack([g[0] for g in gathered]).astype(np.float64)
            got = np.vstack([g[1] for g in gathered])
            check = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-300))
    if me == 0:
        line = {
            "schedule": "seed-bcast (mpi4py + scipy)",
            "ranks": ranks,
            "features": f,
            "seconds": float(np.median(seconds)),
            "max_recv_bytes_per_rank": received,
            "reps": args.reps,
            "nodes": int(offsets[-1]),
        }
        if check is not None:
            line["max_rel_error"] = check
        print(json.dumps(line), flush=True)
        if check is not None and check > 1e-5:
            sys.exit(f"the seed's product differs from the single-process product: {check}")


if __name__ == "__main__":
    main()
