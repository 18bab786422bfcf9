"""The static-cache DFlash drafter (``StaticDFlashDrafter``: fixed-shape buffers, rings for sliding layers,
whole-block appends) against the eager ``DFlashDrafter`` (consecutive context caches, accepted positions
only), step by step: the same draft logits for every drafter shape, window override and acceptance pattern,
each row of a batch as if alone, and the same generation in the loop."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import Qwen3Config

from infer.generate import generate
from infer_helpers import random_dflash_on_reference
from models.dflash import (DFlashDrafter, DFlashDraftModel, LayerAttention, StaticDFlashDrafter, block_visible,
                           make_dflash_config)
from models.static_target import concat_linears

pytestmark = pytest.mark.usefixtures("single_cpu_thread")

SHAPES = {  # (layer types, trained window, causal sliding layers)
    "sliding+full": (["sliding_attention", "full_attention"], 5, True),
    "sliding non-causal": (["sliding_attention", "sliding_attention"], 3, False),
    "full": (["full_attention"], None, True),
    "sliding causal": (["sliding_attention", "sliding_attention"], 3, True),  # the recipes' shape: every layer causal in-block
}


def tiny(shape: str, block: int = 4, head_dim: int = 8):
    torch.manual_seed(0)
    target = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=head_dim)
    types, window, causal = SHAPES[shape]
    model = DFlashDraftModel(make_dflash_config(target, num_hidden_layers=len(types), block_size=block, mask_token_id=1,
                                                target_layer_ids=[0, 2], layer_types=types, sliding_window=window,
                                                sliding_block_causal=causal)).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.3) if p.dim() > 1 else None
    return model, nn.Embedding(64, 32), nn.Linear(32, 64, bias=False)


def run_both(model, embed, head, window, accepted, prompt_len=9, seed=0):
    """Drive both drafters through a prompt and verify steps accepting ``accepted[i]`` drafts; yield both logits per step."""
    g = torch.Generator().manual_seed(seed)
    eager = DFlashDrafter(model, embed, head, window=window)
    static = StaticDFlashDrafter(model, embed, head, window=window)
    b, k_h = model.block_size, 2 * 32
    eager.reset(200)
    static.reset(200)
    features = torch.randn(prompt_len, k_h, generator=g)
    eager.append_context(features, 0)
    static.append_context(features, 0)
    pos = prompt_len
    for acc in accepted:
        token = torch.randint(2, 64, (), generator=g)
        want = eager.draft_logits(token, pos)
        got, greedy = static.block_logits(token.reshape(1), torch.tensor([pos]))
        greedy_alone = static.block_greedy(token.reshape(1), torch.tensor([pos]))  # a greedy chain's pass (no logits kept)
        assert torch.equal(greedy_alone, greedy)
        yield want, got[0], greedy[0]
        block_features = torch.randn(b, k_h, generator=g)  # the verify pass's features; rows after acc are rejected tokens'
        eager.append_context(block_features[:acc + 1], pos)
        static.append_context(block_features, pos)
        pos += acc + 1


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("window", ["trained", None, 2])
def test_static_drafts_equal_the_eager_drafters(shape, window) -> None:
    model, embed, head = tiny(shape)
    accepted = [0, 3, 1, 2, 0, 0, 3, 3, 1] * 3  # past every ring's wrap-around (W + block slots)
    for want, got, greedy in run_both(model, embed, head, window, accepted):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(greedy, want.argmax(-1))


def test_a_long_prompt_chunk_into_a_ring_keeps_its_last_positions() -> None:
    model, embed, head = tiny("sliding+full")
    for want, got, _ in run_both(model, embed, head, "trained", [1, 2], prompt_len=50):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_each_row_of_a_batch_drafts_as_if_alone() -> None:
    model, embed, head = tiny("sliding+full")
    g = torch.Generator().manual_seed(3)
    batch = StaticDFlashDrafter(model, embed, head)
    batch.allocate(100, batch=2)
    singles = [StaticDFlashDrafter(model, embed, head) for _ in range(2)]
    for s in singles:
        s.allocate(100, batch=1)
    lengths = [7, 12]
    for row, n in enumerate(lengths):  # prompts of different lengths, each into its own row
        f = torch.randn(1, n, 64, generator=g)
        singles[row].append(f, torch.tensor([0]))
        batch.append(f, torch.tensor([0]), row=row)
    for step in range(3):  # then batched verify appends, rows at their own positions, two accepted per step
        tokens, anchors = torch.tensor([5 + step, 9]), torch.tensor(lengths)
        logits, _ = batch.block_logits(tokens, anchors)
        for row in range(2):
            want, _ = singles[row].block_logits(tokens[row:row + 1], anchors[row:row + 1])
            torch.testing.assert_close(logits[row], want[0], rtol=1e-5, atol=1e-5)
        f = torch.randn(2, 4, 64, generator=g)
        batch.append(f, anchors)
        for row in range(2):
            singles[row].append(f[row:row + 1], anchors[row:row + 1])
        lengths = [n + 3 for n in lengths]


def test_the_loop_with_the_static_drafter_equals_the_eager_one(reference_target_path) -> None:
    _, target, drafter_model, embed, head, prompt = random_dflash_on_reference(reference_target_path)
    want = generate(target, DFlashDrafter(drafter_model, embed, head), prompt, 40)
    got = generate(target, StaticDFlashDrafter(drafter_model, embed, head), prompt, 40)
    assert got.tokens == want.tokens and got.stats.accepted_per_step == want.stats.accepted_per_step
    forced = [generate(target, d, prompt, 40, accept_per_step=2).tokens  # the drafts themselves, two per step
              for d in (DFlashDrafter(drafter_model, embed, head), StaticDFlashDrafter(drafter_model, embed, head))]
    assert forced[0] == forced[1]


def two_layer_static_dflash(reference_target_path):
    """The reference target (fp32, CPU), its static copy reading layers 1 and 3, and a random two-layer static DFlash
    drafter over them (a sliding layer of W = 6, a full one; block 4), seeded: (model, target, drafter)."""
    from transformers import AutoModelForCausalLM

    from models.static_target import StaticTarget

    model = AutoModelForCausalLM.from_pretrained(reference_target_path, dtype=torch.float32).eval()
    config = make_dflash_config(model.config, num_hidden_layers=2, block_size=4, mask_token_id=5, target_layer_ids=[1, 3],
                                layer_types=["sliding_attention", "full_attention"], sliding_window=6)
    torch.manual_seed(0)
    drafter = StaticDFlashDrafter(DFlashDraftModel(config).eval(), model.get_input_embeddings(), model.get_output_embeddings())
    return model, StaticTarget(model, [1, 3]), drafter


@pytest.mark.slow  # the quick tier stays under 3 minutes (README); the full suite runs it
def test_drafting_the_next_block_ahead_of_the_host_sync_changes_no_token(reference_target_path) -> None:
    from models.sampling import SamplingConfig

    _, target, drafter = two_layer_static_dflash(reference_target_path)
    prompt = torch.randint(10, 8000, (30,)).tolist()
    for kwargs in ({}, {"accept_per_step": 2}, {"sampling": SamplingConfig(temperature=1.0, seed=3)}):
        runs = [generate(target, drafter, prompt, 30, run_ahead=ahead, **kwargs) for ahead in (False, True)]
        assert runs[0].tokens == runs[1].tokens and runs[0].stats.accepted_per_step == runs[1].stats.accepted_per_step
    eos = generate(target, drafter, prompt, 30).tokens[7]  # a stop inside the run: the block drafted ahead is dropped
    runs = [generate(target, drafter, prompt, 30, eos_token_ids=[eos], run_ahead=ahead).tokens for ahead in (False, True)]
    assert runs[0] == runs[1] and runs[0][-1] == eos


@pytest.mark.slow  # the quick tier stays under 3 minutes (README); the full suite runs it
def test_a_chained_second_turn_reuses_the_first_turns_context(reference_target_path) -> None:
    """A conversation's second turn reusing the first's cached tokens (``cached_ids``) with the greedy chain's drafting
    step as one call (``append_and_draft``, taken with ``run_ahead``): the target's own greedy output in both turns, the
    same tokens and accepted counts as the path after the host sync, and the prefix reused."""
    from models.static_target import StaticTarget

    model, target, drafter = two_layer_static_dflash(reference_target_path)
    first = torch.randint(10, 8000, (20,)).tolist()
    turns = {}
    for ahead in (True, False):
        one = generate(target, drafter, first, 16, run_ahead=ahead)
        second = first + one.tokens + torch.randint(10, 8000, (7,), generator=torch.Generator().manual_seed(1)).tolist()
        two = generate(target, drafter, second, 16, run_ahead=ahead, cached_ids=one.cache_ids)
        assert two.stats.reused_tokens > len(first)
        turns[ahead] = [(t.tokens, t.stats.accepted_per_step) for t in (one, two)]
    assert turns[True] == turns[False]
    alone = StaticTarget(model, [1, 3])
    assert turns[True][0][0] == generate(alone, None, first, 16).tokens
    assert turns[True][1][0] == generate(alone, None, second, 16).tokens


@pytest.mark.slow  # the quick tier stays under 3 minutes (README); the full suite runs it
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"))])
def test_steps_end_where_the_target_alone_ends(reference_target_path, device) -> None:
    """Drafting the next block before the host sync (``run_ahead``) or after it: at every budget, with forced acceptances
    that jump across it, and with an end-of-sequence token at each offset of the first blocks, the output is the target's
    own greedy output, both ways take the same steps, and the steps account for every output token."""
    from transformers import AutoModelForCausalLM

    from models.static_target import StaticTarget

    model = AutoModelForCausalLM.from_pretrained(reference_target_path, dtype=torch.float32).eval().to(device)
    config = make_dflash_config(model.config, num_hidden_layers=1, block_size=4, mask_token_id=5, target_layer_ids=[1],
                                layer_types=["sliding_attention"], sliding_window=8)
    torch.manual_seed(0)
    drafter = StaticDFlashDrafter(DFlashDraftModel(config).eval().to(device), model.get_input_embeddings(), model.get_output_embeddings())
    target = StaticTarget(model, [1])
    prompt = torch.randint(10, 8000, (12,)).tolist()
    alone = generate(target, None, prompt, 24).tokens
    for budget in (1, 2, 3, 4, 5, 9, 24):
        for forced in (None, 1, 3):  # forced: every step accepts that many (the drafts themselves, not the target's)
            runs = [generate(target, drafter, prompt, budget, accept_per_step=forced, run_ahead=ahead) for ahead in (True, False)]
            assert runs[0].tokens == runs[1].tokens and runs[0].stats.accepted_per_step == runs[1].stats.accepted_per_step
            assert len(runs[0].tokens) == budget
            if forced is None:
                assert runs[0].tokens == alone[:budget]
    for forced in (None, 3):  # the stop token at every offset of the first steps' blocks (forced: inside a block too)
        free = generate(target, drafter, prompt, 24, accept_per_step=forced).tokens
        for stop in range(1, 9):
            eos = free[stop]
            want = free[:free.index(eos) + 1]
            for ahead in (True, False):
                got = generate(target, drafter, prompt, 24, eos_token_ids=[eos], accept_per_step=forced, run_ahead=ahead)
                assert got.tokens == want and 1 + sum(a + 1 for a in got.stats.accepted_per_step) == len(want)
                assert forced is not None or got.tokens == alone[:len(want)]
    if device == "cuda":  # graphs that read buffers in place (the drafter's step buffers, the forced count): captured once
        graphs = (len(target.graphs.graphs), len(drafter.graphs.graphs))
        for forced in (None, 3, None, 3):
            generate(target, drafter, prompt, 24, accept_per_step=forced, run_ahead=True)
        assert (len(target.graphs.graphs), len(drafter.graphs.graphs)) == graphs
        for _ in range(2):  # a window's copy of the drafter (an eval sweep makes one a cell) writes the target's same buffers
            got = generate(target, drafter.with_window("trained"), prompt, 24, run_ahead=True)
            assert got.tokens == alone and len(target.graphs.graphs) == graphs[0]


@pytest.mark.parametrize("rule", [LayerAttention(True, None), LayerAttention(True, 3), LayerAttention(False, None),
                                  LayerAttention(False, 2), LayerAttention(False, 5)])
def test_block_visibility_follows_the_rule_key_by_key(rule) -> None:
    b = 4
    slot_pos = torch.tensor([[5, -1, 9, 3, 10, 7, 8], [0, 1, 2, -1, -1, -1, -1]])  # a ring: 9 and 10 are past anchor 9
    anchor = torch.tensor([9, 3])
    got = block_visible(slot_pos, anchor, b, rule)
    for row in range(2):
        a = int(anchor[row])
        for k in range(b):
            p = a + k
            for s, key in enumerate(slot_pos[row].tolist()):  # context: filled, before the anchor, inside the window
                assert got[row, k, s] == (0 <= key < a and (rule.window is None or key > p - rule.window))
            for slot in range(b):  # the block's own slots: causal or not, a window (symmetric when not causal)
                want = (slot <= k or not rule.causal) and (rule.window is None or (slot > k - rule.window and
                                                                                   (rule.causal or slot < k + rule.window)))
                assert got[row, k, slot_pos.shape[1] + slot] == want


def test_concatenated_linears_give_the_linears_outputs_side_by_side() -> None:
    torch.manual_seed(0)
    linears = [nn.Linear(6, 3, bias=False), nn.Linear(6, 5, bias=True), nn.Linear(6, 2, bias=False)]
    x = torch.randn(4, 6)
    weight, bias = concat_linears(linears)
    torch.testing.assert_close(nn.functional.linear(x, weight, bias), torch.cat([lin(x) for lin in linears], dim=-1))
    assert concat_linears(linears[:1])[1] is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("compile", [False, True])
@pytest.mark.parametrize("head_dim", [8, 16])  # 16: the block attention through swa_kernels/block_attention.py (tl.dot: K >= 16)
def test_captured_drafter_equals_the_uncaptured_one_on_cuda(shape, compile, head_dim) -> None:
    model, embed, head = (m.cuda() for m in tiny(shape, head_dim=head_dim))
    g = torch.Generator(device="cuda").manual_seed(0)
    drafters = [StaticDFlashDrafter(model, embed, head, capture=c, compile=c and compile) for c in (False, True)]
    assert drafters[0].block_attention == ("split_kv" if head_dim == 16 else "products")
    for d in drafters:
        d.allocate(100, batch=2)
        d.append(torch.randn(2, 9, 64, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1)), torch.tensor([0, 0], device="cuda"))
    pos = torch.tensor([9, 9], device="cuda")
    for step in range(12):
        token = torch.randint(2, 64, (2,), device="cuda", generator=g)
        outs = [d.block_logits(token, pos) for d in drafters]
        torch.testing.assert_close(outs[1][0], outs[0][0], atol=1e-4 if compile else 0, rtol=1e-4 if compile else 0)
        assert torch.equal(outs[1][1], outs[0][1])
        for d in drafters:  # the greedy chain's pass (row_argmax over the head's dtype, no logits kept), captured too
            assert torch.equal(d.block_greedy(token, pos), outs[0][1])
        features = torch.randn(2, 4, 64, device="cuda", generator=g)
        for d in drafters:
            d.append(features, pos)
        pos = pos + torch.tensor([1 + step % 4, 4 - step % 4], device="cuda")


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_shorter_chain_drafts_the_whole_blocks_first_drafts(shape) -> None:
    """``draft_tokens=k``: the block's first k drafts and logits, as the whole block's (a block causal in every layer runs
    its first k + 1 slots alone; any other, the whole block), through appends of k + 1 features and accepted counts <= k;
    the loop's protocol sizes follow k."""
    model, embed, head = tiny(shape, block=6)
    g = torch.Generator().manual_seed(1)
    whole, short = StaticDFlashDrafter(model, embed, head), StaticDFlashDrafter(model, embed, head, draft_tokens=2)
    assert (short.block_size, short.verify_tokens, short.block) == (3, 3, 6)
    assert short.pass_slots == (3 if shape == "sliding causal" else 6)
    whole.reset(200)
    short.reset(200)
    features = torch.randn(1, 9, 64, generator=g)
    whole.append(features, torch.tensor([0]))
    short.append(features, torch.tensor([0]))
    pos = 9
    for acc in [2, 0, 1, 2, 2, 1, 0, 2, 2, 2, 1]:  # past the sliding rings' wrap-around (W + block slots)
        token, anchor = torch.randint(2, 64, (1,), generator=g), torch.tensor([pos])
        want, want_greedy = whole.block_logits(token, anchor)
        got, greedy = short.block_logits(token, anchor)
        assert got.shape == (1, 2, 64)
        torch.testing.assert_close(got, want[:, :2], rtol=1e-5, atol=1e-5)
        assert torch.equal(greedy, want_greedy[:, :2])
        block_features = torch.randn(1, 6, 64, generator=g)  # the verify's features; past acc: rejected tokens'
        whole.append(block_features, anchor)
        short.append(block_features[:, :3], anchor)
        pos += acc + 1


