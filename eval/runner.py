"""Run a prompt set through the speculative loop (and optionally the autoregressive baseline).

Multi-turn: turn t's prompt is the chat so far, the model's own earlier answers included (as
MT-Bench's second turn is meant to be asked). Long prefill: the first user message carries a filler
document of ``prefill_tokens`` tokens before the question (``infer/prompts.py``; the document for
question i starts 997*i tokens into the bundled ShareGPT sample), identical for every window.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import sys
import time
import traceback
from pathlib import Path

import torch
from tqdm import tqdm

from common.json_file import read_eval_text

from infer.prompts import Conversation
from models.dflash import DFlashDrafter
from models.eagle3 import Eagle3Drafter
from infer.generate import generate, pooled_acceptance, trees_on_rows
from infer.loading import sync
from infer.prompts import chat_ids, first_turn_content
from models.sampling import SamplingConfig
from models.target import CachedTarget


def max_positions(target: CachedTarget) -> int:
    return int(getattr(target.model.config.get_text_config(), "max_position_embeddings", 1 << 30))


def check_context_fits(tokenizer, conversations: list[Conversation], prefills: list[int], max_new_tokens: int, limit: int) -> None:
    """Refuse, before anything is decoded, a prefill behind which some conversation's last turn may not fit the target's
    ``limit`` positions: its prompt with each earlier answer counted at ``max_new_tokens`` (+ 16 for re-tokenising and the
    template), plus ``max_new_tokens`` new tokens. A sweep would otherwise stop at that question after hours of cells
    (``run_turns`` still checks each real prompt: answers that end early can only need less)."""

    def need(index: int, prefill: int) -> int:
        conv = conversations[index]
        return last_turn_tokens(tokenizer, conv, index, prefill) + (len(conv.turns) - 1) * (max_new_tokens + 16) + max_new_tokens

    for prefill in sorted(set(prefills), reverse=True):
        needs = [need(i, prefill) for i in range(len(conversations))]
        if max(needs) <= limit:
            continue
        worst = max(range(len(needs)), key=needs.__getitem__)
        # the largest prefill that fits: the filler's tokens add one to one, up to a token or two where it meets the question
        room = [limit - (n - prefill) for n in needs]
        fits = max(min(room), 0)
        while fits > 0 and any(need(i, fits) > limit for i, r in enumerate(room) if r <= fits + 8):
            fits -= 1
        conv = conversations[worst]
        raise ValueError(f"question {conv.id} turn {len(conv.turns)} may need {needs[worst]} positions behind {prefill} prefill tokens "
                         f"(earlier answers counted at {max_new_tokens} tokens, plus {max_new_tokens} new ones): more than the target's "
                         f"max_position_embeddings={limit}; every question fits behind {fits} prefill tokens "
                         "(lower --prefill-tokens/--prefills, --max-new-tokens or --num-questions)")


def read_partial(path: Path | None) -> dict[tuple[str, int], dict]:
    """Records a previous run of the same cell finished: (conversation id, turn) -> record. A line cut off
    by a kill is dropped (its turn is decoded again); a whole line of another shape is refused, naming it."""
    done = {}
    if path is not None and path.exists():
        text = read_eval_text(path)
        for number, line in enumerate(text.splitlines(), 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            missing = [k for k in PARTIAL_KEYS if k not in record] if isinstance(record, dict) else list(PARTIAL_KEYS)
            if missing or not isinstance(record["turn"], int):
                raise ValueError(f"{path}:{number}: not a finished turn's record (expected an object with "
                                 f"{', '.join(PARTIAL_KEYS)}); delete the file to decode the cell again")
            done[(str(record["id"]), record["turn"])] = record
    return done


PARTIAL_KEYS = ("id", "turn", "output_ids", "output_text", "stats")


def open_partial(path: Path):
    """``path`` for appending records; a line a kill cut off is ended first, so the next record starts its own line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sink = open(path, "a", encoding="utf-8")
    if sink.tell() > 0:
        with open(path, "rb") as f:
            f.seek(-1, 2)
            if f.read(1) != b"\n":
                sink.write("\n")
    return sink


