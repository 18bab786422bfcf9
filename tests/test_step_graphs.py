"""train/step_graphs.py on the CPU: the step's inputs found and rebound (the masks' nested dataclasses included), copied
into buffers kept per signature, and the returned stats cloned out of them. The replay itself is a GPU test
(tests/test_gpu.py::test_cuda_graph_step_equals_compiled_step)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels.key_intervals import KeyIntervalMask
from models.dflash import LayerMaskSpec, key_interval_mask
from train.step_graphs import GraphedStep, tensors_in, with_tensors


@dataclasses.dataclass
class Stats:
    total: torch.Tensor
    count: torch.Tensor


def a_mask() -> KeyIntervalMask:
    anchors = torch.tensor([[3, 9], [1, 0]])
    ctx_valid = torch.arange(20)[None] < torch.tensor([[20], [12]])
    return key_interval_mask(anchors, ctx_valid, 4, LayerMaskSpec(8, True), groups=2, head_dim=64)


def test_rebinding_replaces_every_tensor_and_keeps_the_rest() -> None:
    mask = a_mask()
    args = (torch.ones(2, 3), {"sliding_attention": mask}, [torch.zeros(4), 7], "fa4", 0.5)
    found = tensors_in(args)
    # the mask's plan: rows, two forward tables, three backward tables; plus the two plain tensors
    assert len(found) == 2 + 1 + len(mask.plan.forward) + len(mask.plan.backward)
    fresh = [t.clone() for t in found]
    rebuilt = with_tensors(args, iter(fresh))
    again = tensors_in(rebuilt)
    assert len(again) == len(fresh) and all(a is b for a, b in zip(again, fresh))
    m = rebuilt[1]["sliding_attention"]
    assert isinstance(m, KeyIntervalMask) and (m.ctx_len, m.ctx_keys, m.group_major) == (mask.ctx_len, mask.ctx_keys, mask.group_major)
    assert m.plan.groups == mask.plan.groups and m.plan.head_dim == mask.plan.head_dim
    assert rebuilt[2][1] == 7 and rebuilt[3:] == ("fa4", 0.5)
    for a, b in zip(found, again):
        assert torch.equal(a, b)


def test_graphed_step_reads_stable_buffers_and_returns_clones() -> None:
    seen = []

    def step(x: torch.Tensor, extra: dict) -> Stats:
        seen.append((x.data_ptr(), extra["w"].data_ptr()))
        return Stats(x.sum() * extra["w"].sum(), torch.tensor(float(x.numel())))

    graphed = GraphedStep(step)
    first = graphed(torch.full((2, 3), 2.0), {"w": torch.ones(4)})
    second = graphed(torch.full((2, 3), 3.0), {"w": torch.ones(4) * 2})
    assert seen[0] == seen[1]  # the same signature reads the same addresses
    assert float(first.total) == 48.0 and float(second.total) == 144.0  # each call's values, the first kept after the second
    graphed(torch.ones(5), {"w": torch.ones(4)})  # another signature: its own buffers
    assert seen[2][0] != seen[0][0] and len(graphed.buffers) == 2
    with pytest.raises(ValueError, match="a step input requires grad"):
        graphed(torch.ones(2, 3, requires_grad=True), {"w": torch.ones(4)})
