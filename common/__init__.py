"""Helpers every package uses: atomic writes (``atomic.py``) and the metrics sink with W&B
(``metrics_logger.py``). Nothing here imports the project's other packages."""
