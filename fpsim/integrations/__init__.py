"""Training frameworks adapted to the analyzer: callbacks that watch a fit and save its report.

    from fpsim.integrations import LightningCallback, TrainerCallback
    lightning.Trainer(callbacks=[LightningCallback(out="fpsim-report")])
    transformers.Trainer(..., callbacks=[TrainerCallback(out="fpsim-report", tensorboard="runs/fpsim")])

Each name is imported on first use, so that importing fpsim.integrations loads
neither Lightning nor transformers (nor torch). See docs/integrations.md.
"""

_LAZY = {
    "LightningCallback": "fpsim.integrations.lightning_callback",
    "TrainerCallback": "fpsim.integrations.trainer_callback",
    "FitObservation": "fpsim.integrations.observation",
    "to_tensorboard": "fpsim.analyze.tensorboard",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fpsim.integrations' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
