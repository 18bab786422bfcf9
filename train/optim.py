"""The trainer's optimizer: AdamW (the default) or Muon on the drafter's hidden matrices with AdamW on the rest.

``trainer.optimizer=muon`` is vLLM speculators' ``--optimizer muon`` (speculators 0.9.0, train/optimizers.py, read for
this module): ``torch.optim.Muon`` (here its subclass ``Muon``, which may orthogonalise in fp32 on CPUs without bf16
hardware, ``trainer.muon_ns_dtype``) over every trainable 2-D matrix with both sides > 1 except embeddings and LM heads,
``torch.optim.AdamW`` over the rest (norms, and EAGLE-3's draft LM head). Both are torch's own optimizers; this module
only splits the parameters and steps the two as one ``torch.optim.Optimizer``: one ``param_groups`` list (the
inner optimizers' own group dicts, so the learning-rate schedule scales both) and one state dict.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import torch

ADAMW_NAME_HINTS = ("embed_tokens", "lm_head")  # 2-D but vocabulary-shaped: AdamW, as in Keller Jordan's Muon
NS_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
# Muon orthogonalises same-shaped matrices as stacks of at most this many elements: a small drafter's layers in one stack
# each (10 x 1408 x 512 = 7.2M), an 8B-shape drafter's 12288 x 4096 matrices two at a time (the stack and its
# Newton-Schulz temporaries a few hundred MB, not gigabytes)
STACK_ELEMENTS = 1 << 27


@lru_cache(maxsize=1)
def cpu_has_bf16_matmul() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (x86: AVX-512 BF16 or AMX; Arm: the BF16 extension), read
    from /proc/cpuinfo's flags (no file, e.g. macOS: assumed not)."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def newton_schulz_dtype(choice: str, device: torch.device) -> torch.dtype:
    """``trainer.muon_ns_dtype``: auto = bf16 (torch's Muon) on GPUs and on CPUs with bf16 hardware, fp32 on other CPUs,
    where bf16 products are emulated: 10 against 85 GFLOP/s in fp32 on one core of an AVX2 EPYC, which made the
    quickstart's DFlash drafter (Muon on its matrices) spend 30 s per step in the optimizer."""
    if choice != "auto":
        return NS_DTYPES[choice]
    return torch.bfloat16 if device.type != "cpu" or cpu_has_bf16_matmul() else torch.float32


def newton_schulz(update: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype) -> torch.Tensor:
    """Muon's quintic Newton-Schulz orthogonalisation of a 2-D update, or of a stack [n, rows, cols] of them (each
    matrix on its own: its own norm), computed in ``dtype``: torch.optim.Muon's iteration (torch 2.13,
    ``_zeropower_via_newtonschulz``, which fixes bf16), the same operations in the same order; a stack runs each
    product as one batched product (``baddbmm`` for ``addmm``)."""
    a, b, c = coefficients
    x = update.to(dtype)
    tall = update.size(-2) > update.size(-1)
    if tall:
        x = x.mT
    if x.dim() == 2:
        x = x / x.norm().clamp(min=eps)  # spectral norm at most 1
        for _ in range(steps):
            gram = x @ x.T
            x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    else:
        x = x / torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True).clamp(min=eps)
        for _ in range(steps):
            gram = x @ x.mT
            x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


