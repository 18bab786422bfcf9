"""Run a prompt set through the speculative loop (and optionally the autoregressive baseline).

Multi-turn: turn t's prompt is the chat so far, the model's own earlier answers included (as
MT-Bench's second turn is meant to be asked). Long prefill: the first user message carries a filler
document of ``prefill_tokens`` tokens before the question (``infer/prompts.py``; the document for
question i starts 997*i tokens into the bundled ShareGPT sample), identical for every window.
"""

from __future__ import annotations

import json
from pathlib import Path

from tqdm import tqdm

from eval.prompt_sets import Conversation
from models.dflash import DFlashDrafter
from models.eagle3 import Eagle3Drafter
from infer.generate import generate, pooled_acceptance
from infer.prompts import chat_ids, first_turn_content
from models.sampling import SamplingConfig
from models.target import CachedTarget


def max_positions(target: CachedTarget) -> int:
    return int(getattr(target.model.config.get_text_config(), "max_position_embeddings", 1 << 30))


def read_partial(path: Path | None) -> dict[tuple[str, int], dict]:
    """Records a previous run of the same cell finished: (conversation id, turn) -> record. A line cut off
    by a kill (the last one) is dropped."""
    done = {}
    if path is not None and path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            done[(str(record["id"]), record["turn"])] = record
    return done


def run_conversations(target: CachedTarget, drafter: DFlashDrafter | Eagle3Drafter | None, tokenizer, conversations: list[Conversation], *,
                      prefill_tokens: int, sampling: SamplingConfig, max_new_tokens: int, eos_token_ids, baseline: bool,
                      desc: str = "eval", partial: Path | None = None, engine=None) -> list[dict]:
    """One record per (conversation, turn) with the tokens, the accepted counts and the timings.

    ``engine``: an ``eval.engines.VllmEngine`` decoding every turn in place of our loop (greedy; the
    baseline, when asked for, stays our target alone: the lossless check).

    ``partial``: a JSONL file each finished turn is appended to as it ends (flushed); turns already there
    (a rerun after a kill or Ctrl-C) are read back instead of decoded again, their answers feeding the
    later turns as before."""
    limit = max_positions(target)
    records = []
    done = read_partial(partial)
    if partial is not None:
        partial.parent.mkdir(parents=True, exist_ok=True)
    sink = open(partial, "a", encoding="utf-8") if partial is not None else None
    try:
        for index, conv in enumerate(tqdm(conversations, desc=desc, unit="q")):
            records += run_turns(target, drafter, tokenizer, conv, index, prefill_tokens, sampling, max_new_tokens, eos_token_ids,
                                 baseline, limit, done, sink, engine)
    finally:
        if sink is not None:
            sink.close()
    return records


def run_turns(target, drafter, tokenizer, conv: Conversation, index: int, prefill_tokens: int, sampling: SamplingConfig,
              max_new_tokens: int, eos_token_ids, baseline: bool, limit: int, done: dict, sink, engine=None) -> list[dict]:
    """One conversation's turns; turn t's prompt holds the model's own answers to turns < t."""
    records = []
    messages = []
    for turn, question in enumerate(conv.turns):
        content = first_turn_content(tokenizer, question, prefill_tokens, offset=997 * index) if turn == 0 else question
        messages.append({"role": "user", "content": content})
        if (str(conv.id), turn + 1) in done:  # finished by an earlier run of this cell
            records.append(done[(str(conv.id), turn + 1)])
            messages.append({"role": "assistant", "content": records[-1]["output_text"]})
            continue
        prompt = chat_ids(tokenizer, messages)
        if len(prompt) + max_new_tokens > limit:
            raise ValueError(f"question {conv.id} turn {turn + 1}: {len(prompt)} prompt + {max_new_tokens} new tokens exceed the "
                             f"target's max_position_embeddings={limit}; lower --prefill-tokens or --max-new-tokens")
        if engine is not None:
            tokens, stats = engine.generate(prompt, max_new_tokens)
        else:
            out = generate(target, drafter, prompt, max_new_tokens, sampling, eos_token_ids)
            tokens, stats = out.tokens, out.stats.to_dict()
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        record = {"id": conv.id, "category": conv.category, "turn": turn + 1, "prompt_tokens": len(prompt),
                  "question": question, "output_ids": tokens, "output_text": text, "stats": stats}
        if baseline and (drafter is not None or engine is not None):
            base = generate(target, None, prompt, max_new_tokens, sampling, eos_token_ids)
            record["baseline_stats"] = base.stats.to_dict()
            record["same_as_baseline"] = base.tokens == tokens
        records.append(record)
        if sink is not None:
            sink.write(json.dumps(record) + "\n")
            sink.flush()
        messages.append({"role": "assistant", "content": text})
    return records


def summarize(records: list[dict]) -> dict:
    """Pooled over every verify step of every turn: τ, acceptance by position, speed, latency, speedup."""
    accepted = [a for r in records for a in r["stats"]["accepted_per_step"]]
    block = records[0]["stats"]["block_size"] if records else 1
    new_tokens = sum(r["stats"]["new_tokens"] for r in records)
    decode_s = sum(r["stats"]["decode_s"] for r in records)
    tau, acceptance = pooled_acceptance(accepted, block)
    summary = {
        "turns": len(records),
        "steps": len(accepted),
        "tau": tau,
        "acceptance_by_position": acceptance,
        "new_tokens": new_tokens,
        "tokens_per_s": new_tokens / decode_s if decode_s else 0.0,
        "mean_prompt_tokens": sum(r["prompt_tokens"] for r in records) / max(len(records), 1),
        "mean_prefill_s": sum(r["stats"]["prefill_s"] for r in records) / max(len(records), 1),
        "mean_latency_s": sum(r["stats"]["prefill_s"] + r["stats"]["decode_s"] for r in records) / max(len(records), 1),
        "time_split": {k: sum(r["stats"][f"{k}_s"] for r in records) / decode_s if decode_s else 0.0 for k in ("draft", "verify", "other")},
    }
    base = [r["baseline_stats"] for r in records if "baseline_stats" in r]
    summary["engine"] = records[0]["stats"].get("engine", "ours") if records else "ours"
    if base and summary["engine"] != "ours":  # another engine's speed over our baseline's is no speedup: only the lossless check
        summary["same_as_baseline"] = sum(r["same_as_baseline"] for r in records) / len(records)
    elif base:
        base_tps = sum(b["new_tokens"] for b in base) / sum(b["decode_s"] for b in base)
        summary["baseline_tokens_per_s"] = base_tps
        summary["speedup"] = summary["tokens_per_s"] / base_tps
        summary["same_as_baseline"] = sum(r["same_as_baseline"] for r in records) / len(records)
    by_category: dict[str, list[int]] = {}
    for r in records:
        by_category.setdefault(r["category"] or "-", []).extend(r["stats"]["accepted_per_step"])
    summary["tau_by_category"] = {c: sum(a + 1 for a in acc) / max(len(acc), 1) for c, acc in sorted(by_category.items())}
    return summary
