"""A real run's acceptance, step by step, for the speed benchmark to replay (``generate(accept_per_step=trace)``).

Issue 24's speedup at the 8B shape needs a drafter that accepts like a trained one, and there is no trained 8B drafter:
the benchmark's random drafters are forced to accept either a fixed count a step or, with a trace, the counts a real
run accepted, in its order (``benchmarks/decode_speed.py --traces``). A trace is read from what ``python -m eval``
writes, every turn's ``stats.accepted_per_step`` joined in file order:

- ``results.json`` (``mtbench`` / ``prompts``) or a sweep cell (``cells/*.json``): ``{"config", "summary", "records"}``;
- a partial file (``partial/*.jsonl``): one record a line (a line a kill cut off, which eval decoded again, skipped);
- any of them gzipped (``.gz``), as ``benchmarks/results/`` keeps them;
- the compact copies under ``benchmarks/results/``: ``{"config", "summary", "accepted_per_step_by_turn"}``.

A tree run's counts are refused where its config says it drafted trees: the replay drafts chains, whose verify is
cheaper than a tree's, so a tree's acceptance would flatter the chain's speed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from common.json_file import read_eval_text


@dataclass
class AcceptanceTrace:
    path: str
    counts: list[int]  # accepted drafts, step by step, every turn's steps in file order
    block_size: int | None  # the run's drafts a step + 1 (None where the file does not say)
    turns: int

    @property
    def tau(self) -> float:
        """Mean over the trace's steps of (accepted + 1): the run's pooled τ."""
        return sum(c + 1 for c in self.counts) / len(self.counts)

    def spread(self, steps: int) -> list[int]:
        """About ``steps`` of the counts (at least that many), taken evenly across the whole trace (every m-th step): a
        benchmark run shorter than the trace replays the whole run's mix of steps, not its first turn's (a turn's
        acceptance runs in streaks: a repetitive answer accepts whole blocks for dozens of steps)."""
        every = max(1, len(self.counts) // max(1, steps))
        return self.counts[::every]


def _counts(where: str, value) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in value):
        raise ValueError(f"{where}: expected a list of accepted counts (integers >= 0), got {str(value)[:80]}")
    return value


def _from_records(path: str, records, where: str) -> tuple[list[list[int]], set[int]]:
    if not isinstance(records, list):
        raise ValueError(f"{path}: field '{where}' is {type(records).__name__}; expected a list of eval records")
    turns, blocks = [], set()
    for i, r in enumerate(records):
        stats = r.get("stats") if isinstance(r, dict) else None
        if not isinstance(stats, dict) or "accepted_per_step" not in stats:
            raise ValueError(f"{path}: {where}[{i}] has no stats.accepted_per_step; expected eval's records")
        turns.append(_counts(f"{path}: {where}[{i}].stats.accepted_per_step", stats["accepted_per_step"]))
        if isinstance(stats.get("block_size"), int):
            blocks.add(stats["block_size"])
    return turns, blocks


def read_acceptance_trace(path: str | Path) -> AcceptanceTrace:
    """The accepted counts of every turn in ``path`` (an eval output: see the module's docstring), in file order. A
    file that is none of those, a tree run's, or one with no steps raises ValueError naming the file and the field."""
    path = str(path)
    try:
        text = read_eval_text(path)  # committed cells are gzipped
    except OSError as e:
        raise ValueError(f"{path}: cannot read the trace ({e.strerror or e})") from None
    except (EOFError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a UTF-8 eval output ({type(e).__name__}); expected eval's results.json, a sweep cell "
                         "or a .jsonl of records (.gz for gzipped ones)") from None
    blocks: set[int] = set()
    config = None
    if path.removesuffix(".gz").endswith(".jsonl"):
        by_turn: dict = {}
        lines = text.splitlines()
        for n, line in enumerate(lines, 1):
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    if n < len(lines) and line.lstrip().startswith("{"):  # a record a kill cut off, the run resumed
                        continue  # after it: eval decoded that turn again (its read_partial drops the line too)
                    raise ValueError(f"{path}: line {n} is not valid JSON ({e.msg}); expected one eval record a line") from None
                # a partial file holds a turn again when its baseline is added or a resumed run decodes it again: the
                # last record of a (conversation, turn) stands, as eval's own read_partial takes it (each was counted)
                key = (str(record.get("id")), record.get("turn")) if isinstance(record, dict) and "turn" in record else n
                by_turn.pop(key, None)
                by_turn[key] = record
        turns, blocks = _from_records(path, list(by_turn.values()), "line")
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); expected eval's results.json, a sweep "
                             "cell or a .jsonl of records") from None
        if not isinstance(data, dict) or not ("records" in data or "accepted_per_step_by_turn" in data):
            raise ValueError(f"{path}: neither 'records' nor 'accepted_per_step_by_turn' at its top level; expected eval's "
                             "results.json, a sweep cell, or a compact copy of one")
        config = data.get("config")
        if "records" in data:
            turns, blocks = _from_records(path, data["records"], "records")
        else:
            by_turn = data["accepted_per_step_by_turn"]
            if not isinstance(by_turn, list):
                raise ValueError(f"{path}: field 'accepted_per_step_by_turn' is {type(by_turn).__name__}; expected a list of lists")
            turns = [_counts(f"{path}: accepted_per_step_by_turn[{i}]", t) for i, t in enumerate(by_turn)]
            by_position = (data.get("summary") or {}).get("acceptance_by_position")
            if isinstance(by_position, list):
                blocks = {len(by_position) + 1}
    # either tree option turns trees on (models.trees.tree_options): a run given --tree-tokens alone records tree_topk None
    tree_field = next((f for f in ("tree_topk", "tree_tokens") if isinstance(config, dict) and config.get(f) is not None), None)
    if tree_field is not None:
        raise ValueError(f"{path}: a tree run's acceptance (config.{tree_field}={config[tree_field]}); the replay drafts chains, "
                         "whose verify is cheaper than a tree's: give a chain run's records")
    if len(blocks) > 1:
        raise ValueError(f"{path}: records of block sizes {sorted(blocks)}; expected one run's (one drafter's) records")
    counts = [c for turn in turns for c in turn]
    if not counts:
        raise ValueError(f"{path}: no verify steps in {len(turns)} turns; expected a run's records with at least one step")
    block = blocks.pop() if blocks else None
    if block is not None and max(counts) >= block:
        raise ValueError(f"{path}: a step accepts {max(counts)} drafts, past the records' block size {block}")
    return AcceptanceTrace(path, counts, block, len(turns))
