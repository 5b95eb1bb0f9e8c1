"""DSA's compiled CPU kernels (`dsa_kernels.c` through `inference/layers/kernels/dsa_cpu.py`) against
plain torch: the indexer's top-k (keys in place and transposed, ties, queries with fewer
positions than k) and the attention over chosen rows (filler entries, heads and ranks off the
kernel's blocks, one query split among the threads)."""

import pytest
import torch

from inference.layers.kernels import dsa_cpu

pytestmark = pytest.mark.usefixtures("cpu_kernels_built")


def index_scores(q, w, keys, scale):
    """sum_h w_h relu(scale q_h . k) for every query and key: [n, T]."""
    return torch.einsum("nh,nht->nt", w, torch.einsum("nhd,td->nht", q, keys).mul(scale).relu())


@pytest.mark.parametrize("n", [1, 3, 40, 42])  # in place (a few queries) and transposed (many: four a block, 42 ends short)
@pytest.mark.parametrize("heads, dim", [(4, 32), (8, 16), (20, 24)])
def test_select_keeps_the_best_earlier_positions(n, heads, dim):
    gen = torch.Generator().manual_seed(n * 100 + heads)
    total, count = 300, 37
    q, w = torch.randn(n, heads, dim, generator=gen), torch.randn(n, heads, generator=gen)
    keys = torch.randn(total, dim, generator=gen)
    positions = torch.sort(torch.randint(0, total, (n,), generator=gen)).values
    positions[0] = 10  # fewer earlier positions than count
    got, tied = dsa_cpu.select(q, w, keys, positions, count, 0.3)
    scores = index_scores(q, w, keys, 0.3)
    for i, pos in enumerate(positions.tolist()):
        row = got[i].tolist()
        if pos + 1 <= count:
            assert row[: pos + 1] == list(range(pos + 1)) and all(p > pos for p in row[pos + 1 :])
            assert not tied[i]
            continue
        ranked = scores[i, : pos + 1].sort(descending=True).values
        boundary_tie = bool(ranked[count - 1] == ranked[count])  # e.g. at 0, where every head's ReLU is 0
        assert bool(tied[i]) == boundary_tie, i
        if boundary_tie:
            continue  # refused: the caller chooses that row with torch
        assert set(row) == set(scores[i, : pos + 1].topk(count).indices.tolist()), i
        assert row == sorted(set(row)) and row[-1] <= pos, i  # distinct, earlier, in position order


def test_select_with_tied_scores_takes_exactly_k():
    q, w = torch.zeros(2, 4, 16), torch.ones(2, 4)  # every score 0
    got, tied = dsa_cpu.select(q, w, torch.randn(100, 16), torch.tensor([99, 60]), 10, 1.0)
    for row, pos in zip(got.tolist(), (99, 60)):
        assert len(set(row)) == 10 and all(p <= pos for p in row)
    assert tied.tolist() == [True, True]  # which 10 of the equal scores torch's top-k takes: refused


@pytest.mark.parametrize("n, heads, pool", [(1, 4, False), (3, 20, False), (2, 4, True), (20, 4, False)],
                         ids=["library-scores", "kernel-scores", "paged-pool", "transposed-keys"])
def test_a_tie_at_the_boundary_is_refused_on_every_kernel_path(n, heads, pool):
    """Negative head weights turn the keys every head's ReLU zeroes into the best scores: 0 (or
    -0, which torch holds equal to 0) at far more positions than `count`. The kernel's "the
    earliest of the equal scores" is not torch's top-k's choice (transformers, the reference,
    #54): each such row is flagged for torch; a row with a clear boundary is not."""
    gen = torch.Generator().manual_seed(heads + n)
    total, dim, count = 60, 16, 5
    # every head of a query the same: the keys on the wrong side of it are 0 for all of them
    q = torch.randn(n, 1, dim, generator=gen).expand(n, heads, dim).contiguous()
    keys = torch.randn(total, dim, generator=gen)
    w = -torch.rand(n, heads, generator=gen) - 0.1
    w[0] = torch.rand(heads, generator=gen) + 0.1  # the first query: positive weights, distinct scores
    positions = torch.full((n,), total - 1)
    slots = None
    if pool:
        slots = torch.randperm(200, generator=gen)[:total]
        keys = torch.zeros(200, dim).index_copy_(0, slots, keys)
    _, tied = dsa_cpu.select(q, w, keys, positions, count, 0.5, slots)
    assert tied.tolist() == [False] + [True] * (n - 1)


def test_minus_zero_ties_with_zero():
    """One head with a negative weight scores -0 where its ReLU is 0; a +0 elsewhere is equal."""
    from inference.layers.kernels import cpu_kernels

    scores = torch.tensor([[-0.0, 0.0, -1.0, -0.0, 0.0, -2.0, 0.0]])
    out, tied, positions = torch.empty(1, 3, dtype=torch.long), torch.zeros(1, dtype=torch.bool), torch.tensor([6])
    cpu_kernels.library().wecom_dsa_top_rows(scores.data_ptr(), 7, positions.data_ptr(), 1, 3, out.data_ptr(),
                                             tied.data_ptr(), 1)
    assert out[0].tolist() == [0, 1, 3] and tied.tolist() == [True]


