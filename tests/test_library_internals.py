"""Where the code reaches inside another library (transformers' config spellings and mask arguments, torch's private
ops and dynamo config, DeepSpeed's start-up, vLLM's metric names), a library unlike the tested versions is told, loudly,
with its version: each test fakes the library as another version has it, and checks the installed one passes."""

from __future__ import annotations

import importlib.metadata
import logging
import re
import types

import pytest
import torch
import transformers


class Qwen3ConfigAsTransformers4(transformers.Qwen3Config):
    """What transformers 4.56's Qwen3Config does with ``rope_parameters=`` (its RoPE is ``rope_theta``): kept as an
    attribute nobody reads; the RoPE stays at the default theta (found running 4.56.2)."""

    def __init__(self, rope_parameters=None, **kwargs):
        super().__init__(**kwargs)
        self.unread_rope_parameters = rope_parameters


class LlamaConfigAsTransformers4(transformers.LlamaConfig):
    def __init__(self, rope_parameters=None, **kwargs):
        super().__init__(**kwargs)
        self.unread_rope_parameters = rope_parameters


def small_target(theta: float) -> transformers.Qwen3Config:
    return transformers.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=8, rope_parameters={"rope_type": "default", "rope_theta": theta})


def test_a_drafter_config_that_drops_the_targets_rope_is_refused(monkeypatch) -> None:
    from models import dflash, eagle3

    dflash_args = dict(num_hidden_layers=1, block_size=4, mask_token_id=1, target_layer_ids=[1], layer_types=["full_attention"],
                       sliding_window=None)
    config = dflash.make_dflash_config(small_target(1e6), **dflash_args)  # the installed transformers takes it
    assert torch.allclose(dflash.Qwen3RotaryEmbedding(config).inv_freq[1], torch.tensor(1e6 ** (-2 / 8)))
    monkeypatch.setattr(dflash, "Qwen3Config", Qwen3ConfigAsTransformers4)
    with pytest.raises(ValueError, match=re.escape(f"transformers {transformers.__version__}: ") + r".*theta 1e\+06"):
        dflash.make_dflash_config(small_target(1e6), **dflash_args)
    monkeypatch.setattr(eagle3, "LlamaConfig", LlamaConfigAsTransformers4)
    with pytest.raises(ValueError, match=re.escape(f"transformers {transformers.__version__}: ")):
        eagle3.make_eagle3_config(small_target(1e6), num_hidden_layers=1, target_layer_ids=[0, 1, 2], draft_vocab_size=32,
                                  layer_types=["full_attention"], sliding_window=None)


def test_recompile_limit_names_torch_when_dynamo_lacks_it(monkeypatch) -> None:
    import torch._dynamo

    from swa_kernels.attention import raise_recompile_limit

    monkeypatch.setattr(torch._dynamo, "config", types.SimpleNamespace(cache_size_limit=8))  # torch 2.6's spelling
    with pytest.raises(RuntimeError, match=re.escape(f"torch {torch.__version__}: torch._dynamo.config has no recompile_limit")):
        raise_recompile_limit(64)


def test_causal_sdpa_is_registered_only_where_sdpa_mask_takes_the_arguments_it_reads(monkeypatch, caplog) -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from models.target import register_causal_sdpa

    for cls in (AttentionInterface, AttentionMaskInterface):
        monkeypatch.setattr(cls, "_global_mapping", dict(cls._global_mapping))
    assert register_causal_sdpa()  # the installed transformers

    def sdpa_mask_4_56(batch_size, cache_position, kv_length, kv_offset=0, mask_function=None, attention_mask=None, local_size=None,
                       allow_is_causal_skip=True, allow_torch_fix=True, **kwargs):
        return None

    AttentionMaskInterface._global_mapping["sdpa"] = sdpa_mask_4_56
    with caplog.at_level(logging.WARNING):
        assert not register_causal_sdpa()
    assert f"transformers {transformers.__version__}: masking_utils.sdpa_mask has no ['q_length', 'q_offset']" in caplog.text


