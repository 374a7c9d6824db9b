"""A distributed 2-layer GCN in Jittor over distspmm: the counterpart of JittorGeometric's
examples/dist_gcn/dist_gcn.py.

    distspmm partition --input ../shared/datasets/cora.npz --parts 2 --out /tmp/cora-2
    use_mkl=0 mpirun -n 2 python examples/jittor/dist_gcn.py --chunks /tmp/cora-2

Each rank holds one part of the graph (its chunk: rows of Ahat, halo lists, features, labels,
masks) and computes its nodes' rows of

    H = relu(Ahat dropout(X) W1 + b1),   Z = Ahat dropout(H) W2 + b2,   log_softmax(Z)

with `DistSpmm` exchanging only the halo rows (or broadcasting, `--schedule broadcast`).
The weights start equal on every rank (same seed, then broadcast from rank 0) and stay equal:
Jittor's optimiser averages the gradients over the ranks (mpi_all_reduce "mean"), so each rank's
loss is its summed NLL times P / (training nodes of all ranks), and the average is the gradient of
the global mean loss. Metrics are counts summed over the ranks; rank 0 prints them, and the last
line holds `test_acc=<value>` (at the final epoch).
"""

import argparse
import os
import sys
import time

# Jittor first: under mpirun it calls MPI_Init itself, and mpi4py (used by `communicator`) must
# find MPI initialised rather than initialise it first.
import jittor as jt
import numpy as np
from jittor import nn

try:
    import distspmm
except ImportError:  # run from a checkout without installing python/
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import distspmm
from distspmm.jittor import DistSpmm, communicator


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", required=True, help="chunk directory from `distspmm partition`")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--weight-decay", type=float, default=5e-4, help="L2 on the first layer")
    parser.add_argument("--schedule", choices=sorted(distspmm.SCHEDULES), default="halo")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-every", type=int, default=10, help="0: only the final line")
    parser.add_argument("--lib", help="path to libdistspmm.so (default: $DISTSPMM_LIB, target/)")
    args = parser.parse_args()
    if not 0.0 <= args.dropout < 1.0:
        parser.error("--dropout must be in [0, 1)")
    if args.epochs < 1 or args.hidden < 1:
        parser.error("--epochs and --hidden must be positive")
    return args


def glorot(rng, fan_in, fan_out):
    bound = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-bound, bound, size=(fan_in, fan_out)).astype(np.float32)


class GCN(nn.Module):
    """Two graph convolutions, each `Ahat (H W) + b`: the dense product first, so the exchange
    carries `hidden` (then `classes`) columns instead of the input features."""

    def __init__(self, op, features, hidden, classes, dropout, seed):
        super().__init__()
        self.op = op
        self.dropout = dropout
        rng = np.random.default_rng(seed)  # the same on every rank
        self.w1 = jt.array(glorot(rng, features, hidden))
        self.b1 = jt.zeros(hidden)
        self.w2 = jt.array(glorot(rng, hidden, classes))
        self.b2 = jt.zeros(classes)

    def first_layer(self):
        return [self.w1, self.b1]

    def second_layer(self):
        return [self.w2, self.b2]

    def execute(self, x):
        x = nn.dropout(x, self.dropout, is_train=self.is_training())
        h = nn.relu(DistSpmm(self.op, x @ self.w1) + self.b1)
        h = nn.dropout(h, self.dropout, is_train=self.is_training())
        return nn.log_softmax(DistSpmm(self.op, h @ self.w2) + self.b2, dim=1)


def row_normalized(features):
    """Each row divided by its sum (zero rows stay zero), as in the GCN paper."""
    sums = features.sum(axis=1, keepdims=True)
    return np.divide(features, sums, out=np.zeros_like(features), where=sums > 0)


