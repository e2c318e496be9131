"""Grid expansion, paired keys, union grids, scale overrides and --set parsing."""
import pytest

from harness import grid
from harness.catalog import Experiment


def test_product_and_paired():
    cells = grid.expand({"a": [1, 2], "b": ["x", "y"], "c": [10, 20]}, paired=[("a", "c")])
    assert cells == [{"a": 1, "b": "x", "c": 10}, {"a": 1, "b": "y", "c": 10},
                     {"a": 2, "b": "x", "c": 20}, {"a": 2, "b": "y", "c": 20}]
    assert len(grid.expand({"a": [1, 2], "b": [3, 4, 5]})) == 6
    assert grid.expand({"a": [1, 2], "c": [7]}, paired=[("a", "c")]) == [{"a": 1, "c": 7}, {"a": 2, "c": 7}]
    with pytest.raises(ValueError, match="equal length"):
        grid.expand({"a": [1, 2], "c": [1, 2, 3]}, paired=[("a", "c")])
    with pytest.raises(ValueError, match="empty"):
        grid.expand({"a": []})


def test_union_grid_and_overrides():
    g = [{"part": ["landscape"], "res": [5]}, {"part": ["check"], "n": [2, 3]}]
    assert grid.expand(g) == [{"part": "landscape", "res": 5}, {"part": "check", "n": 2}, {"part": "check", "n": 3}]
    assert grid.keys(g) == ["part", "res", "n"]
    g2 = grid.override(g, {"n": [7]})
    assert grid.expand(g2)[-1] == {"part": "check", "n": 7} and len(grid.expand(g2)) == 2
    with pytest.raises(ValueError, match="unknown grid parameter 'm'.*part, res, n"):
        grid.override(g, {"m": [1]})


def test_scales():
    class E(Experiment):
        name = "e"
        grid = {"n": [1, 2, 3], "m": [1]}
        quick = {"n": [1, 2]}
        test = {"n": [1]}

    e = E()
    assert e.grid_for("full") == {"n": [1, 2, 3], "m": [1]}
    assert e.grid_for("quick")["n"] == [1, 2] and e.grid_for("test")["n"] == [1]
    assert e.cells("test", {"m": [4, 5]}) == [{"n": 1, "m": 4}, {"n": 1, "m": 5}]
    with pytest.raises(ValueError, match="unknown scale"):
        e.grid_for("huge")
    with pytest.raises(ValueError, match="unknown grid parameter"):
        e.cells("full", {"zz": [1]})


@pytest.mark.parametrize("text,want", [
    ("3", 3), ("-2", -2), ("1e-3", 1e-3), ("0.5", 0.5), ("true", True), ("False", False), ("none", None),
    ("abc", "abc"), ('"3"', "3"), ("[1, 2]", [1, 2]), ("inf", float("inf")),
])
def test_parse_value(text, want):
    assert grid.parse_value(text) == want and type(grid.parse_value(text)) is type(want)


def test_parse_set():
    got = grid.parse_set(["n=2,4,8", "t=[0.1, 1]", "model=minilm", "n=16", "flag=true", "s=a b"])
    assert got == {"n": [2, 4, 8, 16], "t": [0.1, 1], "model": ["minilm"], "flag": [True], "s": ["a b"]}
    for bad in ("novalue", "=3", "x=[1,"):
        with pytest.raises(ValueError):
            grid.parse_set([bad])


def test_cell_label():
    assert grid.cell_label({"n": 2, "t": 0.5, "m": "x"}) == "n=2,t=0.5,m=x"