def run_conversations(target: CachedTarget, drafter: DFlashDrafter | Eagle3Drafter | None, tokenizer, conversations: list[Conversation], *,
                      prefill_tokens: int, sampling: SamplingConfig, max_new_tokens: int, eos_token_ids, baseline: bool,
                      desc: str = "eval", partial: Path | None = None, engine=None, batch_size: int = 1,
                      reuse_prefixes: bool = True, workers: int = 1, warmup: bool = False) -> list[dict]:
    """One record per (conversation, turn) with the tokens, the accepted counts and the timings.

    ``engine``: an ``eval.engines.VllmEngine`` decoding every turn in place of our loop (greedy; the
    baseline, when asked for, stays our target alone: the lossless check).

    ``partial``: a JSONL file each finished turn is appended to as it ends (flushed); turns already there
    (a rerun after a kill or Ctrl-C) are read back instead of decoded again, their answers feeding the
    later turns as before.

    ``reuse_prefixes``: a turn's prompt is prefilled only past what the target's cache holds from the turn before (its
    earlier turns and answers; the target alone, prompt lookup and the static drafters, ``infer.generate.reusable_prefix``), at every batch
    size.

    ``workers``: batched on the CPU, the batch's rows split over that many forked one-thread processes (``cpu_workers``).

    A static drafter's trees on a captured target (a GPU) run through the batched runner at batch 1 too (one row, one
    capacity for the cell: the tree step is compiled and captured once, ``infer.generate.trees_on_rows``); on the CPU
    turn by turn, where each turn's caches are as long as it needs and the baseline reuses the turn's prefill.

    ``warmup``: untimed, so the speeds are steady-state on a GPU (eval turns it on there): the batched runner first runs
    a few steps of its pass's shapes (``warm_up``), the turn-by-turn path the cell's first turn once (``warm_up_turn``)."""
    if engine is None and (batch_size > 1 or (trees_on_rows(drafter) and getattr(target, "capture", False))):
        return run_conversations_batched(target, drafter, tokenizer, conversations, prefill_tokens=prefill_tokens, sampling=sampling,
                                         max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids, baseline=baseline, desc=desc,
                                         partial=partial, batch_size=batch_size, reuse_prefixes=reuse_prefixes, workers=workers,
                                         warmup=warmup)
    limit = max_positions(target)
    records = []
    done = read_partial(partial)
    sink = open_partial(partial) if partial is not None else None
    cache = [] if reuse_prefixes else None  # what the target's cache holds after the last generation (generate's cache_ids)
    todo_turns = turns_left(conversations, done)
    warm_s = warm_up_turn(target, drafter, tokenizer, conversations[0], prefill_tokens, sampling, max_new_tokens, eos_token_ids,
                          baseline, limit) if warmup and engine is None and todo_turns else 0.0
    try:
        for index, conv in enumerate(tqdm(conversations, desc=desc, unit="q")):
            fresh = run_turns(target, drafter, tokenizer, conv, index, prefill_tokens, sampling, max_new_tokens, eos_token_ids,
                              baseline, limit, done, sink, engine, cache)
            for r in fresh:
                if (str(r["id"]), r["turn"]) not in done:
                    r["stats"]["warmup_s"] = warm_s
            records += fresh
    finally:
        if sink is not None:
            sink.close()
    return records


def turns_left(conversations: list[Conversation], done: dict) -> bool:
    """Whether any turn of ``conversations`` is not among ``done`` (``read_partial``'s): a rerun with nothing left warms nothing."""
    return any((str(c.id), t + 1) not in done for c in conversations for t in range(len(c.turns)))


def warm_up_turn(target, drafter, tokenizer, conv: Conversation, prefill_tokens: int, sampling: SamplingConfig, max_new_tokens: int,
                 eos_token_ids, baseline: bool, limit: int) -> float:
    """The turn-by-turn path's warm-up: the cell's first turn decoded once, untimed, by the drafter (and the target alone
    when a baseline runs), so its caches' shapes are compiled and captured before the first timed turn (later turns
    mostly fit the same buffers: ``StaticTarget.allocate`` keeps them while they are at most twice what is asked). The
    first timed turn reuses nothing of it (the runner's cache record starts empty). Returns its seconds."""
    prompt = turn_prompt(tokenizer, conv, 0, 0, [""] * len(conv.turns), prefill_tokens)
    if len(prompt) + max_new_tokens > limit:
        return 0.0  # the turn itself reports the error
    t0 = time.perf_counter()
    for d in [drafter] + ([None] if baseline and drafter is not None else []):
        generate(target, d, prompt, max_new_tokens, sampling, eos_token_ids)
    sync(target.device)
    return time.perf_counter() - t0


