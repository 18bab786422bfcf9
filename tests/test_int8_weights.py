"""Weight-only int8 drafter matrices (``swa_kernels/int8_weights.py``; ``weights="int8"`` of the DFlash and EAGLE-3 drafters):
the codes and scales against a row-by-row reference, the products against the dequantized matrix's, each drafter against
its model with every matrix replaced by its dequantized copy, the loop still the target's own greedy output; the Triton
kernel under its interpreter (CPU) and compiled (GPU), the captured drafters on CUDA."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from infer.generate import generate
from swa_kernels.int8_weights import Int8Weight, config_for, dequantized, int8_linear, int8_weight, quantize_rows
from infer_helpers import random_dflash_on_reference
from models.dflash import DFlashDrafter, StaticDFlashDrafter
from test_static_drafters import tiny
from models.static_target import prepacked_copy
from triton_interpreter import run_interpreted

pytestmark = pytest.mark.usefixtures("single_cpu_thread")


def test_codes_and_scales_row_by_row() -> None:
    torch.manual_seed(0)
    w = torch.randn(6, 9)
    w[2] = 0.0  # an all-zero row
    w[3, 4] = 50.0  # one large value: the rest of the row rounds to few codes
    w[4] = -w[4].abs()  # every value negative: its largest magnitude codes to -127
    q, scale = quantize_rows(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32
    for i in range(w.shape[0]):
        row = w[i].numpy().astype(np.float32)
        s = np.float32(np.abs(row).max()) / np.float32(127) if np.abs(row).max() > 0 else np.float32(np.finfo(np.float32).tiny)
        assert scale[i].item() == s
        for j in range(w.shape[1]):
            code = int(np.clip(np.round(row[j] / s), -127, 127))  # numpy rounds half to even, as torch
            assert q[i, j].item() == code, (i, j)
    assert q[4].min().item() == -127 and q[2].abs().max().item() == 0
    # the codes stand for the matrix within half a step of each row's scale
    assert ((dequantized(Int8Weight(q, scale, None)) - w).abs() <= scale[:, None] / 2 + 1e-7).all()


def test_bad_matrices_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"quantize_rows: a floating-point matrix \[N, K\] expected, got torch.int64 \(3,\)"):
        quantize_rows(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="weights='fp8'; expected one of model, int8"):
        StaticDFlashDrafter(*tiny_drafter()[:3], weights="fp8")


@pytest.mark.parametrize("pack", ["plain", "prepacked"])
def test_cpu_products_equal_the_dequantized_matrix_products(pack) -> None:
    torch.manual_seed(1)
    w, bias = torch.randn(1536, 512), torch.randn(1536)  # large enough to be prepacked
    weight = int8_weight(w, prepacked_copy if pack == "prepacked" else (lambda m: m))
    assert weight.dense is not None  # the CPU: no kernel
    from models.static_target import prepacked_linear

    for rows in (1, 5, 16, 40):
        x = torch.randn(2, rows, 512)
        got = int8_linear(x, weight, bias, prepacked_linear if pack == "prepacked" else torch.nn.functional.linear)
        torch.testing.assert_close(got, torch.nn.functional.linear(x, dequantized(weight), bias), rtol=1e-5, atol=1e-4)


def tiny_drafter():
    return tiny("sliding+full")  # test_static_drafters' tiny drafter: a sliding layer (window 5) and a full one, block 4


def dequantized_copy(model: nn.Module, head: nn.Linear) -> tuple[nn.Module, nn.Linear]:
    """The reference: every linear of the drafter (and the head it decodes with) replaced by its int8 codes times their
    scales, in the model's dtype; nothing else touched."""
    model, head = copy.deepcopy(model), copy.deepcopy(head)
    for module in list(model.modules()) + [head]:
        if isinstance(module, nn.Linear):
            q, scale = quantize_rows(module.weight.data)
            module.weight.data = (q.float() * scale[:, None]).to(module.weight.dtype)
    return model, head


