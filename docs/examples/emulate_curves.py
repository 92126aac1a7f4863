"""Loss curves of one training loop under emulated recipes (docs/emulate.md).

    python docs/examples/emulate_curves.py sensor      # the demo's SensorNet, with an analyzer report
    python docs/examples/emulate_curves.py gpt         # a small GPT

Each recipe trains the same model from the same seed with the same data order; the loop is
unchanged, only the fpsim.emulate options differ. For `sensor`, a short FP32 run is first
observed with fpsim.watch and its report saved to sensor-report/; the `from_report` run
applies that report's recommendation (layers to keep in FP32, the loss scale).
"""

import argparse
import time

import torch

import fpsim
from fpsim.analyze.demo import SensorNet, sensor_data, test_accuracy, train as train_sensor
from fpsim.analyze.gpt import GPT, GPTConfig, token_batches

parser = argparse.ArgumentParser()
parser.add_argument("model", choices=("sensor", "gpt"))
parser.add_argument("--steps", type=int, default=200)
args = parser.parse_args()
torch.set_num_threads(1)

if args.model == "sensor":
    data = sensor_data()
    build = SensorNet
    accuracy = {}

    def train(model):
        losses = train_sensor(model, data, args.steps)
        accuracy[len(accuracy)] = test_accuracy(model, data)
        return losses

    torch.manual_seed(0)
    observed = SensorNet()
    with fpsim.watch(observed, formats=("fp16", "bf16", "e4m3", "e5m2")) as w:
        train_sensor(observed, data, 50)
    w.report().save("sensor-report", figures=False)
    advice = fpsim.emulate(SensorNet(), "fp16", from_report="sensor-report")
    print(f"sensor-report/ recommends for fp16: keep {sorted(advice.selection.kept_modules)} and ops "
          f"{advice.selection.kept_ops or 'none'} in FP32, loss scale {advice.loss_scale:g}")
    recipes = {
        "fp32": "fp32",
        "bf16": "bf16",
        "fp16": "fp16",
        "fp16, keep pressure": ("fp16", {"keep": ["pressure"]}),
        "fp16, keep pressure, scale 2^15": ("fp16", {"keep": ["pressure"], "loss_scale": 2.0 ** 15}),
        "fp16, from_report": ("fp16", {"from_report": "sensor-report"}),
        "fp8, keep pressure": ("fp8", {"keep": ["pressure"]}),
    }
else:
    config = GPTConfig(n_layer=2, n_embd=64, n_head=4, block_size=64)
    accuracy = None

    def build():
        return GPT(config)

    def train(model):
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses = []
        for x, y in token_batches(config, 8, args.steps, seed=1):
            _, loss = model(x, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses

    recipes = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp16, scale 2^12": ("fp16", {"loss_scale": 2.0 ** 12}),
               "fp8": "fp8", "fp8-e4m3": "fp8-e4m3"}

start = time.perf_counter()
runs = fpsim.emulate.compare(build, train, recipes)
shown = list(range(0, args.steps, args.steps // 10)) + [args.steps - 1]
print(f"{'step':<32}" + "".join(f"{s:>7}" for s in shown) + ("  test accuracy" if accuracy else ""))
for i, (label, run) in enumerate(runs.items()):
    tail = f"  {accuracy[i]:.3f}" if accuracy else ""
    print(f"{label:<32}" + "".join(f"{run.losses[s]:7.3f}" for s in shown) + tail)
print(f"({len(runs)} runs of {args.steps} steps in {time.perf_counter() - start:.0f} s)")
