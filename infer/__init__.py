"""Lossless speculative decoding (``python -m infer``): the generate loop (``generate.py``), loading
a target and a drafter (``loading.py``), prompt lookup (``prompt_lookup.py``), prompts, and the
pure-PyTorch reference loop (``reference.py``) that the fast path is tested against. Imports
``models/``, ``kernels/`` and ``common/``, never ``train/``."""
