"""Several watches at once (two framework callbacks in one Trainer, two `fpsim.watch` blocks), closed in any order.

Sources of truth: torch's own state before the first watch (its dispatch-mode stack, torch.amp.GradScaler's
own methods, nn.Module's and the optimizers' global hook tables, autograd's engine call), the report of the
same run watched by one watch alone, and an unwatched twin of the run (parameters, bit for bit).
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

import fpsim


def torch_state() -> dict:
    """What fpsim may change in torch while it watches, as torch holds it."""
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as optim_module

    scaler = torch.amp.GradScaler
    return {"modes": _get_current_dispatch_mode_stack(),
            "scaler": {name: scaler.__dict__[name] for name in ("scale", "unscale_", "step", "update")},
            "module hooks": (dict(nn_module._global_forward_pre_hooks), dict(nn_module._global_forward_hooks)),
            "optimizer hooks": (dict(optim_module._global_optimizer_pre_hooks),
                                dict(optim_module._global_optimizer_post_hooks)),
            "engine": torch.autograd._engine_run_backward}


def model_and_loop():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 20)   # skips its first steps: records to compare
    g = torch.Generator().manual_seed(1)

    def steps(n: int) -> None:
        for _ in range(n):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(torch.randn(4, 8, generator=g)).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    return model, steps


def counted(watch) -> str:
    """Everything a watch counted and judged (its report without the time it took and the date)."""
    data = watch.report().to_dict()
    data["run"].pop("seconds")
    data["run"].pop("date", None)
    return json.dumps({key: data[key] for key in ("layers", "ops", "run")}, sort_keys=True)


def lone_watch(steps_watched: int) -> str:
    model, steps = model_and_loop()
    with fpsim.watch(model, formats=("fp16",)) as watch:
        steps(steps_watched)
    return counted(watch)


@pytest.mark.parametrize("first_closed", ["first_opened", "last_opened"])
def test_two_watches_closed_in_either_order_leave_nothing_of_fpsim_in_torch(first_closed):
    before = torch_state()
    model, steps = model_and_loop()
    a = fpsim.watch(model, formats=("fp16",)).__enter__()
    b = fpsim.watch(model, formats=("fp16",)).__enter__()
    steps(2)
    first, second = (a, b) if first_closed == "first_opened" else (b, a)
    first.__exit__(None, None, None)             # (not nested: what two callbacks of one Trainer do)
    steps(2)                                     # the other one goes on observing
    second.__exit__(None, None, None)
    assert torch_state() == before               # no mode left on the stack, torch's own GradScaler methods
    assert torch.amp.GradScaler.scale.__module__ == "torch.amp.grad_scaler"
    assert counted(first) == lone_watch(2) and counted(second) == lone_watch(4)

    plain, plain_steps = model_and_loop()
    plain_steps(4)
    assert all(torch.equal(p, q) for p, q in zip(plain.parameters(), model.parameters()))

    steps(3)                                     # a loop after every watch closed reaches none of them
    assert counted(first) == lone_watch(2) and counted(second) == lone_watch(4)


def test_a_watch_under_a_mode_of_the_run_pauses_where_it_is_and_observes_every_step():
    class Passing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    before = torch_state()
    model, steps = model_and_loop()
    with fpsim.watch(model, formats=("fp16",)) as watch:
        with Passing() as mode:
            steps(6)                                # (the scaler skips steps 0-2: the optimizer steps from 3 on)
            assert _get_current_dispatch_mode_stack()[1:] == [mode]   # the watch's mode stayed below the run's
    assert torch_state() == before
    assert counted(watch) == lone_watch(6)
