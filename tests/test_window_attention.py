"""swa_kernels/window_attention.py against one dense mask built element by element (fp64, CPU), both
ways of running the band (cut into causal pieces, or whole); on the GPU the cuDNN kernels (chunked,
and cuDNN's native band through the frontend) against the PyTorch reference."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from swa_kernels.window_attention import CUDNN, REFERENCE, REFERENCE_BAND, BandOps, band_ops, cudnn_band_available, fa4_available, window_attention
from train.eagle3 import ttt_dense_mask


def dense_reference(q, k, v, window, diag_k=None, diag_v=None):
    """Softmax attention over [k ; diag_k[0] ; ...] with a mask filled pair by pair."""
    b, hq, t, d = q.shape
    steps = 0 if diag_k is None else diag_k.shape[0]
    keys = torch.cat([k] + [diag_k[s] for s in range(steps)], dim=2)
    values = torch.cat([v] + [diag_v[s] for s in range(steps)], dim=2)
    mask = torch.zeros(t, (steps + 1) * t, dtype=torch.bool)
    for i in range(t):
        for j in range(t):  # step-0 keys: causal, within the window (W keys counting the query)
            mask[i, j] = j <= i and (window is None or i - j < window)
        for s in range(steps):  # diagonal keys: the query's own index only
            mask[i, (s + 1) * t + i] = True
    groups = hq // k.shape[1]
    keys, values = keys.repeat_interleave(groups, 1), values.repeat_interleave(groups, 1)
    scores = (q @ keys.transpose(-1, -2)) * d**-0.5
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ values


def grads(fn, inputs, dout):
    for x in inputs:
        x.grad = None
    out = fn()
    out.backward(dout)
    return [out.detach()] + [x.grad.clone() for x in inputs]


@pytest.mark.parametrize("t", [1, 5, 8, 13])
@pytest.mark.parametrize("window", [None, 1, 2, 3, 4, 8, 20])
@pytest.mark.parametrize("steps", [0, 2])
@pytest.mark.parametrize("ops", [REFERENCE, REFERENCE_BAND], ids=lambda o: o.name)
def test_equals_dense_mask(t: int, window: int | None, steps: int, ops) -> None:
    torch.manual_seed(t * 100 + (window or 0) * 10 + steps)
    b, hq, hkv, d = 2, 4, 2, 8
    mk = lambda *s: torch.randn(*s, dtype=torch.float64, requires_grad=True)  # noqa: E731
    q, k, v = mk(b, hq, t, d), mk(b, hkv, t, d), mk(b, hkv, t, d)
    dk, dv = mk(steps, b, hkv, t, d), mk(steps, b, hkv, t, d)
    inputs = [q, k, v] + ([dk, dv] if steps else [])
    dout = torch.randn(b, hq, t, d, dtype=torch.float64)
    diag = (dk, dv) if steps else (None, None)
    got = grads(lambda: window_attention(q, k, v, window, None, *diag, ops=ops), inputs, dout)
    want = grads(lambda: dense_reference(q, k, v, window, *diag), inputs, dout)
    for name, g, w in zip(["out", "dq", "dk", "dv", "ddiag_k", "ddiag_v"], got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9, msg=name)


@pytest.mark.parametrize("step", [0, 1, 3])
@pytest.mark.parametrize("window", [None, 4, 6])
def test_is_the_eagle3_ttt_mask(step: int, window: int | None) -> None:
    """TTT step j = a window of W - j over the step-0 keys + j diagonal keys (train/eagle3.py)."""
    torch.manual_seed(step)
    b, hq, hkv, t, d = 1, 2, 1, 11, 4
    q = torch.randn(b, hq, t, d, dtype=torch.float64)
    k, v = torch.randn(2, step + 1, b, hkv, t, d, dtype=torch.float64)
    valid = torch.ones(b, t, dtype=torch.bool)
    mask = ttt_dense_mask(valid, step, window)
    keys, values = (x.movedim(0, 2).flatten(2, 3).repeat_interleave(hq // hkv, 1) for x in (k, v))
    want = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    got = window_attention(q, k[0], v[0], None if window is None else window - step, None, k[1:], v[1:], ops=REFERENCE)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_bad_window() -> None:
    x = torch.zeros(1, 1, 4, 2)
    with pytest.raises(ValueError, match="window=0"):
        window_attention(x, x, x, 0)


CUDNN_CASES = [(4096, 1024, 0), (3000, 1024, 0), (2048, 4096, 0), (4096, 1024, 6), (1000, 256, 3), (777, 1, 2)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuDNN pieces need a GPU")
@pytest.mark.parametrize("engine", ["cudnn", "cudnn-band", "fa4-band"], ids=["chunked", "band", "fa4"])
@pytest.mark.parametrize("t,window,steps", CUDNN_CASES)
def test_gpu_window_equals_reference(t: int, window: int, steps: int, engine: str) -> None:
    if engine == "cudnn-band" and not cudnn_band_available():
        pytest.skip("cuDNN's band needs the nvidia-cudnn-frontend package")
    if engine == "fa4-band" and not fa4_available():
        pytest.skip("FlashAttention-4's window needs the flash-attn-4 package and a Hopper GPU")
    torch.manual_seed(0)
    b, hq, hkv, d = 1, 8, 2, 128
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, requires_grad=True)  # noqa: E731
    # q, k, v in the models' layout: [B, T, H, D] projections viewed as [B, H, T, D]
    bshd = lambda h: torch.randn(b, t, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()  # noqa: E731
    q, k, v = bshd(hq), bshd(hkv), bshd(hkv)
    dk, dv = mk(steps, b, hkv, t, d), mk(steps, b, hkv, t, d)
    inputs = [q, k, v] + ([dk, dv] if steps else [])
    diag = (dk, dv) if steps else (None, None)
    dout = torch.randn(b, hq, t, d, device="cuda", dtype=torch.bfloat16)
    ops = CUDNN if engine == "cudnn" else band_ops(engine)
    got = grads(lambda: window_attention(q, k, v, window, None, *diag, ops=ops), inputs, dout)
    want = grads(lambda: window_attention(q, k, v, window, None, *diag, ops=REFERENCE), inputs, dout)
    for name, g, w in zip(["out", "dq", "dk", "dv", "ddiag_k", "ddiag_v"], got, want):
        rel = float((g.float() - w.float()).norm() / w.float().norm())
        assert rel < 1e-2, f"{name}: relative error {rel:.2e}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlashAttention-4 needs a GPU")
@pytest.mark.parametrize("b,t,window,steps,d", [(2, 1000, 256, 3, 128), (1, 4096, 1024, 6, 128), (2, 777, 64, 1, 64),
                                                (1, 300, None, 2, 128)])
def test_gpu_fa4_fused_diagonal(b: int, t: int, window: int | None, steps: int, d: int) -> None:
    """FA4's backward with the diagonal keys' gradient folded into its preprocess (swa_kernels/fa4_diagonal.py)
    against the reference and against the two run apart; padded tiles (T not a multiple of FA4's
    query tile), batch > 1, head_dim 64 and no window included."""
    if not fa4_available():
        pytest.skip("FlashAttention-4's window needs the flash-attn-4 package and a Hopper GPU")
    torch.manual_seed(1)
    hq, hkv = 8, 2
    bshd = lambda h: torch.randn(b, t, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()  # noqa: E731
    q, k, v = bshd(hq), bshd(hkv), bshd(hkv)
    dk, dv = (torch.randn(steps, b, hkv, t, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    inputs, dout = [q, k, v, dk, dv], torch.randn(b, hq, t, d, device="cuda", dtype=torch.bfloat16)
    run = lambda ops: grads(lambda: window_attention(q, k, v, window, None, dk, dv, ops=ops), inputs, dout)  # noqa: E731
    fused = run(band_ops("fa4-band"))
    apart = run(dataclasses.replace(band_ops("fa4-band"), backward_with_diagonal=None))
    want = run(REFERENCE)
    for name, f, a, w in zip(["out", "dq", "dk", "dv", "ddiag_k", "ddiag_v"], fused, apart, want):
        rel = float((f.float() - w.float()).norm() / w.float().norm())
        assert rel < 1e-2, f"{name}: relative error {rel:.2e} against the reference"
        rel = float((f.float() - a.float()).norm() / a.float().norm())
        assert rel < 5e-3, f"{name}: relative difference {rel:.2e} against the unfused kernels"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlashAttention-4 needs a GPU")
@pytest.mark.parametrize("steps", [0, 3])
def test_gpu_fa4_band_compiles_as_one_graph(steps: int) -> None:
    """FA4's window and its fused diagonal backward are custom ops (swa_kernels/fa4_window.py): the attention
    compiles with ``fullgraph=True`` (Dynamo broke the graph inside FA4's Python before) and gives
    eager's output and gradients (the same kernels, up to FA4's atomic dQ sums and the diagonal share merged in another order); q and k in
    fp32 beside bf16 values under autocast (RoPE from an fp32 hidden state) run as bf16, as autocast runs SDPA."""
    if not fa4_available():
        pytest.skip("FlashAttention-4's window needs the flash-attn-4 package and a Hopper GPU")
    torch._dynamo.reset()
    torch.manual_seed(2)
    b, t, hq, hkv, d = 2, 1000, 8, 2, 128
    bshd = lambda h: torch.randn(b, t, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()  # noqa: E731
    q, k, v = bshd(hq), bshd(hkv), bshd(hkv)
    dk, dv = (torch.randn(steps, b, hkv, t, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    inputs = [q, k, v] + ([dk, dv] if steps else [])
    diag = (dk, dv) if steps else (None, None)
    dout = torch.randn(b, hq, t, d, device="cuda", dtype=torch.bfloat16)
    ops = band_ops("fa4-band")

    def attend(q, k, v, dk, dv):
        return window_attention(q, k, v, 256, None, dk, dv, ops=ops)

    compiled = torch.compile(attend, fullgraph=True)
    got = grads(lambda: compiled(q, k, v, *diag), inputs, dout)
    want = grads(lambda: attend(q, k, v, *diag), inputs, dout)
    for name, g, w in zip(["out", "dq", "dk", "dv", "ddiag_k", "ddiag_v"], got, want):
        rel = float((g.float() - w.float()).norm() / w.float().norm())
        assert rel < 1e-3, f"{name}: relative difference {rel:.2e}"
    with torch.autocast("cuda", dtype=torch.bfloat16):  # mixed dtypes in: the kernels get bf16, the grads their inputs' dtypes
        q32, k32 = (x.detach().float().requires_grad_() for x in (q, k))
        mixed = grads(lambda: attend(q32, k32, v, *diag), [q32, k32, v], dout)
    assert mixed[1].dtype == torch.float32 and mixed[3].dtype == torch.bfloat16
    for name, g, w in zip(["out", "dq", "dk", "dv"], mixed, want):
        rel = float((g.float() - w.float()).norm() / w.float().norm())
        assert rel < 1e-2, f"{name} (fp32 q, k under autocast): relative difference {rel:.2e}"


def shifted_band(shift: int) -> BandOps:
    """The reference band with its window read ``shift`` keys off: what a frontend counting W otherwise would run."""
    return BandOps(f"shifted{shift}", lambda q, k, v, w, scale: REFERENCE_BAND.forward(q, k, v, w + shift, scale),
                   lambda dout, q, k, v, out, lse, w, scale: REFERENCE_BAND.backward(dout, q, k, v, out, lse, w + shift, scale))


def test_the_cudnn_band_probe_passes_the_window_and_names_an_off_by_one_or_another_signature() -> None:
    """cuDNN's band is called through the frontend's torch ops by keyword, ``window_left`` read as W (probed on one
    frontend version): ``cudnn_band_problem`` runs a band once against the dense mask and names what is off, so that
    another version falls back to the chunked path loudly instead of training on another window."""
    from swa_kernels.window_attention import cudnn_band_problem

    assert cudnn_band_problem(REFERENCE_BAND, device="cpu") is None
    for shift in (-1, 1):  # FlashAttention's W - 1 handed to it, or a window counted without the query
        problem = cudnn_band_problem(shifted_band(shift), device="cpu")
        assert problem is not None and problem.startswith("disagrees with the window's dense mask (max |error| "), problem

    def renamed(q, k, v, window, scale):
        raise TypeError("sdpa_fwd() got an unexpected keyword argument 'window_left'")

    problem = cudnn_band_problem(BandOps("renamed", renamed, REFERENCE_BAND.backward), device="cpu")
    assert problem == "failed on a 64-token problem (TypeError: sdpa_fwd() got an unexpected keyword argument 'window_left')"


def test_the_cudnn_band_probe_runs_once_outside_a_compiled_step(monkeypatch) -> None:
    """EAGLE-3's compiled training step asks for its kernels inside traced code; Dynamo looks through functools.cache, so
    the probe (a 64-token problem and its reference) was traced into the step (seen on an H100 with the frontend
    installed). ``cudnn_band_available`` is a constant to torch.compile: the probe runs once, at trace time, and the
    step compiles as one graph. The frontend faked as installed."""
    import sys
    import types

    from swa_kernels import window_attention

    for name in ("cudnn", "cudnn.sdpa", "cudnn.sdpa.fwd", "cudnn.sdpa.fwd.torch_op"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    probes = []
    monkeypatch.setattr(window_attention, "installed_band_problem", lambda: probes.append(1))  # None: the band serves
    window_attention._cudnn_band_available.cache_clear()
    try:
        step = torch.compile(lambda x: x + 1 if window_attention.cudnn_band_available() else x - 1, backend="eager", fullgraph=True)
        assert step(torch.zeros(2)).tolist() == [1.0, 1.0] and step(torch.ones(2)).tolist() == [2.0, 2.0]
        assert probes == [1]
    finally:
        window_attention._cudnn_band_available.cache_clear()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuDNN's band needs a GPU")
def test_gpu_the_installed_cudnn_band_passes_its_probe() -> None:
    if not cudnn_band_available():
        pytest.skip("cuDNN's band needs the nvidia-cudnn-frontend package (or failed its probe: see the warning)")
    from swa_kernels.window_attention import cudnn_band_problem

    assert cudnn_band_problem() is None


def test_unknown_band_engine() -> None:
    with pytest.raises(ValueError, match="'flash3'.*fa4-band"):
        band_ops("flash3")


def test_autocast_hands_the_band_kernels_one_dtype(monkeypatch) -> None:
    """EAGLE-3's recipe under autocast (``norm_output``: from step 1 on the hidden state, hence RoPE's cos/sin and q, is
    fp32) gives window_attention q and the diagonal keys in fp32 beside bf16 step-0 keys and values; FlashAttention-4
    refuses mixed dtypes (an H200 run of the recipe stopped so), so window_attention casts to autocast's dtype first,
    as autocast does for PyTorch's own attention. A spy band engine records what the kernels get (CPU autocast)."""
    from transformers import Qwen3Config

    import train.eagle3 as eagle3_train
    from models.eagle3 import Eagle3DraftModel, make_eagle3_config

    seen, inputs = [], []
    spy = BandOps("spy", lambda q, k, v, window, scale: (seen.append((q.dtype, k.dtype, v.dtype)), REFERENCE_BAND.forward(q, k, v, window, scale))[1],
                  REFERENCE_BAND.backward)

    def recording(q, k, v, window, scale, diag_k=None, diag_v=None, ops=None):
        inputs.append((q.dtype, k.dtype, None if diag_k is None else diag_k.dtype))
        return window_attention(q, k, v, window, scale, diag_k, diag_v, ops=ops)

    monkeypatch.setattr(eagle3_train, "window_kernels", lambda backend, on_gpu=True: spy)
    monkeypatch.setattr(eagle3_train, "window_attention", recording)
    target = Qwen3Config(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         num_hidden_layers=6, vocab_size=256)
    config = make_eagle3_config(target, num_hidden_layers=1, target_layer_ids=[1, 3, 5], layer_types=["sliding_attention"],
                                sliding_window=16, draft_vocab_size=128, ttt_length=3, norm_before_fc=True, norm_output=True)
    torch.manual_seed(0)
    model = Eagle3DraftModel(config)
    features = torch.randn(1, 24, 3 * 64).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eagle3_train.unroll(model, features, torch.randint(0, 256, (1, 24)), torch.ones(1, 24, dtype=torch.bool), 3, backend="fa4")
    assert inputs[1][0] == torch.float32 and inputs[1][1] == torch.bfloat16  # the mixed dtypes the recipe produces
    assert len(seen) == 3 and all(dtypes == (torch.bfloat16,) * 3 for dtypes in seen), seen