def run_turns(target, drafter, tokenizer, conv: Conversation, index: int, prefill_tokens: int, sampling: SamplingConfig,
              max_new_tokens: int, eos_token_ids, baseline: bool, limit: int, done: dict, sink, engine=None,
              cache: list[int] | None = None) -> list[dict]:
    """One conversation's turns; turn t's prompt holds the model's own answers to turns < t. ``cache`` (None: no reuse)
    holds the token ids the target's cache holds, updated in place after each generation."""

    def run(d, prompt):
        out = generate(target, d, prompt, max_new_tokens, sampling, eos_token_ids, cached_ids=cache)
        if cache is not None:
            cache[:] = out.cache_ids
        return out

    records = []
    messages = []
    for turn, question in enumerate(conv.turns):
        content = first_turn_content(tokenizer, question, prefill_tokens, offset=997 * index) if turn == 0 else question
        messages.append({"role": "user", "content": content})
        if (str(conv.id), turn + 1) in done:  # finished by an earlier run of this cell
            record = done[(str(conv.id), turn + 1)]
            if baseline and (drafter is not None or engine is not None) and "baseline_stats" not in record:
                # its baseline not run yet: the batched runner writes a turn after its drafter pass and again after the
                # baseline's, so a batched run killed between them, resumed at batch 1 (a speed setting: the same
                # folder), had turns without one (a KeyError in the summary, or no speedup, exit 0)
                base = run(None, chat_ids(tokenizer, messages))
                record = {**record, "baseline_stats": base.stats.to_dict(), "same_as_baseline": base.tokens == record["output_ids"]}
                if sink is not None:
                    sink.write(json.dumps(record) + "\n")
                    sink.flush()
            records.append(record)
            messages.append({"role": "assistant", "content": records[-1]["output_text"]})
            continue
        prompt = chat_ids(tokenizer, messages)
        if len(prompt) + max_new_tokens > limit:
            raise ValueError(f"question {conv.id} turn {turn + 1}: {len(prompt)} prompt + {max_new_tokens} new tokens exceed the "
                             f"target's max_position_embeddings={limit}; lower --prefill-tokens or --max-new-tokens")
        if engine is not None:
            tokens, stats = engine.generate(prompt, max_new_tokens)
        else:
            out = run(drafter, prompt)
            tokens, stats = out.tokens, out.stats.to_dict()
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        record = {"id": conv.id, "category": conv.category, "turn": turn + 1, "prompt_tokens": len(prompt),
                  "question": question, "output_ids": tokens, "output_text": text, "stats": stats}
        if baseline and (drafter is not None or engine is not None):
            base = run(None, prompt)
            record["baseline_stats"] = base.stats.to_dict()
            record["same_as_baseline"] = base.tokens == tokens
        records.append(record)
        if sink is not None:
            sink.write(json.dumps(record) + "\n")
            sink.flush()
        messages.append({"role": "assistant", "content": text})
    return records


def last_turn_tokens(tokenizer, conv: Conversation, index: int, prefill_tokens: int) -> int:
    """The tokens of the conversation's last prompt with every earlier answer empty: what a turn needs before its answers
    (``check_context_fits`` and the batched runner's capacity add room for those)."""
    turns = len(conv.turns)
    return len(turn_prompt(tokenizer, conv, index, turns - 1, [""] * turns, prefill_tokens))


def turn_prompt(tokenizer, conv: Conversation, index: int, turn: int, answers: list[str], prefill_tokens: int) -> list[int]:
    """Turn ``turn``'s prompt (0-based): the user turns up to it, the model's ``answers`` to the earlier ones between."""
    messages = []
    for t in range(turn + 1):
        question = conv.turns[t]
        messages.append({"role": "user", "content": first_turn_content(tokenizer, question, prefill_tokens, offset=997 * index) if t == 0 else question})
        if t < turn:
            messages.append({"role": "assistant", "content": answers[t]})
    return chat_ids(tokenizer, messages)


