"""Real model shapes for speed benchmarks, built with random weights on the GPU (no download)."""

from __future__ import annotations

import torch

# From the models' config.json files.
TARGET_SHAPES = {
    "qwen3-8b": ("qwen3", dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                               num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                               rope_parameters={"rope_type": "default", "rope_theta": 1e6}, tie_word_embeddings=False)),
    "llama3.1-8b": ("llama", dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                  num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
                                  rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                                  tie_word_embeddings=False)),
    # openai/gpt-oss-20b's config.json (its experts stored MXFP4; here bf16, as TargetModel.from_pretrained loads them)
    "gpt-oss-20b": ("gpt_oss", dict(vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=24,
                                    num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32,
                                    num_experts_per_tok=4, sliding_window=128, layer_types=["sliding_attention", "full_attention"] * 12,
                                    max_position_embeddings=131072, rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0,
                                    "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                    "original_max_position_embeddings": 4096}, tie_word_embeddings=False)),
    # HuggingFaceTB/SmolLM2-135M-Instruct as target.path=builtin:smollm2-135m-instruct builds it (YaRN x2 added)
    "smollm2-135m": ("llama", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5,
                                   max_position_embeddings=16384, rope_parameters={"rope_type": "yarn", "rope_theta": 1e5, "factor": 2.0,
                                   "original_max_position_embeddings": 8192}, tie_word_embeddings=True)),
    # smoke-test shapes (CPU): the scripts' code paths in seconds
    "tiny-qwen3": ("qwen3", dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                                 rope_parameters={"rope_type": "default", "rope_theta": 1e6}, tie_word_embeddings=False)),
    "tiny-gpt-oss": ("gpt_oss", dict(vocab_size=512, hidden_size=64, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2, sliding_window=16,
                                     layer_types=["sliding_attention", "full_attention"] * 3, max_position_embeddings=4096,
                                     tie_word_embeddings=False)),
}


def zlab_feature_layers(num_layers: int) -> list[int]:
    """The 5 target layers z-lab's DFlash drafters read, spaced as theirs are (Qwen3-8B's 36 layers: 1, 9, 17, 25, 33)."""
    return [int(round(1 + i * (num_layers - 4) / 4)) for i in range(5)]


def random_target(shape: str, device: str = "cuda", seed: int = 0):
    """A ``TargetModel`` with ``shape``'s config and random bf16 weights, built on ``device``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from models.target import TargetModel

    model_type, kwargs = TARGET_SHAPES[shape]
    config = AutoConfig.for_model(model_type, **kwargs)
    config._attn_implementation = "eager" if model_type == "gpt_oss" else "sdpa"  # gpt-oss's sinks: no SDPA path
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if device != "cpu" else torch.float32)
    return TargetModel(model, tokenizer=None, path=f"random:{shape}")
