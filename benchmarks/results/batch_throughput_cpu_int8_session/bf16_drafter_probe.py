"""A probe, not kept: benchmarks/batch_throughput.py with the drafter loaded in bf16 on the CPU (the target in fp32).
    python bf16_drafter_probe.py --target ../shared/targets/qwen3-27m-sharegpt --drafter EXPORT --questions 16 \
        --max-new-tokens 128 --batch-sizes 1 8 --threads 2 --only drafter"""
import runpy
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
import infer.loading as loading  # noqa: E402

load = loading.load_drafter_model
loading.load_drafter_model = lambda path, config, dtype: load(path, config, torch.bfloat16)
sys.argv = ["batch_throughput.py"] + sys.argv[1:]
runpy.run_path(str(REPO / "benchmarks" / "batch_throughput.py"), run_name="__main__")