# torch < 2.9 has no Muon: the module still imports (AdamW runs), MuonWithAdamW refuses in one line
class Muon(getattr(torch.optim, "Muon", torch.optim.Optimizer)):
    """``torch.optim.Muon`` (its arguments, parameter groups and state, so checkpoints load into either) whose
    Newton-Schulz iteration runs in ``ns_dtype``: with bf16 its steps are torch's own, bit for bit (a test)."""

    def __init__(self, params, *, ns_dtype: torch.dtype = torch.bfloat16, **kwargs):
        super().__init__(params, **kwargs)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("Muon.step takes no closure")
        for group in self.param_groups:
            lr, momentum = float(group["lr"]), group["momentum"]
            params, updates = [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.lerp_(grad, 1 - momentum)
                params.append(p)
                updates.append(grad.lerp(buf, momentum) if group["nesterov"] else buf)
            # The matrices of one shape (a drafter's layers repeat theirs) orthogonalised as one stack: ~15 batched
            # products per shape instead of 15 per matrix, the launches that made the step host-bound on small drafters
            by_shape: dict[tuple[int, ...], list[int]] = {}
            for i, update in enumerate(updates):
                by_shape.setdefault(tuple(update.shape), []).append(i)
            stacks = []  # (shape, members): at most STACK_ELEMENTS a stack, so large drafters' stacks stay small
            for shape, members in by_shape.items():
                per_stack = max(1, STACK_ELEMENTS // math.prod(shape))
                stacks += [(shape, members[i:i + per_stack]) for i in range(0, len(members), per_stack)]
            for shape, members in stacks:
                stacked = updates[members[0]] if len(members) == 1 else torch.stack([updates[i] for i in members])
                ortho = newton_schulz(stacked, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype)
                rows, cols = shape[:2]
                # torch's adjust_lr_fn: "match_rms_adamw" scales to AdamW's update RMS (Moonshot), else Keller Jordan's
                ratio = 0.2 * math.sqrt(max(rows, cols)) if group["adjust_lr_fn"] == "match_rms_adamw" else math.sqrt(max(1, rows / cols))
                for j, i in enumerate(members):
                    p = params[i]
                    p.mul_(1 - lr * group["weight_decay"])
                    p.add_(ortho if len(members) == 1 else ortho[j], alpha=-lr * ratio)


def split_for_muon(named_params: Iterable[tuple[str, torch.nn.Parameter]]) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    """(Muon's, AdamW's) trainable parameters."""
    muon, adamw = [], []
    for name, p in named_params:
        if not p.requires_grad:
            continue
        is_matrix = p.ndim == 2 and min(p.shape) > 1 and not any(h in name for h in ADAMW_NAME_HINTS)
        (muon if is_matrix else adamw).append(p)
    return muon, adamw


class MuonWithAdamW(torch.optim.Optimizer):
    """``torch.optim.Muon`` on the hidden matrices and ``torch.optim.AdamW`` on the rest, stepped together."""

    def __init__(self, named_params: Iterable[tuple[str, torch.nn.Parameter]], *, lr: float, muon_lr: float, betas: tuple[float, float],
                 weight_decay: float, muon_weight_decay: float, fused: bool = False, ns_dtype: torch.dtype = torch.bfloat16):
        if not hasattr(torch.optim, "Muon"):  # torch.optim.Muon (with adjust_lr_fn) is in torch >= 2.9
            raise ValueError(f"trainer.optimizer=muon needs torch >= 2.9 (torch.optim.Muon); this is torch {torch.__version__}: "
                             "upgrade or use trainer.optimizer=adamw")
        muon_params, adamw_params = split_for_muon(named_params)
        if not muon_params:
            raise ValueError("trainer.optimizer=muon: the drafter has no trainable 2-D hidden matrix for Muon; use trainer.optimizer=adamw")
        # match_rms_adamw: Muon's update scaled to AdamW's RMS, so one learning rate serves both (speculators' default)
        self.muon = Muon(muon_params, lr=muon_lr, weight_decay=muon_weight_decay, adjust_lr_fn="match_rms_adamw", ns_dtype=ns_dtype)
        self.adamw = torch.optim.AdamW(adamw_params, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused) if adamw_params else None
        inner = [self.muon] + ([self.adamw] if self.adamw is not None else [])
        super().__init__([g for opt in inner for g in opt.param_groups], {})  # the same group dicts: a schedule scales both
        self.inner = inner

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("MuonWithAdamW.step takes no closure")
        for opt in self.inner:
            opt.step()

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict() if self.adamw is not None else None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if set(state_dict) != {"muon", "adamw"}:
            raise ValueError(f"trainer.optimizer=muon: the checkpoint's optimizer state has keys {sorted(state_dict)}; "
                             "expected muon and adamw (was it saved with trainer.optimizer=adamw?)")
        self.muon.load_state_dict(state_dict["muon"])
        if self.adamw is not None:
            self.adamw.load_state_dict(state_dict["adamw"])
        # torch's load_state_dict gives each inner optimizer new group dicts: point ours (which the schedule
        # scales) at them again, in place, as a scheduler holds this list through the optimizer
        self.param_groups[:] = [g for opt in self.inner for g in opt.param_groups]


def build_optimizer(cfg: Any, drafter: torch.nn.Module, fused: bool) -> torch.optim.Optimizer:
    """``trainer.optimizer`` over the drafter's trainable parameters (EAGLE-3's embedding is the target's, frozen)."""
    tc = cfg.trainer
    betas = (0.9, 0.95)
    if tc.optimizer == "muon":
        ns_dtype = newton_schulz_dtype(tc.muon_ns_dtype, next(drafter.parameters()).device)
        return MuonWithAdamW(drafter.named_parameters(), lr=tc.lr, muon_lr=tc.muon_lr or tc.lr, betas=betas,
                             weight_decay=tc.weight_decay, muon_weight_decay=tc.muon_weight_decay, fused=fused, ns_dtype=ns_dtype)
    trainable = [p for p in drafter.parameters() if p.requires_grad]
    return torch.optim.AdamW(trainable, lr=tc.lr, betas=betas, weight_decay=tc.weight_decay, fused=fused)
