"""``trainer.optimizer=muon`` (train/optim.py): torch's Muon on the hidden matrices and AdamW on the rest, stepped as
one optimizer, against the two torch optimizers stepped by hand on a copy; the schedule scales both; a resume
continues exactly; bad settings fail at start-up."""

from __future__ import annotations

import copy

import pytest
import torch

from train.optim import Muon, MuonWithAdamW, newton_schulz, newton_schulz_dtype, split_for_muon


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(10, 8)
        self.fc = torch.nn.Linear(8, 8, bias=False)
        self.norm = torch.nn.LayerNorm(8)
        self.lm_head = torch.nn.Linear(8, 10, bias=False)
        self.frozen = torch.nn.Linear(8, 8, bias=False)
        self.frozen.weight.requires_grad_(False)

    def forward(self, ids):
        return self.lm_head(self.norm(self.frozen(self.fc(self.embed_tokens(ids)))))


def loss_of(model, step):
    ids = torch.randint(0, 10, (4, 6), generator=torch.Generator().manual_seed(step))
    return torch.nn.functional.cross_entropy(model(ids).reshape(-1, 10), ids.roll(1, 1).reshape(-1))


def schedule(opt):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))


def test_split_follows_speculators_rule() -> None:
    model = Tiny()
    muon, adamw = split_for_muon(model.named_parameters())
    assert [p is model.fc.weight for p in muon] == [True]
    assert {id(p) for p in adamw} == {id(model.embed_tokens.weight), id(model.norm.weight), id(model.norm.bias), id(model.lm_head.weight)}


def test_steps_equal_the_two_torch_optimizers_by_hand() -> None:
    torch.manual_seed(0)
    model = Tiny()
    ref = copy.deepcopy(model)
    opt = MuonWithAdamW(model.named_parameters(), lr=1e-2, muon_lr=2e-2, betas=(0.9, 0.95), weight_decay=0.01, muon_weight_decay=0.1)
    sched = schedule(opt)
    ref_muon, ref_adamw = split_for_muon(ref.named_parameters())
    by_hand = [torch.optim.Muon(ref_muon, lr=2e-2, weight_decay=0.1, adjust_lr_fn="match_rms_adamw"),
               torch.optim.AdamW(ref_adamw, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.01)]
    by_hand_sched = [schedule(o) for o in by_hand]
    for step in range(4):
        for m, opts, scheds in ((model, [opt], [sched]), (ref, by_hand, by_hand_sched)):
            loss_of(m, step).backward()
            for o in opts:
                o.step()
                o.zero_grad(set_to_none=True)
            for s in scheds:
                s.step()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([2e-2 / 5, 1e-2 / 5])  # the schedule reached both
    assert not torch.equal(model.fc.weight, Tiny().fc.weight)


