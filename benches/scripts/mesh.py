#!/usr/bin/env python3
"""Writes the ROWS x COLS 5-point 2-D mesh as a PyG-layout .npz (edge_index with both
directions of every undirected edge, num_nodes): the mesh benches/partition-quality.sh
partitions. Node (i, j) is i * COLS + j.

    mesh.py ROWS COLS OUT.npz
"""
import sys

import numpy as np


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit("usage: mesh.py ROWS COLS OUT.npz")
    rows, cols, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    if rows < 1 or cols < 1:
        sys.exit("ROWS and COLS must be at least 1")
    ids = np.arange(rows * cols, dtype=np.int64).reshape(rows, cols)
    # Right and down neighbours, each undirected edge once, then both directions.
    src = np.concatenate([ids[:, :-1].ravel(), ids[:-1, :].ravel()])
    dst = np.concatenate([ids[:, 1:].ravel(), ids[1:, :].ravel()])
    edge_index = np.stack([np.concatenate([src, dst]), np.concatenate([dst, src])])
    np.savez(out, edge_index=edge_index, num_nodes=np.int64(rows * cols))


if __name__ == "__main__":
    main()
