"""A small real pytest file for the README walkthrough: a class, a parametrized test, a skip."""

import math

import pytest


class TestArithmetic:
    def test_addition(self) -> None:
        assert 2 + 2 == 4

    @pytest.mark.parametrize(("x", "root"), [(4, 2), (9, 3), (2.25, 1.5)])
    def test_square_root(self, x: float, root: float) -> None:
        assert math.sqrt(x) == pytest.approx(root)


def test_sorting_is_stable() -> None:
    pairs = [(1, "b"), (0, "a"), (1, "a")]
    assert sorted(pairs, key=lambda p: p[0]) == [(0, "a"), (1, "b"), (1, "a")]


@pytest.mark.skip(reason="shows how a skipped test is reported")
def test_skipped() -> None:
    raise AssertionError("never runs")
