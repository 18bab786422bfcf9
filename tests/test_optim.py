"""``trainer.optimizer=muon`` (train/optim.py): torch's Muon on the hidden matrices and AdamW on the rest, stepped as
one optimizer, against the two torch optimizers stepped by hand on a copy; the schedule scales both; a resume
continues exactly; bad settings fail at start-up."""

from __future__ import annotations

import copy

import pytest
import torch

from train.optim import MuonWithAdamW, split_for_muon


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