def test_static_int8_drafts_equal_the_eager_drafter_over_dequantized_weights() -> None:
    model, embed, head = tiny_drafter()
    ref_model, ref_head = dequantized_copy(model, head)
    eager = DFlashDrafter(ref_model, embed, ref_head)
    static = StaticDFlashDrafter(model, embed, head, weights="int8")
    assert isinstance(static.fused.head, Int8Weight) and isinstance(static.fused.layers[1].w2, Int8Weight)
    plain = StaticDFlashDrafter(model, embed, head)  # the same drafter without int8: different logits (the test can fail)
    g = torch.Generator().manual_seed(0)
    for d in (eager, static, plain):
        d.reset(200)
    features = torch.randn(9, 64, generator=g)
    for d in (eager, static, plain):
        d.append_context(features, 0)
    pos, moved = 9, 0.0
    for acc in [0, 3, 1, 2, 0, 3, 3, 1] * 2:  # past the sliding ring's wrap-around
        token = torch.randint(2, 64, (), generator=g)
        want = eager.draft_logits(token, pos)
        got, greedy = static.block_logits(token.reshape(1), torch.tensor([pos]))
        torch.testing.assert_close(got[0], want, rtol=1e-5, atol=1e-5)
        assert torch.equal(greedy[0], want.argmax(-1))
        moved = max(moved, (plain.block_logits(token.reshape(1), torch.tensor([pos]))[0][0] - want).abs().max().item())
        block_features = torch.randn(4, 64, generator=g)
        eager.append_context(block_features[:acc + 1], pos)
        static.append_context(block_features, pos)
        plain.append_context(block_features, pos)
        pos += acc + 1
    assert moved > 1e-3  # int8 rounding moves the logits: the comparison above is not the plain drafter's by accident
    assert static.with_window(None).fused is static.fused  # another window shares the int8 copies


@pytest.mark.slow  # ~6 s on one core; the quick tier keeps EAGLE-3's int8 loop
def test_the_loop_with_int8_drafter_weights_stays_the_targets_greedy_output(reference_target_path) -> None:
    _, target, drafter_model, embed, head, prompt = random_dflash_on_reference(reference_target_path)
    ref_model, ref_head = dequantized_copy(drafter_model, head)
    alone = generate(target, None, prompt, 40).tokens
    got = generate(target, StaticDFlashDrafter(drafter_model, embed, head, weights="int8"), prompt, 40)
    want = generate(target, DFlashDrafter(ref_model, embed, ref_head), prompt, 40)
    assert got.tokens == alone and got.stats.accepted_per_step == want.stats.accepted_per_step
    forced = [generate(target, d, prompt, 40, accept_per_step=2).tokens  # the drafts themselves, two per step
              for d in (DFlashDrafter(ref_model, embed, ref_head), StaticDFlashDrafter(drafter_model, embed, head, weights="int8"))]
    assert forced[0] == forced[1]
    # the target's own head is not quantized: the int8 copy is the drafter's
    assert head.weight.dtype == torch.float32 and not torch.equal(head.weight, ref_head.weight)


