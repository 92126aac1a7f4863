"""The stochastic-rounding stream (fpsim.philox and the kernel's copy): Philox4x32-10 and its layout.

Sources of truth: the published known-answer vectors of Philox4x32-10 (Random123's kat_vectors
file, as quoted in D. E. Shaw Research's core123 tests, ut_philox.cpp), and a scalar Philox
written here from Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC'11), on Python
ints (foundation_helpers.reference_philox), itself held to those vectors. The stream's layout (word j of element i is word i mod 4 of
the block with counter (i div 4 mod 2^32, i div 2^34, j, 0)) is the documented one in philox.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from fpsim import _arrays, _native, philox

from foundation_helpers import reference_philox, reference_word, requires_torch, torch

# (counter words, key words, output words), Random123 kat_vectors, philox4x32 with 10 rounds
KNOWN_ANSWERS = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter,key,expected", KNOWN_ANSWERS)
def test_reference_matches_the_known_answers(counter, key, expected):
    assert reference_philox(counter, key) == expected


@pytest.mark.parametrize("counter,key,expected", KNOWN_ANSWERS)
def test_numpy_philox_matches_the_known_answers(counter, key, expected):
    words = tuple(np.array([c], dtype=np.int64) for c in counter)
    assert tuple(int(w[0]) for w in philox.philox4x32(words, key)) == expected


@requires_torch
@pytest.mark.parametrize("counter,key,expected", KNOWN_ANSWERS)
def test_torch_philox_matches_the_known_answers(counter, key, expected):
    words = tuple(torch.tensor([c], dtype=torch.int64) for c in counter)
    assert tuple(int(w[0]) for w in philox.philox4x32(words, key)) == expected


@pytest.mark.skipif(not _native.available(), reason="the compiled kernel is not built")
def test_kernel_philox_matches_the_zero_known_answer():
    """The kernel's stream at key 0, elements 0..3, depth 0 is the block with counter 0 and key 0."""
    out = np.zeros(4, dtype=np.uint32)
    _native._fastround.philox_words(0, 0, 0, out)
    assert tuple(int(w) for w in out) == KNOWN_ANSWERS[0][2]


KEYS = [0, 1, 0xFFFFFFFF, 0x123456789ABCDEF0, 2**64 - 1]


def _sample_indices(rng) -> np.ndarray:
    low = rng.integers(0, 4096, size=200)
    high = rng.integers(2**32 - 64, 2**32 + 64, size=100) * 4 + rng.integers(0, 4, size=100)  # block high word
    huge = rng.integers(2**60, 2**62, size=50)
    return np.concatenate([low, high, huge]).astype(np.int64)


@pytest.mark.parametrize("key", KEYS)
def test_stream_words_follow_the_documented_layout(key):
    rng = np.random.default_rng(key % 1000)
    index = _sample_indices(rng)
    stream = philox.Stream(key)
    ops = _arrays.Ops(index)
    for depth in (0, 1, 5):
        got = stream.words(depth, index, ops)
        assert [int(w) for w in got] == [reference_word(key, int(i), depth) for i in index]
    lead = stream.leading_words(2, 1001, ops)
    assert [int(w) for w in lead] == [reference_word(key, i, 2) for i in range(1001)]


@requires_torch
@pytest.mark.parametrize("key", KEYS)
def test_torch_stream_equals_numpy_stream(key):
    index = _sample_indices(np.random.default_rng(3))
    stream = philox.Stream(key)
    t = torch.from_numpy(index)
    for depth in (0, 3):
        assert np.array_equal(stream.words(depth, t, _arrays.Ops(t)).numpy(),
                              stream.words(depth, index, _arrays.Ops(index)))
    assert np.array_equal(stream.leading_words(0, 777, _arrays.Ops(t)).numpy(),
                          stream.leading_words(0, 777, _arrays.Ops(index)))


@pytest.mark.skipif(not _native.available(), reason="the compiled kernel is not built")
@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("first,count", [(0, 4), (0, 100), (8, 37), (4 * (2**32 - 3), 64), (2**62, 260)])
def test_kernel_stream_equals_the_reference(key, first, count):
    """The AVX-512 loop (64 words at a time), the AVX2 loop (32 words) and the scalar tail, each where the CPU
    has it, across the block index's word boundary."""
    out = np.zeros((count + 3) // 4 * 4, dtype=np.uint32)
    _native._fastround.philox_words(key, first, 1, out)
    assert [int(w) for w in out] == [reference_word(key, first + i, 1) for i in range(len(out))]


# ------------------------------------------------------------------ keys
def test_seed_is_the_key():
    assert philox.key_from(0, None, False) == 0
    assert philox.key_from(2**64 - 1, None, False) == 2**64 - 1
    assert philox.key_from(np.uint64(12345), None, False) == 12345


@pytest.mark.parametrize("seed", [-1, 2**64, 1.5, "3", True])
def test_bad_seeds_are_refused(seed):
    with pytest.raises(ValueError, match="seed"):
        philox.key_from(seed, None, False)


def test_numpy_generator_gives_a_key_and_advances():
    g = np.random.default_rng(5)
    expected_words = np.random.default_rng(5).integers(0, 2**32, size=2, dtype=np.uint64)
    key = philox.key_from(None, g, False)
    assert key == int(expected_words[0]) | int(expected_words[1]) << 32
    assert philox.key_from(None, g, False) != key  # advanced


@requires_torch
def test_torch_generator_gives_a_key_and_advances():
    g = torch.Generator().manual_seed(5)
    words = torch.randint(0, 2**32, (2,), generator=torch.Generator().manual_seed(5), dtype=torch.int64)
    key = philox.key_from(None, g, True)
    assert key == int(words[0]) | int(words[1]) << 32
    assert philox.key_from(None, g, True) != key


def test_generator_type_and_seed_conflicts_are_refused():
    with pytest.raises(TypeError, match="numpy.random.Generator"):
        philox.key_from(None, np.random.RandomState(0), False)
    with pytest.raises(ValueError, match="seed or generator"):
        philox.key_from(1, np.random.default_rng(1), False)
    if torch is not None:
        with pytest.raises(TypeError, match="torch.Generator"):
            philox.key_from(None, np.random.default_rng(0), True)


def test_fresh_keys_differ():
    assert len({philox.key_from(None, None, False) for _ in range(8)}) == 8  # 64 random bits each