def test_deepspeed_without_build_shm_op_is_told(monkeypatch, caplog) -> None:
    pytest.importorskip("deepspeed")
    import sys

    import deepspeed
    import deepspeed.comm.torch  # noqa: F401

    from train import deepspeed_engine
    from train.distributed import Ranks

    comm_torch = sys.modules["deepspeed.comm.torch"]
    monkeypatch.delattr(comm_torch, "build_shm_op")
    monkeypatch.setattr(deepspeed_engine, "init_process_group", lambda *a, **k: None)

    class Engine:
        world_size = 1

        def zero_optimization_stage(self): return 0
        def train_micro_batch_size_per_gpu(self): return 1
        def gradient_accumulation_steps(self): return 1
        def train_batch_size(self): return 1

    monkeypatch.setattr(deepspeed, "initialize", lambda **k: (Engine(), None, None, None))
    with caplog.at_level(logging.WARNING):
        deepspeed_engine.initialize(torch.nn.Linear(2, 2), None, None, {}, torch.device("cpu"), Ranks())
    assert f"DeepSpeed {importlib.metadata.version('deepspeed')} has no deepspeed.comm.torch.build_shm_op" in caplog.text
    assert not hasattr(comm_torch, "build_shm_op")  # a name DeepSpeed no longer calls is not added


def test_vllm_counters_refuse_metric_names_they_do_not_know() -> None:
    from infer import vllm_worker

    class Metric:
        def __init__(self, name, value=0, values=None):
            self.name, self.value, self.values = name, value, values

    class LLM:
        def __init__(self, metrics):
            self.metrics = metrics

        def get_metrics(self):
            return self.metrics

    known = [Metric("vllm:spec_decode_num_drafts", 5), Metric("vllm:spec_decode_num_draft_tokens", 15),
             Metric("vllm:spec_decode_num_accepted_tokens_per_pos", values=[4, 2, 1])]
    assert vllm_worker.counters(LLM(known)) == {"drafts": 5, "draft_tokens": 15, "accepted_per_pos": [4, 2, 1]}
    renamed = [Metric("vllm:spec_decode_drafts", 5), Metric("vllm:spec_decode_num_draft_tokens", 15),
               Metric("vllm:spec_decode_accepted_per_position", values=[4, 2])]
    with pytest.raises(RuntimeError, match=r"LLM.get_metrics\(\) has no \['vllm:spec_decode_num_accepted_tokens_per_pos', "
                                           r"'vllm:spec_decode_num_drafts'\]"):
        vllm_worker.counters(LLM(renamed))


def test_torchs_private_cudnn_attention_ops_are_checked_before_use(monkeypatch) -> None:
    from swa_kernels import window_attention

    window_attention.check_cudnn_pieces()  # the installed torch (2.13 on CPU, 2.11 on the GPU image) has them as called
    # torch 2.4's op: no attn_bias, no compute_log_sumexp; called positionally, its arguments would shift silently
    names = ("query", "key", "value", "dropout_p", "is_causal", "return_debug_mask", "scale")
    schema = types.SimpleNamespace(arguments=[types.SimpleNamespace(name=n) for n in names], returns=[None] * 9)
    monkeypatch.setattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", types.SimpleNamespace(default=types.SimpleNamespace(_schema=schema)))
    monkeypatch.setattr(window_attention, "cudnn_band_available", lambda: False)
    window_attention.cudnn_ops.cache_clear()  # (cached per process)
    try:
        with pytest.raises(ValueError, match=re.escape(f"torch {torch.__version__}: torch.ops.aten._scaled_dot_product_cudnn_attention takes")):
            window_attention.cudnn_ops()
    finally:
        window_attention.cudnn_ops.cache_clear()


def test_a_cudnn_frontend_that_fails_to_load_is_said(tmp_path, monkeypatch, caplog) -> None:
    """nvidia-cudnn-frontend installed but not loading (here: its libcudnn missing) fell back to cuDNN's chunks with no
    word, a slower EAGLE-3 step; said once now. Not installed stays quiet."""
    import sys

    from swa_kernels import window_attention

    package = tmp_path / "cudnn" / "sdpa" / "fwd"
    package.mkdir(parents=True)
    for folder in (tmp_path / "cudnn", tmp_path / "cudnn" / "sdpa", package):
        (folder / "__init__.py").write_text("")
    (package / "torch_op.py").write_text("raise OSError('libcudnn.so.9: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "cudnn" or m.startswith("cudnn.")]:
        monkeypatch.delitem(sys.modules, name)
    window_attention._cudnn_band_available.cache_clear()
    try:
        with caplog.at_level(logging.WARNING):
            assert not window_attention.cudnn_band_available()
        assert "nvidia-cudnn-frontend is installed but cudnn.sdpa.fwd.torch_op did not load (OSError: libcudnn.so.9" in caplog.text
    finally:
        window_attention._cudnn_band_available.cache_clear()
        for name in [m for m in sys.modules if m == "cudnn" or m.startswith("cudnn.")]:
            sys.modules.pop(name)
