"""Study 6: two published mixed-precision findings, reproduced by emulated training on the CPU.

Micikevicius et al. 2018: a model whose gradients fall below FP16's range trains worse in
FP16 without loss scaling, and as FP32 with it. Micikevicius et al. 2022: FP8 training with
E4M3 in the forward pass and E5M2 for gradients tracks 16-bit (BF16) training on a small GPT.
Each run is the same loop from the same seed under `fpsim.emulate`, only the recipe differs.

    fpsim study emulated_training [--fast] [--out DIR]   # or: python studies/emulated_training.py
"""

from __future__ import annotations

import math
import sys

TITLE = "Emulated training: FP16 loss scaling (Micikevicius et al. 2018) and FP8 against BF16 (2022)"
CLAIM = (
    "Micikevicius et al., *Mixed Precision Training* (ICLR 2018): gradients below FP16's range are lost "
    "without loss scaling, and a model that depends on them trains worse (their Multibox SSD diverged); with "
    "loss scaling, FP16 mixed precision matches FP32. Micikevicius et al., *FP8 Formats for Deep Learning* "
    "(arXiv:2209.05433, 2022): FP8 training with E4M3 for weights and activations and E5M2 for gradients, "
    "per-tensor scaled, matches 16-bit training (their GPT models' loss curves track the BF16 ones)."
)

# the 2018 part: the demo's SensorNet, narrowed to train in seconds
SENSOR = dict(hidden=64, depth=6)
SENSOR_BATCH = 1024
KEEP = ["pressure"]       # raw pressures (1e5 Pa) overflow FP16: kept in FP32, so that only underflow is tested
# the 2022 part: a small GPT
GPT = dict(n_layer=2, n_embd=32, n_head=2, block_size=32)
GPT_BATCH, GPT_LR = 8, 3e-3


def _sensor_runs(steps: int, every: int) -> dict:
    import torch

    import fpsim
    from fpsim.analyze.demo import SensorNet, sensor_data, test_accuracy, train

    data = sensor_data()
    torch.manual_seed(0)
    observed = SensorNet(**SENSOR)
    with fpsim.watch(observed, formats=("fp16",), every=every) as watcher:   # the FP32 run, observed
        reference = train(observed, data, steps, batch=SENSOR_BATCH)
    advice = watcher.report().to_dict()["loss_scale"]["fp16"]
    scale = float(advice["recommended"])
    runs = {"fp32": (reference, test_accuracy(observed, data))}
    for label, options in (("fp16, no loss scale", {}), (f"fp16, loss scale 2^{int(math.log2(scale))}",
                                                           {"loss_scale": scale})):
        torch.manual_seed(0)
        model = SensorNet(**SENSOR)
        with fpsim.emulate(model, "fp16", keep=KEEP, **options):
            losses = train(model, data, steps, batch=SENSOR_BATCH)
        runs[label] = (losses, test_accuracy(model, data))
    return runs, scale, advice