def test_kernel_tiling_fills_the_gpu_and_divides_k() -> None:
    for m, n, k in [(16, 4096, 12288), (15, 151936, 4096), (16, 6144, 4096), (120, 4096, 20480), (1, 10240, 4096), (3, 64, 48)]:
        config, block_m = config_for(m, n, k)
        assert k % (config.splits * config.block_k) == 0  # the kernel's K loop covers K exactly
        assert block_m in (16, 32, 64, 128) and block_m >= min(m, 64)  # one row block up to 64 rows, blocks of 128 beyond
        assert (block_m, config.block_n, config.num_warps) == ((block_m, 64, 4) if m <= 64 else (128, 128, 8))
        programs = -(-n // config.block_n) * -(-m // block_m) * config.splits
        assert programs >= 264 or config.splits == 8 or k % (2 * config.splits * config.block_k), (m, n, k, config)


INTERPRETED = """
import torch
from swa_kernels import skinny_gemm as sg
from swa_kernels.int8_weights import config_for, quantize_rows
torch.manual_seed(0)
for m, n, k in [(1, 96, 256), (16, 200, 512), (17, 64, 128), (70, 130, 256), (300, 260, 256)]:
    w = torch.randn(n, k)
    q, scale = quantize_rows(w)
    x = torch.randn(m, k).to(torch.float16)
    config, block_m = config_for(m, n, k)
    for splits in sorted({1, config.splits}):
        c = sg.Config(block_n=config.block_n, block_k=config.block_k, splits=splits)
        y = sg._products(x, q, c, scale, block_m)
        assert y.dtype == torch.float16 and y.shape == (m, n)
        want = x.float() @ (q.float() * scale[:, None]).T
        torch.testing.assert_close(y.float(), want, rtol=1e-2, atol=2e-2)
print("ok")
"""


@pytest.mark.slow  # the Triton interpreter
def test_int8_kernel_equals_the_dequantized_product_under_the_interpreter() -> None:
    pytest.importorskip("triton")
    out = run_interpreted(INTERPRETED)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_int8_kernel_on_the_gpu_at_the_8b_widths() -> None:
    torch.manual_seed(0)
    for m, (n, k) in [(16, (6144, 4096)), (1, (4096, 12288)), (15, (151936, 4096)), (16, (4096, 20480)), (120, (10240, 4096))]:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        weight = int8_weight(w)
        assert weight.dense is None  # the kernel runs every product
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        want = x.float() @ dequantized(weight).T
        got = int8_linear(x, weight)
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_captured_int8_drafter_on_cuda_drafts_what_the_dequantized_eager_one_drafts() -> None:
    model, embed, head = tiny_drafter()
    model, embed, head = model.cuda().to(torch.bfloat16), embed.cuda().to(torch.bfloat16), head.cuda().to(torch.bfloat16)
    ref_model, ref_head = dequantized_copy(model, head)
    # K = 32 and 48: multiples of 16, so every product runs the kernel
    static = StaticDFlashDrafter(model, embed, head, weights="int8")
    assert static.capture and static.fused.layers[0].wqkv.dense is None
    eager = StaticDFlashDrafter(ref_model, embed, ref_head, capture=False, compile=False, triton_products=False)
    g = torch.Generator(device="cuda").manual_seed(0)
    features = torch.randn(1, 20, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    for d in (static, eager):
        d.allocate(100)
        d.append(features, torch.tensor([0], device="cuda"))
    pos = 20
    for step in range(5):
        token, anchor = torch.randint(2, 64, (1,), device="cuda", generator=g), torch.tensor([pos], device="cuda")
        (got, greedy), (want, _) = ((t.clone() for t in d.block_logits(token, anchor)) for d in (static, eager))
        torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2 * want.abs().max().item())
        top2 = want.topk(2, dim=-1).values
        clear = (top2[..., 0] - top2[..., 1]) > 2 * (got - want).abs().max()
        assert torch.equal(greedy[clear], want.argmax(-1)[clear])
        block = torch.randn(1, 4, 64, device="cuda", dtype=torch.bfloat16, generator=g)
        for d in (static, eager):
            d.append(block, anchor)
        pos += 1 + step % 3


def test_int8_linears_replaces_every_linear_and_shares_the_rest() -> None:
    from swa_kernels.int8_weights import Int8Linear, int8_linears

    model, embed, head = tiny_drafter()
    model.embed = embed  # a module that is not a linear: shared, not copied
    quantized = int8_linears(model)
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert linears and all(isinstance(quantized.get_submodule(n), Int8Linear) for n in linears)
    assert not any(isinstance(m, nn.Linear) for m in quantized.modules())
    assert all(isinstance(model.get_submodule(n), nn.Linear) for n in linears)  # the original left as it is
    assert quantized.embed.weight is model.embed.weight and quantized.norm.weight is model.norm.weight
    assert int8_linears(quantized) is quantized  # nothing left to quantize
    x = torch.randn(3, 64)
    fc = quantized.get_submodule("fc")
    torch.testing.assert_close(fc(x), torch.nn.functional.linear(x, dequantized(fc.int8), model.fc.bias), rtol=1e-5, atol=1e-5)


def test_eagle3_with_int8_weights_computes_its_dequantized_copy_and_stays_lossless(reference_target_path) -> None:
    """EAGLE-3 with ``weights="int8"``: the drafter's model is its copy with int8 linears, whose features projection,
    layer and draft logits equal those of a copy holding the dequantized int8 values (the drafters run nothing else
    through the weights); in the loop (static chains, eager trees) the output is the target's own greedy output."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from swa_kernels.int8_weights import Int8Linear
    from models.eagle3 import Eagle3Drafter, Eagle3DraftModel, StaticEagle3Drafter, make_eagle3_config
    from models.static_target import StaticTarget

    torch.manual_seed(0)
    config = make_eagle3_config(AutoConfig.from_pretrained(reference_target_path), num_hidden_layers=1, target_layer_ids=[1, 3, 4],
                                layer_types=["sliding_attention"], sliding_window=8, draft_vocab_size=1024, ttt_length=3)
    drafter_model = Eagle3DraftModel(config).eval()
    ref_model, _ = dequantized_copy(drafter_model, nn.Linear(1, 1))
    static = StaticEagle3Drafter(drafter_model, weights="int8")
    quantized = static.model
    assert isinstance(quantized.fc, Int8Linear) and isinstance(quantized.lm_head, Int8Linear) and drafter_model.fc.weight is not None
    features = torch.randn(2, 5, 3 * 512)
    h = quantized.project_features(features)
    torch.testing.assert_close(h, ref_model.project_features(features), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(quantized.logits(h), ref_model.logits(h), rtol=1e-5, atol=1e-4)
    x = torch.randn(2, 5, 2 * 512)
    for name in ("q_proj", "k_proj", "v_proj"):
        got = getattr(quantized.layers[0].self_attn, name)(x)
        torch.testing.assert_close(got, getattr(ref_model.layers[0].self_attn, name)(x), rtol=1e-5, atol=1e-5)
    model = AutoModelForCausalLM.from_pretrained(reference_target_path, dtype=torch.float32).eval()
    target = StaticTarget(model, [1, 3, 4])
    prompt = torch.randint(10, 8000, (30,)).tolist()
    alone = generate(target, None, prompt, 24).tokens
    for drafter in (static, Eagle3Drafter(drafter_model, tree_topk=2, tree_tokens=5, weights="int8")):
        assert generate(target, drafter, prompt, 24).tokens == alone


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_captured_int8_eagle3_on_cuda_drafts_what_the_dequantized_uncaptured_one_drafts() -> None:
    from models.eagle3 import StaticEagle3Drafter
    from models.sampling import SamplingConfig
    from test_static_eagle3 import VOCAB, tiny

    model = tiny("sliding").cuda().to(torch.bfloat16)
    ref_model, _ = dequantized_copy(model, nn.Linear(1, 1))
    g = torch.Generator(device="cuda").manual_seed(0)
    drafters = [StaticEagle3Drafter(model, weights="int8"), StaticEagle3Drafter(ref_model, capture=False, compile=False)]
    assert drafters[0].capture and drafters[0].model.fc.int8.dense is None  # K = 32 / 96: the kernel runs
    features = torch.randn(2, 9, model.fc.in_features, device="cuda", dtype=torch.bfloat16, generator=g)
    ids = torch.randint(0, VOCAB, (2, 9), device="cuda", generator=g)
    for d in drafters:
        d.allocate(100, batch=2)
        for row in range(2):
            d.prefill(features[row], 0, ids[row], row=row)
    pos = torch.tensor([9, 9], device="cuda")
    for step in range(8):
        token = torch.randint(0, VOCAB, (2,), device="cuda", generator=g)
        (got_ids, got, *_), (want_ids, want, *_) = (
            [t.clone() if torch.is_tensor(t) else t for t in d.draft_chain(token, pos, SamplingConfig(), None)] for d in drafters)
        # the first draft's logits (the context alone decides them; a near tie flipped by rounding would change the
        # later drafts' inputs, so those are not compared)
        torch.testing.assert_close(got[:, 0], want[:, 0], rtol=3e-2, atol=3e-2 * want[:, 0].abs().max().item())
        block_ids = torch.cat([token[:, None], want_ids], dim=1)
        more = torch.randn(2, 4, model.fc.in_features, device="cuda", dtype=torch.bfloat16, generator=g)
        for d in drafters:
            d.append(more, pos, block_ids)
        pos = pos + torch.tensor([1 + step % 4, 4 - step % 4], device="cuda")
