"""The split-KV decode attention kernel (``swa_kernels/decode_attention.py``) against a softmax written out element by
element under the repo's one visibility rule (``swa_kernels.attention.aligned_visible``), and the static target's step
with it against the same step through the two-product path.

On the CPU the kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``, set before Triton compiles anything, so in
a child process), fp32 only: the interpreter multiplies bf16 tiles as raw bits. bf16 is checked on a GPU."""

from __future__ import annotations

import math
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


def reference(q, k, v, pos, n_tokens, scale, window):
    """q [B, Hkv, G*n, D] (rows (g, t)), k/v [B, Hkv, C, D] (slot = position): each row's softmax, key by key, in fp64."""
    b, h, rows, d = q.shape
    out = torch.zeros(b, h, rows, d, dtype=torch.float64)
    for i in range(b):
        for r in range(rows):
            q_pos = int(pos[i]) + r % n_tokens
            keys = [c for c in range(k.shape[2]) if aligned_visible(torch.tensor(q_pos), torch.tensor(c), True, window)]
            for j in range(h):
                w = torch.softmax(torch.stack([scale * (q[i, j, r].double() @ k[i, j, c].double()) for c in keys]), 0)
                out[i, j, r] = sum(wc * v[i, j, c].double() for wc, c in zip(w, keys))
    return out


CASES = [  # (rows B, KV heads, group G, tokens n, capacity C, head dim D, window)
    (2, 2, 4, 1, 300, 16, None),  # decode; several splits, rows at position 0 and in the middle
    (2, 1, 2, 5, 520, 32, None),  # a verify of 5 tokens, one row ending at the capacity
    (3, 1, 4, 3, 700, 16, 100),  # a window: keys before it are skipped
    (2, 1, 2, 6, 200, 16, 4),  # a window narrower than the new tokens
    (1, 2, 4, 16, 700, 16, None),  # 64 query rows: longer splits (KEYS_PER_ROW), the last ones past the row, empty
]


def run_cases(device: str, dtype: torch.dtype) -> list[float]:
    from swa_kernels.decode_attention import decode_attention

    errors = []
    for b, h, g, n, c, d, window in CASES:
        gen = torch.Generator().manual_seed(c)
        q, k, v = (torch.randn(shape, generator=gen).to(dtype) for shape in [(b, h, g * n, d), (b, h, c, d), (b, h, c, d)])
        pos = torch.tensor([0, 123, c - n][:b])
        want = reference(q, k, v, pos, n, d ** -0.5, window)
        got = decode_attention(q.to(device), k.to(device), v.to(device), pos.to(device), n, d ** -0.5, window)
        errors.append((got.cpu().double() - want).abs().max().item())
        # the new tokens' keys/values passed apart (the cache holds garbage there): the kernel writes them and reads them
        slots = pos[:, None] + torch.arange(n)  # [B, n]
        k_new = torch.stack([k[i, :, slots[i]] for i in range(b)])  # [B, Hkv, n, D]
        v_new = torch.stack([v[i, :, slots[i]] for i in range(b)])
        k_dev, v_dev = k.clone().to(device), v.clone().to(device)
        for i in range(b):
            k_dev[i, :, slots[i]] = 1e4
            v_dev[i, :, slots[i]] = -1e4
        got = decode_attention(q.to(device), k_dev, v_dev, pos.to(device), n, d ** -0.5, window,
                               k_new=k_new.to(device), v_new=v_new.to(device))
        errors.append((got.cpu().double() - want).abs().max().item())
        errors.append(max((k_dev.cpu() - k).abs().max().item(), (v_dev.cpu() - v).abs().max().item()))  # written back exactly
    return errors


CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    sys.path.insert(0, {tests!r})
    import torch
    from test_decode_attention import run_cases, static_step_difference
    from swa_kernels import decode_attention
    live = max(run_cases("cpu", torch.float32))  # the rule: live tiles only where the interpreter loops to a runtime bound
    decode_attention.LIVE_TILES = False  # every split's fixed tile count (older Tritons' interpreters)
    fixed = max(run_cases("cpu", torch.float32))
    decode_attention.LIVE_TILES = None
    print(decode_attention.live_tiles(torch.device("cpu")), max(live, fixed), static_step_difference("cpu", {qwen!r}),
          static_step_difference("cpu", {llama!r}))
