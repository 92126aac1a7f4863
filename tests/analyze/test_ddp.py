"""Under DDP (2 ranks, gloo, CPU) the statistics are reduced across ranks and rank 0 alone writes the report."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from analyze_helpers import assert_same, numpy_count


def _worker(rank: int, world: int, folder: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world)
    try:
        from fpsim.analyze import watch
        from fpsim.analyze.demo import SensorNet, sensor_data

        data = sensor_data(samples=1024)
        torch.manual_seed(0)
        model = SensorNet(hidden=16, depth=2)
        seen = []
        model.body[0].register_forward_hook(lambda m, a, out: seen.append(out.detach().clone()))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        with watch(ddp) as w:
            for step in range(4):
                i = torch.arange(64) + 64 * (2 * step + rank)   # each rank its own shard
                loss = torch.nn.functional.cross_entropy(ddp(data["readings"][i], data["pressure"][i]),
                                                         data["label"][i])
                opt.zero_grad()
                loss.backward()
                opt.step()
        np.save(os.path.join(folder, f"activations{rank}.npy"),
                torch.cat([s.reshape(-1) for s in seen]).numpy())
        np.save(os.path.join(folder, f"weights{rank}.npy"),
                torch.cat([p.detach().reshape(-1) for p in model.body[0].parameters()]).numpy())
        report = w.report()                       # collective: every rank calls it
        assert report.run["world_size"] == world
        report.save(os.path.join(folder, f"out{rank}"), figures=False)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_two_ranks_reduce_to_one_report(tmp_path):
    mp.spawn(_worker, args=(2, str(tmp_path)), nprocs=2, join=True)
    assert (tmp_path / "out0" / "report.json").exists()
    assert not (tmp_path / "out1").exists()                  # only rank 0 writes
    report = json.loads((tmp_path / "out0" / "report.json").read_text())
    assert report["run"]["world_size"] == 2
    layer = next(layer for layer in report["layers"] if layer["name"] == "body.0")
    from fpsim.analyze.histogram import Log2Histogram

    both = np.concatenate([np.load(tmp_path / f"activations{r}.npy") for r in (0, 1)])
    assert_same(Log2Histogram.from_dict(layer["tensors"]["activation"]["log2_histogram"]), numpy_count(both))
    assert layer["tensors"]["activation"]["samples"] == 8               # 4 steps x 2 ranks
    assert layer["tensors"]["weight"]["samples"] == 4                   # replicated: rank 0's only
    assert layer["tensors"]["weight"]["values"] == np.load(tmp_path / "weights0.npy").size * 4


TORCHRUN_SCRIPT = """
import torch, torch.distributed as dist
from torch import nn
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(dist.get_rank())
for step in range(6):
    loss = nn.functional.mse_loss(model(torch.randn(8, 16, generator=g)), torch.randn(8, 4, generator=g))
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _torchrun(tmp_path, *options, script_text=TORCHRUN_SCRIPT):
    """`torchrun --standalone --nproc_per_node 2 -m fpsim analyze OPTIONS train.py` in tmp_path: the run."""
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(script_text)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "fpsim", "analyze", "--out", str(tmp_path / "out"), "--quiet", *options,
                           str(script)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_fpsim_analyze_under_torchrun_succeeds_on_every_rank(tmp_path):
    """`torchrun -m fpsim analyze`: rank 0 writes and prints the report of both ranks, and every rank exits 0
    (before, rank 1, which writes nothing, exited 1, and torchrun took the job for failed and terminated rank 0)."""
    run = _torchrun(tmp_path, "--shadow-every", "0")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("report written to") == 1                            # one summary, rank 0's
    assert sum(line.startswith("layer ") for line in run.stdout.splitlines()) == 1
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["run"]["world_size"] == 2
    layer = next(layer for layer in report["layers"] if layer["name"].endswith(".0"))
    assert layer["tensors"]["activation"]["samples"] == 2 * 6       # both ranks' six steps


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_an_emulated_run_under_torchrun_runs_on_every_rank_and_rank_0_writes(tmp_path):
    """--emulate runs the script on both ranks (its DDP all-reduces need them), and rank 0 alone writes and
    prints its losses (before, both ranks wrote the same file and printed)."""
    # (the script ends its process group, as torch asks: a gloo group left to the interpreter's exit aborted a
    # rank now and then, "terminate called without an active exception", 1 run in 2 fresh suites)
    run = _torchrun(tmp_path, "--emulate", "bf16", script_text=TORCHRUN_SCRIPT + "dist.destroy_process_group()\n")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("losses written to") == 1
    runs = json.loads((tmp_path / "out" / "emulation.json").read_text())["runs"]
    assert [len(r["losses"]) for r in runs] == [6]


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_confirm_under_torchrun_is_refused_before_anything_runs(tmp_path):
    """--confirm runs the script four times in one process, which the script's one init_process_group does
    not allow: a usage error at once (before, rank 0 waited forever for the rank that had exited)."""
    run = _torchrun(tmp_path, "--confirm", "--emulate", "bf16")
    assert run.returncode != 0
    assert "--confirm runs the script four times in one process" in run.stderr
    assert not (tmp_path / "out").exists()
