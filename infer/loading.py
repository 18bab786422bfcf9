"""Load a Hugging Face target and an exported DFlash drafter (``python -m train.export --format dflash``
or a training run's ``export/``) for the inference loop, checking that they belong together."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from infer.drafter import DFlashDrafter
from infer.target import CachedTarget
from train.models.dflash import DFlashDraftModel
from train.target import TargetModel
from train.tiny_target import resolve_target_path


def read_drafter_config(path: str | Path) -> dict:
    config_file = Path(path) / "config.json"
    if not config_file.exists():
        raise ValueError(f"drafter {path}: no config.json there; expected an exported DFlash drafter folder")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{config_file}: not valid JSON ({e.msg})") from None
    if "dflash_config" not in config:
        raise ValueError(f"{config_file}: no 'dflash_config' field; expected a DFlash drafter (our 'dflash' export format)")
    return config


def load_models(target_path: str, drafter_path: str | None = None, device: str = "cpu", dtype: str = "auto", window="trained",
                attention_backend: str = "sdpa") -> tuple[CachedTarget, DFlashDrafter | None, object]:
    """(cached target, drafter or None, tokenizer); the target captures the layers the drafter reads."""
    target = TargetModel.from_pretrained(resolve_target_path(target_path), device=device, dtype=dtype)
    drafter = None
    layer_ids: list[int] = []
    if drafter_path is not None:
        config = read_drafter_config(drafter_path)
        layer_ids = list(config["dflash_config"]["target_layer_ids"])
        target.check_layer_ids(layer_ids, where=f"{drafter_path}/config.json dflash_config.target_layer_ids")
        if config.get("hidden_size") != target.hidden_size:
            raise ValueError(f"{drafter_path}/config.json: hidden_size={config.get('hidden_size')}, the target's is {target.hidden_size}")
        model = DFlashDraftModel.from_pretrained(drafter_path, dtype=target.model.dtype).to(target.device)
        drafter = DFlashDrafter(model, target.embed_tokens, target.lm_head, window=window, attention_backend=attention_backend)
    cached = CachedTarget(target.model, layer_ids, attention_backend=attention_backend)
    return cached, drafter, target.tokenizer


def eos_ids(tokenizer, model) -> list[int]:
    """End-of-sequence ids: the generation config's (may be a list), else the tokenizer's."""
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if ids is None:
        ids = tokenizer.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    return ids


def parse_window(value: str):
    """CLI window: ``trained`` | ``none`` | a positive int."""
    if value == "trained":
        return "trained"
    if value.lower() == "none":
        return None
    try:
        window = int(value)
    except ValueError:
        window = 0
    if window < 1:
        raise ValueError(f"--window {value!r}; expected 'trained', 'none' or a positive integer")
    return window


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def set_threads(device: str, threads: int | None) -> None:
    """CPU intra-op threads. Default 1 on CPU: on 2-core machines each OpenMP parallel region was
    measured to cost ~16 ms of wake-up, and batch-1 decoding of a small model is a chain of tiny
    matmuls (the tiny target's MT-Bench run: 150 tok/s on 1 thread, 32 on 2)."""
    if threads is not None and threads < 1:
        raise SystemExit(f"error: --threads {threads}; expected >= 1")
    if threads is not None or str(device).startswith("cpu"):
        torch.set_num_threads(threads or 1)
