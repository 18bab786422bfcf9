"""DFlash's block attention kernel (``swa_kernels/block_attention.py``) against a softmax written out key by key under the
repo's one visibility rule (``swa_kernels.attention.aligned_visible``: W keys including the query), and the static DFlash
drafter with it against the eager ``DFlashDrafter`` (``tests/test_static_drafters.py``'s protocol).

On the CPU the kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``, set before Triton compiles anything, so in
a child process), fp32 only: the interpreter multiplies bf16 tiles as raw bits. bf16 and the captured, compiled drafter
are checked on a GPU."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from swa_kernels.attention import aligned_visible
from triton_interpreter import run_interpreted

ROOT = Path(__file__).resolve().parents[1]
HAS_TRITON = subprocess.run([sys.executable, "-c", "import triton"], capture_output=True).returncode == 0


def reference(q, k, v, slot_pos, anchor, scale, causal, window):
    """q [B, n, Hq, D], k/v [B, Hkv, S + b, D], slot_pos [B, S], anchor [B] -> [B, n, Hq, D] in fp64, one softmax per
    (row, slot, head) over the keys it sees: context slots holding a position in [0, anchor), then the block's slots
    S .. S+n-1 at positions anchor .. anchor+n-1, each kept if ``aligned_visible`` says so."""
    bsz, n, hq, d = q.shape
    hkv, context = k.shape[1], slot_pos.shape[1]
    groups = hq // hkv
    out = torch.zeros(bsz, n, hq, d, dtype=torch.float64)
    for b in range(bsz):
        a = int(anchor[b])
        held = [(c, int(slot_pos[b, c])) for c in range(context) if 0 <= int(slot_pos[b, c]) < a]
        block = [(context + j, a + j) for j in range(n)]
        for t in range(n):
            keys = [c for c, p in held + block if aligned_visible(torch.tensor(a + t), torch.tensor(p), causal, window)]
            for head in range(hq):
                kv = head // groups
                w = torch.softmax(torch.stack([scale * (q[b, t, head].double() @ k[b, kv, c].double()) for c in keys]), 0)
                out[b, t, head] = sum(wc * v[b, kv, c].double() for wc, c in zip(w, keys))
    return out


def ring_positions(slots: int, newest: int, rejected: int = 0) -> torch.Tensor:
    """A ring of ``slots`` slots after writing positions 0 .. newest + rejected (position p in slot p mod slots): the
    last ``rejected`` are positions at or past the anchor ``newest + 1`` (rejected drafts not yet written over)."""
    held = torch.full((slots,), -1, dtype=torch.long)
    for p in range(newest + 1 + rejected):
        held[p % slots] = p
    return held


CASES = [  # (KV heads, group G, block slots n, context slots S, head dim D, causal, window, newest positions, rejected)
    (2, 2, 4, 40, 16, True, 5, [20, 3], [2, 0]),  # the recipes' sliding rule; a ring that wrapped, one mostly empty
    (1, 4, 5, 200, 32, True, None, [0, 150], [3, 1]),  # a full layer (no window), one row whose context is one position
    (2, 1, 6, 70, 16, False, 3, [65, 140], [4, 0]),  # z-lab's symmetric band: a window narrower than the block
    (1, 2, 3, 90, 16, False, None, [10, 300], [0, 5]),  # non-causal full; a ring past several wraps
    (2, 4, 16, 150, 16, True, 100, [400, 40], [15, 15]),  # 64 query rows: longer splits; a full block of rejected slots
]


def run_cases(device: str, dtype: torch.dtype) -> list[float]:
    from swa_kernels.block_attention import block_attention

    errors = []
    for hkv, g, n, context, d, causal, window, newest, rejected in CASES:
        gen = torch.Generator().manual_seed(context + n)
        bsz = len(newest)
        q = torch.randn(bsz, n, hkv * g, d, generator=gen).to(dtype)
        k, v = (torch.randn(bsz, hkv, context + n + 2, d, generator=gen).to(dtype) for _ in range(2))  # 2 unused slots past
        slot_pos = torch.stack([ring_positions(context, p, r) for p, r in zip(newest, rejected)])
        anchor = torch.tensor(newest) + 1
        want = reference(q, k, v, slot_pos, anchor, d ** -0.5, causal, window)
        got = block_attention(q.to(device), k.to(device), v.to(device), slot_pos.to(device), anchor.to(device), d ** -0.5, causal, window)
        errors.append((got.cpu().double() - want).abs().max().item())
        # q as the transposed view the drafter may hand over (strides, not a copy)
        q_view = q.transpose(1, 2).contiguous().transpose(1, 2)
        got = block_attention(q_view.to(device), k.to(device), v.to(device), slot_pos.to(device), anchor.to(device), d ** -0.5,
                              causal, window)
        errors.append((got.cpu().double() - want).abs().max().item())
    return errors


def norm_rope(x, weight, eps, cos, sin):
    """Qwen3's per-head RMSNorm then RoPE (rotate_half) in fp64: x [..., D], cos/sin [..., D] broadcastable."""
    x = x.double()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()
    half = x.shape[-1] // 2
    return x * cos.double() + torch.cat([-x[..., half:], x[..., :half]], -1) * sin.double()