def cpu_workers(device, batch_size: int, threads: int | None, requested: int | None = None) -> int:
    """How many processes a batched CPU run splits its rows over (``--cpu-workers``; 1 = one process).

    Each worker is a forked process on one thread with its share of the rows and of the conversations: a batch-8 verify
    on 2 cores spends about a third of its step in small eager ops that one process runs one after another, and two
    one-thread processes run them side by side (prompt lookup on the reference target, 80 MT-Bench conversations, 2 cores:
    21.7 s against 25.7 s for one two-thread process; BENCHMARKS.md, issue 24). One thread each because GNU OpenMP's
    thread pool does not survive a fork: a forked child on 2 threads hung. Auto (None or 0): one worker per core when
    the batch gives every core at least 4 rows and ``--threads`` is not set (Linux), else 1."""
    from infer import loading

    cores = loading.DEFAULT_THREADS  # the cores eval's batched runs take as threads (``set_threads``): one worker each
    if not str(device).startswith("cpu") or batch_size < 2:
        if requested not in (None, 0, 1):
            raise ValueError(f"--cpu-workers {requested}: worker processes split a batched run on the CPU; this run is on {device} "
                             f"at batch size {batch_size}")
        return 1
    if requested in (None, 0):  # Linux only: fork is the start method there (macOS's fork is unsafe with its frameworks)
        return cores if threads is None and cores >= 2 and batch_size >= 4 * cores and sys.platform.startswith("linux") else 1
    if requested < 1 or requested > batch_size:
        raise ValueError(f"--cpu-workers {requested}; expected 1 to the batch size ({batch_size})")
    if requested > 1 and threads not in (None, 1):
        raise ValueError(f"--cpu-workers {requested} with --threads {threads}: workers are forked processes on one thread each "
                         "(GNU OpenMP hangs in a forked child on more); leave out --threads")
    return requested


def run_conversations_batched(target, drafter, tokenizer, conversations: list[Conversation], *, prefill_tokens: int, sampling: SamplingConfig,
                              max_new_tokens: int, eos_token_ids, baseline: bool, desc: str, partial: Path | None, batch_size: int,
                              reuse_prefixes: bool = True, workers: int = 1, warmup: bool = False) -> list[dict]:
    """``run_conversations`` with ``batch_size`` conversations in flight (``infer/batch.py``): each finished turn is written
    to ``partial`` at once and its conversation's next turn enters the batch; the autoregressive baseline, when asked for,
    runs batched afterwards over the same prompts (a record is written again with it; the last line of a turn counts).
    ``workers`` > 1: the rows and the conversations (round robin) split over forked one-thread processes
    (``cpu_workers``); a row's tokens do not depend on which rows share its batch."""
    from infer.batch import generate_batch

    limit = max_positions(target)
    done = read_partial(partial)
    sink = open_partial(partial) if partial is not None else None
    bar = tqdm(total=len(conversations), desc=desc, unit="q")
    verify_len = drafter.verify_tokens if drafter is not None else 1
    # the most positions a turn can need: every user turn and filler, plus room for each earlier answer (re-tokenised)
    capacity = max(last_turn_tokens(tokenizer, c, i, prefill_tokens) for i, c in enumerate(conversations))
    capacity = min(capacity + max(len(c.turns) for c in conversations) * (max_new_tokens + 16) + verify_len, limit + verify_len)

    def write(record: dict) -> None:
        if sink is not None:
            sink.write(json.dumps(record) + "\n")
            sink.flush()

    decode_args = dict(prefill_tokens=prefill_tokens, sampling=sampling, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids,
                       limit=limit, done=done, capacity=capacity, reuse_prefixes=reuse_prefixes)
    todo_turns = turns_left(conversations, done)
    warm = dict(rows=min(batch_size, len(conversations)), batch_size=batch_size, sampling=sampling, max_new_tokens=max_new_tokens,
                prompt=turn_prompt(tokenizer, conversations[0], 0, 0, [""], 0)) if warmup and workers == 1 else None
    try:
        warm_s = warm_up(target, drafter, capacity=capacity, **warm) if warm and todo_turns else 0.0
        t0 = time.perf_counter()
        if workers > 1:
            records, prompts = decode_in_workers(target, drafter, tokenizer, conversations, workers, batch_size, write, bar, decode_args)
        else:
            order = iter(range(len(conversations)))
            by_index, prompts = decode_batched(target, drafter, tokenizer, conversations, lambda: next(order, None), batch_size,
                                               write, lambda: bar.update(1), **decode_args)
            records = [by_index[i] for i in range(len(conversations))]
        wall = time.perf_counter() - t0
        bar.close()
        flat = [r for conv_records in records for r in conv_records]
        fresh = [r for r in flat if (str(r["id"]), r["turn"]) not in done]
        for r in fresh:  # the rows' own decode times overlap: the pass's throughput is its tokens over its wall time
            r["stats"]["batch"] = {"size": batch_size, "workers": workers, "pass_s": wall,
                                   "pass_tokens": sum(x["stats"]["new_tokens"] for x in fresh), "warmup_s": warm_s}
        todo = [(i, r) for i, conv_records in enumerate(records) for r in conv_records
                if baseline and drafter is not None and "baseline_stats" not in r]
        if todo:
            base_prompts = [prompts.get((i, r["turn"] - 1)) or turn_prompt(tokenizer, conversations[i], i, r["turn"] - 1,
                                                                           [x["output_text"] for x in records[i]], prefill_tokens)
                            for i, r in todo]
            base_warm_s = warm_up(target, None, capacity=max(len(p) for p in base_prompts) + max_new_tokens + 1,
                                  **{**warm, "rows": min(batch_size, len(base_prompts))}) if warm else 0.0  # generate_batch's shapes
            generate_args = dict(max_new_tokens=max_new_tokens, sampling=sampling, eos_token_ids=eos_token_ids)
            if workers > 1:  # as the drafter pass ran: its speed and the baseline's are of one setup
                bases = baseline_in_workers(target, base_prompts, workers, batch_size, **generate_args)
            else:
                bases = [(g.tokens, g.stats.to_dict()) for g in generate_batch(target, None, base_prompts, batch_size=batch_size, **generate_args)]
            for (_, record), (tokens, stats) in zip(todo, bases):
                record["baseline_stats"] = {**stats, "warmup_s": base_warm_s, "workers": workers}
                record["same_as_baseline"] = tokens == record["output_ids"]
                write(record)
    finally:
        if sink is not None:
            sink.close()
    return flat


