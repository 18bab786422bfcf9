"""Drafters for loop tests: a real DFlash (or EAGLE-3) drafter overfit on the target's own greedy text (so drafts
get accepted, as from a trained drafter), and a wrapper that replaces some of a drafter's proposals
by a script (to force every acceptance length, including whole blocks and EOS inside a block)."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import torch

from models.dflash import DFlashDrafter
from models.eagle3 import Eagle3Drafter
from train.eagle3 import ttt_loss, unroll
from models.eagle3 import Eagle3DraftModel, build_draft_vocab, make_eagle3_config
from train.dflash import block_loss, build_blocks, layer_masks, sample_anchors
from models.dflash import DFlashDraftModel, make_dflash_config


def greedy_continuations(model, prompts: list[list[int]], num_tokens: int) -> list[list[int]]:
    """Each prompt followed by the target's greedy continuation (HF ``generate``)."""
    out = []
    for prompt in prompts:
        ids = model.generate(torch.tensor([prompt], device=model.device), max_new_tokens=num_tokens, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
        out.append(ids[0].tolist())
    return out


def overfit_drafter(model, sequences: list[list[int]], *, layer_types, sliding_window, block_size=8, mask_token_id=3,
                    target_layer_ids=(1, 3, 5), steps=150, seed=0) -> DFlashDraftModel:
    """Train a small DFlash drafter on ``sequences`` until it has mostly memorised them."""
    torch.manual_seed(seed)
    config = make_dflash_config(model.config, num_hidden_layers=len(layer_types), block_size=block_size, mask_token_id=mask_token_id,
                                target_layer_ids=list(target_layer_ids), layer_types=layer_types, sliding_window=sliding_window)
    drafter = DFlashDraftModel(config).to(model.device)
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()
    batch = []
    with torch.no_grad():
        for seq in sequences:
            ids = torch.tensor([seq], device=model.device)
            hidden = model(ids, output_hidden_states=True).hidden_states
            batch.append((ids, torch.cat([hidden[i + 1] for i in target_layer_ids], dim=-1)))
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(seed)
    for step in range(steps):
        ids, features = batch[step % len(batch)]
        loss_mask = torch.ones_like(ids, dtype=torch.bool)
        anchors, valid = sample_anchors(loss_mask, 24, generator)
        blocks = build_blocks(ids, loss_mask, anchors, valid, block_size, mask_token_id)
        ctx_valid = torch.ones_like(loss_mask)
        masks = layer_masks(blocks, ctx_valid, block_size, layer_types, sliding_window, True, "sdpa")
        hidden = drafter(embed(blocks.block_ids).detach(), features, blocks.positions, masks)
        stats = block_loss(lm_head(hidden), blocks.labels, valid, block_size, gamma=4.0)
        optimizer.zero_grad()
        (stats.loss_sum / stats.num_labels).backward()
        optimizer.step()
    return drafter.eval().requires_grad_(False)


def memorised_dflash_drafter(model, tokenizer, shared_dir: Path) -> DFlashDraftModel:
    """``overfit_drafter`` (a sliding and a full layer, window 16, target layers 1, 3, 5; 200 steps) on the target's
    64-token greedy continuations of the first two MT-Bench prompts (``long_prompt_ids``), ``model`` the reference
    target in fp32. test_infer_generate and test_zlab_engine both test the loop with it: trained once per run (~45 s
    of one core) under a file lock in ``shared_dir`` (conftest's ``run_shared_dir``), read back by every module."""
    from filelock import FileLock

    from common.atomic import atomic_dir
    from infer.prompts import long_prompt_ids, mt_bench_questions

    folder = shared_dir / "memorised-dflash-drafter"
    with FileLock(str(folder) + ".lock"):
        if not (folder / "config.json").exists():
            prompts = [long_prompt_ids(tokenizer, q["turns"][0]) for q in mt_bench_questions()[:2]]
            drafter = overfit_drafter(model, greedy_continuations(model, prompts, 64), layer_types=["sliding_attention", "full_attention"],
                                      sliding_window=16, target_layer_ids=(1, 3, 5), steps=200)
            with atomic_dir(folder) as tmp:
                drafter.save_pretrained(tmp)
    return DFlashDraftModel.from_pretrained(folder).to(model.device).eval().requires_grad_(False)


class PartlyScripted:
    """A drafter whose proposal at a slot is, with probability ``p_script``, the script's token for
    that position (the target's known greedy output) and otherwise the wrapped drafter's own."""

    def __init__(self, inner: DFlashDrafter, script: list[int], prompt_len: int, p_script: float, seed: int = 0):
        self.inner = inner
        self.script = script  # new tokens expected after the prompt
        self.prompt_len = prompt_len
        self.p_script = p_script
        self.rng = random.Random(seed)
        self.block_size = inner.block_size
        self.verify_tokens = inner.verify_tokens
        self.target_layer_ids = inner.target_layer_ids

    tree = False
    draft = DFlashDrafter.draft  # drafts through this wrapper's draft_logits

    def reset(self, max_positions: int) -> None:
        self.inner.reset(max_positions)

    def append_context(self, features, start: int, token_ids=None) -> None:
        self.inner.append_context(features, start)

    def draft_logits(self, token, anchor: int) -> torch.Tensor:
        logits = self.inner.draft_logits(token, anchor).clone()
        for slot in range(logits.shape[0]):
            i = anchor + 1 + slot - self.prompt_len  # index into the script of this slot's position
            if 0 <= i < len(self.script) and self.rng.random() < self.p_script:
                logits[slot] = -1e9
                logits[slot, self.script[i]] = 1e9
        return logits


def overfit_eagle3_drafter(model, sequences: list[list[int]], *, layer_types, sliding_window, target_layer_ids=(1, 3, 4), ttt_length=4,
                           draft_vocab_size=4096, steps=300, seed=0) -> Eagle3DraftModel:
    """Train a small EAGLE-3 drafter (the TTT objective) on ``sequences`` until it has mostly memorised them.

    The draft vocabulary is the ``draft_vocab_size`` most frequent ids of the sequences (so the
    mapping to target ids is exercised); the embedding is the target's, as in training."""
    torch.manual_seed(seed)
    config = make_eagle3_config(model.config, num_hidden_layers=len(layer_types), target_layer_ids=list(target_layer_ids),
                                layer_types=layer_types, sliding_window=sliding_window, draft_vocab_size=draft_vocab_size,
                                ttt_length=ttt_length)
    drafter = Eagle3DraftModel(config).to(model.device)
    drafter.embed_tokens.weight.data.copy_(model.get_input_embeddings().weight.data)
    counts = Counter(t for seq in sequences for t in seq)
    drafter.set_draft_vocab(*build_draft_vocab(counts, config.vocab_size, config.draft_vocab_size))
    batch = []
    with torch.no_grad():
        for seq in sequences:
            ids = torch.tensor([seq], device=model.device)
            out = model(ids, output_hidden_states=True)
            features = torch.cat([out.hidden_states[i + 1] for i in target_layer_ids], dim=-1)
            batch.append((ids, features, out.logits))
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-3)
    for step in range(steps):
        ids, features, logits = batch[step % len(batch)]
        ones = torch.ones_like(ids, dtype=torch.bool)
        outputs = unroll(drafter, features, ids, ones, ttt_length)
        stats = ttt_loss(drafter, outputs, logits, ids, ones, ones)
        optimizer.zero_grad()
        (stats.loss_sum / stats.num_labels).backward()
        optimizer.step()
    return drafter.eval().requires_grad_(False)


