"""Acceptance evaluation (``python -m eval``): MT-Bench, prompt files and context x window sweeps
through the decoding loop (``runner.py``), with tables, plots and W&B (``report.py``). Imports
``infer/``, ``models/`` and ``common/``, never ``train/``."""