@pytest.mark.parametrize("case", ["random", "spikes the sample sees alone", "three values"])
def test_the_top_k_is_exact_whatever_its_sample_of_the_scores_says(case):
    """The kernel's top-k sets a floor from one score in 8; where that floor is too high (only
    the sampled positions are large) it falls back to every position. Either way: exactly the
    `count` best, ties to the earlier position, in position order."""
    from inference.layers.kernels import cpu_kernels

    m, count = 4096, 700
    torch.manual_seed(3)
    scores = {"random": torch.randn(m), "spikes the sample sees alone": (torch.arange(m) % 8 == 0).float(),
              "three values": torch.randint(0, 3, (m,)).float()}[case]
    out, positions = torch.empty(1, count, dtype=torch.long), torch.tensor([m - 1])
    tied = torch.zeros(1, dtype=torch.bool)
    cpu_kernels.library().wecom_dsa_top_rows(scores.data_ptr(), m, positions.data_ptr(), 1, count, out.data_ptr(),
                                             tied.data_ptr(), 1)
    values = scores.tolist()
    expected = sorted(sorted(range(m), key=lambda i: (-values[i], i))[:count])
    assert out[0].tolist() == expected


def reference_attend(query, latents, picked, positions, rank, scale):
    """query [H, n, W] over each query's chosen rows at or before its position: [H, n, rank]."""
    out = []
    for i in range(query.shape[1]):
        chosen = picked[i][picked[i] <= positions[i]]
        rows = latents[chosen]
        weights = torch.softmax(query[:, i] @ rows.t() * scale, dim=-1)
        out.append(weights @ rows[:, :rank])
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("n", [1, 2, 33])  # one query split among the threads, and many
@pytest.mark.parametrize("heads, rank, rope", [(8, 128, 32), (5, 40, 8), (17, 200, 16)])
def test_attend_matches_softmax_over_the_chosen_rows(n, heads, rank, rope):
    gen = torch.Generator().manual_seed(n + heads)
    total, k = 900, 300
    query = torch.randn(heads, n, rank + rope, generator=gen)
    latents = torch.randn(total, rank + rope, generator=gen)
    positions = torch.randint(k, total, (n,), generator=gen)
    positions[0] = 100  # filler: entries after the query's own are skipped
    picked = torch.stack([torch.randperm(total, generator=gen)[:k] for _ in range(n)])
    got = dsa_cpu.attend(query, latents, picked, positions, rank, 0.05)
    torch.testing.assert_close(got, reference_attend(query, latents, picked, positions, rank, 0.05),
                               atol=2e-5, rtol=1e-4)


def test_attend_reads_a_slice_of_the_layers_query_in_place():
    """The layer passes `query[:, rows]` of its `[H, T, W]` query (one sequence of a batch): the
    kernel reads it through its strides, as it would a copy."""
    gen = torch.Generator().manual_seed(7)
    heads, rank, rope, total, k = 6, 48, 8, 400, 64
    query = torch.randn(heads, 50, rank + rope, generator=gen)
    latents = torch.randn(total, rank + rope, generator=gen)
    positions = torch.randint(k, total, (20,), generator=gen)
    picked = torch.stack([torch.randperm(total, generator=gen)[:k] for _ in range(20)])
    got = dsa_cpu.attend(query[:, 25:45], latents, picked, positions, rank, 0.05)
    torch.testing.assert_close(got, dsa_cpu.attend(query[:, 25:45].contiguous(), latents, picked, positions, rank,
                                                   0.05))
    torch.testing.assert_close(got, reference_attend(query[:, 25:45], latents, picked, positions, rank, 0.05),
                               atol=2e-5, rtol=1e-4)


def test_a_query_whose_every_entry_is_filler_gets_zeros_not_nan():
    query, latents = torch.randn(4, 1, 24), torch.randn(50, 24)
    got = dsa_cpu.attend(query, latents, torch.tensor([[30, 40, 45]]), torch.tensor([20]), 16, 0.1)
    assert torch.equal(got, torch.zeros(4, 1, 16))


def test_attend_reads_each_position_from_its_row_of_a_pool():
    """A paged cache: position p's latent sits in pool row slots[p]; the chosen positions are
    masked by position and read through their rows, as from the sequence's own rows."""
    gen = torch.Generator().manual_seed(5)
    heads, rank, rope, length, k = 6, 48, 16, 200, 64
    query, latents = torch.randn(heads, 3, rank + rope, generator=gen), torch.randn(length, rank + rope, generator=gen)
    slots = torch.randperm(1000, generator=gen)[:length]
    pool = torch.randn(1000, rank + rope, generator=gen)
    pool[slots] = latents
    positions = torch.tensor([40, 150, 199])
    picked = torch.stack([torch.randperm(length, generator=gen)[:k] for _ in range(3)])
    expected = dsa_cpu.attend(query, latents, picked, positions, rank, 0.1)
    torch.testing.assert_close(dsa_cpu.attend(query, pool, picked, positions, rank, 0.1, rows=slots[picked]),
                               expected, atol=0, rtol=0)


def test_select_reads_each_key_from_its_row_of_a_pool():
    gen = torch.Generator().manual_seed(6)
    total, dim, heads, count = 300, 32, 4, 20
    keys = torch.randn(total, dim, generator=gen)
    slots = torch.randperm(2000, generator=gen)[:total]
    pool = torch.randn(2000, dim, generator=gen)
    pool[slots] = keys
    q, w = torch.randn(2, heads, dim, generator=gen), torch.randn(2, heads, generator=gen)
    positions = torch.tensor([150, 299])
    (in_pool, tied_pool), (in_place, tied) = (dsa_cpu.select(q, w, pool, positions, count, 0.2, slots),
                                              dsa_cpu.select(q, w, keys, positions, count, 0.2))
    assert torch.equal(in_pool, in_place) and torch.equal(tied_pool, tied)
