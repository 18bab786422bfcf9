"""Profile one cached target forward (1 and 16 tokens) at a real layer shape with fewer layers:
where does a decode step's time go? ``python benchmarks/profile_target_forward.py --layers 4``"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.infer_speed import SHAPES  # noqa: E402
from models.target import CachedTarget  # noqa: E402
from benchmarks.measure import require_cuda  # noqa: E402
require_cuda(__doc__, __name__, flags=True)  # one line on a machine without a CUDA GPU

p = argparse.ArgumentParser()
p.add_argument("--shape", default="qwen3-8b")
p.add_argument("--layers", type=int, default=4)
p.add_argument("--context", type=int, default=8192)
p.add_argument("--backend", default="sdpa")
args = p.parse_args()

from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

config = Qwen3Config(**{**SHAPES[args.shape], "num_hidden_layers": args.layers})
with torch.device("cuda"):
    model = Qwen3ForCausalLM(config).to(torch.bfloat16).eval()
print("param dtype", next(model.parameters()).dtype, "layers", args.layers)
target = CachedTarget(model, [1], args.backend)
target.allocate(args.context + 32)
ids = torch.randint(100, 1000, (16,), device="cuda")
for n in (1, 16):
    for _ in range(3):
        target.forward(ids[:n], args.context)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        target.forward(ids[:n], args.context)
    torch.cuda.synchronize()
    print(f"{n} tokens: {(time.perf_counter() - t) / 10 * 1e3:.2f} ms")
from torch.profiler import ProfilerActivity, profile  # noqa: E402

with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    target.forward(ids[:1], args.context)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12))
