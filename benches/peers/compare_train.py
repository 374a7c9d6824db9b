#!/usr/bin/env python3
"""Side by side: `distspmm train` against the PyTorch Geometric peer (pyg_gcn.py, the same
2-layer GCN and hyperparameters) on Cora, the CSBM default graph and RMAT-18 with 64 random
features; distspmm at P = 1 with 2 threads and at P = 2 with 1 thread each, PyG with 2 threads
along both of its paths (edge_index and sparse CSR; the faster is the peer).

Every configuration runs ROUNDS times, interleaved (PyG, P = 1, P = 2, next round), so all
see the same machine; the table gives the median epoch of the best round [median round].
The P = 1 runs also time the last epoch's SpMM and GEMM calls in isolation
(`train --isolated-kernels`: the same operator, shapes, routines and thread pool, median of 7
repetitions each) and the table sets their sum beside that run's median epoch.
Raw JSON lines go to OUT/compare_train.jsonl. With --write-doc the table replaces the block
between the markers `<!-- compare_train:begin -->` and `<!-- compare_train:end -->` in
docs/performance.md, with the command, the date and the commit next to it.

    .venv/bin/pip install torch torch_geometric numpy scipy
    cargo build --release -p distspmm-cli
    flock /tmp/bench.lock .venv/bin/python benches/peers/compare_train.py --write-doc
"""
import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BEGIN, END = "<!-- compare_train:begin -->", "<!-- compare_train:end -->"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "distspmm"))
    p.add_argument("--cora", default=os.path.join(ROOT, "..", "shared", "datasets", "cora.npz"))
    p.add_argument("--out", default=os.path.join(ROOT, "target", "peers", "train"))
    p.add_argument("--graphs", nargs="+", default=["cora", "csbm", "rmat18"],
                   choices=["cora", "csbm", "rmat18"])
    p.add_argument("--epochs", type=int, default=200, help="epochs on Cora and CSBM")
    p.add_argument("--epochs-rmat", type=int, default=10, help="epochs on RMAT-18")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=2, help="cores: P = 1 gets all, P = 2 one each")
    p.add_argument("--write-doc", action="store_true", help="put the table into docs/performance.md")
    return p.parse_args()


