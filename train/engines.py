"""Each serving engine's conventions, written once (tests/test_export.py checks them).

Target layer ids. Ours: id i = output of target decoder layer i = HF ``hidden_states[i + 1]``.
  - z-lab DFlash (``dflash_config.target_layer_ids``) and SGLang's DFlash loader: same numbers
    (z-lab ``extract_context_feature`` reads ``hidden_states[layer_id + 1]``).
  - vLLM speculators DFlash (``aux_hidden_state_layer_ids``): the layer whose *input* is
    captured, i.e. ours + 1 (speculators' own DFlash converter adds 1 to z-lab's ids).
  - vLLM EAGLE-3 and the speculators Eagle3 format (``eagle_aux_hidden_state_layer_ids``): ours + 1.
    vLLM v1 ``gpu_model_runner._get_eagle3_aux_layers_from_config`` passes the ids unchanged to
    ``set_aux_hidden_state_layers``, and ``models/llama.py`` ``LlamaModel.forward`` appends
    ``hidden_states + residual`` at the top of the loop for ``idx in aux_hidden_state_layers``,
    i.e. the *input* of layer idx (= HF ``hidden_states[idx]``). speculators passes the ids through
    unchanged (convert/eagle/eagle3_converter.py) and accepts id ``num_layers`` as "the final
    hidden state" (models/utils.py ``resolve_target_layer_ids``): the same input-of-layer meaning.
  - SGLang EAGLE-3 (``eagle_config.eagle_aux_hidden_state_layer_ids`` of a
    ``LlamaForCausalLMEagle3`` draft): ours, unchanged. ``python/sglang/srt/models/llama.py``
    ``set_eagle3_layers_to_capture`` sets ``layers_to_capture = [val + 1 for val in layer_ids]``
    ("for the ith layer, it takes the output of the (i-1)th layer") and ``LlamaModel.forward``
    appends ``hidden_states + residual`` *before* running layer i: config id c -> input of layer
    c + 1 = output of layer c = our id c. (Both engines' defaults, capture points 2, n//2, n-3,
    are our ids 1, n//2 - 1, n - 4: models/target.py::default_layer_ids.)

Windows. Ours (= Hugging Face ``sliding_window``): W keys visible, the query itself included.
  - z-lab DFlash and SGLang / vLLM read ``sliding_window`` from config.json with the same meaning
    (z-lab's mask: ``query_pos - key_pos < sliding_window``).
  - FlashInfer ``window_left`` = W - 1; FlashAttention ``window_size`` = (W - 1, 0).
"""

from __future__ import annotations

import json
import shlex

LAYER_ID_OFFSET = {
    "ours": 0,
    "dflash": 0,  # z-lab reference loader and SGLang DFLASH
    "speculators": 1,  # vLLM speculators format
    # EAGLE-3 differs per engine (see the module docstring for the code read):
    "eagle3_sglang": 0,  # SGLang LlamaForCausalLMEagle3: set_eagle3_layers_to_capture adds the +1 itself
    "eagle3_vllm": 1,  # vLLM Eagle3LlamaForCausalLM and the speculators Eagle3 format: captured at a layer's input
}


def engine_layer_ids(layer_ids: list[int], engine: str) -> list[int]:
    return [i + LAYER_ID_OFFSET[engine] for i in layer_ids]


def flashinfer_window_left(sliding_window: int | None) -> int:
    """FlashInfer counts the keys *before* the query: W keys including itself -> W - 1; -1 = off."""
    return -1 if sliding_window is None else sliding_window - 1


# Printed commands quote every path and the JSON spec for the shell (shlex.quote leaves plain paths as they are): a path
# with a space or a quote printed a command that split the path or a --speculative-config that was no JSON.
def sglang_dflash_command(target: str, draft: str) -> str:
    return (f"python -m sglang.launch_server --model-path {shlex.quote(target)} --speculative-algorithm DFLASH "
            f"--speculative-draft-model-path {shlex.quote(draft)}")


def vllm_serve_command(target: str, method: str, draft: str, num_speculative_tokens: int) -> str:
    spec = json.dumps({"method": method, "model": draft, "num_speculative_tokens": num_speculative_tokens})
    return f"vllm serve {shlex.quote(target)} --speculative-config {shlex.quote(spec)}"


