"""vLLM behind a pipe: run by the vLLM environment's Python, never imported by the project.

    <vllm-venv>/bin/python infer/vllm_worker.py '{"target": ..., "drafter": ..., "method": "eagle3", ...}'

vLLM lives in its own environment (it pins its own torch and transformers), so ``infer/serving.py``
starts this file there and talks JSON lines. After start-up one line ``{"ready": true}`` or
``{"error": "..."}`` (vLLM refused the model: its own message, one line). Then one request per stdin
line, one answer per stdout line:

    {"prompts": [[ids], ...], "max_new_tokens": n, "temperature": t, "top_p": p, "top_k": k, "seed": s[, "seeds": [s, ...]]}
    -> {"outputs": [[ids], ...], "seconds": s, "drafts": n, "draft_tokens": n, "accepted_per_pos": [...]}

The acceptance is read off vLLM's own counters (``vllm:spec_decode_*``, ``LLM.get_metrics()``) before
and after the request, so it is the request's own when the request holds one prompt. Only the
standard library and vLLM are imported here.
"""

from __future__ import annotations

import json
import os
import sys
import time


SPEC_DECODE_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                        "vllm:spec_decode_num_accepted_tokens_per_pos")


def counters(llm) -> dict:
    """vLLM's cumulative speculative-decoding counters."""
    out = {"drafts": 0, "draft_tokens": 0, "accepted_per_pos": []}
    seen = set()
    for metric in llm.get_metrics():
        seen.add(metric.name)
        if metric.name == "vllm:spec_decode_num_drafts":
            out["drafts"] += metric.value
        elif metric.name == "vllm:spec_decode_num_draft_tokens":
            out["draft_tokens"] += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            out["accepted_per_pos"] = list(metric.values)
    missing = sorted(set(SPEC_DECODE_COUNTERS) - seen)
    if missing:  # a vLLM that spells them otherwise: τ would read 0, silently
        version = getattr(sys.modules.get("vllm"), "__version__", "(version unknown)")
        raise RuntimeError(f"vLLM {version}: LLM.get_metrics() has no {missing} (read as in vLLM 0.32.0); its spec_decode metrics "
                           f"here: {sorted(n for n in seen if 'spec_decode' in n)}")
    return out


def one_line(error: BaseException) -> str:
    """The error on one line: pydantic's multi-line validation errors keep their reason (the middle lines)."""
    lines = [line.strip() for line in f"{type(error).__name__}: {error}".splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("For further information")]
    return " | ".join(lines)[:800]


def main() -> None:
    config = json.loads(sys.argv[1])
    # The protocol keeps the real stdout to itself: file descriptor 1 becomes stderr for everything else
    # (vLLM's prints, C++ logging, the engine-core process it starts, which inherits the descriptor).
    real_stdout = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def answer(obj: dict) -> None:
        print(json.dumps(obj), file=real_stdout, flush=True)

    try:
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        speculative = None
        if config.get("drafter"):
            speculative = {"method": config["method"], "model": config["drafter"],
                           "num_speculative_tokens": config["num_speculative_tokens"]}
        llm = LLM(model=config["target"], speculative_config=speculative, dtype=config.get("dtype", "float32"),
                  max_model_len=config["max_model_len"], enforce_eager=True, disable_log_stats=False, seed=0,
                  max_num_seqs=config.get("max_num_seqs", 1))
    except Exception as e:  # noqa: BLE001 - whatever vLLM refuses, the client gets its one line
        answer({"error": one_line(e)})
        return
    answer({"ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        def params_of(seed):
            return SamplingParams(temperature=request.get("temperature", 0.0), top_p=request.get("top_p", 1.0),
                                  top_k=request.get("top_k", 0), seed=seed, max_tokens=request["max_new_tokens"],
                                  stop_token_ids=config.get("eos") or None, detokenize=False)

        # "seeds": one per prompt (sampled replies to a repeated prompt differ); else "seed" for every prompt
        params = [params_of(s) for s in request["seeds"]] if "seeds" in request else params_of(request.get("seed"))
        before = counters(llm) if speculative else None
        start = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in request["prompts"]], params, use_tqdm=False)
        reply = {"outputs": [list(o.outputs[0].token_ids) for o in outs], "seconds": time.perf_counter() - start}
        if speculative:
            after = counters(llm)
            reply["drafts"] = after["drafts"] - before["drafts"]
            reply["draft_tokens"] = after["draft_tokens"] - before["draft_tokens"]
            prior = before["accepted_per_pos"] or [0] * len(after["accepted_per_pos"])
            reply["accepted_per_pos"] = [a - b for a, b in zip(after["accepted_per_pos"], prior)]
        answer(reply)


if __name__ == "__main__":
    main()
