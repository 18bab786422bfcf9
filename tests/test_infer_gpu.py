"""The inference loop on a GPU (skipped without CUDA): FlashInfer attention == SDPA on the cached
layouts, and greedy speculative decoding == HF ``generate`` with longer generations, both backends."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from models.dflash import DFlashDrafter
from infer.generate import generate
from infer.prompts import long_prompt_ids, mt_bench_questions
from models.target import CachedTarget
from infer_helpers import PartlyScripted, greedy_continuations, overfit_drafter
from swa_kernels.attention import cached_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
HAS_FLASHINFER = importlib.util.find_spec("flashinfer") is not None
BACKENDS = ["sdpa"]  # FlashInfer has no fp32 kernels: its bf16 loop is compared in benchmarks/infer_speed.py


@pytest.mark.skipif(not HAS_FLASHINFER, reason="flashinfer not installed")
@pytest.mark.parametrize("q_len,k_len,causal,window", [
    (1, 5000, True, None), (16, 5000, True, None), (16, 2063, True, 2048), (16, 300, True, 2048),
    (16, 5000, False, None), (16, 2063, False, 2048), (2048, 6144, True, None), (16, 530, True, 512), (8, 40, True, 3),
    (16, 40, False, 3),  # a bidirectional band narrower than the queries: FlashInfer's window has no right edge
])
def test_flashinfer_equals_sdpa(q_len, k_len, causal, window) -> None:
    torch.manual_seed(0)
    q = torch.randn(q_len, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(k_len, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    want = cached_attention(q.float(), k.float(), v.float(), causal=causal, window=window, scale=128 ** -0.5)
    got = cached_attention(q, k, v, causal=causal, window=window, scale=128 ** -0.5, backend="flashinfer")
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


@pytest.fixture(scope="module")
def setup(reference_target_path):
    model = AutoModelForCausalLM.from_pretrained(reference_target_path, dtype=torch.float32).cuda().eval()
    tokenizer = AutoTokenizer.from_pretrained(reference_target_path)
    questions = [q["turns"][0] for q in mt_bench_questions()[:20]]
    memorised = greedy_continuations(model, [long_prompt_ids(tokenizer, q) for q in questions[:2]], 64)
    drafter = overfit_drafter(model, memorised, layer_types=["sliding_attention", "full_attention"], sliding_window=16,
                              target_layer_ids=[1, 3, 5], steps=200)
    return model, tokenizer, questions, drafter


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("prefill", [0, 2048, 8192])
def test_greedy_lossless_on_gpu_fp32(setup, backend, prefill) -> None:
    model, tokenizer, questions, drafter_model = setup
    target = CachedTarget(model, [1, 3, 5], attention_backend=backend)
    steps = 0
    for i, question in enumerate(questions):
        prompt = long_prompt_ids(tokenizer, question, prefill, offset=997 * i)
        want = model.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=128, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, len(prompt):].tolist()
        for window in [None, 512, 2048]:
            drafter = DFlashDrafter(drafter_model, model.get_input_embeddings(), model.get_output_embeddings(), window=window,
                                    attention_backend=backend)
            got = generate(target, PartlyScripted(drafter, want, len(prompt), p_script=0.7, seed=i), prompt, max_new_tokens=128)
            assert got.tokens == want, f"prompt {i}, window {window}"
            steps += got.stats.steps
    assert steps > 0