def warm_up(target, drafter, *, prompt: list[int], rows: int, batch_size: int, capacity: int, sampling: SamplingConfig,
            max_new_tokens: int) -> float:
    """A few untimed steps of a batched pass's shapes before it: ``rows`` copies of a short ``prompt`` through
    ``generate_streams`` with the pass's batch size and capacity (so the same buffers and graphs), up to 16 new tokens
    each, no end-of-sequence token. On a GPU the pass's step graphs compile and capture here (an H200 spent 75 s on the
    first step of batch-1 trees), so the pass's tokens/s, latency and speedup are steady-state. Nothing it writes is
    read later: a pass prefills every row it decodes. Returns its seconds."""
    from infer.batch import generate_streams

    t0 = time.perf_counter()
    generate_streams(target, drafter, lambda stream, finished: list(prompt) if finished is None else None, rows, batch_size=batch_size,
                     capacity=capacity, max_new_tokens=min(max_new_tokens, 16), sampling=sampling, reuse_prefixes=False)
    sync(target.device)
    return time.perf_counter() - t0


def decode_batched(target, drafter, tokenizer, conversations: list[Conversation], claim, batch_size: int, write, finished_one, *,
                   prefill_tokens: int, sampling: SamplingConfig, max_new_tokens: int, eos_token_ids, limit: int, done: dict, capacity: int,
                   reuse_prefixes: bool) -> tuple[dict[int, list[dict]], dict[tuple[int, int], list[int]]]:
    """Turns of ``conversations`` through ``generate_streams`` with ``batch_size`` rows: (the records of each conversation
    decoded here, by its index in ``conversations``; the prompts by (that index, turn)). A row that frees takes the next
    conversation ``claim()`` gives (an index; None when none is left): in order in one process, from a counter the CPU
    workers share (``decode_in_workers``), so no worker idles while another still has conversations queued. The index
    is also the conversation's filler document's offset. ``write(record)`` as each turn ends, ``finished_one()`` as each
    conversation does."""
    from infer.batch import generate_streams

    records: dict[int, list[dict]] = {}
    prompts: dict[tuple[int, int], list[int]] = {}
    assigned: dict[int, int | None] = {}  # stream (generate_streams' numbering) -> conversation index

    def next_prompt(stream: int, finished) -> list[int] | None:
        if stream not in assigned:
            assigned[stream] = claim()
            if assigned[stream] is not None:
                records[assigned[stream]] = []
        i = assigned[stream]
        if i is None:  # every conversation claimed: this stream has none
            return None
        conv = conversations[i]
        if finished is not None:
            turn = len(records[i])
            text = tokenizer.decode(finished.tokens, skip_special_tokens=True)
            record = {"id": conv.id, "category": conv.category, "turn": turn + 1, "prompt_tokens": len(prompts[(i, turn)]),
                      "question": conv.turns[turn], "output_ids": finished.tokens, "output_text": text, "stats": finished.stats.to_dict()}
            records[i].append(record)
            write(record)
        while len(records[i]) < len(conv.turns):
            turn = len(records[i])
            if (str(conv.id), turn + 1) in done:  # finished by an earlier run of this cell
                records[i].append(done[(str(conv.id), turn + 1)])
                continue
            prompt = turn_prompt(tokenizer, conv, i, turn, [r["output_text"] for r in records[i]], prefill_tokens)
            if len(prompt) + max_new_tokens > limit:
                raise ValueError(f"question {conv.id} turn {turn + 1}: {len(prompt)} prompt + {max_new_tokens} new tokens exceed the "
                                 f"target's max_position_embeddings={limit}; lower --prefill-tokens or --max-new-tokens")
            prompts[(i, turn)] = prompt
            return prompt
        finished_one()
        return None

    generate_streams(target, drafter, next_prompt, len(conversations), batch_size=batch_size, capacity=capacity,
                     max_new_tokens=max_new_tokens, sampling=sampling, eos_token_ids=eos_token_ids, reuse_prefixes=reuse_prefixes)
    return records, prompts


