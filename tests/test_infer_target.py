"""The cached target forward (``models/target.py``) against Hugging Face's own forward with no cache."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from models.target import CachedTarget

pytestmark = pytest.mark.usefixtures("single_cpu_thread")


def load(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()


@pytest.mark.parametrize("which", ["reference", "tiny_llama3"])
def test_chunked_prefill_and_overwritten_drafts_match_hf(which, reference_target_path, tiny_llama3_path) -> None:
    model = load(reference_target_path if which == "reference" else tiny_llama3_path)
    vocab = model.config.vocab_size
    torch.manual_seed(0)
    ids = torch.randint(3, vocab, (300,))
    target = CachedTarget(model, feature_layer_ids=[4, 1, 5])
    target.allocate(320)
    logits = []
    for start in range(0, 250, 96):  # odd chunk boundaries
        out, _ = target.forward(ids[start:min(start + 96, 250)], start)
        logits.append(out)
    target.forward(torch.randint(3, vocab, (16,)), 250)  # rejected drafts at 250..265 ...
    tail, features = target.forward(ids[250:300], 250)  # ... are overwritten by the real tokens
    logits.append(tail)
    with torch.no_grad():
        ref = model(ids[None], output_hidden_states=True)
    torch.testing.assert_close(torch.cat(logits), ref.logits[0], rtol=1e-4, atol=1e-4)
    want_features = torch.cat([ref.hidden_states[i + 1][0, 250:] for i in [4, 1, 5]], dim=-1)
    torch.testing.assert_close(features, want_features, rtol=1e-4, atol=1e-4)


def test_last_logits_only_and_capacity_error(reference_target_path) -> None:
    target = CachedTarget(load(reference_target_path), feature_layer_ids=[])
    target.allocate(10)
    ids = torch.arange(3, 13)
    last, features = target.forward(ids, 0, last_logits_only=True)
    assert last.shape == (1, 8192) and features is None
    with pytest.raises(ValueError, match="exceeds the KV cache capacity 10"):
        target.forward(ids[:2], 9)


def test_what_the_cached_forward_cannot_run_is_refused() -> None:
    """Architectures outside the checked list (Gemma 2's soft-capped logits among them; more in
    ``test_gpt_oss_target.py``) and layer types other than full / sliding are refused by name (sliding layers, sinks and
    experts run: ``test_gpt_oss_target.py``)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    shape = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=8)
    with pytest.raises(ValueError, match=r"target 'gemma2': the inference loop runs gpt_oss, llama, .* targets \(each checked "
                                         r"against Hugging Face's forward\), not gemma2$"):
        CachedTarget(Gemma2ForCausalLM(Gemma2Config(attn_logit_softcapping=50.0, **shape)), feature_layer_ids=[0])
    config = Qwen3Config(layer_types=["sliding_attention", "full_attention"], sliding_window=4, use_sliding_window=True, **shape)
    model = Qwen3ForCausalLM(config)
    model.config.layer_types = ["sliding_attention", "chunked_attention"]
    with pytest.raises(ValueError, match=r"target 'qwen3': layer_types \['chunked_attention'\]; expected 2 of full_attention / sliding_attention"):
        CachedTarget(model, feature_layer_ids=[0])