def test_resume_from_state_dict_continues_exactly() -> None:
    """Optimizer and schedule saved mid-run and loaded into fresh ones: the same weights after two more steps (the
    schedule still reaches the inner optimizers, whose group dicts loading replaces)."""
    torch.manual_seed(0)
    model = Tiny()
    opt = MuonWithAdamW(model.named_parameters(), lr=1e-2, muon_lr=1e-2, betas=(0.9, 0.95), weight_decay=0.0, muon_weight_decay=0.1)
    sched = schedule(opt)
    for step in range(2):
        loss_of(model, step).backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    saved_sched = copy.deepcopy(sched.state_dict())
    for step in range(2, 4):
        loss_of(model, step).backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    resumed = Tiny()
    resumed.load_state_dict(saved_model)
    opt2 = MuonWithAdamW(resumed.named_parameters(), lr=1e-2, muon_lr=1e-2, betas=(0.9, 0.95), weight_decay=0.0, muon_weight_decay=0.1)
    sched2 = schedule(opt2)
    opt2.load_state_dict(saved_opt)
    sched2.load_state_dict(saved_sched)
    for step in range(2, 4):
        loss_of(resumed, step).backward()
        opt2.step()
        sched2.step()
        opt2.zero_grad()
    assert [g["lr"] for g in opt2.inner[0].param_groups + opt2.inner[1].param_groups] == [g["lr"] for g in opt.param_groups]
    for p, q in zip(model.parameters(), resumed.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    with pytest.raises(ValueError, match="keys .*state.*expected muon and adamw"):
        opt2.load_state_dict(torch.optim.AdamW(resumed.parameters()).state_dict())


def test_no_matrix_for_muon_fails_in_one_line() -> None:
    with pytest.raises(ValueError, match="no trainable 2-D hidden matrix"):
        MuonWithAdamW(torch.nn.LayerNorm(4).named_parameters(), lr=1e-3, muon_lr=1e-3, betas=(0.9, 0.95), weight_decay=0, muon_weight_decay=0)


def test_a_torch_without_muon_fails_in_one_line(monkeypatch) -> None:
    monkeypatch.delattr(torch.optim, "Muon")
    with pytest.raises(ValueError, match=r"trainer.optimizer=muon needs torch >= 2.9 \(torch.optim.Muon\); this is torch "):
        MuonWithAdamW(Tiny().named_parameters(), lr=1e-3, muon_lr=1e-3, betas=(0.9, 0.95), weight_decay=0, muon_weight_decay=0)


@pytest.mark.parametrize("adjust_lr_fn", ["match_rms_adamw", "original"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_in_bf16_is_torchs_muon_bit_for_bit(adjust_lr_fn, nesterov) -> None:
    """``train.optim.Muon`` with its Newton-Schulz in bf16 against ``torch.optim.Muon`` (tall and wide matrices)."""
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(12, 5)), torch.nn.Parameter(torch.randn(4, 9))]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    kwargs = dict(lr=3e-2, weight_decay=0.1, nesterov=nesterov, adjust_lr_fn=adjust_lr_fn)
    opts = [Muon(ours, ns_dtype=torch.bfloat16, **kwargs), torch.optim.Muon(theirs, **kwargs)]
    for step in range(3):
        grads = [torch.randn(p.shape, generator=torch.Generator().manual_seed(10 * step + i)) for i, p in enumerate(ours)]
        for params, opt in zip((ours, theirs), opts):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            opt.step()
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert opts[0].state_dict()["state"].keys() == opts[1].state_dict()["state"].keys()
    opts[1].load_state_dict(opts[0].state_dict())  # checkpoints load into either


def test_newton_schulz_in_fp32_follows_a_float64_reference() -> None:
    """fp32 is the float64 iteration to fp32 rounding; bf16 (torch's) only to bf16's, a few percent."""
    update = torch.randn(48, 20, generator=torch.Generator().manual_seed(0))
    coefficients = (3.4445, -4.7750, 2.0315)
    reference = newton_schulz(update.double(), coefficients, 5, 1e-7, torch.float64)
    fp32, bf16 = (newton_schulz(update, coefficients, 5, 1e-7, dtype) for dtype in (torch.float32, torch.bfloat16))
    assert fp32.dtype == torch.float32 and fp32.shape == update.shape
    torch.testing.assert_close(fp32.double(), reference, rtol=1e-5, atol=1e-5)
    error = (bf16.double() - reference).norm() / reference.norm()
    assert 1e-4 < error < 0.05
    singular = torch.linalg.svdvals(reference)  # orthogonalised: the spread Keller Jordan's coefficients leave
    assert singular.min() > 0.3 and singular.max() < 1.3


def test_auto_ns_dtype_is_fp32_only_on_a_cpu_without_bf16_hardware(monkeypatch) -> None:
    import train.optim as optim

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(optim, "cpu_has_bf16_matmul", lambda: False)
    assert [newton_schulz_dtype("auto", cpu), newton_schulz_dtype("auto", gpu)] == [torch.float32, torch.bfloat16]
    assert [newton_schulz_dtype(c, cpu) for c in ("bfloat16", "float32")] == [torch.bfloat16, torch.float32]
    monkeypatch.setattr(optim, "cpu_has_bf16_matmul", lambda: True)
    assert newton_schulz_dtype("auto", cpu) == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_stack_through_newton_schulz_is_each_matrix_on_its_own(dtype) -> None:
    """Muon orthogonalises same-shaped matrices as one stack (batched products); each matrix of the stack must come out
    as it does alone, with its own norm (a stack of very different scales checks that)."""
    coefficients = (3.4445, -4.7750, 2.0315)
    for shape in ((3, 24, 10), (4, 8, 30)):  # tall and wide
        stack = torch.randn(shape, generator=torch.Generator().manual_seed(1)) * torch.tensor([1e-3, 1.0, 50.0, 7.0][: shape[0]]).view(-1, 1, 1)
        together = newton_schulz(stack, coefficients, 5, 1e-7, dtype)
        alone = torch.stack([newton_schulz(m, coefficients, 5, 1e-7, dtype) for m in stack])
        assert together.shape == stack.shape and together.dtype == dtype
        if dtype == torch.float32:
            torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)
        else:  # bf16: batched and single products may round differently; a bf16 ulp or two on values of at most ~1
            assert (together.float() - alone.float()).abs().max() < 0.02


