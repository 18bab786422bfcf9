"""Probe: how far do the target's features on the same tokens move when a long filler document sits before them?

A sliding-window drafter reads the target's hidden states at ``--layers`` inside its window. If those states on the
same text differ behind a long prompt from what they are at prefill 0 (the only states a drafter trained on rows of at
most 2,048 tokens has read), the drafter drafts from features it never saw, whatever its window. For each of the first
``--questions`` MT-Bench questions this takes the target's own greedy answer at prefill 0 (``--answer-tokens``) and runs
the target over [prompt ; answer] with no filler and with each ``--fillers`` L tokens of the eval's filler document
(``infer.prompts.long_prompt_ids``, as ``python -m eval sweep --prefills L`` builds it), then compares the answer
tokens' states layer by layer. CPU, fp32:

    python benchmarks/probe_long_context_features.py --target ../shared/targets/qwen3-27m-sharegpt --layers 1 2 3 4 5 \\
        --questions 5 --fillers 2048 8192 32000

Columns: the mean cosine similarity of each layer's states behind L to the same states at prefill 0; their RMS over
the prefill-0 RMS; how often the target's argmax over the answer equals the answer's next token at prefill 0 (1.0 up to
float ties: it is the target's own greedy text) and behind L (the target's own predictions on the same text).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infer.prompts import long_prompt_ids, mt_bench  # noqa: E402
from models.builtin_targets import resolve_target_path  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--layers", type=int, nargs="+", required=True, help="decoder-layer ids (the drafter's target_layer_ids)")
    p.add_argument("--questions", type=int, default=5)
    p.add_argument("--fillers", type=int, nargs="+", default=[2048, 8192, 32000])
    p.add_argument("--answer-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    path = resolve_target_path(args.target)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    bad = [i for i in args.layers if not 0 <= i < model.config.num_hidden_layers]
    if bad:
        p.error(f"--layers {bad}: expected ids in 0 .. {model.config.num_hidden_layers - 1}")
    stats = {L: {"cos": [[] for _ in args.layers], "rms": [[] for _ in args.layers], "agree": [], "agree0": []} for L in args.fillers}

    @torch.no_grad()
    def states(prompt: list[int], answer: list[int]) -> tuple[list[torch.Tensor], float]:
        out = model(torch.tensor([prompt + answer]), output_hidden_states=True)
        n = len(answer)
        hidden = [out.hidden_states[i + 1][0, -n:] for i in args.layers]  # hidden_states[i + 1]: decoder layer i's output
        agree = (out.logits[0, -n - 1:-1].argmax(-1) == torch.tensor(answer)).float().mean().item()
        return hidden, agree

    for q, conversation in enumerate(mt_bench(args.questions)):
        t0 = time.perf_counter()
        prompt = long_prompt_ids(tokenizer, conversation.turns[0])
        with torch.no_grad():
            generated = model.generate(torch.tensor([prompt]), max_new_tokens=args.answer_tokens, do_sample=False)
        answer = generated[0, len(prompt):].tolist()
        base, agree0 = states(prompt, answer)
        for L in args.fillers:
            # the eval's filler for question q starts 997 * q tokens into the document (eval.runner)
            hidden, agree = states(long_prompt_ids(tokenizer, conversation.turns[0], L, 997 * q), answer)
            for j in range(len(args.layers)):
                stats[L]["cos"][j].append(F.cosine_similarity(base[j], hidden[j], dim=-1).mean().item())
                stats[L]["rms"][j].append((hidden[j].pow(2).mean().sqrt() / base[j].pow(2).mean().sqrt()).item())
            stats[L]["agree"].append(agree)
            stats[L]["agree0"].append(agree0)
        print(f"question {conversation.id}: {len(answer)} answer tokens, {time.perf_counter() - t0:.0f} s", flush=True)

    def mean(values):
        return sum(values) / len(values)

    names = " ".join(f"layer {i}" for i in args.layers)
    print(f"\n| filler tokens | cos to prefill 0: {names} | RMS / prefill 0: {names} | target argmax = answer: at 0 / behind the filler |")
    print("|---:|---|---|---|")
    for L in args.fillers:
        s = stats[L]
        print(f"| {L} | " + " ".join(f"{mean(c):.3f}" for c in s["cos"]) + " | " + " ".join(f"{mean(r):.3f}" for r in s["rms"])
              + f" | {mean(s['agree0']):.3f} / {mean(s['agree']):.3f} |")


if __name__ == "__main__":
    main()
