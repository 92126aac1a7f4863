"""Study 6: the analyzer's shadow-step verdicts against what real FP16/BF16 training did.

Each model is trained in FP32 under `fpsim.watch(shadow_every=...)`, which gives per-layer verdicts and a
loss scale for FP16 and BF16; then the same model, from the same weights and the same batches, is trained
for real with CPU torch.autocast: FP16 as it is, FP16 with the layers fpsim said to keep in FP32, FP16 with
the whole recommendation (those layers and the loss scale), BF16 as it is where fpsim asks anything for it,
and BF16 with its recommendation. A row agrees
when each part of the recommendation was needed exactly where fpsim said so.

    fpsim study verdict_agreement [--fast] [--out DIR]   # or: python studies/verdict_agreement.py
"""

from __future__ import annotations

import copy
import itertools
import math
import sys

import torch
from torch import nn

from fpsim import plots


TITLE = "Verdicts against reality: shadow-step verdicts and real CPU FP16/BF16 training"
CLAIM = (
    "From one observed FP32 run, fpsim tells which layers need FP32 and which loss scale FP16 needs, judging "
    "each layer by the gradient error a low-precision replay of the step really produces, against the noise "
    "the FP32 gradient already carries (docs/verdicts.md). If the verdicts are right, real FP16 training "
    "fails (or trains worse) exactly when fpsim asks for something, and trains as FP32 did once given it."
)
SEEDS, FAST_SEEDS = tuple(range(9)), (0, 1, 2)
"""Every configuration (FP32 included) is trained once per seed, from the same weights: seed k draws the dropout
masks from torch.manual_seed(k) and the k-th run of batches of the same stream. A low-precision run is judged
by its paired differences (its metric minus FP32's with the same seed), so that the seed-to-seed noise of the
training, which is larger than many real numeric effects, cancels where the runs follow each other and is
measured where they do not. Nine seeds resolve effects of a few percent of what training achieves (the demo's
unscaled FP16 loses about 4% of it, and three seeds could not tell); the fast version keeps three."""
ROUNDS = 3
"""A configuration that its first seeds leave undecided (see `decided`) gets more rounds of as many seeds, up to
this many rounds in all, and its FP32 runs with it. The GPT showed why: after chaotic training its FP16 runs
end up to 0.09 from FP32's with the same seed; its first nine seeds on one machine put FP16 +0.038 +- 0.011 above
FP32 in training loss (3.4 standard errors), thirty seeds +0.010 +- 0.009."""
MATERIAL = 0.01
"""A real effect smaller than this share of what FP32 training achieved by a measure (the untrained metric, or
the first step's loss, minus FP32's) is no effect anyone would act on, and no verdict should ask for anything
because of it."""


# ------------------------------------------------------------------ models
def gpt_task(fast: bool):
    """A 2-layer GPT (nanoGPT style) on characters of the Python documentation shipped with the stdlib."""
    from pydoc_data.topics import topics

    from fpsim.analyze.gpt import GPT, GPTConfig

    text = "".join(topics[k] for k in sorted(topics))
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    config = GPTConfig(vocab_size=len(chars), block_size=32, n_layer=2, n_head=4, n_embd=64, dropout=0.1)
    torch.manual_seed(0)
    model = GPT(config)
    split = len(data) * 9 // 10

    def batches(steps, batch=16, seed=1, start=0, stop=split):
        g = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            i = torch.randint(start, stop - config.block_size - 1, (batch,), generator=g)
            x = torch.stack([data[j:j + config.block_size] for j in i])
            y = torch.stack([data[j + 1:j + 1 + config.block_size] for j in i])
            yield (x, y), None

    def evaluate(model):
        model.eval()
        with torch.no_grad():
            losses = [float(model(*x)[1]) for x, _ in batches(8, 32, seed=99, start=split, stop=len(data))]
        model.train()
        return sum(losses) / len(losses)

    return {"name": "GPT, 2 layers x 64, pydoc_data.topics characters, dropout 0.1", "model": model,
            "loss": lambda out, _: out[1], "batches": batches, "evaluate": evaluate,
            "metric": "validation loss", "steps": 40 if fast else 300}


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean(dim=(2, 3)))


