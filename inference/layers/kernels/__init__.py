"""The engine's own kernels, each beside the torch code it replaces and switchable off.

CPU: `cpu_kernels.c` (the decode products, the fused decoder-layer and whole-model decode calls)
and `dsa_kernels.c` (the DSA indexer's scores and top-k), compiled on first use by
`cpu_kernels.py`; `dsa_cpu.py` calls the DSA ones. CUDA (Triton): `paged_decode_triton.py`
(paged attention over the pools, its programs in `paged_attention_programs.py`),
`w8a16_triton.py` (int8 weight-only matmul), `moe_triton.py` (the experts, `moe_programs.py`).
"""