def die_with_parent(parent: int) -> None:
    """A forked worker ends when the process that forked it does (Linux's ``PR_SET_PDEATHSIG``): a SIGTERM or SIGKILL to
    eval's process left its workers decoding, then blocked on the queue forever, each holding the model."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1 (linux/prctl.h)
    except (OSError, AttributeError):  # not Linux: workers are forked on Linux only (cpu_workers)
        return
    if os.getppid() != parent:  # the parent ended before the call above took effect
        os._exit(1)


def decode_in_workers(target, drafter, tokenizer, conversations: list[Conversation], workers: int, batch_size: int, write, bar,
                      decode_args: dict) -> tuple[list[list[dict]], dict[tuple[int, int], list[int]]]:
    """``decode_batched`` in ``workers`` forked one-thread processes, each with its share of the ``batch_size`` rows; a
    worker's free row claims the next conversation from a counter they share (in order: a worker that drew short ones
    takes more rather than idling while the other finishes a fixed half; measured against round-robin halves on 16
    conversations it changed nothing, both left the 2-core machine's workers busy ~81% of the wall time, the batch's end
    being what idles them: BENCHMARKS.md; letting the workers still decoding take a finished one's core, from a parent
    that never started its OpenMP pool, kept both cores busy but did not shorten the pass: tried, not kept). The turns
    come back through a queue as they end (written here, in the order they end) and each worker's records and prompts
    at its end. A worker's ValueError (bad input) is raised here as the one-process run raises it; another error as a
    RuntimeError with the worker's traceback."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the tokenizer's Rust threads do not survive a fork either
    context = multiprocessing.get_context("fork")
    messages = context.Queue()
    claimed = context.Value("i", 0)  # the next conversation to hand out (its own lock)
    rows = rows_per_worker(batch_size, workers)

    def claim() -> int | None:
        with claimed.get_lock():
            i = claimed.value
            if i >= len(conversations):
                return None
            claimed.value = i + 1
            return i

    parent = os.getpid()

    def work(w: int) -> None:
        try:
            die_with_parent(parent)
            torch.set_num_threads(1)
            records, prompts = decode_batched(target, drafter, tokenizer, conversations, claim, rows[w],
                                              lambda record: messages.put(("record", record)), lambda: messages.put(("finished", None)),
                                              **decode_args)
            messages.put(("done", (w, records, prompts)))
        except BaseException as e:
            messages.put(("error", (w, type(e).__name__, str(e), traceback.format_exc())))

    records: list[list[dict]] = [[] for _ in conversations]
    prompts: dict[tuple[int, int], list[int]] = {}

    def done(payload) -> None:
        _, share_records, share_prompts = payload
        for i, conv_records in share_records.items():
            records[i] = conv_records
        prompts.update(share_prompts)

    on = {"record": write, "finished": lambda _: bar.update(1), "done": done}
    collect_workers(context, work, min(workers, len(conversations)), messages, on)
    return records, prompts


