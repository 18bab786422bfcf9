"""Compose ``configs/train.yaml`` the way ``python -m train`` does, for tests that call ``train(cfg)``.

The loop evaluation (``eval/loop_*``) and the tiny experiments' on-policy regeneration are off unless a test
asks for them: the first decodes on every eval, the second before training (``tests/test_loop_eval.py``,
``tests/test_regenerate.py`` and the quickstart CLI test are where they are tested)."""

from hydra import compose, initialize_config_module

import train.config  # noqa: F401  (registers the schemas, each drafter's too, with Hydra)


def compose_train(overrides: list[str]):
    if not any(o.startswith("trainer.loop_eval") for o in overrides):
        overrides = [*overrides, "trainer.loop_eval_prompts=0"]
    if not any(o.startswith("data.regenerate") for o in overrides):
        overrides = [*overrides, "data.regenerate.enabled=false"]
    with initialize_config_module(config_module="configs", version_base="1.3"):
        return compose(config_name="train", overrides=overrides)