def vllm_dflash_command(target: str, draft: str, block_size: int) -> str:
    return vllm_serve_command(target, "dflash", draft, block_size - 1)


# --- EAGLE-3 -----------------------------------------------------------------------------------
#
# SGLang's draft window: ``--speculative-draft-window-size N`` (python/sglang/srt/arg_groups/fields/spec.py; its help says
# "the drafter only attends to the most recent N keys") is the one way to window an EAGLE-3 draft: no SGLang release reads
# ``sliding_window`` / ``layer_types`` from an EAGLE-3 draft's config.json, and the flag is one window for every draft
# layer (a drafter mixing sliding and full layers cannot be told so). Read in the sglang 0.5.23 wheel (2026-10-30):
# models/llama_eagle3.py sets ``RadixAttention.sliding_window_size = N`` with no ``- 1``, and SGLang's attention backends
# read that field as FlashInfer's ``window_left`` (keys before the query): FA3 ``window_size=(N, 0)``, FlashInfer's
# extend and decode paths and Triton's extend kernel show a query N + 1 keys; Triton's decode clamps to N (the gap
# sgl-project/sglang#32087 names). SGLang's own models pass ``config.sliding_window - 1`` (gemma2.py, gemma3, gpt_oss.py)
# and its DFlash drafter does the same from the draft's config (speculative/dflash_utils.py): the window_left meaning.
# So we pass W - 1 for our W (keys visible, the query included): W keys on FA3 (Hopper's default) and FlashInfer, W - 1
# on Triton's decode.


def sglang_draft_window_size(sliding_window: int) -> int:
    """SGLang's ``--speculative-draft-window-size`` for a drafter trained with Hugging Face's ``sliding_window`` W (W keys,
    the query included): SGLang's ``window_left``, W - 1 (see above)."""
    if sliding_window < 2:
        raise ValueError(f"sliding_window={sliding_window}: SGLang's --speculative-draft-window-size must be positive, so the "
                         "drafter's window needs at least 2 keys")
    return flashinfer_window_left(sliding_window)


def sglang_eagle3_command(target: str, draft: str, num_steps: int, sliding_window: int | None = None) -> str:
    command = (f"python -m sglang.launch_server --model-path {shlex.quote(target)} --speculative-algorithm EAGLE3 "
               f"--speculative-draft-model-path {shlex.quote(draft)} --speculative-num-steps {num_steps} "
               f"--speculative-eagle-topk 1 --speculative-num-draft-tokens {num_steps + 1}")
    if sliding_window is not None:
        command += f" --speculative-draft-window-size {sglang_draft_window_size(sliding_window)}"
    return command


def vllm_eagle3_command(target: str, draft: str, num_steps: int) -> str:
    return vllm_serve_command(target, "eagle3", draft, num_steps)


# EAGLE-3 options SGLang's LlamaForCausalLMEagle3 (models/llama_eagle3.py) does not implement; vLLM reads them all
SGLANG_EAGLE3_UNSUPPORTED_FLAGS = ("fc_norm", "norm_before_fc", "norm_output", "norm_before_residual")


SPECULATORS_MIXED_CAUSALITY = (
    "--format speculators: this drafter has causal sliding layers and bidirectional full layers, and speculators' config has "
    "one causality flag for every layer (vLLM: dflash_config.causal); export --format dflash, whose per-layer rule vLLM "
    "follows (sliding causal, full non-causal)")


def speculators_dflash_non_causal(layer_types: list[str], sliding_block_causal: bool) -> bool | None:
    """speculators' DFlash ``sliding_window_non_causal`` for a drafter, or None when one flag cannot say it.

    vLLM turns the flag into ``dflash_config.causal`` for *every* draft layer (``update_dflash``), while we
    train sliding layers causal inside the block (``sliding_block_causal``, the default) and full layers
    bidirectional. One flag expresses that only when all layers agree: all sliding (the flag is the
    sliding layers' rule), all full (non-causal), or sliding layers trained bidirectional too."""
    types = set(layer_types)
    if types == {"full_attention"}:
        return True
    if types == {"sliding_attention"} or not sliding_block_causal:
        return not sliding_block_causal
    return None
