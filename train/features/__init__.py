"""The offline feature store: ``python -m train.features`` writes it (write.py), ``python -m train
features.path=...`` reads it (store.py) instead of running the target."""
