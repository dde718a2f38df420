"""Structure: flatten a yielded object into leaves with paths, rebuild its shape."""

from __future__ import annotations

from collections import namedtuple

import pytest

from dask_coro.core.structure import Structure, format_path


class Leaf:
    """A stand-in for a lazy object; classify() says True only for these."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Leaf({self.name!r})"


def is_leaf(obj, path):
    return isinstance(obj, Leaf)


Point = namedtuple("Point", ["x", "y"])


def test_format_path():
    assert format_path(()) == "(top level)"
    assert format_path((0,)) == "[0]"
    assert format_path((1, "a")) == "[1]['a']"
    assert format_path(("k", 2, 3)) == "['k'][2][3]"


def test_single_leaf_top_level():
    a = Leaf("a")
    s = Structure(a, is_leaf)
    assert s.leaves == [a]
    assert s.paths == [()]
    assert s.rebuild([42]) == 42


def test_plain_value_top_level():
    s = Structure(7, is_leaf)
    assert s.leaves == []
    assert s.paths == []
    assert s.rebuild([]) == 7


def test_list():
    a, b = Leaf("a"), Leaf("b")
    s = Structure([a, 5, b], is_leaf)
    assert s.leaves == [a, b]
    assert s.paths == [(0,), (2,)]
    out = s.rebuild(["A", "B"])
    assert out == ["A", 5, "B"]
    assert type(out) is list


def test_tuple():
    a, b = Leaf("a"), Leaf("b")
    s = Structure((a, b, "plain"), is_leaf)
    assert s.leaves == [a, b]
    assert s.paths == [(0,), (1,)]
    out = s.rebuild([1, 2])
    assert out == (1, 2, "plain")
    assert type(out) is tuple


def test_namedtuple():
    a = Leaf("a")
    s = Structure(Point(a, 3), is_leaf)
    assert s.leaves == [a]
    assert s.paths == [(0,)]
    out = s.rebuild([10])
    assert type(out) is Point
    assert out == Point(10, 3)
    assert out.x == 10 and out.y == 3


def test_dict():
    a, b = Leaf("a"), Leaf("b")
    s = Structure({"x": a, "y": 1, "z": b}, is_leaf)
    assert s.leaves == [a, b]
    assert s.paths == [("x",), ("z",)]
    out = s.rebuild(["A", "B"])
    assert out == {"x": "A", "y": 1, "z": "B"}
    assert list(out) == ["x", "y", "z"]  # order kept


def test_nesting_paths_and_indices():
    a, b, c, d = (Leaf(n) for n in "abcd")
    obj = [a, {"k": (b, [c, "v"]), "p": None}, Point(d, 2)]
    s = Structure(obj, is_leaf)
    assert s.leaves == [a, b, c, d]
    assert s.paths == [(0,), (1, "k", 0), (1, "k", 1, 0), (2, 0)]
    assert [format_path(p) for p in s.paths] == [
        "[0]",
        "[1]['k'][0]",
        "[1]['k'][1][0]",
        "[2][0]",
    ]
    out = s.rebuild([1, 2, 3, 4])
    assert out == [1, {"k": (2, [3, "v"]), "p": None}, Point(4, 2)]
    assert type(out[2]) is Point
    assert type(out[1]["k"]) is tuple


def test_same_leaf_twice_gets_two_slots():
    a = Leaf("a")
    s = Structure([a, a], is_leaf)
    assert s.leaves == [a, a]
    assert s.paths == [(0,), (1,)]
    assert s.rebuild(["first", "second"]) == ["first", "second"]


def test_plain_values_are_kept_by_identity():
    plain = object()
    inner = {1, 2}  # classify says False for it, so it is kept as is
    s = Structure([plain, inner, "s", None, 1.5], is_leaf)
    assert s.leaves == []
    out = s.rebuild([])
    assert out[0] is plain
    assert out[1] is inner
    assert out[2:] == ["s", None, 1.5]


def test_subclasses_of_containers_are_not_walked():
    class MyList(list):
        pass

    class MyDict(dict):
        pass

    seen = []

    def classify(obj, path):
        seen.append((obj, path))
        return False

    ml, md = MyList([Leaf("a")]), MyDict(x=Leaf("b"))
    s = Structure([ml, md], classify)
    assert s.leaves == []
    assert seen == [(ml, (0,)), (md, (1,))]
    out = s.rebuild([])
    assert out[0] is ml and out[1] is md


def test_classify_receives_paths():
    seen = []

    def classify(obj, path):
        seen.append((obj, path))
        return False

    Structure({"a": [1, (2, 3)], "b": 4}, classify)
    assert seen == [(1, ("a", 0)), (2, ("a", 1, 0)), (3, ("a", 1, 1)), (4, ("b",))]


def test_classify_error_propagates():
    class Boom(Exception):
        pass

    def classify(obj, path):
        if obj == "bad":
            raise Boom(f"bad at {format_path(path)}")
        return False

    with pytest.raises(Boom, match=r"^bad at \[1\]\['x'\]$"):
        Structure([0, {"x": "bad"}], classify)


def test_empty_containers():
    s = Structure([[], (), {}], is_leaf)
    assert s.leaves == []
    assert s.rebuild([]) == [[], (), {}]


def test_rebuild_twice_gives_fresh_containers():
    a = Leaf("a")
    s = Structure([a, [a]], is_leaf)
    r1 = s.rebuild([1, 2])
    r2 = s.rebuild([3, 4])
    assert r1 == [1, [2]]
    assert r2 == [3, [4]]
    assert r1[1] is not r2[1]


def test_rebuild_length_mismatch():
    s = Structure([Leaf("a"), Leaf("b")], is_leaf)
    with pytest.raises(ValueError, match=r"^expected 2 results, got 1$"):
        s.rebuild([1])
    with pytest.raises(ValueError, match=r"^expected 2 results, got 3$"):
        s.rebuild([1, 2, 3])
    s0 = Structure(5, is_leaf)
    with pytest.raises(ValueError, match=r"^expected 0 results, got 1$"):
        s0.rebuild([1])


# -- what is walked is what dask.compute walks ------------------------------

import collections  # noqa: E402
import dataclasses  # noqa: E402
import typing  # noqa: E402

import dask  # noqa: E402
import dask.utils  # noqa: E402

from dask_coro.core.structure import is_namedtuple_instance  # noqa: E402


@dataclasses.dataclass
class DC:
    a: object
    b: object = 0


class TypedPoint(typing.NamedTuple):
    x: object
    y: object


class SubDict(dict):
    pass


class SubList(list):
    pass


class SubTuple(tuple):
    pass


class FieldsOnly(tuple):
    _fields = ("a",)  # not the namedtuple API: dask does not walk it


def shapes(leaf):
    """Containers holding ``leaf()``s (fresh each call), the kinds dask
    walks and the kinds it does not."""
    return [
        [leaf(), 1],
        (leaf(), [leaf()]),
        {"a": leaf(), "b": (leaf(),)},
        collections.OrderedDict(a=leaf(), b=2),
        DC(leaf(), [leaf()]),
        DC(collections.OrderedDict(z=leaf())),
        Point(leaf(), 3),
        TypedPoint(leaf(), DC(leaf())),
        SubDict(a=leaf()),
        SubList([leaf()]),
        SubTuple((leaf(),)),
        FieldsOnly((leaf(),)),
        DC,  # a dataclass type is a value, not a container
    ]


def test_walks_what_dask_compute_walks():
    # A Delayed leaf: dask.compute replaces each one it reaches by its value.
    # The same shapes with Leaf: Structure replaces the leaves it reaches. The
    # two must reach the same ones and rebuild the same types.
    n = [0]

    def delayed_leaf():
        n[0] += 1
        return dask.delayed(n[0], name=f"leaf-{n[0]}")

    def leaf():
        n[0] += 1
        return Leaf(n[0])

    def fill(obj):
        # a Leaf becomes its number, as a Delayed leaf computes to its number
        s = Structure(obj, is_leaf)
        return s.rebuild([x.name for x in s.leaves])

    def delayed_to_marker(obj):
        # What dask.compute left alone still holds Delayeds: compare them by key
        return repr(obj).replace("Delayed('leaf-", "Leaf(").replace("')", ")")

    n[0] = 0
    ours = [fill(x) for x in shapes(leaf)]
    n[0] = 0
    theirs = [dask.compute(x, scheduler="sync")[0] for x in shapes(delayed_leaf)]
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert type(a) is type(b), (a, b)
        assert repr(a) == delayed_to_marker(b), (a, b)


def test_namedtuple_check_is_dask_s():
    for obj in [Point(1, 2), TypedPoint(1, 2), (1, 2), FieldsOnly((1,)), SubTuple(()), [1], DC(1)]:
        assert is_namedtuple_instance(obj) == dask.utils.is_namedtuple_instance(obj), obj


def test_dataclass_and_ordered_dict_paths_and_rebuild():
    a, b, c = Leaf("a"), Leaf("b"), Leaf("c")
    s = Structure(DC(a, collections.OrderedDict(k=b, j=c)), is_leaf)
    assert s.paths == [("a",), ("b", "k"), ("b", "j")]
    out = s.rebuild([1, 2, 3])
    assert out == DC(1, collections.OrderedDict(k=2, j=3))
    assert type(out.b) is collections.OrderedDict and list(out.b) == ["k", "j"]