def rows_per_worker(batch_size: int, workers: int) -> list[int]:
    """The ``batch_size`` rows of a batched pass shared out over ``workers`` (the first ones one more where it does not divide)."""
    return [batch_size // workers + (w < batch_size % workers) for w in range(workers)]


def collect_workers(context, work, workers: int, messages, on: dict) -> None:
    """Start ``work(w)`` in ``workers`` forked processes and handle what they put on ``messages`` until each has sent
    ("done", (w, ...)): ``on[kind](payload)`` for each message; ("error", (w, name, message, traceback)) raises here, a
    ValueError (bad input) as the one-process run raises it, another error as a RuntimeError with the worker's traceback;
    a worker that exits without its "done" is an error too."""
    processes = {w: context.Process(target=work, args=(w,), daemon=True) for w in range(workers)}
    for process in processes.values():
        process.start()
    pending = set(processes)
    try:
        while pending:
            try:
                kind, payload = messages.get(timeout=5)
            except queue.Empty:  # nothing for 5 s: a worker that has exited without its records will send none
                dead = [processes[w] for w in pending if processes[w].exitcode is not None]
                if dead:
                    raise RuntimeError(f"a CPU worker process died (exit code {dead[0].exitcode}) before sending its records")
                continue
            if kind == "error":
                w, name, message, trace = payload
                if name == "ValueError":  # bad input (a turn that cannot fit, say): the one line the one-process run raises
                    raise ValueError(message)
                raise RuntimeError(f"CPU worker {w} failed with {name}: {message}\n{trace}")
            on[kind](payload)
            if kind == "done":
                pending.discard(payload[0])
    finally:
        for process in processes.values():
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()


def baseline_in_workers(target, prompts: list[list[int]], workers: int, batch_size: int, **generate_args) -> list[tuple[list[int], dict]]:
    """The autoregressive baseline of a batched pass run as its drafter pass ran (``decode_in_workers``): ``workers``
    forked one-thread processes, each with its share of the ``batch_size`` rows and every ``workers``-th prompt. Run
    in this process on its threads instead, the baseline's speed was another setup's (on a loaded 2-core machine its
    two threads ran 30-50x slower than the workers' one each, and the speedup column read 40x). -> (tokens, stats dict)
    per prompt, in order."""
    from infer.batch import generate_batch

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    context = multiprocessing.get_context("fork")
    messages = context.Queue()
    workers = min(workers, len(prompts))
    rows = [max(r, 1) for r in rows_per_worker(batch_size, workers)]
    parent = os.getpid()

    def work(w: int) -> None:
        try:
            die_with_parent(parent)
            torch.set_num_threads(1)
            share = prompts[w::workers]
            out = generate_batch(target, None, share, batch_size=rows[w], **generate_args)
            messages.put(("done", (w, [(g.tokens, g.stats.to_dict()) for g in out])))
        except BaseException as e:
            messages.put(("error", (w, type(e).__name__, str(e), traceback.format_exc())))

    results: list = [None] * len(prompts)

    def done(payload) -> None:
        w, share = payload
        results[w::workers] = share

    collect_workers(context, work, workers, messages, {"done": done})
    return results


def decoded_tokens(stats: dict) -> int:
    """``GenerationStats.decoded_tokens`` of a record's stats as saved: each turn's first token is the prefill's."""
    return max(stats["new_tokens"] - 1, 0)


def as_engine_counts(records: list[dict]) -> list[dict]:
    """Our loop's records with each turn's last step counting the drafts it accepted past the end (the token budget or
    an end-of-sequence token; ``GenerationStats.untrimmed_steps``), as vLLM's counters count them: the prompt-lookup τ
    printed beside an engine's τ, counted the same way."""
    out = []
    for r in records:
        steps = list(r["stats"]["accepted_per_step"])
        if steps:
            steps[-1] += r["stats"].get("accepted_past_end", 0)
        out.append({**r, "stats": {**r["stats"], "accepted_per_step": steps}})
    return out


def tau_over_drafting_steps(accepted: list[int], without: int | None) -> float | None:
    """τ over the steps that proposed drafts (vLLM's count), given every step's accepted count and how many of the steps
    proposed none (each accepted 0); None where that count is unknown or no step drafted."""
    if without is None or len(accepted) <= without:
        return None
    return (sum(accepted) + len(accepted) - without) / (len(accepted) - without)


def summarize(records: list[dict]) -> dict:
    """Pooled over every verify step of every turn: τ, acceptance by position, speed, latency, speedup."""
    accepted = [a for r in records for a in r["stats"]["accepted_per_step"]]
    block = records[0]["stats"]["block_size"] if records else 1
    new_tokens = sum(r["stats"]["new_tokens"] for r in records)
    decoded = sum(decoded_tokens(r["stats"]) for r in records)
    decode_s = sum(r["stats"]["decode_s"] for r in records)
    tau, acceptance = pooled_acceptance(accepted, block)
    # τ over the steps that proposed drafts, as vLLM's counters count it (a step without drafts is no draft there): above
    # τ for prompt lookup, whose steps without an n-gram match decode one token (accepted 0); τ itself for the others
    # (turns saved before the loop counted them, e.g. a resumed cell's, have no count: then neither is known)
    counted = all("steps_without_drafts" in r["stats"] for r in records)
    without = sum(r["stats"]["steps_without_drafts"] for r in records) if counted else None
    summary = {
        "turns": len(records),
        "steps": len(accepted),
        "tau": tau,
        "steps_without_drafts": without,
        "tau_drafting_steps": tau_over_drafting_steps(accepted, without),
        "acceptance_by_position": acceptance,
        "new_tokens": new_tokens,
        "tokens_per_s": decoded / decode_s if decode_s else 0.0,  # decoding speed: the decode steps' tokens over their time
        "mean_prompt_tokens": sum(r["prompt_tokens"] for r in records) / max(len(records), 1),
        "mean_prefill_s": sum(r["stats"]["prefill_s"] for r in records) / max(len(records), 1),
        "mean_latency_s": sum(r["stats"]["prefill_s"] + r["stats"]["decode_s"] for r in records) / max(len(records), 1),
        "time_split": {k: sum(r["stats"][f"{k}_s"] for r in records) / decode_s if decode_s else 0.0 for k in ("draft", "verify", "other")},
    }
    batched = [r["stats"]["batch"] for r in records if "batch" in r["stats"]]
    if batched:  # batched decoding: per-row tokens/s above, the batch's throughput here
        summary["batch_size"] = batched[0]["size"]
        summary["batch_tokens_per_s"] = batched[0]["pass_tokens"] / batched[0]["pass_s"] if batched[0]["pass_s"] else 0.0
    summary["warmup_s"] = max((r["stats"].get("warmup_s", r["stats"].get("batch", {}).get("warmup_s", 0.0)) for r in records), default=0.0)
    base = [r["baseline_stats"] for r in records if "baseline_stats" in r]
    summary["engine"] = records[0]["stats"].get("engine", "ours") if records else "ours"
    if base and summary["engine"] != "ours":  # another engine's speed over our baseline's is no speedup: only the lossless check
        summary["same_as_baseline"] = sum(r["same_as_baseline"] for r in records) / len(records)
    elif base:
        base_tps = sum(decoded_tokens(b) for b in base) / sum(b["decode_s"] for b in base)
        summary["baseline_tokens_per_s"] = base_tps
        summary["speedup"] = summary["tokens_per_s"] / base_tps
        summary["same_as_baseline"] = sum(r["same_as_baseline"] for r in records) / len(records)
        summary["baseline_warmup_s"] = max(b.get("warmup_s", 0.0) for b in base)
    by_category: dict[str, list[int]] = {}
    for r in records:
        by_category.setdefault(r["category"] or "-", []).extend(r["stats"]["accepted_per_step"])
    summary["tau_by_category"] = {c: sum(a + 1 for a in acc) / max(len(acc), 1) for c, acc in sorted(by_category.items())}
    return summary
