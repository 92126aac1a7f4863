"""The rounding-mode registry (fpsim.modes) against the exact oracle and the compiled kernel.

Sources of truth: IEEE 754-2019 section 7.4 (where an overflowing result goes in each
rounding direction), as the Fraction oracle fpsim.exact implements it from the
definitions without reading the registry's overflow column; the C enum of the kernel.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from fpsim import exact, modes


@pytest.mark.parametrize("name", modes.ROUNDING_MODES)
@pytest.mark.parametrize("negative", [False, True])
def test_overflow_direction_is_the_oracles(name, negative):
    """A value far beyond E5M2's max goes to Inf exactly where the registry says it does."""
    x = -1e6 if negative else 1e6
    kwargs = {"random_fraction": 0} if name == "stochastic" else {}
    result = exact.round_value(x, "e5m2", name, **kwargs)
    assert math.isinf(result) == modes.MODES[name].to_infinity[negative]


def test_kernel_ids_are_distinct_and_match_the_c_enum():
    ids = [m.kernel_id for m in modes.MODES.values()]
    assert sorted(ids) == list(range(len(ids)))
    source = (Path(modes.__file__).parent / "_fastround.c").read_text()
    listed = re.search(r"#define FOR_EACH_MODE\(X\)((?:\s*X\(\w+\))+)", source).group(1)
    names = [n.lower() for n in re.findall(r"X\((\w+)\)", listed)]
    assert names == list(modes.ROUNDING_MODES)


def test_lookup_errors_name_the_value_and_the_modes():
    with pytest.raises(ValueError, match=r"unknown rounding mode 'nearest'.*nearest_even.*stochastic"):
        modes.mode("nearest")
    with pytest.raises(TypeError, match=r"rounding must be a mode name.*got int 3"):
        modes.check_rounding(3)
    assert modes.mode(modes.MODES["up"]) is modes.MODES["up"]
    assert modes.DETERMINISTIC_MODES == tuple(m for m in modes.ROUNDING_MODES if m != "stochastic")
