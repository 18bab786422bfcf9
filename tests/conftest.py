"""Shared fixtures. Nothing here downloads: targets are the builtin tiny ones (built offline into a
per-session cache) and the reference target in ../shared (read-only)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# pytest-xdist (pyproject: -n 2 --dist loadfile): two worker processes on a 2-core machine, each on one intra-op
# thread, so they do not fight over the cores (and subprocesses they start inherit the setting).
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if WORKER:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
# ../shared beside the checkout; SWA_REFERENCE_TARGET points elsewhere (the GPU machine gets a carried copy)
REFERENCE_TARGET = Path(os.environ.get("SWA_REFERENCE_TARGET", REPO_ROOT.parent / "shared" / "targets" / "qwen3-27m-sharegpt"))


# The slowest modules first, longest first (pyproject: ``--dist loadfile --no-loadscope-reorder``, so each worker takes
# the next whole module in this order). xdist's own order is by tests per module, which sent the few-test, many-minute
# modules out last: one worker then ran test_vllm_engine (~9 min) or test_infer_sampling (~4 min) while the other sat idle.
# Module times summed over their tests on the 2-core CI-like machine (seconds, 2 workers, at 46bac86 + this order:
# 2,821 s in all, a 23:56 run); a rough order is enough.
SLOWEST_MODULES_FIRST = (
    "test_vllm_engine.py",             # 532: trains two drafters, starts vLLM in-process and as a server
    "test_infer_generate.py",          # 388: long prefills, the memorised drafter (test_zlab_engine reads it)
    "test_infer_eagle3_generate.py",   # 284
    "test_infer_sampling.py",          # 265: 9,000 speculative samples
    "test_batch.py",                   # 265
    "test_loop_eval.py",               # 232: an on-policy training run with regeneration and the loop
    "test_deepspeed.py",               # 140: two-process runs
    "test_train_pipeline.py",          # 132
)


def pytest_collection_modifyitems(config, items) -> None:
    """Every test skipped without a GPU carries the ``gpu`` marker, so ``pytest -m gpu`` on a GPU machine runs all of
    them: the one place the marker is given (the skip conditions name CUDA or a GPU in their reasons). ``long`` tests
    run only where ``-m`` names them: pyproject's ``-m 'not long'`` is replaced by any ``-m`` given, so the quick tier's
    ``-m "not slow"`` ran the full matrices too (47 one-interpreter ``--help`` runs among them, ~3 CPU minutes). Then
    the slowest modules move to the front (``SLOWEST_MODULES_FIRST``; a stable sort: the rest keep their order)."""
    if "long" not in (config.option.markexpr or ""):
        long = [item for item in items if item.get_closest_marker("long")]
        if long:
            config.hook.pytest_deselected(items=long)
            items[:] = [item for item in items if not item.get_closest_marker("long")]
    for item in items:
        reasons = [str(mark.kwargs.get("reason", "")) for mark in item.iter_markers("skipif")]
        if any("CUDA" in reason or "GPU" in reason for reason in reasons):
            item.add_marker(pytest.mark.gpu)
    rank = {name: i for i, name in enumerate(SLOWEST_MODULES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="module")
def single_cpu_thread():
    """One intra-op thread for the inference-loop tests (batch-1 decoding: chains of tiny matmuls). On
    2-core CI-like machines each OpenMP parallel region was measured to cost ~16 ms of wake-up (a
    2x512 @ 512x1408 matmul: 16 ms on 2 threads, 0.12 ms on 1), more than the work itself."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def run_shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every pytest-xdist worker of this run sees (their base folders' parent), this run's own without xdist:
    for what several workers or test modules build alike (they build it once, under a file lock)."""
    shared = (tmp_path_factory.getbasetemp().parent if WORKER else tmp_path_factory.getbasetemp()) / "shared-builds"
    shared.mkdir(parents=True, exist_ok=True)
    return shared


@pytest.fixture(scope="session", autouse=True)
def isolated_cache(tmp_path_factory: pytest.TempPathFactory, run_shared_dir: Path) -> Path:
    """Every test run caches into its own folder, never the user's ~/.cache. The builtin tiny targets are
    the exception: deterministic builds (seeded, keyed by their build version), they are kept between runs
    in ``$SWA_TESTS_BUILD_CACHE`` (default ~/.cache/swa-drafters-tests); ``SWA_TESTS_FRESH_BUILD=1`` (set by
    .ci/run) builds them afresh (seconds from the shipped weights; SmolLM2's conversion ~30 s)."""
    cache = tmp_path_factory.mktemp("swa-cache")
    if not os.environ.get("SWA_TESTS_FRESH_BUILD"):
        kept = Path(os.environ.get("SWA_TESTS_BUILD_CACHE", Path.home() / ".cache" / "swa-drafters-tests")) / "builtin"
    else:  # fresh, but once per run: built into the folder the run's workers share (builds are file-locked)
        kept = run_shared_dir / "swa-builtin"
    kept.mkdir(parents=True, exist_ok=True)
    (cache / "builtin").symlink_to(kept, target_is_directory=True)
    os.environ["SWA_DRAFTERS_CACHE"] = str(cache)
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    return cache


@pytest.fixture(scope="session")
def reference_target_path() -> Path:
    if not (REFERENCE_TARGET / "config.json").exists():
        pytest.fail(f"reference target missing at {REFERENCE_TARGET} (../shared must sit beside the checkout)")
    return REFERENCE_TARGET


@pytest.fixture(scope="session")
def reference_tokenizer(reference_target_path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(reference_target_path)


@pytest.fixture(scope="session")
def tiny_llama3_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """builtin:tiny-llama3's tokenizer and model with random weights: its tests read the chat template and
    compare the loop's logits with Hugging Face's on the same weights, for which random weights serve (the
    shipped weights and the pretraining that makes them are tested in test_builtin_targets)."""
    from models.builtin_targets import TINY_MODELS, build_model, build_tokenizer

    style, arch = TINY_MODELS["tiny-llama3"]
    out = tmp_path_factory.mktemp("tiny-llama3-untrained")
    tokenizer = build_tokenizer(style)
    build_model(arch, tokenizer).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def tiny_qwen3_path(isolated_cache: Path) -> str:
    from models.builtin_targets import resolve_target_path

    return resolve_target_path("builtin:tiny-qwen3")


@pytest.fixture(scope="session")
def tiny_gpt_oss_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny gpt-oss folder (``infer_helpers.tiny_gpt_oss``: sliding layers, sinks, experts; random weights) with the
    ChatML tokenizer of the builtin targets: what ``from_pretrained`` reads for gpt-oss-20b, at a CPU test's size."""
    from infer_helpers import tiny_gpt_oss

    from models.builtin_targets import build_tokenizer

    tokenizer = build_tokenizer("chatml")
    model = tiny_gpt_oss(vocab_size=len(tokenizer))
    model.config.eos_token_id, model.config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    out = tmp_path_factory.mktemp("tiny-gpt-oss")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)
