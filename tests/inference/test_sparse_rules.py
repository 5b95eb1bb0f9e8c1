"""The sparse-attention arithmetic against the contract's wording (inference/layers/attention.py), position by position."""

import torch

from inference.layers.sparse_rules import (
    blocks_completed,
    elect,
    nodes_seen,
    nodes_seen_by,
    nodes_seen_from,
    window_start,
)

W, G = 16, 4


def test_a_query_sees_the_nodes_of_the_complete_blocks_left_of_its_window():
    for t in range(80):
        local = [p for p in range(t + 1) if p >= t - W + 1]
        assert window_start(t, W) == local[0]
        left = [b for b in range(t // G + 1) if b * G + G - 1 < local[0]]
        assert nodes_seen(t, W, G) == len(left)
    assert nodes_seen_from(3, 60, W, G) == tuple(nodes_seen(t, W, G) for t in range(3, 63))
    assert nodes_seen_by(torch.arange(3, 63), W, G).tolist() == list(nodes_seen_from(3, 60, W, G))


def test_the_blocks_a_chunk_completes_are_those_whose_last_position_it_holds():
    for start in range(20):
        for count in range(1, 12):
            last = set(range(start, start + count))
            expected = [b for b in range(10) if b * G + G - 1 in last]
            assert list(blocks_completed(start, count, G)) == expected


def test_a_node_is_the_largest_norm_earliest_on_ties():
    norms = torch.tensor([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, 5.0]])
    assert elect(norms).tolist() == [1, 0]
