"""GPU paths (skipped without CUDA): flex_attention block masks == dense SDPA masks, and a
training step on the flex backend equals the SDPA one."""

from __future__ import annotations

import pytest
import torch

from swa_kernels.attention import attention
from models.dflash import LayerMaskSpec, dense_mask, flex_block_mask, flex_packed_block_mask

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def dflash_case(requires_grad: bool = False):
    """2 sequences of 3000 context tokens (the second padded after 2950), 40 random anchors, blocks
    of 16; 8 query / 2 KV heads of 64, bf16. Returns anchors, ctx_valid, q, k, v."""
    torch.manual_seed(0)
    device = "cuda"
    bsz, ctx_len, block, n = 2, 3000, 16, 40
    anchors = torch.sort(torch.randint(1, 2900, (bsz, n), device=device)).values
    ctx_valid = torch.arange(ctx_len, device=device)[None] < torch.tensor([[3000], [2950]], device=device)
    q = torch.randn(bsz, 8, n * block, 64, device=device, dtype=torch.bfloat16, requires_grad=requires_grad)
    k = torch.randn(bsz, 2, ctx_len + n * block, 64, device=device, dtype=torch.bfloat16, requires_grad=requires_grad)
    v = torch.randn_like(k, requires_grad=requires_grad)
    return anchors, ctx_valid, q, k, v


@pytest.mark.parametrize("spec", [LayerMaskSpec(2048, True), LayerMaskSpec(100, False), LayerMaskSpec(1, True), LayerMaskSpec(None, False)])
def test_flex_attention_equals_dense_sdpa(spec: LayerMaskSpec) -> None:
    block = 16
    anchors, ctx_valid, q, k, v = dflash_case()
    flex = attention(q, k, v, flex_block_mask(anchors, ctx_valid, block, spec))
    dense = attention(q.float(), k.float(), v.float(), dense_mask(anchors, ctx_valid, block, spec))
    torch.testing.assert_close(flex.float(), dense, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("spec", [LayerMaskSpec(2048, True), LayerMaskSpec(100, False), LayerMaskSpec(None, False)])
def test_packed_flex_equals_dense_sdpa_with_gradients(spec: LayerMaskSpec) -> None:
    """Queries packed by KV group (4 heads x 16 slots = 64 rows per block) through the compiled kernel, forward and backward."""
    block = 16
    anchors, ctx_valid, q, k, v = dflash_case(requires_grad=True)
    dout = torch.randn_like(q)
    results = []
    for mask, dtype in ((flex_packed_block_mask(anchors, ctx_valid, block, spec, groups=4), torch.bfloat16),
                        (dense_mask(anchors, ctx_valid, block, spec), torch.float32)):
        for x in (q, k, v):
            x.grad = None
        out = attention(*(x.to(dtype) for x in (q, k, v)), mask)
        out.backward(dout.to(dtype))
        results.append([out.float()] + [x.grad.float() for x in (q, k, v)])
    for name, got, want in zip(["out", "dq", "dk", "dv"], *results):
        rel = relative_error(got, want)
        assert rel < 1e-2, f"{name}: relative error {rel:.2e}"


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in fp32: half-precision results against a reference, where elementwise closeness would
    test rounding."""
    got, want = got.float(), want.float()
    return float((got - want).norm() / want.norm().clamp(min=1e-12))


def training_step_results(overrides: list[str], tmp_path, bf16: bool = False) -> tuple:
    """One training step's stats and gradients for the first 4 rows of a tiny experiment on the GPU (fp32, or bf16
    autocast over a bf16 target for kernels that run only in half precision)."""
    from compose import compose_train

    from train.trainer import build, to_train_config

    cfg = to_train_config(compose_train(["trainer.progress=false", "data.num_eval=0", "trainer.loop_eval_prompts=0", "trainer.device=cuda",
                                         *(["trainer.precision=bf16", "target.dtype=bfloat16"] if bf16 else ["trainer.precision=fp32", "target.dtype=float32"]), f"output_dir={tmp_path}", *overrides]))
    run = build(cfg)
    step = run.step
    batch = step.ctx.to_device(step.ctx.collate([run.train_ds[i] for i in range(4)], run.target.pad_id))
    plan = step.plan(batch, torch.Generator().manual_seed(0))
    stats = step.forward(batch, plan)
    (stats.loss_sum / stats.num_labels).backward()
    grads = {n: p.grad.detach().clone() for n, p in step.drafter.named_parameters() if p.grad is not None}
    return stats, grads


def assert_same_step(a: tuple, b: tuple, rtol: float = 1e-3) -> None:
    (stats_a, grads_a), (stats_b, grads_b) = a, b
    assert float(stats_a.num_labels) == float(stats_b.num_labels)
    torch.testing.assert_close(stats_b.loss_sum.detach(), stats_a.loss_sum.detach(), rtol=1e-4, atol=1e-3)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name, g in grads_a.items():
        torch.testing.assert_close(grads_b[name], g, rtol=rtol, atol=1e-5, msg=name)


@pytest.mark.parametrize("scope", [
    ["trainer.compile_scope=regions"],
    ["trainer.compile_scope=step"],
    ["trainer.compile_scope=step", "+trainer.flex_kernel_options={BLOCK_M1: 32, BLOCK_N1: 64, BLOCK_M2: 64, BLOCK_N2: 32}"],
    ["trainer.compile_scope=step", "target.compile_capture=true"],
], ids=["regions", "step", "step-bwd-tiles", "step-target-capture"])
def test_compiled_training_step_equals_eager(scope: list[str], tmp_path) -> None:
    """trainer.compile_drafter (DFlash: compiled regions and loss, or the whole training forward as one function, with
    other backward tiles, with the target's capture compiled as one graph) against the eager drafter: the same loss, stats and gradients
    for the same micro-batches and plan, on the GPU's flex backend."""
    common = ["experiment=dflash_swa_tiny", "trainer.attention_backend=flex"]
    assert_same_step(training_step_results([*common, "trainer.compile_drafter=false"], tmp_path / "eager"),
                     training_step_results([*common, "trainer.compile_drafter=true", *scope], tmp_path / "compiled"))


@pytest.mark.parametrize("extra", [[], ["trainer.activation_checkpointing=true"], ["target.compile_capture=true"]],
                         ids=["compiled", "checkpointed-eager", "compiled-target-capture"])
def test_eagle3_compiled_training_step_equals_eager(extra: list[str], tmp_path) -> None:
    """EAGLE-3's ``trainer.compile_scope=step`` (the TTT unroll and its soft-CE loss as one compiled function, flex's
    block masks as inputs) against the eager step on the GPU's flex backend: the same loss, stats and gradients; with
    checkpointed TTT steps the step stays eager (said in a warning) and equals it too; with the target's capture
    compiled (its final hidden state included) on the compiled side only."""
    common = ["experiment=eagle3_swa_tiny", "trainer.attention_backend=flex"]
    eager_extra = [] if extra == ["target.compile_capture=true"] else extra
    assert_same_step(training_step_results([*common, *eager_extra, "trainer.compile_drafter=false"], tmp_path / "eager"),
                     training_step_results([*common, *extra, "trainer.compile_drafter=true", "trainer.compile_scope=step"], tmp_path / "compiled"))


@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_flex_training_step_equals_dense_masks(kind: str, tmp_path) -> None:
    """The trainers' flex path (tile structures from the anchors / the TTT rule, the Triton tile options) against
    SDPA with the element-by-element masks, on the GPU: the same loss and gradients."""
    common = [f"experiment={kind}_swa_tiny", "trainer.compile_drafter=false"]
    assert_same_step(training_step_results([*common, "trainer.attention_backend=sdpa"], tmp_path / "sdpa"),
                     training_step_results([*common, "trainer.attention_backend=flex"], tmp_path / "flex"), rtol=2e-3)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9, reason="FA4's key intervals: Hopper")
