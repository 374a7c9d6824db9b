#!/usr/bin/env python3
"""The PyTorch Geometric peer of `distspmm train --model sage|gin|gat`: the same 2-layer models
with the same hyperparameters, trained with PyG's SAGEConv, GINConv and GATConv on the CPU,
timed per epoch, with each path's peak resident memory.

Models (the reference configurations of the models' issue; dropout on every layer's input, as
`distspmm train` and pyg_gcn.py, unless `--input-dropout false`, which keeps only the dropout
between the layers):
  sage  dropout(p) -> SAGEConv(in, hidden) -> ReLU -> dropout(p) -> SAGEConv(hidden, classes)
        (SAGEConv's defaults: mean over in-neighbours, root weight, bias); hidden 64, p 0.5,
        lr 0.01
  gin   dropout(p) -> GINConv(Linear(in, hidden), ReLU, Linear(hidden, hidden)) -> ReLU
        -> dropout(p) -> GINConv(Linear(hidden, hidden), ReLU, Linear(hidden, classes))
        (sum aggregation, ε = 0 fixed); hidden 64, p 0.5, lr 0.01
  gat   dropout(p) -> GATConv(in, hidden, heads, dropout=attn) -> ELU -> dropout(p)
        -> GATConv(hidden·heads, classes, heads=1, concat=False, dropout=attn)
        (LeakyReLU 0.2, self loops added); hidden 8 per head, 8 heads, p 0.6, attn 0.6, lr 0.005
then log_softmax; NLL (mean) over the training nodes; Adam with L2 weight decay 5e-4 on every
parameter (`Adam(weight_decay=…)`); features row-normalised when non-negative
(`--normalize-features true`); PyG's default initialisation, seeded by `--seed`. One epoch = one
training step plus one evaluation forward pass without dropout (loss and train/val/test
accuracy), exactly what an epoch of `distspmm train` does. The first epoch is a warm-up, left
out of the median.

Two ways PyG can aggregate; both are run and timed, the faster is the peer:
  edge_index   message passing over the [2, E] edge list (scatter);
  csr          the adjacency as a torch sparse CSR tensor `adj_t` (to_torch_csr_tensor).
For SAGEConv and GINConv `csr` is PyG's fused SpMM path (`message_and_aggregate`:
torch.sparse.mm with reduce="mean" / "sum"); a torch_sparse SparseTensor would take the same
torch.sparse.mm call on the CPU. GATConv has no fused path: it turns `adj_t` back into an edge
list on every call (self loops, attention and aggregation run over edges either way), so for GAT
`csr` measures that conversion on top of `edge_index`.

With more than one path, every path runs in a fresh child process (this script with one
`--paths`), so that `peak_rss_bytes` (the process's `ru_maxrss`: loading the graph, the model
and every epoch) is that path's own peak, not masked by an earlier one; `rss_loaded_bytes` is
the peak after loading the graph, before the model is built.

Prints one JSON line per path:
{"library": "pyg", "model", "path", "epochs", "epoch_seconds_median", "epoch_seconds_min",
 "final_loss", "train_acc", "val_acc", "test_acc", "threads", "nodes", "edges", "hidden",
 "heads", "lr", "weight_decay", "dropout", "attn_dropout", "input_dropout",
 "normalize_features", "seed",
 "peak_rss_bytes", "rss_loaded_bytes", "torch", "torch_geometric"}

    .venv/bin/pip install torch torch_geometric numpy
    python3 benches/peers/pyg_models.py --model sage --input G.npz --epochs 200 --threads 2
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

# Per model: hidden (per head for GAT), dropout, learning rate.
DEFAULTS = {"sage": (64, 0.5, 0.01), "gin": (64, 0.5, 0.01), "gat": (8, 0.6, 0.005)}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, choices=sorted(DEFAULTS))
    p.add_argument("--input", required=True, help="graph .npz (PyG layout: edge_index, x, y, masks)")
    p.add_argument("--hidden", type=int, help="hidden width (per head for GAT); default 64, GAT 8")
    p.add_argument("--heads", type=int, default=8, help="GAT: heads of the first layer")
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--lr", type=float, help="Adam learning rate; default 0.01, GAT 0.005")
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--dropout", type=float, help="dropout on layer inputs; default 0.5, GAT 0.6")
    p.add_argument("--attn-dropout", type=float, default=0.6, help="GAT: attention dropout")
    p.add_argument("--input-dropout", choices=["true", "false"], default="true",
                   help="dropout on the first layer's input too (false: between the layers only)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--paths", nargs="+", choices=["edge_index", "csr"], default=["edge_index", "csr"])
    p.add_argument("--normalize-features", choices=["true", "false"], default="true")
    a = p.parse_args()
    hidden, dropout, lr = DEFAULTS[a.model]
    a.hidden = hidden if a.hidden is None else a.hidden
    a.dropout = dropout if a.dropout is None else a.dropout
    a.lr = lr if a.lr is None else a.lr
    return a


args = parse_args()
if len(args.paths) > 1:
    # One fresh process per path: each reports its own peak memory. The last `--paths` given
    # is the one argparse keeps.
    for path in args.paths:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--paths", path])
        if r.returncode != 0:
            sys.exit(f"the {path} path failed with exit status {r.returncode}")
    sys.exit(0)

# Thread counts are read when the OpenMP runtime starts: set them before torch loads.
for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_geometric  # noqa: E402
from torch.nn import Linear, ReLU, Sequential  # noqa: E402
from torch_geometric.nn import GATConv, GINConv, SAGEConv  # noqa: E402
from torch_geometric.utils import to_torch_csr_tensor  # noqa: E402

torch.set_num_threads(args.threads)


def peak_rss():
    """The process's peak resident set so far, in bytes (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def load(path):
    z = np.load(path)
    for key in ("edge_index", "x", "y", "train_mask"):
        if key not in z.files:
            sys.exit(f"{path} has no `{key}`; the model peer needs edges, features, labels and masks")
    x = z["x"].astype(np.float32)
    n = int(z["num_nodes"]) if "num_nodes" in z.files else x.shape[0]
    ei = torch.from_numpy(z["edge_index"].astype(np.int64))
    y = torch.from_numpy(z["y"].astype(np.int64))
    masks = {k: torch.from_numpy(z[f"{k}_mask"].astype(bool)) if f"{k}_mask" in z.files
             else torch.zeros(n, dtype=torch.bool) for k in ("train", "val", "test")}
    if args.normalize_features == "true" and x.min() >= 0:
        s = x.sum(axis=1, keepdims=True)
        x = np.divide(x, s, out=np.zeros_like(x), where=s != 0)
    # Unlabelled nodes (y < 0) count in no mask, as in distspmm.
    for m in masks.values():
        m &= y >= 0
    return n, torch.from_numpy(np.ascontiguousarray(x)), ei, y.clamp(min=0), masks


