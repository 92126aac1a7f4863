"""Step time with fpsim.watch attached, as a ratio to the same training unobserved, in the same process.

    python benchmarks/bench_watch.py [--models demo,gpt10m,layers500] [--steps 20] [--repeats 3] [--threads 1]

Each model trains `steps` steps from the same initial weights, unobserved,
observed every step, observed every 10th step (op-level observation, the
default, with the mass per binade) and observed every step with the scaling
recipes measured every 10th (recipes_every=10: every FP8/FP6/FP4 recipe on
each module's tensors), and under the peer, EmptyHooks: the hooks an observed
step puts in place, doing nothing (what observing at the op level through
torch's hooks costs before anything is counted), interleaved `repeats` times. A run's time
is its mean step time after `warmup` steps, as CPU time of this process
(torch runs one thread: other work on a shared machine does not count) and
as wall-clock time; a configuration's time is the fastest of its runs (the
least disturbed by other work on the machine; medians are printed too). Then
`report.save` with figures is timed for a 12-layer GPT's report.
Targets: every step <= 1.3, every 10 steps <= 1.05, report.save <= 2 s.

Models: the demo's SensorNet (batch 1024, Adam); a 10M-parameter GPT
(fpsim.analyze.gpt: 6 layers, 384 wide, block 128, batch 8, AdamW); a stack
of 500 Linear(16, 16) layers with Tanh (batch 64, SGD).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import tempfile
import time

import torch
from torch import nn

from common import demo_batches, gpt_report
from fpsim.analyze import watch
from fpsim.analyze.gpt import GPT, GPTConfig, token_batches


def demo_model():
    model, batch = demo_batches()
    return "demo model (SensorNet, batch 1024, Adam)", model, torch.optim.Adam, batch, nn.functional.cross_entropy


def gpt10m():
    cfg = GPTConfig(vocab_size=65, block_size=128, n_layer=6, n_head=6, n_embd=384)
    batches = token_batches(cfg, 8, 4096)   # enough for every run of the benchmark (32 MB of tokens, not 8 GB)
    torch.manual_seed(0)
    model = GPT(cfg)
    n = sum(p.numel() for p in model.parameters())

    def loss_fn(logits, y):
        return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))

    def batch():
        x, y = next(batches)
        return (x,), y
    return f"GPT ({n / 1e6:.1f}M parameters, 6 layers, batch 8 x 128 tokens, AdamW)", model, torch.optim.AdamW, \
        batch, loss_fn


def layers500():
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(250) for m in (nn.Linear(16, 16), nn.Tanh())], nn.Linear(16, 16),
                          *[m for _ in range(249) for m in (nn.Tanh(), nn.Linear(16, 16))])
    g = torch.Generator().manual_seed(0)

    def batch():
        return (torch.randn(64, 16, generator=g),), torch.randn(64, 16, generator=g)
    return "500 Linear(16, 16) layers with Tanh (batch 64, SGD)", model, \
        lambda params: torch.optim.SGD(params, lr=1e-3), batch, nn.functional.mse_loss


MODELS = {"demo": demo_model, "gpt10m": gpt10m, "layers500": layers500}


class EmptyHooks:
    """The peer: the hooks fpsim.watch puts in place on an observed step, each doing nothing. A
    TorchDispatchMode seeing every op of the model's forward (popped for backward and the optimizer step,
    as fpsim's), global module forward pre/post hooks, a pre-hook on the autograd node of every op output
    that a later op consumes, a hook on every parameter: what any op-level observer built on torch's hooks
    costs before it counts anything."""

    def __init__(self, model):
        from torch.nn.modules import module as nn_module
        from torch.utils._python_dispatch import TorchDispatchMode

        hooked = set()

        def nothing(*args):
            return None

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                for a in args:
                    node = getattr(a, "grad_fn", None)
                    if node is not None and id(node) not in hooked:
                        hooked.add(id(node))
                        node.register_prehook(nothing)
                return func(*args, **(kwargs or {}))

        mode = Mode()

        def before(module, args):
            if module is model:
                hooked.clear()
                mode.__enter__()

        def after(module, args, output):
            if module is model:
                mode.__exit__(None, None, None)

        self.handles = [nn_module.register_module_forward_pre_hook(before),
                        nn_module.register_module_forward_hook(after, always_call=True)]
        self.handles += [p.register_hook(nothing) for p in model.parameters()]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()


def timed_run(model, make_optimizer, batch, loss_fn, steps: int, warmup: int, options: dict | None) -> tuple:
    """(CPU, wall) mean seconds per step over the steps after `warmup`, optionally under fpsim.watch(**options)
    (options "empty hooks": under EmptyHooks)."""
    optimizer = make_optimizer(model.parameters())
    if options is None:
        context = contextlib.nullcontext()
    elif options == "empty hooks":
        context = EmptyHooks(model)
    else:
        context = watch(model, **options)
    with context:
        for step in range(warmup + steps):
            if step == warmup:
                start, start_cpu = time.perf_counter(), time.process_time()
            inputs, target = batch()
            loss = loss_fn(model(*inputs), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return (time.process_time() - start_cpu) / steps, (time.perf_counter() - start) / steps


def save_time() -> tuple:
    """Wall-clock and CPU seconds of report.save (with figures) of a 12-layer GPT's report, its layer count
    and its op findings."""
    report = gpt_report()
    with tempfile.TemporaryDirectory() as folder:
        start, start_cpu = time.perf_counter(), time.process_time()
        report.save(folder)
        seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    return seconds, cpu, len([layer for layer in report.layers if not layer.is_op]), len(report.findings)


def _times(times: dict, name: str) -> str:
    """'fastest ms ratio (median ratio)' of a configuration against the unobserved runs."""
    t, m = min(times[name]), statistics.median(times[name])
    return (f"{t * 1e3:7.1f} ms ratio {t / min(times['unobserved']):5.2f} "
            f"(median {m / statistics.median(times['unobserved']):5.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="demo,gpt10m,layers500", help=f"comma-separated: {', '.join(MODELS)}")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run (a multiple of 10)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    configs = {"unobserved": None, "every step": {"every": 1}, "every 10 steps": {"every": 10},
               "every step, recipes every 10": {"every": 1, "recipes_every": 10},
               "peer: empty hooks": "empty hooks"}
    for key in args.models.split(","):
        title, initial, make_optimizer, batch, loss_fn = MODELS[key]()
        cpu, wall = {name: [] for name in configs}, {name: [] for name in configs}
        for _ in range(args.repeats):
            for name, options in configs.items():
                c, w = timed_run(copy.deepcopy(initial), make_optimizer, batch, loss_fn, args.steps, args.warmup,
                                 options)
                cpu[name].append(c)
                wall[name].append(w)
        print(f"{title}, {args.threads} thread(s), {args.steps} steps x {args.repeats} interleaved repeats; "
              f"step time, fastest run (median run):")
        for name in configs:
            print(f"  {name:<28} cpu {_times(cpu, name)}   wall {_times(wall, name)}")
    seconds, cpu, layers, findings = save_time()
    print(f"report.save with figures, 12-layer GPT ({layers} layers, {findings} op findings): {seconds:.2f} s "
          f"(cpu {cpu:.2f} s)")
    print("targets: every step <= 1.3, every 10 steps <= 1.05, report.save <= 2 s")


if __name__ == "__main__":
    main()
