# PyTorch Geometric's GAT example (examples/gat.py, MIT License, Copyright (c) 2023 PyG Team
# <team@pyg.org>) changed to train on a distspmm partition, one chunk per MPI rank:
#
#   distspmm partition --input ../shared/datasets/cora.npz --parts 2 --out /tmp/cora-2
#   mpirun -n 2 python examples/torch/gat.py --chunks /tmp/cora-2
#
# The GAT paper's Cora configuration, as PyG's example: 8 heads of 8 hidden channels, ELU,
# one averaged output head, dropout 0.6 on features and attention, Adam lr 0.005, weight decay
# 5e-4, 200 epochs. Only what distribution needs changed, as in gcn.py (docs/pytorch.md): the
# chunk instead of Planetoid, DistGATConv (GATConv's parameters) with the rank's operator
# instead of edge_index, the loss as the mean over all ranks' training nodes with the gradients
# summed over the ranks, accuracies counted over all ranks, rank 0 printing. The last line is
# `test_acc=<value>`.
import argparse
import os.path as osp
import sys
import time

import torch
import torch.nn.functional as F

import torch_geometric.transforms as T
from torch_geometric.logging import log

try:
    import distspmm
except ImportError:  # run from a checkout without installing python/
    sys.path.insert(0, osp.join(osp.dirname(osp.realpath(__file__)), '..', '..', 'python'))
    import distspmm
from distspmm.torch import (DistGATConv, broadcast_parameters, chunk_data,
                            communicator, global_sum, sync_gradients)

parser = argparse.ArgumentParser()
parser.add_argument('--chunks', required=True, help='`distspmm partition` output')
parser.add_argument('--hidden_channels', type=int, default=8)
parser.add_argument('--heads', type=int, default=8)
parser.add_argument('--lr', type=float, default=0.005)
parser.add_argument('--epochs', type=int, default=200)
parser.add_argument('--seed', type=int, default=1)
args = parser.parse_args()

comm = communicator()
torch.manual_seed(args.seed + comm.rank)  # dropout masks differ between ranks

chunk = distspmm.Chunk(comm, args.chunks)
data = T.NormalizeFeatures()(chunk_data(chunk))
op = distspmm.Spmm(comm, chunk, 'halo')
num_train = global_sum(comm, data.train_mask.sum())[0]


class GAT(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels, heads):
        super().__init__()
        self.conv1 = DistGATConv(in_channels, hidden_channels, heads, dropout=0.6)
        # On the Pubmed dataset, use `heads` output heads in `conv2`.
        self.conv2 = DistGATConv(hidden_channels * heads, out_channels, heads=1,
                                 concat=False, dropout=0.6)

    def forward(self, x, op):
        x = F.dropout(x, p=0.6, training=self.training)
        x = F.elu(self.conv1(x, op))
        x = F.dropout(x, p=0.6, training=self.training)
        x = self.conv2(x, op)
        return x


model = GAT(chunk.num_features, args.hidden_channels, chunk.num_classes, args.heads)
broadcast_parameters(model, comm)  # every rank starts from rank 0's weights
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=5e-4)


def train():
    model.train()
    optimizer.zero_grad()
    out = model(data.x, op)
    loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask],
                           reduction='sum') / num_train
    loss.backward()
    sync_gradients(model, comm)
    optimizer.step()
    return global_sum(comm, loss.detach())[0]


@torch.no_grad()
def test():
    model.eval()
    pred = model(data.x, op).argmax(dim=-1)

    counts = []
    for mask in [data.train_mask, data.val_mask, data.test_mask]:
        counts += [(pred[mask] == data.y[mask]).sum(), mask.sum()]
    counts = global_sum(comm, *counts)  # over all ranks, in one call
    return [correct / total for correct, total in zip(counts[0::2], counts[1::2])]


times = []
best_val_acc = test_acc = 0
for epoch in range(1, args.epochs + 1):
    start = time.time()
    loss = train()
    train_acc, val_acc, tmp_test_acc = test()
    if val_acc > best_val_acc:
        best_val_acc = val_acc
        test_acc = tmp_test_acc
    if comm.rank == 0:
        log(Epoch=epoch, Loss=loss, Train=train_acc, Val=val_acc, Test=test_acc)
    times.append(time.time() - start)
if comm.rank == 0:
    print(f'Median time per epoch: {torch.tensor(times).median():.4f}s')
    print(f'test_acc={test_acc:.4f}', flush=True)
