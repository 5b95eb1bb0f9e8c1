"""Manifold-constrained hyper-connections (mHC), GLM-5.3-Flash's residual stream, as
transformers 5.24's `Glm5NextTextHyperConnection` computes it.

The residual is `hc_mult` (N) streams of the hidden size a position instead of one. Around each
block (attention, then the MLP) one small projection of the N streams (RMS-normed together,
`fn [(2 + N) N, N * hidden]`, plus `base`, each part times its `scale`) gives
- `pre [N]`  = sigmoid(.) + eps: the block's input is `sum_n pre_n stream_n`;
- `post [N]` = 2 sigmoid(.): the block's output goes to stream n times post_n;
- `comb [N, N]` = softmax over rows(.) + eps, made doubly stochastic by `hc_sinkhorn_iters`
  Sinkhorn steps (columns, then rows and columns): the streams mix as `comb^T @ streams`.
The new streams are `post * out + comb^T @ streams`. The model starts with N copies of the
embedding and ends with their mean.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def mix_weights(streams: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, iterations: int,
                eps: float, norm_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For `streams [T, N, hidden]`: (`post [T, N]`, `comb [T, N, N]`, the block's input
    `[T, hidden]`), fp32 weights."""
    rows, n = streams.shape[0], streams.shape[1]
    flat = streams.reshape(rows, -1).float()
    flat = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + norm_eps)
    mixed = F.linear(flat, fn.float())
    pre_w, post_w, comb_w = mixed.split([n, n, n * n], dim=-1)
    pre_b, post_b, comb_b = base.float().split([n, n, n * n])
    pre_s, post_s, comb_s = scale.float().unbind(0)
    pre = torch.sigmoid(pre_w * pre_s + pre_b) + eps
    post = 2 * torch.sigmoid(post_w * post_s + post_b)
    comb = torch.softmax(comb_w.view(rows, n, n) * comb_s + comb_b.view(n, n), dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iterations - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    collapsed = (pre[..., None] * streams).sum(dim=1).to(streams.dtype)
    return post, comb, collapsed


def merge(post: torch.Tensor, comb: torch.Tensor, out: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
    """The streams after a block: `post * out + comb^T @ streams`, `[T, N, hidden]`."""
    dtype = streams.dtype
    return post.to(dtype)[..., None] * out[:, None] + torch.matmul(comb.to(dtype).transpose(-1, -2), streams)
