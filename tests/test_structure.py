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