@pytest.mark.slow  # the quick tier stays under 3 minutes (README); the full suite runs it
def test_a_shorter_chain_is_lossless_and_batches_as_batch_one(reference_target_path) -> None:
    """The loop with ``draft_tokens=3`` of a block of 8: the target's own greedy tokens, at most 3 drafts accepted a step,
    and a batch of 3 rows (a draining batch, packed) equal to each prompt alone, tokens and accepted counts."""
    from transformers import AutoModelForCausalLM

    from infer.batch import generate_batch
    from models.static_target import StaticTarget

    from infer_helpers import greedy_continuations, overfit_drafter

    model = AutoModelForCausalLM.from_pretrained(reference_target_path, dtype=torch.float32).eval()
    torch.manual_seed(0)
    prompts = [torch.randint(10, 8000, (n,)).tolist() for n in (30, 17, 41)]
    # overfit on the target's replies (a random drafter accepted nothing: "batched equals alone" compared zeros)
    drafter_model = overfit_drafter(model, greedy_continuations(model, prompts, 40), layer_types=["sliding_attention", "sliding_attention"],
                                    sliding_window=16, block_size=8, mask_token_id=5, target_layer_ids=(1, 3), steps=100)
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    target = StaticTarget(model, [1, 3])
    drafter = StaticDFlashDrafter(drafter_model, embed, head, draft_tokens=3)
    alone = [generate(target, drafter, p, 30) for p in prompts]
    for p, got in zip(prompts, alone):
        assert got.tokens == generate(target, None, p, 30).tokens
        assert max(got.stats.accepted_per_step) <= 3 and got.stats.block_size == 4
    assert max(a for got in alone for a in got.stats.accepted_per_step) == 3  # whole chains of 3 accepted
    batched = generate_batch(target, drafter, prompts, 30, batch_size=3)
    for want, got in zip(alone, batched):
        assert got.tokens == want.tokens and got.stats.accepted_per_step == want.stats.accepted_per_step