def main():
    args = parse_args()
    distspmm.load(args.lib)
    comm = communicator()
    chunk = distspmm.Chunk(comm, args.chunks)
    op = distspmm.Spmm(comm, chunk, args.schedule)
    rank, parts = comm.rank, comm.size
    jt.set_global_seed(args.seed * 7919 + rank)  # independent dropout masks per rank

    if chunk.num_features == 0 or chunk.num_classes == 0:
        raise SystemExit(f"{args.chunks} holds no features or no labels: nothing to train on")
    features = np.array(chunk.features, dtype=np.float32)
    # Row normalisation is for non-negative features (bag-of-words); signed ones are left alone.
    negative = np.array([float((features < 0).any())])
    if comm.allreduce_sum(negative)[0] == 0:
        features = row_normalized(features)
    labels = np.array(chunk.labels, dtype=np.int32)
    masks = np.array(chunk.masks)
    split = {
        name: (masks & bit != 0) & (labels >= 0)
        for name, bit in [
            ("train", distspmm.MASK_TRAIN),
            ("val", distspmm.MASK_VAL),
            ("test", distspmm.MASK_TEST),
        ]
    }
    train_index = jt.array(np.flatnonzero(split["train"]).astype(np.int32))
    train_labels = jt.array(labels[split["train"]])
    has_train = bool(split["train"].any())
    n_train = comm.allreduce_sum(np.array([float(split["train"].sum())]))[0]
    if n_train == 0:
        raise SystemExit(f"{args.chunks} marks no training nodes (mask bit {distspmm.MASK_TRAIN})")

    x = jt.array(features).stop_grad()
    model = GCN(op, chunk.num_features, args.hidden, chunk.num_classes, args.dropout, args.seed)
    params = model.first_layer() + model.second_layer()
    if jt.in_mpi:  # start from rank 0's weights whatever the seed did elsewhere
        for p in params:
            p.assign(p.mpi_broadcast(0))
    optimizer = nn.Adam(
        [
            {"params": model.first_layer(), "weight_decay": args.weight_decay},
            {"params": model.second_layer(), "weight_decay": 0.0},
        ],
        lr=args.lr,
    )

    def say(line):
        if rank == 0:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def evaluate():
        """(train, val, test) accuracy over all ranks' nodes, without dropout."""
        model.eval()
        with jt.no_grad():
            predicted = model(x).argmax(dim=1)[0].numpy()
        model.train()
        counts = np.array(
            [
                v
                for name in ("train", "val", "test")
                for v in ((predicted[split[name]] == labels[split[name]]).sum(), split[name].sum())
            ],
            dtype=np.float64,
        )
        comm.allreduce_sum(counts)
        return [c / t if t > 0 else float("nan") for c, t in zip(counts[0::2], counts[1::2])]

    say(
        f"ranks={parts} nodes={chunk.num_global_nodes} features={chunk.num_features} "
        f"classes={chunk.num_classes} train={int(n_train)} schedule={args.schedule}"
    )
    start = time.perf_counter()
    model.train()
    for epoch in range(1, args.epochs + 1):
        out = model(x)
        if has_train:
            local_nll = nn.nll_loss(out[train_index], train_labels, reduction="sum")
        else:  # still a function of `out`, so this rank joins the collective backward
            local_nll = (out * 0.0).sum()
        optimizer.step(local_nll * (parts / n_train))
        # The global mean training loss (this epoch's forward, before the step).
        loss = comm.allreduce_sum(np.array([float(local_nll.item())]))[0] / n_train
        if args.log_every and (epoch % args.log_every == 0 or epoch == 1):
            train_acc, val_acc, test_acc = evaluate()
            say(
                f"epoch={epoch} loss={loss:.6f} train_acc={train_acc:.4f} "
                f"val_acc={val_acc:.4f} test_acc={test_acc:.4f}"
            )
    seconds = time.perf_counter() - start
    train_acc, val_acc, test_acc = evaluate()
    say(
        f"final epochs={args.epochs} seconds={seconds:.2f} loss={loss:.6f} "
        f"train_acc={train_acc:.4f} val_acc={val_acc:.4f} test_acc={test_acc:.4f}"
    )


if __name__ == "__main__":
    main()
