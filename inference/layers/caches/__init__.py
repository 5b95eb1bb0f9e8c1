"""The KV caches, one layout per attention kind (`layouts.py` picks the model's).

GQA (`gqa.py`: the layout, the paged pools and their step; `gqa_sequence.py`: one sequence's
ring of the window plus key nodes), MLA (`mla.py`: the compressed latent) and DSA (`dsa.py`:
MLA's plus the indexer's keys). `paged_slots.py` says where a sequence's positions live in the
pools; `kv_cache.py` holds one cache per layer of a single sequence (`KVCache`).
"""
