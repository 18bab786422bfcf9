"""Attention kernels and their dispatch (``attention.py``: SDPA, flex, FlashAttention-4 key
intervals, FlashInfer/SDPA over caches), EAGLE-3's window + diagonal attention
(``window_attention.py``) and FlashAttention-4 behind a version- and signature-checked adapter
(``fa4_adapter.py``). Imports nothing of the project's other packages."""