def _gpt_runs(steps: int) -> dict:
    import torch

    import fpsim
    from fpsim.analyze.gpt import GPT as Model, GPTConfig, token_batches

    config = GPTConfig(**GPT)

    def train(model):
        optimizer = torch.optim.AdamW(model.parameters(), lr=GPT_LR)
        losses = []
        for x, y in token_batches(config, GPT_BATCH, steps, seed=1):
            _, loss = model(x, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses

    runs = fpsim.emulate.compare(lambda: Model(config), train,
                                 {"fp32": "fp32", "bf16": "bf16", "fp8 (E4M3 fwd, E5M2 bwd, delayed scaling)": "fp8"})
    return {label: run.losses for label, run in runs.items()}, config


def _mean_tail(losses, n):
    tail = losses[-n:]
    return sum(tail) / len(tail)


def run(report, fast: bool) -> None:
    import torch

    from fpsim import plots

    torch.set_num_threads(1)
    sensor_steps, gpt_steps = (6, 6) if fast else (100, 80)
    tail = max(1, sensor_steps // 10)
    sensor, scale, advice = _sensor_runs(sensor_steps, every=2 if fast else 5)
    gpt, config = _gpt_runs(gpt_steps)

    report.section("Method")
    report.text(f"""
**2018, loss scaling.** The demo's SensorNet (`fpsim.analyze.demo`, {SENSOR['depth']} Sigmoid layers
{SENSOR['hidden']} wide: its early layers' gradients shrink by the Sigmoids' slopes to below FP16's
smallest subnormal 2^-24) trains {sensor_steps} Adam steps on batches of {SENSOR_BATCH} generated sensor
readings, three times from the same seed and batches: in FP32 (observed by `fpsim.watch(model,
formats=("fp16",))`, which recommends the loss scale), and under `fpsim.emulate(model, "fp16",
keep={KEEP})` without and with that loss scale. The pressure layer sees raw pressures of about 1e5 Pa,
beyond FP16's 65504: it stays in FP32 in both FP16 runs, so that they differ in the loss scale alone.
FP16 runs as torch.autocast runs it on a GPU (its CUDA op lists, FP32 master weights, FP32
accumulation); the loss is the mean cross-entropy of each batch, the accuracy that of 4096 test points.

**2022, FP8.** A GPT ({config.n_layer} layers, {config.n_embd} wide, {config.n_head} heads, context
{config.block_size}, `fpsim.analyze.gpt`) trains {gpt_steps} AdamW steps (lr {GPT_LR}) on batches of
{GPT_BATCH} sequences of generated tokens, from the same seed, in FP32, BF16 (autocast) and FP8: every
linear layer's three GEMMs on E4M3 activations and weights and E5M2 output gradients, with
TransformerEngine's delayed per-tensor scaling (amax history 1024, margin 0: `fpsim.recipes.DelayedScaling`),
the rest in BF16 autocast.
""")

    report.figure(plots.loss_curves({k: v for k, (v, _) in sensor.items()},
                                    title="SensorNet: FP16 with and without loss scaling"),
                  "loss-scaling", "Training loss per step of the same SensorNet run in FP32 and in emulated FP16 "
                                  "mixed precision without and with the analyzer's loss scale.")
    rows = []
    fp32_final = _mean_tail(sensor["fp32"][0], tail)
    for label, (losses, accuracy) in sensor.items():
        final = _mean_tail(losses, tail)
        rows.append((label, f"{final:.4f}", f"{final - fp32_final:+.4f}", f"{accuracy:.3f}"))
    report.table(("run", f"loss, mean of the last {tail} steps", "vs FP32", "test accuracy"), rows,
                 caption=f"The analyzer's FP16 loss scale from the FP32 run: {scale:g} (window 2^{advice['min_log2']} "
                         f".. 2^{advice['max_log2']}). Chance accuracy: 1/5.")

    report.figure(plots.loss_curves(gpt, title="Small GPT: FP8 (hybrid) against BF16 and FP32"),
                  "fp8-gpt", "Training loss per step of the same GPT run in FP32, BF16 and hybrid FP8.")
    gap = max(abs(a - b) for a, b in zip(gpt["fp8 (E4M3 fwd, E5M2 bwd, delayed scaling)"], gpt["bf16"]))
    bf16_gap = max(abs(a - b) for a, b in zip(gpt["bf16"], gpt["fp32"]))
    gpt_tail = max(1, gpt_steps // 10)
    report.table(("run", f"loss, mean of the last {gpt_tail} steps", "largest gap to BF16's loss over the run"),
                 [(label, f"{_mean_tail(losses, gpt_tail):.4f}",
                   f"{max(abs(a - b) for a, b in zip(losses, gpt['bf16'])):.4f}") for label, losses in gpt.items()])

    labels = list(sensor)
    unscaled, scaled = sensor[labels[1]], sensor[labels[2]]
    fp8_final = _mean_tail(gpt["fp8 (E4M3 fwd, E5M2 bwd, delayed scaling)"], gpt_tail)
    bf16_final = _mean_tail(gpt["bf16"], gpt_tail)
    report.values.update(fp32_final=fp32_final, unscaled_final=_mean_tail(unscaled[0], tail),
                         scaled_final=_mean_tail(scaled[0], tail), accuracy={k: a for k, (_, a) in sensor.items()},
                         loss_scale=scale, fp8_bf16_gap=gap, bf16_fp32_gap=bf16_gap, fp8_final=fp8_final,
                         bf16_final=bf16_final)
    report.section("The paper's claim and our numbers")
    report.table(("finding", "paper", "here (emulated, CPU)"), [
        ("FP16 without loss scaling", "SSD: training diverged (2018)",
         f"loss {_mean_tail(unscaled[0], tail):.3f} against FP32's {fp32_final:.3f}, test accuracy "
         f"{unscaled[1]:.3f} against {sensor['fp32'][1]:.3f}"),
        ("FP16 with loss scaling", "matches FP32 (SSD with scale 8; 2018)",
         f"scale {scale:g}: loss {_mean_tail(scaled[0], tail):.3f} ({_mean_tail(scaled[0], tail) - fp32_final:+.4f} "
         f"from FP32), test accuracy {scaled[1]:.3f}"),
        ("FP8, E4M3 forward and E5M2 backward", "tracks 16-bit training on GPT models (2022)",
         f"largest loss gap to BF16 over {gpt_steps} steps {gap:.4f} (BF16 to FP32: {bf16_gap:.4f}); final "
         f"{fp8_final:.3f} against {bf16_final:.3f}"),
    ])
    report.finding = (
        f"FP16 without loss scaling ends at loss {_mean_tail(unscaled[0], tail):.3f} (test accuracy {unscaled[1]:.3f}) "
        f"where FP32 reaches {fp32_final:.3f} ({sensor['fp32'][1]:.3f}); with the analyzer's loss scale {scale:g} FP16 "
        f"ends at {_mean_tail(scaled[0], tail):.3f} ({scaled[1]:.3f}), FP32's curve. Hybrid FP8 stays within "
        f"{gap:.4f} of BF16's loss over {gpt_steps} GPT steps ({fp8_final:.3f} against {bf16_final:.3f} at the end).")


if __name__ == "__main__":
    from fpsim.cli import main

    sys.exit(main(["study", "emulated_training", *sys.argv[1:]]))
