"""Training pipelines for sliding-window draft models (``python -m train``)."""
