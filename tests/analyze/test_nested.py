"""nested.leaves and nested.map_leaves against structures written out by hand."""

from __future__ import annotations

import collections
import dataclasses
import types

import pytest

from fpsim.analyze.nested import MAX_DEPTH, leaves, map_leaves


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: object
    b: object = None

    def __post_init__(self):
        if isinstance(self.a, int) and self.a < 0:
            raise ValueError("runs only when made, not when copied")


Pair = collections.namedtuple("Pair", "left right")


def test_leaves_in_order_through_every_container():
    tree = ([1, Pair(2, {"k": 3, "j": Frozen(4, (5,))})], collections.UserDict(z=6), "text", None)
    assert leaves(tree) == [1, 2, 3, 4, 5, 6, "text", None]


def test_map_makes_new_containers_of_the_same_types_and_leaves_the_tree_as_it_was():
    user = collections.UserDict(z=6)
    tree = ([1, Pair(2, {"k": 3, "j": Frozen(4, (5,))})], user, "text")
    out = map_leaves(lambda x: x * 10 if isinstance(x, int) else x, tree)
    assert out == ([10, Pair(20, {"k": 30, "j": Frozen(40, (50,))})], collections.UserDict(z=60), "text")
    assert type(out[0][1]) is Pair and type(out[1]) is collections.UserDict
    assert tree == ([1, Pair(2, {"k": 3, "j": Frozen(4, (5,))})], user, "text") and user["z"] == 6


def test_a_copied_dataclass_does_not_run_its_post_init_again():
    out = map_leaves(lambda x: -x if isinstance(x, int) else x, Frozen(5))
    assert out.a == -5 and isinstance(out, Frozen)


def test_a_container_that_cannot_be_rebuilt_stays_as_it_is():
    proxy = types.MappingProxyType({"a": 1})
    assert map_leaves(lambda x: x + 1, proxy) is proxy
    assert leaves(proxy) == [1]


def test_deep_or_self_containing_trees_end_at_max_depth():
    loop: list = []
    loop.append(loop)
    assert leaves(loop) == [loop] and len(leaves([[0]] * 3)) == 3
    deep: object = 0
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    assert len(leaves(deep)) == 1 and isinstance(leaves(deep)[0], list)


@pytest.mark.parametrize("tree", [(), [], {}, 7])
def test_empty_containers_and_plain_leaves(tree):
    assert map_leaves(lambda x: x, tree) == tree