class PartlyScriptedEagle3(Eagle3Drafter):
    """An EAGLE-3 drafter whose proposal for a position is, with probability ``p_script``, the script's
    token there (when the draft vocabulary has it); the chain then continues from that token, as it
    would from the drafter's own. Works for chains and trees (every proposal goes through ``logits_for``)."""

    def __init__(self, model: Eagle3DraftModel, script: list[int], prompt_len: int, p_script: float, seed: int = 0, **kwargs):
        super().__init__(model, **kwargs)
        self.script = script
        self.prompt_len = prompt_len
        self.p_script = p_script
        self.rng = random.Random(seed)
        self.draft_id = {t: d for d, t in enumerate(model.draft_ids_in_target().tolist())}

    def logits_for(self, h, positions):
        logits = super().logits_for(h, positions).clone()
        for row, pos in enumerate(positions.tolist()):
            i = pos - self.prompt_len
            if 0 <= i < len(self.script) and self.script[i] in self.draft_id and self.rng.random() < self.p_script:
                logits[row] = -1e9
                logits[row, self.draft_id[self.script[i]]] = 1e9
        return logits


def random_dflash_on_reference(reference_target_path):
    """The reference target (fp32) with a random 2-layer DFlash drafter reading its layers 1 and 3 (block 4, one sliding
    layer of window 6 and one full), the static target over those layers and a 40-token random prompt:
    (hf model, static target, drafter model, embed, head, prompt)."""
    from transformers import AutoModelForCausalLM

    from models.static_target import StaticTarget

    model = AutoModelForCausalLM.from_pretrained(reference_target_path, dtype=torch.float32).eval()
    config = make_dflash_config(model.config, num_hidden_layers=2, block_size=4, mask_token_id=5, target_layer_ids=[1, 3],
                                layer_types=["sliding_attention", "full_attention"], sliding_window=6)
    torch.manual_seed(0)
    drafter_model = DFlashDraftModel(config).eval()
    target = StaticTarget(model, [1, 3])
    prompt = torch.randint(10, 8000, (40,)).tolist()
    return model, target, drafter_model, model.get_input_embeddings(), model.get_output_embeddings(), prompt