def test_fa4_window_ops_fakes_match_the_reference_layouts() -> None:
    """The custom ops' fakes (what a compiled step plans its buffers with; swa_kernels/fa4_window.py) give the shapes, dtypes
    and contiguous strides of what the band engine hands back, checked against the PyTorch reference band's outputs
    (FA4's [B, T, H, D] layout); runs without a GPU or FA4 (the fakes only)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from swa_kernels import fa4_window

    b, t, hq, hkv, d, steps = 2, 40, 8, 2, 16, 3
    q, k, v = (torch.randn(b, h, t, d) for h in (hq, hkv, hkv))  # the window module's layout [B, H, T, D]
    diag_k, diag_v = torch.randn(steps, b, hkv, t, d), torch.randn(steps, b, hkv, t, d)
    out, lse = REFERENCE_BAND.forward(q, k, v, 8, d**-0.5)
    grads = REFERENCE_BAND.backward(torch.randn_like(out), q, k, v, out, lse, 8, d**-0.5)
    bshd = lambda x: x.transpose(1, 2)  # noqa: E731
    real = [x.to(torch.bfloat16) for x in (q, k, v, out)] + [lse] + [x.to(torch.bfloat16) for x in (diag_k, diag_v)]
    with FakeTensorMode() as mode:
        fq, fk, fv, fout, flse, fdk, fdv = (mode.from_tensor(x) for x in real)
        fake_out, fake_lse = fa4_window.window_forward(bshd(fq), bshd(fk), bshd(fv), 7, 0.25)
        fake_grads = fa4_window.window_backward(bshd(fq), bshd(fk), bshd(fv), bshd(fout), bshd(fout), flse, 7, 0.25)
        fake_diag = fa4_window.window_backward_diagonal(fout, fq, fk, fv, fout, flse, fdk, fdv, 7, 0.25)
    assert fake_out.shape == bshd(out).shape and fake_out.is_contiguous() and fake_out.dtype == torch.bfloat16
    assert fake_lse.shape == lse.shape and fake_lse.dtype == torch.float32 and fake_lse.is_contiguous()
    for fake, want in zip(fake_grads, grads):
        assert fake.shape == bshd(want).shape and fake.is_contiguous() and fake.dtype == torch.bfloat16
    for fake, want in zip(fake_diag, [*(bshd(g) for g in grads), diag_k, diag_v]):
        assert fake.shape == want.shape and fake.is_contiguous()
