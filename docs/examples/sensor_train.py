"""A plain FP32 training script (the demo's SensorNet, narrowed) for `fpsim analyze --emulate/--confirm`.

    python docs/examples/sensor_train.py --steps 100
    fpsim analyze --confirm --formats fp16,bf16 docs/examples/sensor_train.py -- --steps 100

Nothing here knows fpsim: the command line runs it unchanged, observed or emulated.
"""

import argparse

import torch

from fpsim.analyze.demo import SensorNet, sensor_data, test_accuracy, train

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
torch.set_num_threads(1)
torch.manual_seed(0)
model = SensorNet(hidden=64, depth=6)
data = sensor_data()
losses = train(model, data, args.steps)
print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, test accuracy {test_accuracy(model, data):.3f}")