@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_fa4_compiled_training_step_equals_dense_masks(kind: str, tmp_path) -> None:
    """The ``fa4`` backend (DFlash: FlashAttention-4 with per-row key intervals; EAGLE-3: its window band and the
    diagonal keys) inside the step compiled as one function, against SDPA with the element-by-element masks, both in
    bf16: the same loss and gradients to bf16's precision."""
    from swa_kernels.fa4_adapter import available

    if not available():
        pytest.skip("flash-attn-4 (pip install '.[fa4]') is not installed")
    common = [f"experiment={kind}_swa_tiny", "trainer.compile_scope=step"]
    (stats_a, grads_a), (stats_b, grads_b) = (
        training_step_results([*common, "trainer.compile_drafter=false", "trainer.attention_backend=sdpa"], tmp_path / "sdpa", bf16=True),
        training_step_results([*common, "trainer.compile_drafter=true", "trainer.attention_backend=fa4"], tmp_path / "fa4", bf16=True))
    assert float(stats_a.num_labels) == float(stats_b.num_labels)
    torch.testing.assert_close(stats_b.loss_sum.float(), stats_a.loss_sum.float(), rtol=1e-2, atol=0)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name, g in grads_a.items():  # bf16 on both sides
        rel = relative_error(grads_b[name], g)
        assert rel < 3e-2, f"{name}: relative error {rel:.2e}"


def test_pinned_copies_equal_the_source() -> None:
    """common.transfer.to_device_async (batches and anchor keys staged through pinned memory): the same values on the GPU,
    the CPU source untouched, and a tensor already pinned or on the GPU passed through."""
    from common.transfer import to_device_async

    source = torch.randint(0, 1000, (16, 2048))
    kept = source.clone()
    on_gpu = to_device_async(source, "cuda")
    torch.cuda.synchronize()
    assert on_gpu.is_cuda and torch.equal(on_gpu.cpu(), kept) and torch.equal(source, kept) and not source.is_pinned()
    pinned = kept.pin_memory()
    assert torch.equal(to_device_async(pinned, "cuda").cpu(), kept)
    assert to_device_async(on_gpu, "cuda") is on_gpu