def stripes(samples: int, seed: int):
    """12x12 images of horizontal, vertical or diagonal stripes (random period and phase) in noise; labels."""
    g = torch.Generator().manual_seed(seed)
    label = torch.randint(0, 3, (samples,), generator=g)
    period = torch.randint(3, 6, (samples, 1, 1), generator=g).float()
    phase = torch.rand(samples, 1, 1, generator=g) * 6.3
    r, c = torch.meshgrid(torch.arange(12.0), torch.arange(12.0), indexing="ij")
    coord = torch.where(label[:, None, None] == 0, r, torch.where(label[:, None, None] == 1, c, r + c))
    images = torch.sin(coord * 6.283 / period + phase) + 0.8 * torch.randn(samples, 12, 12, generator=g)
    return images[:, None], label


def cnn_task(fast: bool):
    """A CNN with BatchNorm on generated stripe images."""
    torch.manual_seed(0)
    model = SmallCNN()
    test_x, test_y = stripes(512, seed=99)

    def batches(steps, batch=32):
        x, y = stripes(steps * batch, seed=1)
        for i in range(steps):
            yield x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]

    def evaluate(model):
        model.eval()
        with torch.no_grad():
            loss = float(nn.functional.cross_entropy(model(test_x), test_y))
        model.train()
        return loss

    return {"name": "CNN with BatchNorm, generated 12x12 stripe images", "model": model,
            "loss": nn.functional.cross_entropy, "batches": batches, "evaluate": evaluate,
            "metric": "test loss", "steps": 20 if fast else 150}


def demo_task(fast: bool):
    """The demo's SensorNet (raw pascals, deep Sigmoid stack), 64 wide, batches of 1024 as the demo uses."""
    from fpsim.analyze.demo import TRAIN_SAMPLES, SensorNet, sensor_data

    data = sensor_data()
    torch.manual_seed(0)
    model = SensorNet(hidden=64)

    def batches(steps, batch=1024):
        g = torch.Generator().manual_seed(1)
        for _ in range(steps):
            i = torch.randint(0, TRAIN_SAMPLES, (batch,), generator=g)
            yield (data["readings"][i], data["pressure"][i]), data["label"][i]

    def evaluate(model):
        with torch.no_grad():
            out = model(data["readings"][TRAIN_SAMPLES:], data["pressure"][TRAIN_SAMPLES:])
            return float(nn.functional.cross_entropy(out, data["label"][TRAIN_SAMPLES:]))

    return {"name": "demo SensorNet (64 wide), generated sensor data", "model": model,
            "loss": nn.functional.cross_entropy, "batches": batches, "evaluate": evaluate,
            "metric": "test loss", "steps": 20 if fast else 200}


PLANTED = {"harmless": "3/4 of the inputs 1e-9 smaller: their weight gradients flush to zero in FP16",
           "aux_head": "a second head trained by an auxiliary loss weighted 1e-6",
           "overflow": "a Linear whose outputs pass 65504, then a LayerNorm",
           "saturated": "attention with query/key weights 40x too large: logits ~10^3, a one-hot softmax"}


def planted_task(name: str, fast: bool):
    from fpsim.analyze import planted

    model, loss_fn, batches = planted.task(name)
    _, _, held_out = planted.task(name, seed=0)
    test = list(held_out(1, 256))[0]

    def evaluate(model):
        with torch.no_grad():
            out = model(test[0])
            if name == "aux_head":           # what the auxiliary loss trains: the second head
                return float(nn.functional.mse_loss(out[1], test[1].flip(1)))
            return float(nn.functional.mse_loss(out, test[1]))

    return {"name": f"planted: {name} ({PLANTED[name]})",
            "model": model, "loss": loss_fn, "batches": batches, "evaluate": evaluate,
            "metric": "aux-head loss" if name == "aux_head" else "loss", "steps": 30 if fast else 150}


