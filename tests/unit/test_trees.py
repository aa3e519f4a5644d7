"""Static tree templates: built from choice lists, validated, parents-first, truncated to budgets."""

from __future__ import annotations

import pytest
import torch

import decodekit as dk
from decodekit.draft.templates import TEMPLATES, TreeTemplate


def test_choice_list_becomes_a_parents_first_tree():
    t = TreeTemplate([(1, 0), (0,), (0, 1), (1,), (0, 0)])  # any order in, (depth, lexicographic) out
    assert t.choices == ((0,), (1,), (0, 0), (0, 1), (1, 0))
    assert t.parents.tolist() == [-1, -1, 0, 0, 1]
    assert t.ranks.tolist() == [0, 1, 0, 1, 0]
    assert t.depth.tolist() == [1, 1, 2, 2, 2]
    assert (t.num_nodes, t.max_depth, t.max_width) == (5, 2, 2)
    assert t.levels() == [(0, 2), (2, 5)]
    assert all(p < i for i, p in enumerate(t.parents.tolist()))
    assert t.parents.dtype == t.ranks.dtype == t.depth.dtype == torch.long


@pytest.mark.parametrize(
    ("choices", "message"),
    [
        ([(0,), (0, 1, 0)], r"\(0, 1, 0\) needs its parent \(0, 1\)"),
        ([(1, 0)], r"needs its parent \(1,\)"),
        ([(0,), (0,)], "listed twice"),
        ([()], "non-empty tuple"),
        ([(0,), (-1,)], ">= 0"),
        ([(0.5,)], "integer"),
        ("0,1", "list of rank tuples"),
    ],
)
def test_malformed_templates_are_refused(choices, message):
    with pytest.raises(dk.ConfigError, match=message):
        TreeTemplate(choices)


def test_from_branching_is_the_full_tree():
    t = TreeTemplate.from_branching((4, 2, 2, 1))
    assert t.num_nodes == 4 + 8 + 16 + 16
    assert (t.max_depth, t.max_width) == (4, 4)
    assert [e - s for s, e in t.levels()] == [4, 8, 16, 16]
    chain = TreeTemplate.from_branching((1, 1, 1))
    assert chain.parents.tolist() == [-1, 0, 1]
    with pytest.raises(dk.ConfigError, match=r"branching\[1\]"):
        TreeTemplate.from_branching((2, 0))


def test_empty_template():
    t = TreeTemplate([])
    assert (t.num_nodes, t.max_depth, t.max_width, t.levels()) == (0, 0, 0, [])


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize(("nodes", "depth", "width"), [(0, None, None), (5, None, None), (12, 3, None), (9, 4, 2)])
def test_truncated_fits_the_budget_and_stays_closed(name, nodes, depth, width):
    full = TEMPLATES[name]
    t = full.truncated(nodes, depth, width)
    assert t.num_nodes <= nodes
    assert t.max_depth <= (depth if depth is not None else full.max_depth)
    if width is not None:
        assert t.max_width <= width
    kept = set(t.choices)
    assert all(c[:-1] in kept for c in t.choices if len(c) > 1)
    assert t.choices == tuple(c for c in full.choices if c in kept)  # the first fitting nodes, in order
    if width is None and depth is None:
        assert t.choices == full.choices[:nodes]


def test_truncated_width_keeps_the_lowest_ranks():
    t = TreeTemplate.from_branching((3, 3)).truncated(100, width=2)
    assert t.choices == ((0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1))
