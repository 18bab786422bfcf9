"""Prompt lookup's τ two ways, replayed exactly from an eval's own records: over every step of the loop (the project's
τ: a step that found no n-gram match decodes one token and counts as accepted 0), and over the steps that proposed
drafts (how vLLM's counters count it: a request without drafts in a step is no draft, so its mean acceptance length
leaves those steps out).

    python benchmarks/pld_drafting_steps.py --target TARGET RESULTS/partial/pld_prefill-0.jsonl.gz [--prefill-tokens 0]
        [--prompts FILE] [--drafts K]

Each record's prompt is rebuilt as the eval built it (``eval.runner.turn_prompt``: the turns, the model's earlier
answers, the filler of ``--prefill-tokens``) and checked against the record's prompt length; prompt lookup is then
replayed over prompt + output (``infer.prompt_lookup.NgramIndex``, the loop's own lookup): at each step its drafts, the
accepted count (the drafts' longest match with the output: a greedy run's output is the target's own), and whether it
proposed any. Every replayed step's accepted count must equal the record's (``accepted_per_step``): the replay is the
run, not a model of it. Needs the tokenizer only (no model, no GPU).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infer.prompt_lookup import NgramIndex, PromptLookupDrafter  # noqa: E402

LOOKUP = PromptLookupDrafter()  # the n-gram sizes the loop's prompt lookup uses (the eval builds it with the defaults)


def replay(prompt: list[int], output: list[int], k: int) -> list[tuple[int, int]]:
    """(accepted, drafts proposed) per verify step of prompt lookup over ``prompt`` + ``output`` (greedy: the output is the
    target's, so a draft is accepted while it matches it); the last step's accepted count cut at the output's end."""
    index = NgramIndex(LOOKUP.min_ngram, LOOKUP.max_ngram)
    index.extend(prompt)
    steps, pos = [], 1  # output[0] comes from the prefill
    while pos < len(output):
        index.extend(output[len(index.tokens) - len(prompt):pos - 1])  # every token before the anchor token
        drafts = index.drafts_after(output[pos - 1], k)
        accepted = 0
        while accepted < len(drafts) and pos + accepted < len(output) and drafts[accepted] == output[pos + accepted]:
            accepted += 1
        accepted = min(accepted, len(output) - pos - 1)  # the token after the accepted drafts is the step's own
        steps.append((accepted, len(drafts)))
        pos += accepted + 1
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", nargs="+", type=Path, help="an eval's prompt lookup records (partial/pld_prefill-N.jsonl[.gz])")
    parser.add_argument("--target", required=True, help="the target folder (its tokenizer and chat template)")
    parser.add_argument("--prompts", help="the eval's --prompts file (default: MT-Bench, as `python -m eval mtbench`)")
    parser.add_argument("--prefill-tokens", type=int, default=0)
    parser.add_argument("--drafts", type=int, help="prompt lookup's drafts a step (default: each record's block_size - 1, as it ran)")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from eval.runner import read_partial, tau_over_drafting_steps, turn_prompt
    from infer.prompts import mt_bench, prompts_file

    tokenizer = AutoTokenizer.from_pretrained(args.target)
    conversations = prompts_file(args.prompts) if args.prompts else mt_bench()
    print(f"| records | turns | steps | steps without drafts | τ, every step | τ, steps with drafts | replay = record |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for path in args.records:
        done = read_partial(path)  # the eval's own reader: (id, turn) -> record, .gz read, a line a kill cut skipped
        all_steps, mismatched, turns = [], [], 0
        for index, conv in enumerate(conversations):
            answers = []
            for turn in range(len(conv.turns)):
                record = done.get((str(conv.id), turn + 1))
                if record is None:
                    break
                prompt = turn_prompt(tokenizer, conv, index, turn, answers + [""] * (len(conv.turns) - turn), args.prefill_tokens)
                stats = record["stats"]
                steps = replay(prompt, list(record["output_ids"]), args.drafts or int(stats["block_size"]) - 1)
                if len(prompt) != int(record["prompt_tokens"]) or [a for a, _ in steps] != list(stats["accepted_per_step"]):
                    mismatched.append(f"{conv.id}/{turn + 1}")
                all_steps += steps
                turns += 1
                answers.append(record["output_text"])
        accepted, without = [a for a, _ in all_steps], sum(d == 0 for _, d in all_steps)
        tau_all = sum(a + 1 for a in accepted) / max(len(accepted), 1)
        tau_drafting = tau_over_drafting_steps(accepted, without) or 0.0  # the eval's summary's own formula
        same = "yes" if not mismatched else f"**no: {len(mismatched)} turns** ({', '.join(mismatched[:5])})"
        print(f"| {path} | {turns} | {len(accepted)} | {without} ({without / max(len(accepted), 1):.1%}) "
              f"| {tau_all:.3f} | {tau_drafting:.3f} | {same} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