def sh(cmd, env=None, capture=True):
    r = subprocess.run(cmd, env=env, capture_output=capture, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {shlex.join(cmd)}\n{r.stderr[-4000:]}")
    return r.stdout


def last_json(text):
    return json.loads([l for l in text.splitlines() if l.startswith("{")][-1])


def prepare(args):
    """Graph files and chunk directories (P = 1, 2) for each graph."""
    os.makedirs(args.out, exist_ok=True)
    graphs = {}
    for g in args.graphs:
        path = os.path.join(args.out, f"{g}.npz")
        hidden, epochs = 16, args.epochs
        if g == "cora":
            path = os.path.abspath(args.cora)
        elif g == "csbm":
            sh([args.bin, "generate", "csbm", "--out", path, "--force"])
        else:
            sh([args.bin, "generate", "rmat", "--scale", "18", "--edge-factor", "16", "--seed", "1",
                "--features", "64", "--classes", "8", "--out", path, "--force"])
            hidden, epochs = 64, args.epochs_rmat
        for p in (1, 2):
            sh([args.bin, "partition", "--input", path, "--parts", str(p), "--out",
                os.path.join(args.out, f"{g}-p{p}"), "--force"])
        graphs[g] = (path, hidden, epochs)
    return graphs


def run_pyg(args, path, hidden, epochs):
    out = sh([sys.executable, os.path.join(ROOT, "benches", "peers", "pyg_gcn.py"), "--input", path,
              "--hidden", str(hidden), "--epochs", str(epochs), "--threads", str(args.threads)])
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")]


def run_ours(args, g, p, hidden, epochs):
    chunks = os.path.join(args.out, f"{g}-p{p}")
    train = [args.bin, "train", "--chunks", chunks, "--epochs", str(epochs), "--hidden", str(hidden),
             "--json"]
    if p == 1:
        train.append("--isolated-kernels")
    threads = max(1, args.threads // p)
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if p == 1:
        cmd = train
    else:
        cmd = ["mpirun", "-n", str(p), "--oversubscribe", "--bind-to", "none", "--mca", "btl",
               "self,vader", "-x", f"RAYON_NUM_THREADS={threads}", *train]
    d = last_json(sh(cmd, env=env))
    d.update(library="distspmm", P=p, threads=threads)
    return d


def table(graphs, rows, args):
    def by(g, key):
        return [r for r in rows if r["graph"] == g and r["key"] == key]

    lines = [
        "| graph | hidden | epochs | PyG edge_index ms | PyG CSR ms | distspmm P=1×2 ms | distspmm P=2×1 ms "
        "| PyG best / P=1 | P=2 / P=1 | P=1 split spmm/dense/other/comm ms "
        "| P=1 isolated SpMM + GEMM ms | P=1 epoch / isolated | test acc PyG / P=1 / P=2 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---|",
    ]
    for g, (_, hidden, epochs) in graphs.items():
        ms = {}
        for key in ("pyg:edge_index", "pyg:csr", "ours:1", "ours:2"):
            t = [r["epoch_seconds_median"] * 1e3 for r in by(g, key)]
            ms[key] = (min(t), statistics.median(t))
        best_pyg = min(ms["pyg:edge_index"][0], ms["pyg:csr"][0])
        med_pyg = min(ms["pyg:edge_index"][1], ms["pyg:csr"][1])
        fmt = lambda k: f"{ms[k][0]:.1f} [{ms[k][1]:.1f}]"  # noqa: E731
        one = min(by(g, "ours:1"), key=lambda r: r["epoch_seconds_median"])
        split = "—"
        if "spmm_seconds" in one:
            split = " / ".join(f"{one[k] * 1e3:.1f}" for k in
                               ("spmm_seconds", "dense_seconds", "other_seconds", "comm_seconds"))
        iso, ratio = "—", "—"
        if "isolated" in one:
            k = one["isolated"]
            iso = f"{k['spmm_seconds'] * 1e3:.1f} + {k['gemm_seconds'] * 1e3:.1f} = {k['sum_seconds'] * 1e3:.1f}"
            ratio = f"**{k['epoch_over_sum']:.2f}**"
        pyg_acc = min(by(g, "pyg:edge_index") + by(g, "pyg:csr"),
                      key=lambda r: r["epoch_seconds_median"])["test_acc"]
        acc = f"{pyg_acc:.3f} / {one['test_acc']:.3f} / {by(g, 'ours:2')[0]['test_acc']:.3f}"
        lines.append(
            f"| {g} | {hidden} | {epochs} | {fmt('pyg:edge_index')} | {fmt('pyg:csr')} | {fmt('ours:1')} "
            f"| {fmt('ours:2')} | **{best_pyg / ms['ours:1'][0]:.1f}×** [{med_pyg / ms['ours:1'][1]:.1f}×] "
            f"| {ms['ours:2'][0] / ms['ours:1'][0]:.2f} [{ms['ours:2'][1] / ms['ours:1'][1]:.2f}] "
            f"| {split} | {iso} | {ratio} | {acc} |")
    return "\n".join(lines)


def main():
    args = parse_args()
    if not os.path.exists(args.bin):
        sys.exit(f"{args.bin} not found: cargo build --release -p distspmm-cli")
    graphs = prepare(args)
    load_start = os.getloadavg()
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    rows = []
    log = os.path.join(args.out, "compare_train.jsonl")
    with open(log, "w") as f:
        for rnd in range(args.rounds):
            for g, (path, hidden, epochs) in graphs.items():
                print(f"round {rnd + 1}/{args.rounds}: {g}", file=sys.stderr)
                runs = [(f"pyg:{r['path']}", r) for r in run_pyg(args, path, hidden, epochs)]
                runs += [(f"ours:{p}", run_ours(args, g, p, hidden, epochs)) for p in (1, 2)]
                for key, r in runs:
                    r.update(graph=g, key=key, round=rnd, loadavg=os.getloadavg()[0])
                    rows.append(r)
                    f.write(json.dumps(r) + "\n")
                    f.flush()
    versions = next(r for r in rows if r["library"] == "pyg")
    commit = sh(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]).strip()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M UTC")
    load = os.getloadavg()
    cmd = "flock /tmp/bench.lock .venv/bin/python benches/peers/compare_train.py " + " ".join(
        shlex.quote(a) for a in sys.argv[1:])
    text = "\n".join([
        f"Measured {started}–{when}, commit {commit}, {args.rounds} round(s), load average (1 / 5 / 15 min) "
        f"at the start {load_start[0]:.1f} / {load_start[1]:.1f} / {load_start[2]:.1f}, at the end "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}; torch {versions['torch']}, "
        f"torch_geometric {versions['torch_geometric']}; raw lines (with each run's 1-minute load average) "
        f"in `{os.path.relpath(log, ROOT)}`. "
        "Median epoch of the best round [median round], ms.",
        "",
        "```", cmd, "```", "",
        table(graphs, rows, args),
    ])
    print(text)
    if args.write_doc:
        doc = os.path.join(ROOT, "docs", "performance.md")
        s = open(doc).read()
        if BEGIN not in s or END not in s:
            sys.exit(f"{doc} has no {BEGIN} … {END} block to replace")
        head, rest = s.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        tmp = doc + ".tmp"
        with open(tmp, "w") as f:
            f.write(head + BEGIN + "\n" + text + "\n" + END + tail)
        os.replace(tmp, doc)


if __name__ == "__main__":
    main()
