"""Each serving engine's conventions, written once (tests/test_export.py checks them).

Target layer ids. Ours: id i = output of target decoder layer i = HF ``hidden_states[i + 1]``.
  - z-lab DFlash (``dflash_config.target_layer_ids``) and SGLang's DFlash loader: same numbers
    (z-lab ``extract_context_feature`` reads ``hidden_states[layer_id + 1]``).
  - vLLM speculators (``aux_hidden_state_layer_ids``), SGLang / vLLM EAGLE-3
    (``eagle_aux_hidden_state_layer_ids``): the layer whose *input* is captured, i.e. ours + 1
    (speculators' own DFlash converter adds 1 to z-lab's ids).

Windows. Ours (= Hugging Face ``sliding_window``): W keys visible, the query itself included.
  - z-lab DFlash and SGLang / vLLM read ``sliding_window`` from config.json with the same meaning
    (z-lab's mask: ``query_pos - key_pos < sliding_window``).
  - FlashInfer ``window_left`` = W - 1; FlashAttention ``window_size`` = (W - 1, 0).
"""

from __future__ import annotations

LAYER_ID_OFFSET = {
    "ours": 0,
    "dflash": 0,  # z-lab reference loader and SGLang DFLASH
    "speculators": 1,  # vLLM speculators format
    "eagle3": 1,  # SGLang / vLLM EAGLE-3 aux hidden states
}


def engine_layer_ids(layer_ids: list[int], engine: str) -> list[int]:
    return [i + LAYER_ID_OFFSET[engine] for i in layer_ids]


def flashinfer_window_left(sliding_window: int | None) -> int:
    """FlashInfer counts the keys *before* the query: W keys including itself -> W - 1; -1 = off."""
    return -1 if sliding_window is None else sliding_window - 1


def sglang_dflash_command(target: str, draft: str) -> str:
    return f"python -m sglang.launch_server --model-path {target} --speculative-algorithm DFLASH --speculative-draft-model-path {draft}"


def vllm_dflash_command(target: str, draft: str, block_size: int) -> str:
    spec = '{"method": "dflash", "model": "%s", "num_speculative_tokens": %d}' % (draft, block_size - 1)
    return f"vllm serve {target} --speculative-config '{spec}'"
