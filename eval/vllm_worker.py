"""vLLM behind a pipe: run by the vLLM environment's Python, never imported by the project.

    <vllm-venv>/bin/python eval/vllm_worker.py '{"target": ..., "drafter": ..., "method": "eagle3", ...}'

vLLM lives in its own environment (it pins its own torch and transformers), so ``eval/engines.py``
starts this file there and talks JSON lines: one request per stdin line
``{"prompt": [token ids], "max_new_tokens": n}``, one answer per stdout line ``{"tokens": [...],
"drafts": n, "draft_tokens": n, "accepted_per_pos": [...], "seconds": s}``, the acceptance read off
vLLM's own counters (``vllm:spec_decode_*``, ``LLM.get_metrics()``) before and after the request.
Only the standard library and vLLM are imported here.
"""

from __future__ import annotations

import json
import sys
import time


def counters(llm) -> dict:
    """vLLM's cumulative speculative-decoding counters."""
    out = {"drafts": 0, "draft_tokens": 0, "accepted_per_pos": []}
    for metric in llm.get_metrics():
        if metric.name == "vllm:spec_decode_num_drafts":
            out["drafts"] += metric.value
        elif metric.name == "vllm:spec_decode_num_draft_tokens":
            out["draft_tokens"] += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            out["accepted_per_pos"] = list(metric.values)
    return out


def main() -> None:
    config = json.loads(sys.argv[1])
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # vLLM's own prints must not corrupt the protocol
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    speculative = None
    if config.get("drafter"):
        speculative = {"method": config["method"], "model": config["drafter"], "num_speculative_tokens": config["num_speculative_tokens"]}
    llm = LLM(model=config["target"], speculative_config=speculative, dtype=config.get("dtype", "float32"),
              max_model_len=config["max_model_len"], enforce_eager=True, disable_log_stats=False, seed=0,
              max_num_seqs=1)
    print(json.dumps({"ready": True}), file=real_stdout, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        params = SamplingParams(temperature=0.0, max_tokens=request["max_new_tokens"], stop_token_ids=config.get("eos") or None,
                                detokenize=False)
        before = counters(llm) if speculative else None
        start = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=request["prompt"])], params, use_tqdm=False)[0]
        seconds = time.perf_counter() - start
        answer = {"tokens": list(out.outputs[0].token_ids), "seconds": seconds}
        if speculative:
            after = counters(llm)
            answer["drafts"] = after["drafts"] - before["drafts"]
            answer["draft_tokens"] = after["draft_tokens"] - before["draft_tokens"]
            prior = before["accepted_per_pos"] or [0] * len(after["accepted_per_pos"])
            answer["accepted_per_pos"] = [a - b for a, b in zip(after["accepted_per_pos"], prior)]
        print(json.dumps(answer), file=real_stdout, flush=True)


if __name__ == "__main__":
    main()