def test_bad_draft_tokens_are_refused() -> None:
    model, embed, head = tiny("sliding causal", block=6)
    for bad in (0, 6):
        with pytest.raises(ValueError, match=rf"draft_tokens={bad}: a DFlash chain verifies 1 .. 5 drafts"):
            StaticDFlashDrafter(model, embed, head, draft_tokens=bad)
    with pytest.raises(ValueError, match="trees take --tree-tokens"):
        StaticDFlashDrafter(model, embed, head, draft_tokens=2, tree_topk=2, tree_tokens=4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("draft_tokens", [None, 3])
def test_triton_products_draft_what_cublas_drafts_at_the_8b_widths(draft_tokens) -> None:
    """At Qwen3-8B's widths (one layer, hidden 4096, the 152K head) the captured, compiled block pass through
    ``swa_kernels/skinny_gemm.py`` (q|k|v, gate|up, the head) gives cuBLAS's logits within bf16 rounding and its drafts."""
    from swa_kernels import skinny_gemm

    target = Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = DFlashDraftModel(make_dflash_config(target, num_hidden_layers=1, block_size=16, mask_token_id=1,
                                                    target_layer_ids=[1, 17], layer_types=["sliding_attention"],
                                                    sliding_window=64)).to(torch.bfloat16).eval()
        embed = nn.Embedding(151936, 4096).to(torch.bfloat16)
        head = nn.Linear(4096, 151936, bias=False).to(torch.bfloat16)
    drafters = [StaticDFlashDrafter(model, embed, head, draft_tokens=draft_tokens, triton_products=t) for t in (False, True)]
    triton_drafter = drafters[1]
    x16 = torch.empty(16, 4096, device="cuda", dtype=torch.bfloat16)
    assert all(skinny_gemm.tuned_config(x16, w) is not None for w in (triton_drafter.fused.layers[0].wqkv, triton_drafter.fused.layers[0].w13, head.weight))
    g = torch.Generator(device="cuda").manual_seed(0)
    features = torch.randn(1, 40, 2 * 4096, device="cuda", dtype=torch.bfloat16, generator=g)
    for d in drafters:
        d.allocate(200)
        d.append(features, torch.tensor([0], device="cuda"))
    pos = 40
    for step in range(6):
        token, anchor = torch.randint(2, 151936, (1,), device="cuda", generator=g), torch.tensor([pos], device="cuda")
        (want, want_greedy), (got, greedy) = ((t.clone() for t in d.block_logits(token, anchor)) for d in drafters)
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
        # the drafts: equal wherever cuBLAS's top logit leads its second by more than twice the largest difference
        # between the two passes' logits (there no rounding can swap them; random weights make most rows near ties)
        top2 = want.topk(2, dim=-1).values
        clear = (top2[..., 0] - top2[..., 1]) > 2 * (got - want).abs().max()
        assert torch.equal(greedy[clear], want_greedy[clear])
        assert torch.equal(greedy, drafters[1].model.draft_to_target(got.argmax(dim=-1)))  # the pass's own logits' argmax
        block_features = torch.randn(1, drafters[0].verify_tokens, 2 * 4096, device="cuda", dtype=torch.bfloat16, generator=g)
        for d in drafters:
            d.append(block_features, anchor)
        pos += 1 + step % 3




class GraphSemantics:
    """``CapturedStep`` with a CUDA graph's semantics on the CPU: inputs copied into its own buffers but for the borrowed
    ones (read in place), the step run at each call, its outputs written into the same buffers every call (a graph's
    outputs are its own: a caller borrowing them borrows fixed addresses, valid until the graph is dropped)."""

    def __init__(self, fn, *inputs, pool, borrowed=()):
        self.fn, self.copied = fn, [i for i in range(len(inputs)) if i not in borrowed]
        self.inputs = [t if i in borrowed else t.clone() for i, t in enumerate(inputs)]
        self.out = None

    def __call__(self, *inputs):
        for i in self.copied:
            self.inputs[i].copy_(inputs[i])
        result = self.fn(*self.inputs)
        if self.out is None:
            self.out = torch.utils._pytree.tree_map(lambda t: None if t is None else t.clone(), result)
        else:
            for dst, src in zip(torch.utils._pytree.tree_leaves(self.out), torch.utils._pytree.tree_leaves(result)):
                if dst is not None:  # an output that is None (a greedy chain's probabilities) stays None
                    dst.copy_(src)
        return self.out


@pytest.mark.slow  # the quick tier stays under 3 minutes (README); the full suite runs it
def test_the_chained_loop_outlives_a_target_that_grows_its_caches(reference_target_path, monkeypatch) -> None:
    """The captured chained loop (the drafter's step borrowing the target's verify outputs) over prompts whose lengths
    make the target alone allocate new caches, so its verify graph and outputs are new each time while the drafter's
    caches stay: the drafter's graphs over the stale outputs are dropped as they age, not counted against it until the
    9th generation failed; every generation is the target's own greedy output."""
    from transformers import AutoModelForCausalLM

    import models.static_target as static_target
    from models.static_target import StaticTarget

    monkeypatch.setattr(static_target, "CapturedStep", GraphSemantics)
    pools = iter(range(1000))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: next(pools))
    model = AutoModelForCausalLM.from_pretrained(reference_target_path, dtype=torch.float32).eval()
    config = make_dflash_config(model.config, num_hidden_layers=1, block_size=4, mask_token_id=5, target_layer_ids=[1],
                                layer_types=["sliding_attention"], sliding_window=6)
    torch.manual_seed(0)
    drafter = StaticDFlashDrafter(DFlashDraftModel(config).eval(), model.get_input_embeddings(), model.get_output_embeddings(),
                                  capture=True, compile=False)
    target, alone = StaticTarget(model, [1]), StaticTarget(model, [1])
    target.capture = True
    grown = 0
    for n in [2100, 200, 460, 720, 980, 1240, 1500, 1760, 2000]:  # the drafter keeps its caches after the first
        prompt = torch.randint(10, 8000, (n,)).tolist()
        before = target.capacity
        assert generate(target, drafter, prompt, 6, run_ahead=True).tokens == generate(alone, None, prompt, 6).tokens
        grown += target.capacity != before
        assert sum(k[0] == "append_and_draft" for k in drafter.graphs.graphs) <= drafter.graphs.max_borrowed_variants
    assert grown == 9


def test_a_chained_generation_drafts_no_block_after_its_last_step(reference_target_path, monkeypatch) -> None:
    """The chained loop ends by its budget: its last step appends the verified block (the next turn reuses the context)
    but drafts no next block (one block pass a generation wasted before); the output is the target's own."""
    from models.static_target import StaticTarget

    model, target, drafter = two_layer_static_dflash(reference_target_path)
    prompt = torch.randint(10, 8000, (20,)).tolist()
    steps, appends = [], []
    monkeypatch.setattr(drafter, "append_and_draft", lambda *a, f=drafter.append_and_draft: steps.append(1) or f(*a))
    monkeypatch.setattr(drafter, "append", lambda *a, f=drafter.append, **k: appends.append(a[0].shape) or f(*a, **k))
    run = generate(target, drafter, prompt, 12, run_ahead=True)
    assert run.tokens == generate(StaticTarget(model, [1, 3]), None, prompt, 12).tokens
    assert len(steps) == run.stats.steps - 1  # every step's drafting but the last's
    assert appends[-1] == (1, drafter.block_size, drafter.model.fc.in_features)  # the last step's append, alone
