"""FSDP2's fully_shard and tensor parallelism on the CPU (gloo, one process): the watch must not break the run.

Source of truth: the same sharded model trained unwatched (parameters bit for bit) and torch itself (the
run completes; before the guards, counting the DTensor parameters in the optimizer's pre-hook, and copying
them for a shadow step, crashed the process with a segmentation fault on torch 2.13); for the DTensor
activations of tensor parallelism, the number of values the model's outputs hold.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fpsim

dist = pytest.importorskip("torch.distributed")


def free_port() -> int:
    """A TCP port nothing listens on now (a fixed one collides with suites run side by side)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fully_sharded(model, mesh):
    from torch.distributed.fsdp import fully_shard

    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def tensor_parallel(model, mesh):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    parallelize_module(model, mesh, {"0": ColwiseParallel(use_local_output=False), "2": RowwiseParallel()})


def sharded_run(watched: bool, shard=fully_sharded, **options):
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        shard(model, init_device_mesh("cpu", (1,)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1)
        watch = fpsim.watch(model, formats=("fp16",), **options) if watched else None
        if watch is not None:
            watch.__enter__()
        for _ in range(3):
            x, y = torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if watch is not None:
            watch.__exit__(None, None, None)
        return [p.full_tensor().detach().clone() for p in model.parameters()], watch
    finally:
        dist.destroy_process_group()


@pytest.fixture
def gloo():
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")


@pytest.mark.parametrize("shadow_every", [None, 1])
def test_fully_shard_on_cpu_runs_unchanged_and_says_what_it_did_not_see(gloo, shadow_every):
    plain, _ = sharded_run(watched=False)
    observed, w = sharded_run(watched=True, shadow_every=shadow_every)
    for a, b in zip(plain, observed):
        assert torch.equal(a, b)
    report = w.report()
    assert {"0", "2"} <= {layer.name for layer in report.layers}
    assert "activation" in report.layer("0").tensors
    assert w.step == 3 and report.layer("0").tensors["activation"].samples == 3   # the optimizer's steps, counted
    assert any("DTensor" in note for note in w.notes())
    if shadow_every:                                       # no replay of sharded parameters: the counts judge
        assert any("tensor subclasses (DTensor): no shadow steps" in note for note in w.notes())
        assert not report.shadow_evidence


def test_tensor_parallel_activations_are_counted_from_their_local_part(gloo):
    """Column-parallel outputs kept as DTensors (use_local_output=False): each is counted from this rank's part
    (here all of it: one rank), 16 x 16 values per step, where before the first one stopped the observation."""
    plain, _ = sharded_run(watched=False, shard=tensor_parallel)
    observed, w = sharded_run(watched=True, shard=tensor_parallel, shadow_every=1)
    for a, b in zip(plain, observed):
        assert torch.equal(a, b)
    assert w.observation_error is None
    activation = w.report().layer("0").tensors["activation"]
    assert activation.samples == 3 and activation.hist.total == 3 * 16 * 16