def run_raw_cases(device: str, dtype: torch.dtype) -> list[float]:
    """The block's keys and values apart and q/k raw (``k_new``, ``v_new``, ``rope``: the drafter's call): the norms and
    RoPE at anchor + t in the kernel, the cache's scratch slots holding NaN (neither read nor needed) against the
    written-out softmax over q and the block's keys normed and rotated in fp64 and placed in the scratch."""
    from swa_kernels.block_attention import _launch, block_attention
    from swa_kernels.decode_attention import Rope

    errors = []
    for hkv, g, n, context, d, causal, window, newest, rejected in CASES:
        gen = torch.Generator().manual_seed(context + n + 1)
        bsz = len(newest)
        q = torch.randn(bsz, n, hkv * g, d, generator=gen)
        k, v = (torch.randn(bsz, hkv, context + n + 2, d, generator=gen) for _ in range(2))
        k_new, v_new = (torch.randn(bsz, n, hkv, d, generator=gen) for _ in range(2))
        q_w, k_w = (1 + 0.3 * torch.randn(d, generator=gen) for _ in range(2))
        angles = torch.arange(1024)[:, None] * (10000.0 ** (-torch.arange(d // 2) / (d // 2)))[None, :]
        cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)  # [1024, D]
        slot_pos = torch.stack([ring_positions(context, p, r) for p, r in zip(newest, rejected)])
        anchor = torch.tensor(newest) + 1
        at = anchor[:, None] + torch.arange(n)  # [B, n]
        q_ref = norm_rope(q, q_w, 1e-6, cos[at][:, :, None], sin[at][:, :, None])
        k_ref, v_ref = k.double(), v.double()
        k_ref[:, :, context:context + n] = norm_rope(k_new, k_w, 1e-6, cos[at][:, :, None], sin[at][:, :, None]).transpose(1, 2)
        v_ref[:, :, context:context + n] = v_new.double().transpose(1, 2)
        want = reference(q_ref, k_ref, v_ref, slot_pos, anchor, d ** -0.5, causal, window)
        k[:, :, context:], v[:, :, context:] = float("nan"), float("nan")
        rope = Rope(cos.to(device, dtype), sin.to(device, dtype), q_w.to(device, dtype), k_w.to(device, dtype), 1e-6)
        got = block_attention(q.to(device, dtype), k.to(device, dtype), v.to(device, dtype), slot_pos.to(device), anchor.to(device),
                              d ** -0.5, causal, window, k_new=k_new.to(device, dtype), v_new=v_new.to(device, dtype), rope=rope)
        errors.append((got.cpu().double() - want).abs().max().item())
        # the layout before: the block's keys in the split holding the last context slots, not a split of their own
        got = _launch(q.to(device, dtype), k.to(device, dtype), v.to(device, dtype), slot_pos.to(device), anchor.to(device),
                      d ** -0.5, causal, window, None, k_new=k_new.to(device, dtype), v_new=v_new.to(device, dtype), rope=rope,
                      new_keys_apart=False)
        errors.append((got.cpu().double() - want).abs().max().item())
    return errors


def drafter_differences() -> list[float]:
    """``test_static_drafters``' protocol (every shape and window override) with the static drafter's block attention
    through the kernel: the largest draft-logit difference from the eager drafter. Each distinct list of layer rules
    runs once (10 of the 12 shape x window pairs: an all-full drafter is the same under every override; the interpreter
    runs ~0.35 s a block pass), over 7 verify steps: a 9-token prompt and 19 positions after it, several times round every ring
    (W + 4 block slots: 6, 7 and 9 slots)."""
    import test_static_drafters as sd
    from models.dflash import StaticDFlashDrafter, layer_attention

    worst, seen = [], set()
    real = StaticDFlashDrafter.__init__
    StaticDFlashDrafter.__init__ = lambda self, *a, **kw: real(self, *a, **{**kw, "block_attention": "split_kv"})
    try:
        for shape in sorted(sd.SHAPES):
            for window in ("trained", None, 2):
                model, embed, head = sd.tiny(shape, head_dim=16)  # tl.dot's K >= 16 (the kernel's GPU rule, kept here)
                rules = tuple(layer_attention(model, window))
                if rules in seen:
                    continue
                seen.add(rules)
                diffs = [(got - want).abs().max().item() for want, got, _ in sd.run_both(model, embed, head, window, [0, 3, 1, 2, 0, 3, 3])]
                worst.append(max(diffs))
    finally:
        StaticDFlashDrafter.__init__ = real
    assert len(worst) == 10, len(worst)  # the distinct rule lists the shapes give (a change to test_static_drafters shows here)
    return worst


CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    sys.path.insert(0, {tests!r})
    import torch
    from test_block_attention import run_cases, run_raw_cases, drafter_differences
    print(max(run_cases("cpu", torch.float32)), max(run_raw_cases("cpu", torch.float32)), max(drafter_differences()))
""")


@pytest.mark.slow  # ~55 s on one core: the interpreter runs every program of the grid in Python
@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed (CPU torch wheels come without it; [dev] installs it)")
def test_block_attention_equals_a_softmax_written_out_in_the_interpreter() -> None:
    child = CHILD.format(root=str(ROOT), tests=str(ROOT / "tests"))
    proc = run_interpreted(child, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kernel_error, raw_error, drafter_error = map(float, proc.stdout.split()[-3:])
    assert kernel_error < 1e-5
    assert raw_error < 1e-4  # the norms and RoPE in fp32 in the kernel against fp64
    assert drafter_error < 1e-5  # the static drafter's logits with the kernel against the eager drafter's


STAGED_CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    sys.path.insert(0, {tests!r})
    import torch
    import test_static_drafters as sd
    from models.dflash import StaticDFlashDrafter

    model, embed, head = sd.tiny("sliding causal", block=8, head_dim=16)
    drafter = StaticDFlashDrafter(model, embed, head, block_attention="split_kv")
    assert drafter.drafts_in_stages and drafter.block_attention == "split_kv"
    drafter.allocate(64, 3)
    g = torch.Generator().manual_seed(0)
    for start in range(0, 24, 8):
        drafter.append(0.5 * torch.randn(3, 8, 64, generator=g), torch.full((3,), start))
    token, anchor = torch.tensor([11, 12, 13]), torch.tensor([24, 21, 17])
    logits, greedy = (t.clone() for t in drafter.block_logits(token, anchor))
    first, rows = 3, torch.tensor([0, 2])
    assert torch.equal(drafter.first_drafts(token, anchor, first), greedy[:, :first])
    rest = drafter._rest_of_block(anchor[rows], rows, first)
    print((rest - logits[rows, first:]).abs().max().item())
""")


@pytest.mark.slow  # ~10 s: the interpreter
@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed (CPU torch wheels come without it; [dev] installs it)")
def test_drafting_in_stages_with_the_kernel_leaves_the_blocks_keys_for_the_rest() -> None:
    """A staged verify drafts a block's first slots (``first_drafts``), then the rest for the rows that matched
    (``_rest_of_block``), which reads the first slots' keys from each row's scratch. The kernel takes the block's keys
    raw and writes them nowhere, so the first stage runs the products (``keep_keys``): the rest's logits are the one
    pass's (under the kernel before, the rest read stale scratch: 2.2 off). Both passes run under the interpreter."""
    proc = run_interpreted(STAGED_CHILD.format(root=str(ROOT), tests=str(ROOT / "tests")), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert float(proc.stdout.split()[-1]) < 1e-4


def test_block_attention_choice_is_checked() -> None:
    from models.dflash import choose_block_attention

    with pytest.raises(ValueError, match="block_attention='flash'"):
        choose_block_attention("flash", torch.device("cpu"), 128)
    with pytest.raises(ValueError, match="power-of-two head_dim"):
        choose_block_attention("split_kv", torch.device("cpu"), 80)
    with pytest.raises(ValueError, match="at least 16"):
        choose_block_attention("split_kv", torch.device("cpu"), 8)
    assert choose_block_attention(None, torch.device("cpu"), 128) == "products"  # the CPU keeps the products
    assert choose_block_attention("products", torch.device("cuda"), 128) == "products"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_attention_on_the_gpu(dtype) -> None:
    assert max(run_cases("cuda", dtype)) < (1e-4 if dtype == torch.float32 else 2e-2)
    assert max(run_raw_cases("cuda", dtype)) < (1e-4 if dtype == torch.float32 else 5e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("draft_tokens", [None, 3])
def test_captured_kernel_drafter_equals_the_products_at_the_8b_widths(draft_tokens) -> None:
    """Qwen3-8B's drafter widths (32 query heads, 8 KV heads, head_dim 128; two layers: sliding W=2048 causal and full),
    bf16, captured and compiled: the kernel's block logits against the two products' over a ring that wrapped."""
    from transformers import Qwen3Config

    from models.dflash import DFlashDraftModel, StaticDFlashDrafter, make_dflash_config

    torch.manual_seed(0)
    target = Qwen3Config(vocab_size=4096, hidden_size=4096, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128)
    model = DFlashDraftModel(make_dflash_config(target, num_hidden_layers=2, block_size=16, mask_token_id=1, target_layer_ids=[0, 2],
                                                layer_types=["sliding_attention", "full_attention"], sliding_window=2048,
                                                sliding_block_causal=True)).cuda().to(torch.bfloat16).eval()
    embed = torch.nn.Embedding(4096, 4096).cuda().to(torch.bfloat16)
    head = torch.nn.Linear(4096, 4096, bias=False).cuda().to(torch.bfloat16)
    drafters = [StaticDFlashDrafter(model, embed, head, block_attention=a, draft_tokens=draft_tokens) for a in ("products", "split_kv")]
    gen = torch.Generator(device="cuda").manual_seed(1)
    prompt = torch.randn(1, 2500, 2 * 4096, device="cuda", generator=gen, dtype=torch.bfloat16)  # past the ring's 2064 slots
    for d in drafters:
        d.allocate(2600 + 16 * 12, batch=1)
        d.append(prompt, torch.tensor([0], device="cuda"))
    pos = torch.tensor([2500], device="cuda")
    for step in range(6):
        token = torch.randint(2, 4096, (1,), device="cuda", generator=gen)
        (want, want_ids), (got, got_ids) = (d.block_logits(token, pos) for d in drafters)
        torch.testing.assert_close(got, want, atol=5e-2, rtol=5e-2)
        # a draft may differ only at a near-tie of the products' logits (bf16 sums in another order; random weights give
        # flat logits): the kernel's pick scores within the tolerance of the products' best
        picked = want[0].gather(-1, got_ids[0][:, None])[:, 0]  # no draft vocabulary here: ids index the logits
        assert ((got_ids == want_ids)[0] | (picked >= want[0].max(-1).values - 0.1)).all()
        features = torch.randn(1, drafters[0].block_size, 2 * 4096, device="cuda", generator=gen, dtype=torch.bfloat16)
        for d in drafters:
            d.append(features, pos)
        pos = pos + 1 + step % 4
