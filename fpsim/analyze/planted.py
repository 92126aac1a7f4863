"""Small models with planted numerics, and a real low-precision trainer to hold verdicts to.

Each planted task is a model, a loss on its outputs and a seeded stream of
batches (targets from a fixed random teacher, so the gradients carry signal):

- `harmless`: a quarter of the inputs are in ordinary units, the rest 1e-9
  times smaller (raw readings in other units): most weight-gradient values of
  the first layer flush to zero in FP16, but they carry ~1e-9 of its norm;
- `aux_head`: a second head trained through an auxiliary loss weighted 1e-6
  (a common pattern): its gradients fall below FP16's smallest subnormal,
  so unscaled FP16 training never updates it, while FP32 Adam (scale-free)
  trains it;
- `overflow`: raw inputs of order 1e3 into a Linear with large weights, then
  a LayerNorm: its outputs pass 65504, FP16 turns them to Inf and the loss to NaN;
- `saturated`: self-attention over four tokens whose query and key weights are
  40 times too large: logits of order 10^3, a one-hot softmax. Rounding to BF16
  changes which key wins for near ties, so the query, key and embedding
  gradients differ from FP32's by 100% and more, yet as much as when the FP32
  weights move by one BF16 rounding unit: the FP32 gradient there is itself
  that arbitrary, and BF16 trains as FP32 does.

`train_real` trains a task for real: FP32, or torch.autocast FP16/BF16 (real
low-precision arithmetic on this machine) with a static loss scale and
chosen modules kept in FP32, the way mixed-precision recipes are applied.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn

INPUTS, HIDDEN, OUTPUTS = 16, 32, 4
AUX_WEIGHT = 1e-6


class Harmless(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(INPUTS, HIDDEN)
        self.out = nn.Linear(HIDDEN, OUTPUTS)

    def forward(self, x):
        return self.out(torch.tanh(self.inp(x)))


class AuxHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(INPUTS, HIDDEN)
        self.head = nn.Linear(HIDDEN, OUTPUTS)
        self.aux = nn.Linear(HIDDEN, OUTPUTS)

    def forward(self, x):
        h = torch.tanh(self.trunk(x))
        return self.head(h), self.aux(h)


class Overflow(nn.Module):
    def __init__(self):
        super().__init__()
        self.raw = nn.Linear(INPUTS, HIDDEN)
        with torch.no_grad():
            self.raw.weight.mul_(100.0)
        self.norm = nn.LayerNorm(HIDDEN)
        self.out = nn.Linear(HIDDEN, OUTPUTS)

    def forward(self, x):
        return self.out(self.norm(self.raw(x)))


class Saturated(nn.Module):
    """Self-attention over the input read as TOKENS tokens, query and key weights QK_GAIN times too large."""

    TOKENS, WIDTH, QK_GAIN = 4, 32, 40.0

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(INPUTS // self.TOKENS, self.WIDTH)
        self.q, self.k, self.v = (nn.Linear(self.WIDTH, self.WIDTH) for _ in range(3))
        with torch.no_grad():
            self.q.weight.mul_(self.QK_GAIN)
            self.k.weight.mul_(self.QK_GAIN)
        self.out = nn.Linear(self.WIDTH, OUTPUTS)

    def forward(self, x):
        h = self.embed(x.reshape(x.shape[0], self.TOKENS, -1))
        logits = self.q(h) @ self.k(h).transpose(1, 2) / math.sqrt(self.WIDTH)
        return self.out((torch.softmax(logits, -1) @ self.v(h)).mean(1))


def _mse(out, target):
    return nn.functional.mse_loss(out, target)


def _aux_loss(out, target):
    main, aux = out
    return nn.functional.mse_loss(main, target) + AUX_WEIGHT * nn.functional.mse_loss(aux, target.flip(1))


TASKS = {
    "harmless": (Harmless, _mse, lambda x: torch.cat([x[:, :4], x[:, 4:] * 1e-9], 1)),
    "aux_head": (AuxHead, _aux_loss, lambda x: x),
    "overflow": (Overflow, _mse, lambda x: x * 1e3),
    "saturated": (Saturated, _mse, lambda x: x),
}


def task(name: str, seed: int = 0):
    """(model, loss_fn, batches) of a planted task; batches(steps, batch) yields (x, target) from `seed`."""
    if name not in TASKS:
        raise ValueError(f"unknown planted task {name!r}; the tasks: {', '.join(TASKS)}")
    make, loss_fn, inputs = TASKS[name]
    torch.manual_seed(seed)
    model = make()
    teacher = torch.randn(INPUTS, OUTPUTS, generator=torch.Generator().manual_seed(seed + 100))

    def batches(steps: int, batch: int = 32):
        g = torch.Generator().manual_seed(seed + 1)
        for _ in range(steps):
            x = torch.randn(batch, INPUTS, generator=g)
            yield inputs(x), torch.tanh(x @ teacher) + 0.1 * torch.randn(batch, OUTPUTS, generator=g)

    return model, loss_fn, batches


@contextlib.contextmanager
def kept_in_fp32(model, names):
    """Run the named submodules outside autocast, their floating inputs cast to float32."""
    handles, contexts = [], []
    modules = dict(model.named_modules())
    modules[type(model).__name__] = model          # the root by its class name, as the analyzer names it

    def pre(module, args):
        ctx = torch.autocast(next(model.parameters()).device.type, enabled=False)
        ctx.__enter__()
        contexts.append(ctx)
        return tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)

    def post(module, args, output):
        contexts.pop().__exit__(None, None, None)

    for name in names:
        if name not in modules:
            raise ValueError(f"no module named {name!r} in the model")
        handles += [modules[name].register_forward_pre_hook(pre), modules[name].register_forward_hook(post)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def train_real(model, loss_fn, batches, *, dtype=None, scale_log2: int = 0, keep_fp32=(), lr: float = 1e-2):
    """Train with Adam, for real; {'losses': [...], 'skipped': n}. batches: (inputs, target) pairs, inputs a
    tensor or a tuple of them; loss_fn(output, target). dtype None: FP32; torch.float16/bfloat16:
    CPU torch.autocast with the loss multiplied by 2^scale_log2 and the gradients divided back (a step with a
    non-finite gradient is skipped, as GradScaler does)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    scale = math.ldexp(1.0, scale_log2)
    losses, skipped = [], 0
    autocast = torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()
    for x, target in batches:
        with kept_in_fp32(model, keep_fp32), autocast:
            out = model(*x) if isinstance(x, tuple) else model(x)
        loss = loss_fn(tuple(o.float() for o in out) if isinstance(out, tuple) else out.float(), target)
        optimizer.zero_grad()
        (loss * scale).backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        for g in grads:
            g.div_(scale)
        losses.append(float(loss.detach()))
        if not all(bool(torch.isfinite(g).all()) for g in grads):
            skipped += 1
            continue
        optimizer.step()
    return {"losses": losses, "skipped": skipped}
