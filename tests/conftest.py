"""Test-suite configuration shared by every test directory."""

import os
from pathlib import Path

import pytest
from hypothesis import settings

# Hypothesis draws the same examples on every run by default, so that a run of the suite (CI's above all)
# gives the same result each time; HYPOTHESIS_PROFILE=explore draws new ones each run (how bugs are found:
# keep what it finds as an @example).
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

# Directories whose tests train small torch models: they run single-threaded, which is faster for
# models this small, on a busy machine above all.
SINGLE_THREAD_DIRS = ("analyze", "emulate", "integrations")
TESTS = Path(__file__).resolve().parent


def pytest_configure(config):
    # numpy warns when a signalling-NaN bit pattern is widened; the tests do that on purpose
    config.addinivalue_line("filterwarnings", "ignore:invalid value encountered in cast:RuntimeWarning")


@pytest.fixture(autouse=True)
def one_torch_thread(request):
    """torch.set_num_threads(1) around each test of SINGLE_THREAD_DIRS (torch is loaded only there)."""
    path = Path(request.node.path).resolve()
    if not any(path.is_relative_to(TESTS / name) for name in SINGLE_THREAD_DIRS):
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
