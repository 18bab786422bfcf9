"""The models, shared by training (``train/``), decoding (``infer/``) and evaluation (``eval/``):
one Hugging Face-style modeling file per drafter (``dflash.py``, ``eagle3.py``: architecture,
training masks and cached drafting), the target wrapper (``target.py``: features for training, the
cached forward and the caches for decoding), sampling rules (``sampling.py``) and the builtin tiny
targets (``builtin_targets.py``). Nothing here imports ``train/``, ``infer/`` or ``eval/``."""
