"""A scratch diagnostic, run from .whl/ on the device (kept here as the record of call 3, run3.sh): where DFlash's block attention spends its time, one layer at 8K (sliding W=2048 ring
and full cache), H200. Variants of swa_kernels/block_attention.py's source patched in text, each timed with 20 calls
captured in one graph (benchmarks.measure.captured_us; the keys L2-resident across calls)."""
import importlib.util, inspect, sys, re
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch
import swa_kernels.block_attention as ba
from swa_kernels.decode_attention import Rope
from benchmarks.measure import captured_us

SRC = inspect.getsource(ba)

def variant(name, *subs, merge=True):
    s = SRC
    for a, b in subs:
        assert a in s, (name, a)
        s = s.replace(a, b)
    if not merge:
        a = "    merge_splits(o_part, m_part, l_part, out, n,"
        assert a in s
        s = s.replace(a, "    if False: merge_splits(o_part, m_part, l_part, out, n,")
    s = s.replace('"swa_drafters::dflash_block_attention"', f'"swa_diag::{name}"')
    path = Path(f"/tmp/ba_{name}.py"); path.write_text(s)
    spec = importlib.util.spec_from_file_location(f"ba_{name}", path); mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod); return mod

LOOP = "        for i in range(TILES):"
HELD = "            held = tl.load(SLOT_POS + b * sp_b + offs_n, mask=in_context, other=-1)"
variants = {
    "base": variant("base"),
    "pass1": variant("pass1", merge=False),
    "pass1_noslots": variant("pass1_noslots", (HELD, "            held = offs_n + anchor - context_slots"), merge=False),
    "pass1_1tile": variant("pass1_1tile", (LOOP, "        for i in range(1):"), merge=False),
    "pass1_0tiles": variant("pass1_0tiles", (LOOP, "        for i in range(0):"), merge=False),
}
HQ, HKV, D, BLOCK, W = 32, 8, 128, 16, 2048
g = torch.Generator(device="cuda").manual_seed(0)
anchor = 8192
print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__}")
for window in (W, None):
    capacity = anchor + 256 + BLOCK
    slots = capacity if window is None else W + BLOCK
    k, v = (torch.randn(1, HKV, slots + BLOCK, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    q = torch.randn(1, BLOCK, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k_new, v_new = (torch.randn(1, BLOCK, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    held = torch.arange(anchor, device="cuda")
    slot_pos = torch.full((1, slots), -1, dtype=torch.long, device="cuda"); slot_pos[0, held[-slots:] % slots] = held[-slots:]
    at = torch.tensor([anchor], device="cuda")
    pos = torch.arange(capacity + BLOCK, device="cuda", dtype=torch.float32)
    freq = 1e6 ** (-torch.arange(0, D, 2, device="cuda", dtype=torch.float32) / D)
    ang = torch.cat([pos[:, None] * freq] * 2, -1)
    w = torch.ones(D, device="cuda", dtype=torch.bfloat16)
    rope = Rope(ang.cos().bfloat16(), ang.sin().bfloat16(), w, w, 1e-6)
    row = []
    for name, mod in variants.items():
        for label, kw in (("raw", dict(k_new=k_new, v_new=v_new, rope=rope)), ("cache", {})):
            for stages in (2,):
                f = lambda: mod._launch(q, k, v, slot_pos, at, D ** -0.5, window is not None, window, None, 4, stages, **kw)
                row.append(f"{name}/{label} {captured_us(f):.1f}")
    if window is None:  # the target's verify kernel over the same keys: 16 tokens and 1 token, raw, at the anchor
        from swa_kernels.decode_attention import decode_attention
        kc, vc = k[:, :, :capacity].contiguous(), v[:, :, :capacity].contiguous()
        for n in (16, 1):
            f = lambda: decode_attention(q[:, :n], kc, vc, at, n, D ** -0.5, None, k_new[:, :n], v_new[:, :n], rope)
            row.append(f"verify{n} {captured_us(f):.1f}")
    print(f"{'sliding' if window else 'full'} ({slots} slots): " + " | ".join(row), flush=True)
