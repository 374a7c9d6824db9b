# PyTorch Geometric's two-layer GCN example (examples/gcn.py, MIT License, Copyright (c) 2023 PyG
# Team <team@pyg.org>) changed to train on a distspmm partition, one chunk per MPI rank:
#
#   distspmm partition --input ../shared/datasets/cora.npz --parts 2 --out /tmp/cora-2
#   mpirun -n 2 python examples/torch/gcn.py --chunks /tmp/cora-2
#
# Only what distribution needs changed (the diff is in docs/pytorch.md): the chunk instead of
# Planetoid, DistGCNConv (GCNConv's parameters) with the rank's operator instead of edge_index,
# the loss as the mean over all ranks' training nodes with the gradients summed over the ranks,
# accuracies counted over all ranks, rank 0 printing. The last line is `test_acc=<value>`.
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
from distspmm.torch import (DistGCNConv, broadcast_parameters, chunk_data,
                            communicator, global_sum, sync_gradients)

parser = argparse.ArgumentParser()
parser.add_argument('--chunks', required=True, help='`distspmm partition` output')
parser.add_argument('--hidden_channels', type=int, default=16)
parser.add_argument('--lr', type=float, default=0.01)
parser.add_argument('--epochs', type=int, default=200)
parser.add_argument('--seed', type=int, default=1)
args = parser.parse_args()

comm = communicator()
torch.manual_seed(args.seed + comm.rank)  # dropout masks differ between ranks

chunk = distspmm.Chunk(comm, args.chunks)
data = T.NormalizeFeatures()(chunk_data(chunk))
op = distspmm.Spmm(comm, chunk, 'halo')
num_train = global_sum(comm, data.train_mask.sum())[0]


class GCN(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.conv1 = DistGCNConv(in_channels, hidden_channels)
        self.conv2 = DistGCNConv(hidden_channels, out_channels)

    def forward(self, x, op):
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv1(x, op).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv2(x, op)
        return x


model = GCN(
    in_channels=chunk.num_features,
    hidden_channels=args.hidden_channels,
    out_channels=chunk.num_classes,
)
broadcast_parameters(model, comm)  # every rank starts from rank 0's weights

optimizer = torch.optim.Adam([
    dict(params=model.conv1.parameters(), weight_decay=5e-4),
    dict(params=model.conv2.parameters(), weight_decay=0)
], lr=args.lr)  # Only perform weight-decay on first convolution.


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

best_val_acc = test_acc = 0
times = []
for epoch in range(1, args.epochs + 1):
    start = time.time()
    loss = train()
    if epoch >= 10:  # We treat the first 10 iterations as a warm-up
        times.append(time.time() - start)

    train_acc, val_acc, tmp_test_acc = test()
    if val_acc > best_val_acc:
        best_val_acc = val_acc
        test_acc = tmp_test_acc
    if comm.rank == 0:
        log(Epoch=epoch, Loss=loss, Train=train_acc, Val=val_acc, Test=test_acc)
if comm.rank == 0:
    if times:
        print(f'Median time per epoch: {torch.tensor(times).median():.4f}s')
    print(f'test_acc={test_acc:.4f}', flush=True)