class Net(torch.nn.Module):
    def __init__(self, model, fi, classes):
        super().__init__()
        h = args.hidden
        if model == "sage":
            self.conv1, self.conv2 = SAGEConv(fi, h), SAGEConv(h, classes)
            self.act = F.relu
        elif model == "gin":
            self.conv1 = GINConv(Sequential(Linear(fi, h), ReLU(), Linear(h, h)), train_eps=False)
            self.conv2 = GINConv(Sequential(Linear(h, h), ReLU(), Linear(h, classes)), train_eps=False)
            self.act = F.relu
        else:
            self.conv1 = GATConv(fi, h, heads=args.heads, dropout=args.attn_dropout)
            self.conv2 = GATConv(h * args.heads, classes, heads=1, concat=False,
                                 dropout=args.attn_dropout)
            self.act = F.elu

    def forward(self, x, adj):
        if args.input_dropout == "true":
            x = F.dropout(x, args.dropout, self.training)
        x = self.act(self.conv1(x, adj))
        x = F.dropout(x, args.dropout, self.training)
        return F.log_softmax(self.conv2(x, adj), dim=1)


def run(path, n, x, ei, y, masks):
    loaded = peak_rss()
    torch.manual_seed(args.seed)
    classes = int(y.max()) + 1
    model = Net(args.model, x.shape[1], classes)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    if path == "csr":
        # adj_t[target, source]: PyG's SparseTensor convention (row = the aggregating node).
        adj = to_torch_csr_tensor(torch.stack([ei[1], ei[0]]), size=(n, n))
    else:
        adj = ei
    train = masks["train"]
    times = []
    loss = acc = None
    for epoch in range(args.epochs + 1):
        t = time.perf_counter()
        model.train()
        opt.zero_grad(set_to_none=True)
        out = model(x, adj)
        loss = F.nll_loss(out[train], y[train])
        loss.backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            out = model(x, adj)
            pred = out.argmax(dim=1)
            acc = {k: float((pred[m] == y[m]).float().mean()) if bool(m.any()) else 0.0
                   for k, m in masks.items()}
            float(F.nll_loss(out[train], y[train]))
        if epoch > 0:  # epoch 0 is a warm-up (allocator, first-call dispatch)
            times.append(time.perf_counter() - t)
    times.sort()
    return {
        "library": "pyg", "model": args.model, "path": path, "epochs": args.epochs,
        "epoch_seconds_median": times[len(times) // 2], "epoch_seconds_min": times[0],
        "final_loss": loss.item(), "train_acc": acc["train"], "val_acc": acc["val"],
        "test_acc": acc["test"], "threads": args.threads, "nodes": n, "edges": int(ei.shape[1]),
        "hidden": args.hidden, "heads": args.heads if args.model == "gat" else 1, "lr": args.lr,
        "weight_decay": args.weight_decay, "dropout": args.dropout,
        "attn_dropout": args.attn_dropout if args.model == "gat" else 0.0,
        "input_dropout": args.input_dropout == "true",
        "normalize_features": args.normalize_features == "true", "seed": args.seed,
        "peak_rss_bytes": peak_rss(), "rss_loaded_bytes": loaded,
        "torch": torch.__version__, "torch_geometric": torch_geometric.__version__,
    }


def main():
    if args.epochs < 1:
        sys.exit("--epochs must be at least 1")
    data = load(args.input)
    print(json.dumps(run(args.paths[0], *data)), flush=True)


if __name__ == "__main__":
    main()
