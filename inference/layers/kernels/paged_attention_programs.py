"""The Triton programs behind inference/layers/kernels/paged_decode_triton.py (which says what each
computes and wraps them): a module of their own so that they are plain module-level jitted
functions, imported only when a step takes them (triton comes with PyTorch's CUDA wheels).
"""

import triton.language as tl
from triton import jit


@jit
def softmax_start(ROWS: tl.constexpr, COLS: tl.constexpr):
    """An empty running softmax: each row's max (-inf), sum and weighted values (zeros)."""
    return tl.full((ROWS,), float("-inf"), tl.float32), tl.zeros((ROWS,), tl.float32), tl.zeros((ROWS, COLS), tl.float32)


@jit
def online_softmax(s, top, total, acc, v):
    """One block of scores `s` folded into a running softmax; a row with nothing seen yet
    (every score -inf so far) stays empty, never NaN."""
    new_top = tl.maximum(top, tl.max(s, axis=1))
    base = tl.where(new_top == float("-inf"), 0.0, new_top)
    p = tl.exp(s - base[:, None])
    fix = tl.exp(top - base)
    total = total * fix + tl.sum(p, axis=1)
    acc = acc * fix[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
    return new_top, total, acc

@jit
def entry_slots(slots_ptr, row_offset, n, live, PAGE: tl.constexpr):
    """The pool slots of entries `n` of a row: its slot list's (`PAGE` 0), or, read through its
    block table (`PAGE` the block size), position n's: `table[n // PAGE] * PAGE + n % PAGE`."""
    if PAGE > 0:
        block = tl.load(slots_ptr + row_offset + n // PAGE, mask=live, other=0).to(tl.int64)
        return block * PAGE + n % PAGE
    return tl.load(slots_ptr + row_offset + n, mask=live, other=0).to(tl.int64)


@jit
def gqa_decode_kernel(q_ptr, k_ptr, v_ptr, k2_ptr, v2_ptr, slots_ptr, lengths_ptr, split_ptr, firsts_ptr,
                      pages_ptr, out_ptr, scale,
                      stride_qb, stride_qh, stride_kh, stride_ks, stride_k2h, stride_k2s, stride_sb, stride_pb,
                      stride_ob, stride_oh,
                      GROUP: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                      BLOCK_N: tl.constexpr, PAGE: tl.constexpr, NODE_PAGE: tl.constexpr):
    b, kv = tl.program_id(0), tl.program_id(1)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kv * GROUP + g
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
                mask=(g[:, None] < GROUP) & (d[None, :] < D), other=0.0)
    length = tl.load(lengths_ptr + b)
    split = tl.load(split_ptr + b)  # entries before it are slots of the first pools, after it of the second
    top, total, acc = softmax_start(BLOCK_G, BLOCK_D)
    for start in range(0, length, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        live = n < length
        first = n < split
        if PAGE > 0:  # block tables: entry n < split is position firsts[b] + n, then node n - split
            slot = entry_slots(slots_ptr, b * stride_sb, tl.load(firsts_ptr + b) + n, live & first, PAGE)
            slot2 = entry_slots(pages_ptr, b * stride_pb, n - split, live & (n >= split), NODE_PAGE)
        else:  # one slot list for both
            slot = entry_slots(slots_ptr, b * stride_sb, n, live, PAGE)
            slot2 = slot
        keep1 = (live & first)[:, None] & (d[None, :] < D)
        keep2 = (live & (n >= split))[:, None] & (d[None, :] < D)
        rows1 = kv * stride_kh + slot[:, None] * stride_ks + d[None, :]
        rows2 = kv * stride_k2h + slot2[:, None] * stride_k2s + d[None, :]
        k = tl.load(k_ptr + rows1, mask=keep1, other=0.0) + tl.load(k2_ptr + rows2, mask=keep2, other=0.0)
        v = tl.load(v_ptr + rows1, mask=keep1, other=0.0) + tl.load(v2_ptr + rows2, mask=keep2, other=0.0)
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale  # [BLOCK_G, BLOCK_N]
        s = tl.where(live[None, :], s, float("-inf"))
        top, total, acc = online_softmax(s, top, total, acc, v)
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=(g[:, None] < GROUP) & (d[None, :] < D))


@jit
def latent_decode_kernel(q_ptr, pool_ptr, slots_ptr, table_rows_ptr, lengths_ptr, out_ptr, scale, H,
                         stride_qb, stride_qh, stride_ps, stride_sb, stride_ob, stride_oh,
                         R: tl.constexpr, DR: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr,
                         BLOCK_DR: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr):
    b, hb = tl.program_id(0), tl.program_id(1)
    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    r = tl.arange(0, BLOCK_R)
    e = tl.arange(0, BLOCK_DR)
    head_ok = h < H
    q_nope = tl.load(q_ptr + b * stride_qb + h[:, None] * stride_qh + r[None, :],
                     mask=head_ok[:, None] & (r[None, :] < R), other=0.0)
    q_rope = tl.load(q_ptr + b * stride_qb + h[:, None] * stride_qh + R + e[None, :],
                     mask=head_ok[:, None] & (e[None, :] < DR), other=0.0)
    length = tl.load(lengths_ptr + b)
    table_row = tl.load(table_rows_ptr + b)  # the slot list this row reads (its sequence's, or its own)
    top, total, acc = softmax_start(BLOCK_H, BLOCK_R)
    for start in range(0, length, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        live = n < length
        slot = entry_slots(slots_ptr, table_row * stride_sb, n, live, PAGE)
        c = tl.load(pool_ptr + slot[:, None] * stride_ps + r[None, :],
                    mask=live[:, None] & (r[None, :] < R), other=0.0)  # [BLOCK_N, BLOCK_R]
        k_rope = tl.load(pool_ptr + slot[:, None] * stride_ps + R + e[None, :],
                         mask=live[:, None] & (e[None, :] < DR), other=0.0)
        s = (tl.dot(q_nope, tl.trans(c)) + tl.dot(q_rope, tl.trans(k_rope))).to(tl.float32) * scale
        s = tl.where(live[None, :], s, float("-inf"))
        top, total, acc = online_softmax(s, top, total, acc, c)
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(out_ptr + b * stride_ob + h[:, None] * stride_oh + r[None, :],
             out.to(out_ptr.dtype.element_ty), mask=head_ok[:, None] & (r[None, :] < R))

@jit
def gqa_prefill_kernel(q_ptr, k_ptr, v_ptr, nk_ptr, nv_ptr, slots_ptr, node_slots_ptr, gate_ptr,
                       block_seq_ptr, block_first_ptr, rows_ptr, starts_ptr, news_ptr, local_starts_ptr,
                       out_ptr, scale, stride_qt, stride_qh, stride_kh, stride_ks, stride_nkh, stride_nks,
                       stride_sb, stride_nb, stride_ot, stride_oh,
                       GROUP: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WINDOW: tl.constexpr,
                       INTERVAL: tl.constexpr, ROUTED: tl.constexpr, PAGE: tl.constexpr,
                       NODE_PAGE: tl.constexpr):
    blk, kv = tl.program_id(0), tl.program_id(1)
    b = tl.load(block_seq_ptr + blk)  # the sequence this block of queries belongs to
    m0 = tl.load(block_first_ptr + blk)  # its first query, counted in the sequence's new rows
    row0 = tl.load(rows_ptr + b)  # the sequence's first row in the step
    start = tl.load(starts_ptr + b)  # the position of that row
    num_new = tl.load(news_ptr + b)
    local_start = tl.load(local_starts_ptr + b)  # the position of the slot list's first entry
    i = tl.arange(0, BLOCK_M * BLOCK_G)  # a query's heads of this kv head, query after query
    m, g = i // BLOCK_G, i % BLOCK_G
    d = tl.arange(0, BLOCK_D)
    valid = (g < GROUP) & (m0 + m < num_new)
    position = start + m0 + m
    row = (row0 + m0 + m).to(tl.int64)
    heads = kv * GROUP + g
    q = tl.load(q_ptr + row[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
                mask=valid[:, None] & (d[None, :] < D), other=0.0)
    end = start + tl.minimum(m0 + BLOCK_M, num_new)  # one past the block's last position
    lo = local_start
    if WINDOW > 0:
        lo = tl.maximum(local_start, start + m0 - WINDOW + 1)  # the block's first query's window
    top, total, acc = softmax_start(BLOCK_M * BLOCK_G, BLOCK_D)
    # local keys (every earlier position, or the window's): each query's first one lies in
    # the first block read (BLOCK_M <= BLOCK_N), so no valid row stays empty
    for first in range(lo, end, BLOCK_N):
        n = first + tl.arange(0, BLOCK_N)
        live = n < end
        if PAGE > 0:  # the sequence's block table: position n's slot
            slot = entry_slots(slots_ptr, b * stride_sb, n, live, PAGE)
        else:  # its slot list, from its first entry's position on
            slot = entry_slots(slots_ptr, b * stride_sb, n - local_start, live, PAGE)
        keep = live[:, None] & (d[None, :] < D)
        rows = kv * stride_kh + slot[:, None] * stride_ks + d[None, :]
        k = tl.load(k_ptr + rows, mask=keep, other=0.0)
        v = tl.load(v_ptr + rows, mask=keep, other=0.0)
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale  # [BLOCK_M * BLOCK_G, BLOCK_N]
        seen = live[None, :] & (n[None, :] <= position[:, None])
        if WINDOW > 0:
            seen = seen & (n[None, :] > position[:, None] - WINDOW)
        top, total, acc = online_softmax(tl.where(seen, s, float("-inf")), top, total, acc, v)
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    if WINDOW > 0:
        # key nodes: the first (position - W + 1) // G of the sequence's node list, per query
        # (union: the same softmax as the window's; routed: a softmax of their own)
        own = tl.maximum(position - WINDOW + 1, 0) // INTERVAL
        count = tl.maximum(end - WINDOW, 0) // INTERVAL
        n_top, n_total, n_acc = softmax_start(BLOCK_M * BLOCK_G, BLOCK_D)
        if not ROUTED:
            n_top, n_total, n_acc = top, total, acc
        for first in range(0, count, BLOCK_N):
            j = first + tl.arange(0, BLOCK_N)
            live = j < count
            slot = entry_slots(node_slots_ptr, b * stride_nb, j, live, NODE_PAGE)
            keep = live[:, None] & (d[None, :] < D)
            rows = kv * stride_nkh + slot[:, None] * stride_nks + d[None, :]
            k = tl.load(nk_ptr + rows, mask=keep, other=0.0)
            v = tl.load(nv_ptr + rows, mask=keep, other=0.0)
            s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
            seen = live[None, :] & (j[None, :] < own[:, None])
            n_top, n_total, n_acc = online_softmax(tl.where(seen, s, float("-inf")), n_top, n_total, n_acc, v)
        nodes = n_acc / tl.where(n_total > 0, n_total, 1.0)[:, None]
        if ROUTED:  # p_local * Attn(window) + p_global * Attn(nodes); no node seen adds nothing
            weight_local = tl.load(gate_ptr + row * 2, mask=valid, other=0.0).to(tl.float32)
            weight_nodes = tl.load(gate_ptr + row * 2 + 1, mask=valid, other=0.0).to(tl.float32)
            out = weight_local[:, None] * out + weight_nodes[:, None] * nodes
        else:
            out = nodes
    tl.store(out_ptr + row[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=valid[:, None] & (d[None, :] < D))