def random_eagle3_on_reference(reference_target_path):
    """The reference target (fp32) with a random 2-layer EAGLE-3 drafter reading its layers 1, 3 and 4 (a sliding layer of
    window 6, a full one; draft vocabulary 2,048; 3 TTT steps), sharing its embedding, the static target over those layers
    and a 40-token random prompt: (hf model, static target, drafter model, prompt)."""
    from transformers import AutoModelForCausalLM

    from models.static_target import StaticTarget

    model = AutoModelForCausalLM.from_pretrained(reference_target_path, dtype=torch.float32).eval()
    config = make_eagle3_config(model.config, num_hidden_layers=2, target_layer_ids=[1, 3, 4], layer_types=["sliding_attention", "full_attention"],
                                sliding_window=6, draft_vocab_size=2048, ttt_length=3)
    torch.manual_seed(0)
    drafter_model = Eagle3DraftModel(config).eval()
    drafter_model.embed_tokens.weight.data.copy_(model.get_input_embeddings().weight.data)
    prompt = torch.randint(10, 8000, (40,)).tolist()
    return model, StaticTarget(model, [1, 3, 4]), drafter_model, prompt


def bigram_eagle3(model, prompts: list[list[int]], draft_vocab_size: int = 256) -> Eagle3DraftModel:
    """An EAGLE-3 drafter (a ring layer and a full layer) whose drafts are often accepted without training: its first
    layer (window 1) turns the input token's embedding into the hidden state and its head holds a bigram table read off
    the target's greedy replies, so draft 1 (a chain's later drafts less often) is the target's next token; the target's
    features (a random projection) and the full layer (random, amplified) over the context move the logits enough that
    a row drafting from another row's pending tokens or features changes the greedy outcome (checked by hand). Greedy
    τ ~2 (acceptances 0 .. k, rows at different offsets of their pending blocks)."""
    from infer.generate import generate
    from models.static_target import StaticTarget

    target = StaticTarget(model, [])
    table = {}
    for p in prompts:
        seq = p + generate(target, None, p, 24).tokens
        table.update(zip(seq, seq[1:]))
    drafted = sorted(set(table.values()))
    kept = torch.tensor(sorted(drafted + [i for i in range(0, 8192, 31) if i not in drafted][:draft_vocab_size - len(drafted)]))
    config = make_eagle3_config(model.config, num_hidden_layers=2, target_layer_ids=[1, 3, 4], sliding_window=1, ttt_length=3,
                                layer_types=["sliding_attention", "full_attention"], draft_vocab_size=draft_vocab_size)
    torch.manual_seed(0)
    eagle3 = Eagle3DraftModel(config).eval().requires_grad_(False)
    eagle3.set_draft_vocab(kept - torch.arange(draft_vocab_size), torch.zeros(8192, dtype=torch.bool).index_fill_(0, kept, True))
    eagle3.embed_tokens.weight.copy_(model.get_input_embeddings().weight)
    eagle3.fc.weight.normal_(0, 0.02)  # step 0's hidden state: a small part of the logits
    first, d = eagle3.layers[0], config.head_dim  # 2 kv heads of 64, 4 query heads each
    first.self_attn.v_proj.weight.zero_()[:, :2 * d] = torch.eye(2 * d)  # v: the normed embedding's first 128 features
    first.self_attn.o_proj.weight.zero_()[:2 * d, [*range(d), *range(4 * d, 5 * d)]] = torch.eye(2 * d)  # query heads 0 and 4
    first.mlp.down_proj.weight.zero_()
    eagle3.layers[1].self_attn.o_proj.weight.mul_(10)
    eagle3.layers[1].mlp.down_proj.weight.mul_(10)
    code = torch.nn.functional.normalize(first.input_layernorm(eagle3.embed_tokens.weight)[:, :2 * d], dim=-1)
    row = {int(t): i for i, t in enumerate(kept)}
    head = eagle3.lm_head.weight.zero_()
    for a, b in table.items():
        head[row[b], :2 * d] += 10 * code[a]
    return eagle3


def ancestor_masks(parents: torch.Tensor) -> torch.Tensor:
    """[B, N+1, N+1] from parents [B, N] (rows of [root, nodes]): row i sees itself and every node met walking its
    parents up to the root, in plain Python: the reference the tree masks are checked against (``tree_masks`` against
    itself let a depth bound one short pass)."""
    b, n = parents.shape[0], parents.shape[1] + 1
    masks = torch.zeros(b, n, n, dtype=torch.bool)
    for r in range(b):
        parent = [0] + parents[r].tolist()
        for i in range(n):
            j = i
            masks[r, i, j] = True
            while j != 0:
                j = parent[j]
                masks[r, i, j] = True
    return masks


def tiny_gpt_oss(vocab_size: int = 96, window: int = 8, seed: int = 0, intermediate_size: int = 48):
    """A 4-layer gpt-oss (random init, fp32, eager attention; heads of 16, the least flex attention takes in a drafter): sliding layers of ``window`` keys alternating with full
    ones, attention sinks drawn large enough to matter (N(0, 2): HF's init leaves them ~0.02), 4 experts, top 2, YaRN
    RoPE whose tables cover half the head; attention, expert and router biases as the architecture has them."""
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=intermediate_size, num_hidden_layers=4, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=window,
                          layer_types=["sliding_attention", "full_attention"] * 2, max_position_embeddings=131072,
                          tie_word_embeddings=False, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    torch.manual_seed(seed)
    model = GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)
    return model
