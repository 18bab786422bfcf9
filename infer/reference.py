"""Pure-PyTorch greedy speculative decoding with no caches: the oracle for ``infer/generate.py``.

Every step recomputes everything from scratch: one uncached forward of the Hugging Face target
(``output_hidden_states``) over the sequence and its drafts, whose prefix gives the next step's
features, and the drafter's *training* forward under the training masks (``models/dflash.py``), so it shares
neither the KV caches, the sliding buffers, nor the aligned masks of the fast path. Slow (quadratic);
for tests on small models.
"""

from __future__ import annotations

import torch

from models.dflash import LayerMaskSpec, dense_mask
from models.dflash import DFlashDraftModel, sliding_block_causal


@torch.no_grad()
def reference_speculative_greedy(target_model, drafter: DFlashDraftModel, prompt_ids: list[int], max_new_tokens: int,
                                 window="trained") -> tuple[list[int], list[int]]:
    """Greedy speculative decoding; returns (new tokens, accepted drafts per step)."""
    device = drafter.fc.weight.device
    window = drafter.config.sliding_window if window == "trained" else window
    causal = sliding_block_causal(drafter.config)
    specs = {"full_attention": LayerMaskSpec(None, False), "sliding_attention": LayerMaskSpec(window, causal)}
    embed, lm_head = target_model.get_input_embeddings(), target_model.get_output_embeddings()
    b = drafter.block_size
    seq = list(prompt_ids)
    out = target_model(torch.tensor([seq], device=device), output_hidden_states=True)
    seq.append(int(out.logits[0, -1].argmax()))
    new, accepted_per_step = [seq[-1]], []
    while len(new) < max_new_tokens:
        a = len(seq) - 1  # anchor: position of the last token, whose features the target has not made yet
        # The features of seq[:-1] from the last forward, which ran over a sequence that starts with it (the prompt, then
        # each step's seq + drafts, of which the new seq[:-1] is a prefix): one uncached target forward per step
        features = torch.cat([out.hidden_states[i + 1][:, :a] for i in drafter.target_layer_ids], dim=-1)  # [1, a, k*H]
        block = torch.tensor([[seq[-1]] + [drafter.mask_token_id] * (b - 1)], device=device)
        anchors = torch.tensor([[a]], device=device)
        ctx_valid = torch.ones(1, a, dtype=torch.bool, device=device)
        masks = {name: dense_mask(anchors, ctx_valid, b, spec) for name, spec in specs.items()}
        draft_hidden = drafter(embed(block), features, torch.arange(a, a + b, device=device)[None], masks)
        drafts = lm_head(draft_hidden)[0, 1:].argmax(-1).tolist()
        out = target_model(torch.tensor([seq + drafts], device=device), output_hidden_states=True)
        target_next = out.logits[0, a:].argmax(-1).tolist()
        accepted = 0
        while accepted < b - 1 and drafts[accepted] == target_next[accepted]:
            accepted += 1
        step = drafts[:accepted] + [target_next[accepted]]
        accepted_per_step.append(min(accepted, max_new_tokens - len(new) - 1))  # drafts the budget cuts are not counted
        seq += step
        new += step
    return new[:max_new_tokens], accepted_per_step
