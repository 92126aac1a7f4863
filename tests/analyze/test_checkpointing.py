"""Activation checkpointing under fpsim.watch: a checkpointed run is counted as the same run without it.

torch.utils.checkpoint recomputes a forward in backward: the reentrant kind (transformers' default) runs the
forward without grad and recomputes it, with grad, inside its own backward call; the non-reentrant kind runs the
forward with grad and recomputes it to restore the tensors it saved. Either way the run computes the values of
the run without checkpointing, once for training. Sources of truth: the report of the same run without
checkpointing (every count, every verdict), an unwatched twin of the checkpointed run (parameters and RNG state,
bit for bit), and the number of loss.backward() calls the loop makes.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import fpsim
from fpsim.trace import Tracer


class Block(nn.Module):
    """LayerNorm, Linear, GELU, Linear, Dropout and a residual add in the block's own forward."""

    def __init__(self, checkpoints_itself=None):
        super().__init__()
        self.ln, self.fc, self.act = nn.LayerNorm(16), nn.Linear(16, 32), nn.GELU()
        self.proj, self.drop = nn.Linear(32, 16), nn.Dropout(0.1)
        self.checkpoints_itself = checkpoints_itself      # None, or use_reentrant

    def body(self, x):
        return x + self.drop(self.proj(self.act(self.fc(self.ln(x)))))

    def forward(self, x):
        if self.checkpoints_itself is None:
            return self.body(x)
        return checkpoint(self.body, x, use_reentrant=self.checkpoints_itself)


class Net(nn.Module):
    """Two blocks, checkpointed (reentrant: True or False) or not (None) in one of three ways (`style`):
    "module": checkpoint(block, h); "forward": the block checkpoints its own forward, its module hooks outside
    the checkpoint (transformers' GradientCheckpointingLayer); "function": checkpoint(fn, h), where fn runs an
    op before calling the block."""

    def __init__(self, reentrant, style):
        super().__init__()
        self.reentrant, self.style = reentrant, style
        self.inp = nn.Linear(8, 16)
        itself = reentrant if style == "forward" else None
        self.blocks = nn.ModuleList([Block(itself), Block(itself)])
        self.out = nn.Linear(16, 1)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            if self.style == "function":
                def fn(t, block=block):
                    return block(t * 0.5)
            else:
                fn = block
            if self.reentrant is None or self.style == "forward":
                h = fn(h)
            else:
                h = checkpoint(fn, h, use_reentrant=self.reentrant)
        return self.out(h)


def train(reentrant, style, amp: bool, watched: bool, steps: int = 3):
    torch.manual_seed(0)
    model = Net(reentrant, style)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=amp)
    g = torch.Generator().manual_seed(1)

    def loop():
        for _ in range(steps):
            with torch.autocast("cpu", dtype=torch.float16, enabled=amp):
                loss = model(torch.randn(4, 8, generator=g)).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    if not watched:
        loop()
        return None, model
    with fpsim.watch(model, formats=("fp16", "bf16"), modules="all") as watch:
        loop()
    return watch, model


def counted(watch) -> dict:
    """Every layer's and op's counts and verdicts, and the dtypes the ops ran in."""
    data = watch.report().to_dict()
    return {"layers": {e["name"]: json.dumps(e, sort_keys=True) for e in data["layers"]},
            "ops": {e["name"]: json.dumps(e, sort_keys=True) for e in data["ops"]},
            "precision": data["run"]["precision"]}


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "autocast_fp16"])
@pytest.mark.parametrize("style", ["module", "forward", "function"])
@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_a_checkpointed_run_counts_what_the_run_without_checkpointing_counts(reentrant, style, amp):
    reference, _ = train(None, style, amp, watched=True)
    watch, model = train(reentrant, style, amp, watched=True)
    _, twin = train(reentrant, style, amp, watched=False)
    assert counted(watch) == counted(reference)     # ops and module outputs once, forward and backward
    assert any(name.startswith("blocks.1.fc:") for name in counted(watch)["ops"])
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))


def test_a_reentrant_checkpoints_backward_call_ends_no_backward_pass_of_the_run():
    class Ends:
        def __init__(self):
            self.backward_passes = 0

        def forward_op(self, site, outputs):
            return None

        def module_output(self, name, module, output):
            return None

        def backward_done(self):
            self.backward_passes += 1

    torch.manual_seed(0)
    model = Net(True, "module")
    client = Ends()
    tracer = Tracer(client)
    tracer.names.add_root(model, "Net")
    tracer.attach()
    tracer.intercept(True)
    try:
        for _ in range(3):
            model(torch.randn(4, 8)).sum().backward()       # each: two nested backward calls, one per block
    finally:
        tracer.close()
    assert client.backward_passes == 3


def test_a_forward_without_grad_counts_nothing_also_under_autocast():
    # under no_grad autocast casts a weight with grad on (its cast cache then serves grad regions too): an
    # evaluation's casts were counted as the run's activations
    def run(evaluate: bool):
        torch.manual_seed(0)
        model = Net(None, "module")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        batches = torch.randn(3, 4, 8, generator=torch.Generator().manual_seed(1))
        with fpsim.watch(model, formats=("fp16",)) as watch:
            for x in batches:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = model(x).float().pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                if evaluate:
                    model.eval()
                    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                        model(torch.ones(4, 8))
                    model.train()
        return counted(watch)

    assert run(evaluate=True) == run(evaluate=False)
