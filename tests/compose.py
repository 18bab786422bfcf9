"""Compose ``configs/train.yaml`` the way ``python -m train`` does, for tests that call ``train(cfg)``."""

from hydra import compose, initialize_config_module


def compose_train(overrides: list[str]):
    with initialize_config_module(config_module="configs", version_base="1.3"):
        return compose(config_name="train", overrides=overrides)