""")


@pytest.mark.slow  # ~35 s: the interpreter runs every program of the grid in Python (the cases twice: both loops)
@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed (CPU torch wheels come without it; [dev] installs it)")
def test_split_kv_equals_a_softmax_written_out_in_the_interpreter(reference_target_path, tiny_llama3_path) -> None:
    child = CHILD.format(root=str(ROOT), tests=str(ROOT / "tests"), qwen=str(reference_target_path), llama=str(tiny_llama3_path))
    proc = run_interpreted(child, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    live, kernel_error, qwen_error, llama_error = proc.stdout.split()[-4:]
    kernel_error, qwen_error, llama_error = map(float, (kernel_error, qwen_error, llama_error))
    import triton

    assert live == str(tuple(map(int, triton.__version__.split(".")[:2])) >= (3, 9))  # which loop the cases ran first
    assert kernel_error < 1e-5
    assert qwen_error < 1e-4  # q/k norms and RoPE inside the kernel (Qwen3)
    assert llama_error < 1e-4  # RoPE only (Llama)


def static_step_difference(device: str, path: str) -> float:
    """A target's decode and verify steps, rows at different positions, split-KV (raw projections in: norms, RoPE and
    the cache writes in the kernel) against the products path: the largest logit or feature difference (fp32)."""
    from transformers import AutoModelForCausalLM

    from models.static_target import StaticTarget

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    ids = torch.randint(3, model.config.vocab_size, (2, 90), generator=torch.Generator().manual_seed(0)).to(device)
    worst = 0.0
    outputs = {}
    for attention in ("products", "split_kv"):
        target = StaticTarget(model, [1], capture=False, decode_attention=attention)
        target.allocate(100, batch=2)
        target.prefill(ids[0, :40], 0, 0)
        target.prefill(ids[1, :70], 1, 0)
        pos = torch.tensor([40, 70], device=device)
        outputs[attention] = [target.step(ids[:, 80:81], pos), target.step(ids[:, 80:86], pos + 1)]
    for (a_logits, a_feat), (b_logits, b_feat) in zip(outputs["products"], outputs["split_kv"]):
        worst = max(worst, (a_logits - b_logits).abs().max().item(), (a_feat - b_feat).abs().max().item())
    return worst


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_kv_on_the_gpu(dtype) -> None:
    assert max(run_cases("cuda", dtype)) < (1e-4 if dtype == torch.float32 else 2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_static_target_split_kv_on_the_gpu(reference_target_path, tiny_llama3_path) -> None:
    assert static_step_difference("cuda", str(reference_target_path)) < 1e-3
    assert static_step_difference("cuda", tiny_llama3_path) < 1e-3


def test_pass_one_tiling_by_query_rows(monkeypatch) -> None:
    """A one-token step keeps two loads in flight, the 16-token verify's 64 rows per KV head three (measured,
    ``benchmarks/attention_tilings.py``); a benchmark's override wins over both; split sizes are whole tiles."""
    from swa_kernels import decode_attention as da

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    monkeypatch.setattr(da, "_hopper", lambda index: True)
    assert da.tiling_for(4, cuda) == da.FEW_ROWS and da.tiling_for(da.MANY_ROWS_FROM - 1, cuda) == da.FEW_ROWS
    assert da.tiling_for(64, cuda) == da.MANY_ROWS and da.MANY_ROWS.num_stages == 3 and da.FEW_ROWS.num_stages == 2
    assert da.tiling_for(64, cpu) == da.FEW_ROWS  # the interpreter
    monkeypatch.setattr(da, "_hopper", lambda index: False)  # measured on Hopper only: other GPUs keep two stages
    assert da.tiling_for(64, cuda) == da.FEW_ROWS
    monkeypatch.setattr(da, "TILING", da.Tiling(block_n=32, num_warps=4, num_stages=3))
    assert da.tiling_for(4, cuda) == da.tiling_for(64, cpu) == da.Tiling(32, 4, 3)
    # the splits at Qwen3-8B's 8 KV heads on a 132-SM GPU, as benchmarks/attention_split_sizes.py measured them: a verify's
    # 64 rows read 1024 keys a split at 32K (16 a row), 512 at 8K and 128 at 1K (the one-wave cap); 4 rows keep 512
    monkeypatch.setattr(da, "_num_sms", lambda index: 132)
    assert [da.split_size(c, 8, cuda, 64) for c in (33040, 8464, 1296)] == [1024, 512, 128]
    assert da.split_size(33040, 8, cuda, 4) == 512
    for rows in (4, 64):
        assert da.split_size(33040, 8, torch.device("cpu"), rows, 32) % 32 == 0
        assert da.split_size(33040, 8, torch.device("cpu"), rows) % da.BLOCK_N == 0
    # DFlash's block attention (equal splits): its one wave at most one program an SM, where ceil gave 17 splits (136
    # programs) of a 2,080-key ring and of an 8K full layer; at 32K the 1024-key cap binds either way
    for keys, ceil_size, equal_size in ((2080, 128, 192), (8480, 512, 576), (33056, 1024, 1024)):
        assert da.split_size(keys, 8, cuda, 64) == ceil_size
        size = da.split_size(keys, 8, cuda, 64, equal_splits=True)
        assert size == equal_size and (math.ceil(keys / size) * 8 <= 132 or size == 1024)
    assert da.pass1_grid(8, 17) == (8, 17)  # heads fastest: the last programs launched are the last splits