@pytest.mark.parametrize("ns_dtype", [torch.float32, torch.bfloat16])
def test_muon_with_repeated_shapes_steps_as_a_plain_per_matrix_loop(ns_dtype) -> None:
    """``Muon.step`` groups a drafter's same-shaped matrices; a plain loop written here (momentum, Newton-Schulz per
    matrix, decoupled weight decay, match_rms_adamw's scale) is the reference, over three steps."""
    torch.manual_seed(0)
    shapes = [(12, 5), (12, 5), (4, 9), (12, 5), (4, 9), (7, 7)]
    ours = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    ref = [p.detach().clone() for p in ours]
    lr, wd, momentum = 3e-2, 0.1, 0.95
    opt = Muon(ours, lr=lr, weight_decay=wd, momentum=momentum, nesterov=True, adjust_lr_fn="match_rms_adamw", ns_dtype=ns_dtype)
    coefficients, steps, eps = opt.param_groups[0]["ns_coefficients"], opt.param_groups[0]["ns_steps"], opt.param_groups[0]["eps"]
    bufs = [torch.zeros_like(p) for p in ref]
    for step in range(3):
        grads = [torch.randn(p.shape, generator=torch.Generator().manual_seed(10 * step + i)) for i, p in enumerate(ours)]
        for p, g in zip(ours, grads):
            p.grad = g.clone()
        opt.step()
        for p, g, buf in zip(ref, grads, bufs):
            buf.lerp_(g, 1 - momentum)
            update = newton_schulz(g.lerp(buf, momentum), coefficients, steps, eps, ns_dtype)
            p.mul_(1 - lr * wd).add_(update, alpha=-lr * 0.2 * max(p.shape) ** 0.5)
    for p, q in zip(ours, ref):
        if ns_dtype == torch.float32:
            torch.testing.assert_close(p.detach(), q, rtol=1e-5, atol=1e-6)
        else:
            torch.testing.assert_close(p.detach(), q, rtol=0, atol=2e-3)


def test_muon_splits_a_shape_into_stacks_of_at_most_stack_elements(monkeypatch) -> None:
    """Large matrices go through Newton-Schulz a few at a time (``STACK_ELEMENTS``): the same steps as one stack."""
    import train.optim as optim

    torch.manual_seed(0)
    start = [torch.randn(12, 5) for _ in range(5)]
    results = []
    for cap in (1 << 27, 2 * 60, 1):  # one stack; stacks of two (and a last of one); one matrix at a time
        monkeypatch.setattr(optim, "STACK_ELEMENTS", cap)
        params = [torch.nn.Parameter(t.clone()) for t in start]
        opt = Muon(params, lr=3e-2, weight_decay=0.1, nesterov=True, adjust_lr_fn="match_rms_adamw", ns_dtype=torch.float32)
        calls = []
        real = optim.newton_schulz
        monkeypatch.setattr(optim, "newton_schulz", lambda u, *a: calls.append(u.shape) or real(u, *a))
        for step in range(2):
            for i, p in enumerate(params):
                p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(10 * step + i))
            opt.step()
        monkeypatch.setattr(optim, "newton_schulz", real)
        results.append(torch.stack([p.detach() for p in params]))
        per_step = {1 << 27: [(5, 12, 5)], 2 * 60: [(2, 12, 5), (2, 12, 5), (12, 5)], 1: [(12, 5)] * 5}[cap]
        assert calls == per_step * 2
    for other in results[1:]:
        torch.testing.assert_close(other, results[0], rtol=1e-5, atol=1e-6)