# ------------------------------------------------------------------ method
def observe(task, shadow_every: int, steps: int):
    from fpsim.analyze import watch

    model = copy.deepcopy(task["model"])
    torch.manual_seed(0)                 # the same dropout masks in every run
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    with watch(model, formats=("fp16", "bf16"), shadow_every=shadow_every) as w:
        for x, target in task["batches"](steps):
            out = model(*x) if isinstance(x, tuple) else model(x)
            loss = task["loss"](out, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return w.report()


def real(task, seed: int = 0, **options) -> tuple:
    """(the task's metric, the mean training loss over the last quarter of the steps, the first step's training
    loss) after real training with train_real's options, NaN where the run ended non-finite; seed k: dropout from
    torch.manual_seed(k) and the k-th run of batches of the same stream (those after the first k * steps)."""
    from fpsim.analyze.planted import train_real

    model = copy.deepcopy(task["model"])
    steps = task["steps"]
    batches = itertools.islice(task["batches"]((seed + 1) * steps), seed * steps, None)
    torch.manual_seed(seed)
    losses = train_real(model, task["loss"], batches, **options)["losses"]
    if not all(math.isfinite(v) for v in losses[-5:]):
        return math.nan, math.nan, losses[0]
    tail = losses[-max(1, len(losses) // 4):]
    return task["evaluate"](model), _mean(tail), losses[0]


def recommendation(report, fmt: str):
    """(layers to keep in FP32, log2 loss scale) for a format, with their qualified module names."""
    keep = tuple(layer.name for layer in report.layers if not layer.is_op
                 and report.verdicts[layer.name][fmt].verdict == "fp32")
    scale = report.loss_scale[fmt].recommended_log2
    return keep, scale or 0


def worse(runs, fp32_runs, material) -> bool:
    """A configuration trains worse than FP32: non-finite with some seed, or by either measure (the task's
    metric, the training loss at the end) a mean paired difference above both twice its standard error and
    that measure's material margin. runs, fp32_runs: per seed (metric, training loss); material: per measure."""
    if not all(math.isfinite(v) for run in runs for v in run[:2]):
        return True
    for i, margin in enumerate(material):
        mean, error = paired([r[i] for r in runs], [r[i] for r in fp32_runs])
        if mean > 2 * error and mean > margin:
            return True
    return False


def decided(runs, fp32_runs, material) -> bool:
    """Whether the seeds run so far settle `worse`, whatever fpsim predicted: the runs are non-finite, or some
    measure is clearly worse (a mean paired difference above both 5 standard errors and its material margin), or
    every measure is clearly immaterial (a mean below half its margin)."""
    if not all(math.isfinite(v) for run in runs for v in run[:2]):
        return True
    means = [paired([r[i] for r in runs], [r[i] for r in fp32_runs]) for i in range(len(material))]
    if any(mean > 5 * error and mean > margin for (mean, error), margin in zip(means, material)):
        return True
    return all(mean < margin / 2 for (mean, _), margin in zip(means, material))


def _mean(values) -> float:
    return sum(values) / len(values)


def paired(runs, fp32_runs):
    """(mean, standard error) of the paired differences run k minus FP32 run k."""
    d = [a - b for a, b in zip(runs, fp32_runs)]
    mean = _mean(d)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1))
    return mean, sd / math.sqrt(len(d))


def describe(keep, scale) -> str:
    parts = [f"FP32: {', '.join(keep)}"] if keep else []
    if scale:
        parts.append(f"scale 2^{scale}")
    return "; ".join(parts) or "nothing (ok, scale 1)"


def counted(report, fmt: str) -> str:
    c = report.counted
    if c is None:
        return "-"
    keep = [n for n, v in c["verdicts"].items() if v[fmt].verdict == "fp32" and ":" not in n]
    scaled = [n for n, v in c["verdicts"].items() if v[fmt].verdict == "loss_scale" and ":" not in n]
    s = c["loss_scale"][fmt].recommended_log2
    return f"{len(keep)} fp32, {len(scaled)} loss_scale, scale {'none' if s is None else f'2^{s}'}"


FAST_TASKS = ("harmless", "aux_head", "overflow", "saturated", "cnn")
SLOW_TASKS = ("gpt", "demo")
"""The rows: the fast version (the test suite's) leaves out the slowest models."""
SHADOW_EVERY = 5


def _material(metrics, key: str, seeds, untrained: float) -> tuple:
    """Per measure, MATERIAL of what FP32 training achieved over the first seeds: (metric, training loss)."""
    fp32 = [metrics[key, "fp32", s] for s in seeds]
    return (MATERIAL * (untrained - _mean([r[0] for r in fp32])),
            MATERIAL * (_mean([r[2] for r in fp32]) - _mean([r[1] for r in fp32])))


def make_task(key: str, fast: bool):
    return planted_task(key, fast) if key in PLANTED else globals()[f"{key}_task"](fast)


def observed(key: str, fast: bool):
    """fpsim's side of a row: (recommendation fp16, recommendation bf16, what the counts said, untrained metric)."""
    torch.set_num_threads(1)
    task = make_task(key, fast)
    analysis = observe(task, SHADOW_EVERY, min(task["steps"], 40))
    return (recommendation(analysis, "fp16"), recommendation(analysis, "bf16"), counted(analysis, "fp16"),
            task["evaluate"](copy.deepcopy(task["model"])))


def trained(key: str, fast: bool, seed: int = 0, dtype=None, keep_fp32=(), scale_log2: int = 0) -> tuple:
    """Reality's side: the metrics after real training (see `real`)."""
    torch.set_num_threads(1)
    options = {} if dtype is None else {"dtype": dtype, "keep_fp32": keep_fp32, "scale_log2": scale_log2}
    return real(make_task(key, fast), seed, **options)


def _map(calls):
    """[f(*args) for f, args in calls], each in a forked process, as many at a time as there are cores (every
    run is seeded: the results are those of one process); in this process where fork is not available."""
    import multiprocessing
    import multiprocessing.connection
    import os

    workers = os.cpu_count() or 1
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return [f(*args) for f, args in calls]
    context = multiprocessing.get_context("fork")     # fork: the study module need not be importable by name
    todo, running, results = list(enumerate(calls)), [], {}
    while todo or running:
        while todo and len(running) < workers:
            i, (f, args) = todo.pop(0)
            reader, writer = context.Pipe(duplex=False)
            process = context.Process(target=_child, args=(f, args, writer))
            process.start()
            writer.close()
            running.append((i, process, reader))
        ready = multiprocessing.connection.wait([reader for _, _, reader in running])
        for entry in [e for e in running if e[2] in ready]:
            i, process, reader = entry
            try:
                ok, value = reader.recv()
            except EOFError:
                ok, value = False, f"the worker process ended with exit code {process.join() or process.exitcode}"
            process.join()
            running.remove(entry)
            if not ok:
                raise RuntimeError(f"{calls[i][0].__name__}{calls[i][1]}: {value}")
            results[i] = value
    return [results[i] for i in range(len(calls))]


def _child(f, args, writer):
    try:
        writer.send((True, f(*args)))
    except BaseException as err:           # reported by the parent, which raises
        writer.send((False, f"{type(err).__name__}: {err}"))


def run(report, fast: bool) -> None:
    torch.set_num_threads(1)
    keys = FAST_TASKS if fast else FAST_TASKS + SLOW_TASKS
    about = {key: {k: task[k] for k in ("name", "steps", "metric")} for key, task in
             ((key, make_task(key, fast)) for key in keys)}
    shadow_every = SHADOW_EVERY
    seeds = FAST_SEEDS if fast else SEEDS
    rows, agree_all = [], True
    report.section("Method")
    report.text(f"""
Each model is first trained in FP32 for min(N, 40) steps with Adam (lr 1e-2) under
`fpsim.watch(model, formats=("fp16", "bf16"), shadow_every={shadow_every})`: every {shadow_every}th step is
replayed (the noise floor, FP16 and BF16 taking turns; FP16/BF16 emulated, the default), and each layer is
judged by its gradient error against its noise floor.
fpsim's recommendation for a format is: the layers judged `fp32` kept outside autocast, and the recommended
loss scale. Then the model is trained for real from the same initial weights (CPU torch.autocast, torch's own
FP16/BF16 arithmetic; a static loss scale, steps with non-finite gradients skipped as GradScaler does): FP32,
FP16 as it is, FP16 with the FP32 layers, FP16 with the whole recommendation, BF16 as it is (where fpsim
recommends anything for BF16) and BF16 with its recommendation, each with seeds {", ".join(map(str, seeds))}
(seed k: dropout masks from torch.manual_seed(k) and the k-th run of batches of the same stream). Two measures
of each run: the task's metric, measured in FP32 after training, and the mean training loss over the last quarter
of the steps.
A configuration is *worse* than FP32 when it is non-finite with some seed, or when, by either measure, its mean
paired difference (its value minus FP32's with the same seed, averaged over the seeds) exceeds both twice its
standard error (the seed-to-seed noise that pairing does not cancel) and {MATERIAL:.0%} of what FP32 training
achieved by that measure (the untrained metric, or the first step's loss, minus FP32's: a smaller effect is
none anyone would act on). A configuration that these seeds leave undecided (neither non-finite, nor clearly
worse by some measure: a mean above 5 standard errors and the material margin, nor clearly immaterial by every
measure: a mean below half its margin) is trained with {len(seeds)} more seeds, and its FP32 runs with it, up to
{ROUNDS * len(seeds)} seeds; this rule does not look at fpsim's verdicts.
A row agrees when: FP16 as it is is worse exactly when fpsim recommends anything; FP16 with only the FP32
layers is worse exactly when fpsim recommends a scale above 1; BF16 as it is is worse exactly when fpsim
recommends anything for BF16; FP16 and BF16 with their recommendations are not worse. (The runs are
independent and seeded: they run in parallel processes where the machine has several cores.)
""")
    sides = dict(zip(keys, _map([(observed, (key, fast)) for key in keys])))
    options = {}
    for key in keys:
        (keep16, scale16), (keep_bf, scale_bf), _, _ = sides[key]
        options[key] = {"fp32": (), "fp16": (torch.float16,), "bf16_recommended": (torch.bfloat16, keep_bf, scale_bf)}
        # a run with the same options as one before is the same computation (seeded alike): not repeated
        if keep_bf or scale_bf:
            options[key]["bf16"] = (torch.bfloat16,)
        if keep16:
            options[key]["fp16_kept"] = (torch.float16, keep16)
        if scale16:
            options[key]["fp16_recommended"] = (torch.float16, keep16, scale16)
    metrics = {}

    def seeds_run(key, config):
        return [s for s in range(len(seeds) * ROUNDS) if (key, config, s) in metrics]

    todo = {(key, config): list(seeds) for key in keys for config in options[key]}
    for round_ in range(ROUNDS):
        calls = {(key, config, seed): (key, fast, seed, *options[key][config])
                 for (key, config), more in todo.items() for seed in more if (key, config, seed) not in metrics}
        metrics.update(zip(calls, _map([(trained, args) for args in calls.values()])))
        next_seeds = [s + (round_ + 1) * len(seeds) for s in seeds]
        todo = {}
        for key in keys:
            material = _material(metrics, key, seeds, sides[key][3])
            for config in options[key]:
                ran = seeds_run(key, config)
                if config != "fp32" and not decided([metrics[key, config, s] for s in ran],
                                                    [metrics[key, "fp32", s] for s in ran], material):
                    todo[key, config] = todo[key, "fp32"] = next_seeds
        if not todo or round_ + 1 == ROUNDS:
            break
    for key in keys:
        name, steps, metric = about[key]["name"], about[key]["steps"], about[key]["metric"]
        (keep16, scale16), (keep_bf, scale_bf), said, untrained = sides[key]
        ran = {config: seeds_run(key, config) for config in options[key]}
        runs = {config: [metrics[key, config, s] for s in ran[config]] for config in options[key]}
        against = {config: [metrics[key, "fp32", s] for s in ran[config]] for config in options[key]}
        for alias, original in (("fp16_kept", "fp16"), ("fp16_recommended", "fp16_kept"),
                                ("bf16", "bf16_recommended")):
            if alias not in runs:
                runs[alias], against[alias] = runs[original], against[original]
        material = _material(metrics, key, seeds, untrained)
        judged = {config: worse(r, against[config], material) for config, r in runs.items() if config != "fp32"}
        agrees = (judged["fp16"] == bool(keep16 or scale16) and judged["fp16_kept"] == bool(scale16)
                  and not judged["fp16_recommended"] and not judged["bf16_recommended"]
                  and judged["bf16"] == bool(keep_bf or scale_bf))
        agree_all &= agrees

        def cell(config):
            r = runs[config]
            bad = sum(not all(math.isfinite(v) for v in run[:2]) for run in r)
            if bad:
                return f"NaN/Inf ({bad} of {len(r)} seeds)"
            parts = []
            for i in (0, 1):
                mean, error = paired([x[i] for x in r], [x[i] for x in against[config]])
                parts.append(f"{mean:+.4f} ± {error:.4f}".replace("-0.0000 ", "+0.0000 "))
            more = f", {len(r)} seeds" if len(r) > len(seeds) else ""
            return (f"{_mean([x[0] for x in r]):.4f} ({parts[0]}; train {parts[1]}{more})"
                    f"{' **worse**' if judged[config] else ''}")

        rows.append([name, f"{steps} ({metric}; untrained {untrained:.3g})", describe(keep16, scale16), said,
                     f"{_mean([metrics[key, 'fp32', s][0] for s in seeds]):.4f}",
                     f"{material[0]:.4f}; train {material[1]:.4f}",
                     cell("fp16"), cell("fp16_kept"), cell("fp16_recommended"), describe(keep_bf, scale_bf),
                     cell("bf16"), cell("bf16_recommended"), "yes" if agrees else "**no**"])
        report.values[name] = {**{config: _mean([x[0] for x in r]) for config, r in runs.items()},
                               "ratio": {config: _mean([x[0] for x in r]) / _mean([x[0] for x in against[config]])
                                         for config, r in runs.items()},
                               "seeds": {config: [list(x[:2]) for x in r] for config, r in runs.items()},
                               "material": list(material), "worse": judged,
                               "fp16_recommendation": [list(keep16), scale16], "agrees": agrees}
    report.section("Agreement")
    report.table(["model", "steps (metric)", "fpsim FP16", "value counts said (FP16)", "FP32", "material",
                  "FP16 as is", "FP16 + FP32 layers", "FP16 + recommendation", "fpsim BF16", "BF16 as is",
                  "BF16 + recommendation",
                  "agrees"],
                 rows, caption=f"Real CPU autocast training after N steps, from the same weights, seeds "
                               f"{', '.join(map(str, seeds))} (more where a cell says so; FP32's column: these "
                               f"seeds). Each cell: the mean metric over its seeds (measured "
                               f"in FP32 after training) and, in brackets, the mean paired difference from FP32 ± "
                               f"its standard error, of the metric and of the training loss over the last quarter "
                               f"of the steps; 'material': {MATERIAL:.0%} of FP32's progress by each measure.")
    runs = ("fp16", "fp16_kept", "fp16_recommended", "bf16_recommended")
    labels = ("FP16 as is", "FP16 + FP32 layers", "FP16 + recommendation", "BF16 + recommendation")
    ratios = {label: [report.values[about[k]["name"]]["ratio"][r] for k in keys]
              for r, label in zip(runs, labels)}
    report.figure(plots.sweep(list(range(1, len(keys) + 1)), ratios, xlabel="model (rows of the table, in order)",
                              ylabel="metric / FP32 run's metric",
                              marks=[(i + 1, str(i + 1)) for i in range(len(keys))],
                              title="Real CPU autocast training against FP32, per model"),
                  "ratios", "Each model's mean metric over the seeds after real low-precision training divided by "
                            "the FP32 runs' mean over the same seeds; missing points: a run ended in NaN/Inf. 1 is as "
                            "good as FP32.")
    report.values["all_agree"] = agree_all
    if agree_all:
        report.finding = ("Every row agrees: real FP16 training was worse than FP32 exactly where fpsim's "
                          "shadow-step verdicts asked for FP32 layers or a loss scale, and trained as FP32 did once "
                          "given them; value counts alone asked for more.")
    else:
        report.finding = ("Not every row agrees: " + "; ".join(
            row[0] for row in rows if row[-1] != "yes") + " (see the table).")


if __name__ == "__main__":
    from fpsim.cli import main

    sys.exit(main(["study", "verdict_agreement", *sys.argv[1:]]))
