"""Batched speculative decoding: many generations in flight, each row with its own positions, acceptance and caches.

    rows:   B slots of the static target (``models/static_target.py``) and drafter; a finished row takes the next
            request once a wave of rows is free (their prompts prefilled together, each from position 0 of its own
            row: what the row held before is never visible again, every key the new prompt sees is written first)
    step:   draft every row's block -> verify all rows in one [B, k+1] target pass (greedy DFlash chains on the CPU:
            the first drafts of every row, then the rest of the rows whose checked drafts all matched, ``staged_verify``;
            a block-causal drafter drafts that rest only for those rows too, ``first_drafts`` / ``rest_drafts``)
            -> accept per row ->
            append every row's verified block to the drafter (fixed shapes) -> one host sync for all rows
            (prompt lookup: each row's real drafts, 0 .. k, padded to the longest row's; uncaptured, the padding skips
            the target's linears, and a row accepts at most its real drafts, as at batch 1)
    reuse:  the target alone, prompt lookup and the static drafters (their contexts keep the prefix): a row's next
            prompt is prefilled only past its common prefix with what the row's cache holds (a conversation's next
            turn holds its earlier turns and answers), as ``generate``'s ``cached_ids``; a waiting or idle row steps
            past that prefix, not over it
    drain:  once no request waits, an uncaptured target with no drafter caches (the CPU; the target alone or prompt
            lookup) moves its live rows to the front and steps only those

Each row's output and accepted counts are the batch-1 loop's (``infer.generate.generate``): greedy acceptance is
per row, and sampling draws from a generator per row seeded as ``generate`` seeds its own (from ``sampling.seed``, or
the stream's own seed with ``stream_seeds``), in the same order (``tests/test_batch.py``). Requests come from a
driver, so a conversation's next turn (whose prompt holds this turn's answer) enters as soon as the answer is out.

Drafters: None (the target alone), ``StaticDFlashDrafter`` (blocks, and greedy trees over a block's marginals:
``models/dflash.py``), ``StaticEagle3Drafter`` (chains, and greedy EAGLE-2 dynamic trees: each row drafts from its own
pending block, ``models/eagle3.py``) and prompt lookup (one copy per row).
Trees may take prompt lookup's chain over each row's text as one more branch (``tree_lookup``: merged on the host, one
more sync per step). The eager drafters (``Eagle3Drafter``, ``DFlashDrafter``: FlashInfer attention) keep per-request
state and run at batch size 1 (``generate``).

    tree step: draft every row's tree -> verify all rows' trees in one [B, N+1] target pass under tree masks ->
            accept per row on the device (``accept_trees``) -> move each accepted path's keys into place -> the
            accepted path's features to the drafter -> one host sync for all rows
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch

from infer.generate import Generation, GenerationStats, common_prefix, eos_id_set, reuses_prefixes, staged_verify, trim_output, verify_stages
from infer.prompt_lookup import GrowingLookup, PromptLookupDrafter
from models.dflash import StaticDFlashDrafter
from models.eagle3 import StaticEagle3Drafter
from models.trees import accept_trees, merge_chains
from models.sampling import SamplingConfig, choose, verify
from models.static_target import DECODE_MAX_TOKENS, StaticTarget
from models.target import eager_reason

# driver(stream, finished generation or None at the stream's start) -> the stream's next prompt, or None when done
Driver = Callable[[int, Generation | None], list[int] | None]


@dataclass
class Row:
    stream: int
    prompt_len: int
    out: list[int]
    pos: int  # position of the newest token, which the target has not seen yet
    stats: GenerationStats
    generator: torch.Generator
    drafter: PromptLookupDrafter | None = None  # prompt lookup keeps a copy per row
    ended: bool = False  # an end-of-sequence token came out
    prompt: list[int] | None = None
    lookup: GrowingLookup | None = None  # the trees' lookup branch over the row's prompt and output (``tree_lookup``)

    def seen(self) -> list[int]:
        """The tokens whose keys/values the row's cache holds at positions 0 .. pos-1."""
        return self.prompt + self.out[:self.pos - self.prompt_len]


def check_batchable(drafter, batch_size: int, target=None) -> None:
    if batch_size > 1 and target is not None and not isinstance(target, StaticTarget):
        raise ValueError(f"--batch-size {batch_size}: batched decoding runs on the static target; "
                         f"{eager_reason(target.model, target.attention_backend)}: decodes on the eager cached target, at --batch-size 1")
    if batch_size > 1 and drafter is not None and not isinstance(drafter, (StaticDFlashDrafter, StaticEagle3Drafter, PromptLookupDrafter)):
        name = type(drafter).__name__
        what = f"the eager {'EAGLE-3' if 'Eagle3' in name else 'DFlash'} drafter ({name})" if getattr(drafter, "tree", False) else name
        raise ValueError(f"--batch-size {batch_size}: batched decoding runs DFlash and EAGLE-3 blocks, chains and trees (their static drafters), "
                         f"prompt lookup or the target alone; {what} runs at --batch-size 1")
    # a batched chain verifies through StaticTarget.step, at most DECODE_MAX_TOKENS tokens a row (batch 1's forward sends
    # longer ones down the prefill path): refused here, before any model work, not at the first step that drafts that many
    if batch_size > 1 and drafter is not None and not getattr(drafter, "tree", False) and drafter.verify_tokens > DECODE_MAX_TOKENS:
        raise ValueError(f"--batch-size {batch_size}: a batched verify takes at most {DECODE_MAX_TOKENS - 1} drafts a step; this "
                         f"drafter drafts up to {drafter.verify_tokens - 1} (lower --draft-steps, or run --batch-size 1)")


@torch.no_grad()
def generate_streams(target: StaticTarget, drafter, driver: Driver, num_streams: int, *, batch_size: int, capacity: int,
                     max_new_tokens: int, sampling: SamplingConfig = SamplingConfig(),
                     eos_token_ids: int | Iterable[int] | None = (), prefill_chunk: int = 4096,
                     refill_wave: int | None = None, run_steps: int = 8, reuse_prefixes: bool = True,
                     stream_seeds: Sequence[int] | None = None, verify_first: int | None | str = "auto",
                     cached_ids: Sequence[int] | None = None, run_ahead: bool = False) -> None:
    """Run ``num_streams`` request streams through ``batch_size`` rows; every finished generation goes to ``driver``.

    capacity: the most positions one request needs (prompt + ``max_new_tokens`` + a verify block); a longer request
    is refused with its stream's number.
    refill_wave: rows whose request finished wait (stepping idle) until this many are waiting, or as many as rows still
        decode, and are then prefilled together (``StaticTarget.prefill_rows``): one prefill per row was what bounded
        regeneration on small targets (default: an eighth of the rows). A row's tokens do not depend on when it starts.
    run_steps: the target alone, greedy, steps this many times between host syncs (``decode_alone``): per-row host
        bookkeeping after every step bounded regeneration on small targets, not the GPU. 1: a sync every step.
    run_ahead: the target alone, greedy, in runs: the next run is queued on the device before the host syncs and books
        the run before it, so the host's work (the rows' bookkeeping, finished requests, the next prompts, their waves
        of prefills) overlaps the device's next run instead of leaving it idle. That next run steps every row from where
        the device left it: rows whose request ended in the run before make tokens nobody reads, and rows refilled
        after it was queued start with the run after (what a queued run made for a row it no longer serves is
        dropped). The caches keep two runs of room past ``capacity``; rows do not move (no packing). Tokens equal to
        without (tests); on the CPU, where nothing overlaps, it only costs the wasted steps.
    reuse_prefixes: the target alone, prompt lookup and the static drafters prefill a row's next prompt only past its
        common prefix with the row's cached tokens (the earlier turns of the same stream land in the same row; the
        drafter's context keeps them, its ``kept_prefix``). Off: every prompt whole.
    stream_seeds: each stream's sampling seed (its requests' generators start from it, as ``generate`` with
        ``SamplingConfig(seed=...)``); default ``sampling.seed`` for all. n samples of one prompt: n streams, n seeds.
    verify_first: as ``generate``'s (greedy DFlash chains on the CPU check the first drafts of every row, then verify
        the rest of the rows whose checked drafts all matched: ``staged_verify``).
    cached_ids: one row only (``generate``'s batch-1 protocol, its static trees): the token ids whose keys/values and
        drafter context the row holds at positions 0 .. from the last generation on these caches; the first prompt
        reuses its common prefix with them, as a stream's next turn does.
    """
    for name, value in (("batch_size", batch_size), ("max_new_tokens", max_new_tokens), ("prefill_chunk", prefill_chunk),
                        ("run_steps", run_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}; expected an integer >= 1")
    check_batchable(drafter, batch_size)
    if stream_seeds is not None and len(stream_seeds) != num_streams:
        raise ValueError(f"stream_seeds: {len(stream_seeds)} seeds for {num_streams} streams")
    device = target.device
    block = drafter.block_size if drafter is not None else 1
    span = drafter.verify_tokens if drafter is not None else 1  # cache slots a verify pass writes past a row's position
    tree = isinstance(drafter, (StaticDFlashDrafter, StaticEagle3Drafter)) and drafter.tree
    if tree and not sampling.greedy:
        raise ValueError(f"tree drafting is greedy only (temperature={sampling.temperature}); leave out the tree options to sample with chains")
    first = verify_stages(target, drafter, sampling) if verify_first == "auto" else verify_first
    if first is not None and not (sampling.greedy and isinstance(drafter, StaticDFlashDrafter) and not tree and first >= 1):
        raise ValueError(f"verify_first={first}: batched, a staged verify checks >= 1 drafts of greedy DFlash chains")
    staged = first is not None and first < block - 1
    rows_n = min(batch_size, num_streams)
    alone = drafter is None and sampling.greedy and run_steps > 1  # no per-step host work: runs of run_steps steps
    if run_ahead and not alone:
        raise ValueError(f"run_ahead: the target alone, greedy, in runs of run_steps > 1 (drafter {type(drafter).__name__}, "
                         f"temperature {sampling.temperature}, run_steps {run_steps})")
    reuse = reuse_prefixes and reuses_prefixes(drafter)
    if cached_ids and rows_n != 1:
        raise ValueError(f"cached_ids: one row's cache (batch_size 1, one stream); got {rows_n} rows")
    keep = len(cached_ids) if cached_ids and reuse else 0  # positions the new buffers keep (``allocate``'s keep)
    keep = min(keep, target.allocate(capacity + (run_steps * (1 + run_ahead) if alone else 0), batch=rows_n, keep=keep))
    if isinstance(drafter, (StaticDFlashDrafter, StaticEagle3Drafter)):
        # keys of rejected drafts land up to a block past the last position
        drafter.allocate(capacity + block, batch=rows_n, keep=keep)
        drafter.context_ids = []  # the batch-1 protocol's record of row 0's context: rewritten here (``generate`` sets it)
    idle_generator = torch.Generator(device=device)  # an idle row's sampled drafts (discarded) draw from this, not the global one
    eos = eos_id_set(eos_token_ids)
    pending = iter(range(num_streams))
    rows: list[Row | None] = [None] * rows_n
    tokens = torch.zeros(rows_n, dtype=torch.long, device=device)  # each row's newest token
    positions = torch.zeros(rows_n, dtype=torch.long, device=device)
    # a free row's cached tokens (keys/values at positions 0 ..), reusable by its next prompt
    cached: list[list[int]] = [[] for _ in range(rows_n)]
    if keep:
        cached[0] = list(cached_ids[:keep])

    def parked(r: int) -> int:
        """Where a free row steps (idle steps write keys there): past its cached tokens, 0 without."""
        return len(cached[r])

    def check(stream: int, prompt: list[int]) -> None:
        if not prompt:
            raise ValueError(f"request {stream}: empty prompt")
        if len(prompt) + max_new_tokens + span > capacity:
            raise ValueError(f"request {stream}: {len(prompt)} prompt + {max_new_tokens} new tokens exceed the batch's capacity {capacity}")

    def prefill_alone(r: int, ids: torch.Tensor, skip: int) -> torch.Tensor:
        """A long prompt past its first ``skip`` tokens (cached), chunk by chunk into row ``r`` (the drafter's context
        with it): the last token's logits [1, V]."""
        for s in range(skip, ids.shape[0], prefill_chunk):
            logits, features = target.prefill(ids[s:s + prefill_chunk], r, s, last_logits_only=True)
            feed_drafter(r, s, ids[s:s + prefill_chunk], features)
        return logits

    def feed_drafter(r: int, s: int, ids: torch.Tensor, features: torch.Tensor | None) -> None:
        if isinstance(drafter, StaticDFlashDrafter):
            drafter.append(features[None], torch.tensor([s], device=device), row=r)
        elif isinstance(drafter, StaticEagle3Drafter):  # step 0 over the chunk; its last index waits for the next token
            drafter.prefill(features, s, ids, row=r)

    def start_wave() -> None:
        """Prefill every waiting request past its row's cached prefix: prompts up to ``prefill_chunk`` tokens in forwards
        of several rows (at most ``prefill_chunk`` padded tokens each, similar lengths together), longer ones alone."""
        t0 = time.perf_counter()
        # each prompt's tokens the row's cache holds already (all but the last: it runs for the first new token)
        skip = {r: min(common_prefix(cached[r], prompt), len(prompt) - 1) for r, _, prompt in waiting}
        for r, _, prompt in waiting:
            common, cached[r] = common_prefix(cached[r], prompt), []
            if isinstance(drafter, (StaticDFlashDrafter, StaticEagle3Drafter)):  # its context keeps the prefix where its rings hold it
                # the common prefix uncapped (a prompt the row holds whole: EAGLE-3's key at its last position is kept too)
                skip[r] = drafter.kept_prefix(r, common, len(prompt))
        entries = sorted(waiting, key=lambda e: len(e[2]) - skip[e[0]])
        waiting.clear()
        ids = {r: torch.as_tensor(prompt, dtype=torch.long, device=device) for r, _, prompt in entries}
        last_logits, groups, group = {}, [], []
        for entry in entries:
            r, n = entry[0], len(entry[2]) - skip[entry[0]]
            if skip[r] + n > prefill_chunk:  # long, or past a long cached prefix (a group gathers every row's keys)
                last_logits[r] = prefill_alone(r, ids[r], skip[r])
            elif group and (len(group) + 1) * n > prefill_chunk:  # sorted: n is the group's longest
                groups, group = groups + [group], [entry]
            else:
                group.append(entry)
        for group in groups + ([group] if group else []):
            logits, features = target.prefill_rows([ids[r][skip[r]:] for r, _, _ in group], [r for r, _, _ in group],
                                                   [skip[r] for r, _, _ in group])
            for j, (r, _, prompt) in enumerate(group):
                last_logits[r] = logits[j:j + 1]
                if features is not None:  # the positions prefilled: past the row's kept prefix
                    feed_drafter(r, skip[r], ids[r][skip[r]:], features[j, :len(prompt) - skip[r]])
        firsts = {}
        for r, stream, prompt in entries:
            generator = torch.Generator(device=device).manual_seed(sampling.seed if stream_seeds is None else int(stream_seeds[stream]))
            firsts[r] = (choose(last_logits[r], sampling, generator)[0][0], generator)
        first_tokens = torch.stack([firsts[r][0] for r, _, _ in entries]).tolist()  # one sync for the wave
        total = sum(len(prompt) - skip[r] for r, _, prompt in entries)
        elapsed = time.perf_counter() - t0
        for (r, stream, prompt), first in zip(entries, first_tokens):
            n = len(prompt)
            row = Row(stream, n, [first], n, GenerationStats(prompt_tokens=n, new_tokens=0, block_size=block, reused_tokens=skip[r]),
                      firsts[r][1], prompt=prompt)
            row.ended = first in eos
            if tree and drafter.tree_lookup:
                row.lookup = GrowingLookup()
            if isinstance(drafter, PromptLookupDrafter):
                row.drafter = copy.copy(drafter)
                row.drafter.reset(n + max_new_tokens + block)
                row.drafter.append_context(None, 0, ids[r])
            tokens[r], positions[r] = first, n
            row.stats.prefill_s = elapsed * (n - skip[r]) / total  # the wave's time, shared by the tokens prefilled
            rows[r] = row

    def next_request(r: int, finished: Generation | None, stream: int | None) -> None:
        """Queue row ``r`` for the next prompt of ``stream`` (after ``finished``), else of a new stream, else idle it."""
        if reuse and rows[r] is not None:  # kept short of the capacity's end: idle steps write a block past them
            cached[r] = rows[r].seen()[:capacity - span]
        rows[r] = None
        positions[r] = parked(r)  # a waiting or idle row keeps stepping harmlessly past its cached tokens (its prefill rewrites them)
        while True:
            prompt = driver(stream, finished) if stream is not None else None
            if prompt is not None:
                check(stream, prompt)
                waiting.append((r, stream, list(prompt)))
                return
            stream, finished = next(pending, None), None
            if stream is None:
                return

    def settle() -> None:
        """Finish every row whose request is done (budget or an end-of-sequence token) and queue its row for the next
        prompt; start the queued rows together once there are ``wave`` of them or as many as rows still decoding."""
        while True:
            for r, row in enumerate(rows):
                if row is not None and (len(row.out) >= max_new_tokens or row.ended):
                    finish(r, row, max_new_tokens, eos, next_request, with_ids=cached_ids is not None)
            decoding = sum(row is not None for row in rows)
            if not waiting or (len(waiting) < wave and len(waiting) < decoding):
                return
            start_wave()

    def pack() -> int:
        """How many rows step: the first m, m past the last live row. Where nothing is captured (the CPU) and the rows
        hold no drafter caches or DFlash's chain caches (which move with them), live rows move down into finished ones
        while no request waits for a row, so a batch draining at its end stops paying for rows that have nothing to
        decode (a CPU verify and block pass cost per row)."""
        if packable and not waiting:
            live = [r for r, row in enumerate(rows) if row is not None]
            holes = [r for r in range(len(live)) if rows[r] is None]
            for dst, src in zip(holes, [r for r in live if r >= len(live)]):
                target.move_row(src, dst, rows[src].pos)
                if isinstance(drafter, StaticDFlashDrafter):
                    drafter.move_row(src, dst)
                rows[dst], rows[src] = rows[src], None
                cached[dst] = cached[src] = []
                tokens[dst], positions[dst], positions[src] = tokens[src], positions[src], 0
        return max(r for r, row in enumerate(rows) if row is not None) + 1

    dflash_chain = isinstance(drafter, StaticDFlashDrafter) and not drafter.capture and not tree
    packable = not target.capture and not run_ahead and (drafter is None or isinstance(drafter, PromptLookupDrafter) or dflash_chain)
    waiting: list[tuple[int, int, list[int]]] = []  # (row, stream, prompt) queued for the next wave of prefills
    wave = max(1, rows_n // 8) if refill_wave is None else refill_wave
    for r in range(rows_n):
        next_request(r, None, next(pending, None))
    settle()

    def queue_run(m: int) -> tuple[torch.Tensor, list[Row | None], torch.cuda.Event | None]:
        """``run_steps`` greedy one-token steps of the first ``m`` rows with no host work between them, queued: the
        tokens stay on the device ([m, run_steps]) and come back in one copy, with the rows they are for. Run ahead on a
        GPU, the copy is queued right behind the run, into pinned memory, with an event: ``book_run`` waits for that
        event, not for the whole stream (a plain ``tolist`` would also wait for the run queued after it)."""
        made = []
        for _ in range(run_steps):
            logits, _ = target.step(tokens[:m, None], positions[:m])
            tokens[:m] = logits[:, 0].argmax(-1)
            positions[:m] += 1
            made.append(tokens[:m].clone())
        made, copied = torch.stack(made, dim=1), None
        if run_ahead and made.is_cuda:
            made, copied = made.to("cpu", non_blocking=True), torch.cuda.Event()
            copied.record()
        return made, list(rows[:m]), copied

    def book_run(run: tuple[torch.Tensor, list[Row | None], torch.cuda.Event | None], t0: float) -> None:
        """A queued run's tokens to the rows it ran for that still hold the same request. A row whose request ends
        inside the run (an end-of-sequence token, its budget) steps on to the run's end: ``finish`` trims what it made
        after, its stats count only the steps before, and the caches hold room past ``capacity`` for it. Then the
        positions of the rows that no longer decode go back where they wait (their cached prefix), and ``settle``."""
        made, ran_for, copied = run
        if copied is not None:
            copied.synchronize()
        values = made.tolist()  # the run's one host sync (run ahead on a GPU: the event's, above)
        elapsed = time.perf_counter() - t0
        for r, row in enumerate(ran_for):
            if row is None or rows[r] is not row:  # idle then, or its request finished and the row was handed on
                continue
            new = values[r]
            ends = [i for i, t in enumerate(new) if t in eos]
            kept = min([run_steps, max_new_tokens - len(row.out)] + [i + 1 for i in ends[:1]])
            row.stats.accepted_per_step.extend([0] * kept)
            row.stats.verify_s += elapsed * kept / run_steps
            row.pos += run_steps
            row.out.extend(new)
            row.ended = bool(ends)
        if run_ahead:  # a run is queued after this one: only the rows that do not decode are put back, ordered after it
            for r, row in enumerate(rows):  # (a fill each: a list copied to the device would wait for the queued run)
                if row is None:
                    positions[r] = parked(r)
        else:
            positions.copy_(torch.tensor([row.pos if row else parked(r) for r, row in enumerate(rows)]))
        settle()

    queued = None  # run_ahead: the run queued before the one being booked
    while any(row is not None for row in rows):  # settle leaves no request waiting without a row decoding
        if alone:
            t0 = time.perf_counter()
            run = queued or queue_run(pack() if packable else rows_n)
            queued = queue_run(rows_n) if run_ahead else None
            book_run(run, t0)
            continue
        t0 = time.perf_counter()
        m = pack() if packable else rows_n
        num_drafts, lengths = None, None  # prompt lookup: each row's real drafts, and + 1 the tokens it verifies
        in_stages = False  # a block-causal DFlash chain: its drafts past the checked ones drafted in the staged verify
        if drafter is None:
            ids = tokens[:m, None]
            draft_tokens = draft_probs = None
        elif tree:  # every row's tree: tokens, parents, depths [B, N], mask [B, N+1, N+1] (captured: the graph's buffers)
            tree_tokens, parents, depths, tree_mask = drafter.draft_tree(tokens, positions)
            if drafter.tree_lookup:  # prompt lookup's chain over each row's text joins its tree (host: one more sync)
                chains = [row.lookup(row.prompt, row.out, drafter.tree_lookup) if row else [] for row in rows]
                tree_tokens, parents, depths, tree_mask = merge_chains(tree_tokens, parents, depths, chains, drafter.tree_lookup)
            ids = torch.cat([tokens[:, None], tree_tokens], dim=1)
        elif isinstance(drafter, StaticDFlashDrafter) and staged and drafter.drafts_in_stages:
            # block-causal: the checked slots drafted now, the rest in the staged verify for the rows whose checked drafts
            # all matched (``staged_verify``'s drafter; the same drafts as one block pass, most of it skipped)
            head = drafter.first_drafts(tokens[:m], positions[:m], first)
            draft_probs = None
            ids = torch.cat([tokens[:m, None], head, head.new_zeros(m, drafter.drafts - first)], dim=1)
            draft_tokens = ids[:, 1:]  # a view: the staged verify writes the rest into ids
            in_stages = True
        elif isinstance(drafter, StaticDFlashDrafter):
            logits, greedy = drafter.block_logits(tokens[:m], positions[:m])  # m < B: a packed draining batch (the CPU)
            if sampling.greedy:
                draft_tokens, draft_probs = greedy.clone(), None
            else:
                drawn = [drafter.choose(logits[r], sampling, row.generator) if row else drafter.choose(logits[r], SamplingConfig(), None)
                         for r, row in enumerate(rows[:m])]
                draft_tokens = torch.stack([d[0] for d in drawn])
                draft_probs = [d[1] for d in drawn]
            ids = torch.cat([tokens[:m, None], draft_tokens], dim=1)
        elif isinstance(drafter, StaticEagle3Drafter):
            # each row's Exp(1) noise from its own generator, step by step, as batch 1 draws it (idle rows: a throwaway one)
            generators = None if sampling.greedy else [row.generator if row else idle_generator for row in rows]
            # drafts [B, k], probs [B, k, V] or None: on a GPU the captured graph's buffers, read (verify) before the next draft
            drafted, _, draft_probs = drafter.draft_chain(tokens, positions, sampling, generators)
            draft_tokens = drafted.clone()
            ids = torch.cat([tokens[:, None], draft_tokens], dim=1)
        else:  # prompt lookup, one copy per row: each row's real drafts (0 .. k), padded to the longest (captured: to k)
            drawn = [row.drafter.draft(tokens[r], row.pos, sampling, row.generator) if row else
                     (tokens.new_zeros(0), None) for r, row in enumerate(rows[:m])]
            num_drafts = [d[0].shape[0] for d in drawn]
            width = block - 1 if target.capture else max(num_drafts)
            draft_tokens = torch.stack([torch.cat([d[0], d[0].new_zeros(width - d[0].shape[0])]) for d in drawn])  # [m, width]
            draft_probs = [d[1] for d in drawn]
            ids = torch.cat([tokens[:m, None], draft_tokens], dim=1)
            lengths = torch.tensor(num_drafts, device=device) + 1  # the padding's work is skipped uncaptured (StaticTarget.step)
        t1 = time.perf_counter()
        if tree:
            # the furthest slot any row writes, known here: the products run over the live keys, not the capacity
            keys = max(row.pos if row else parked(r) for r, row in enumerate(rows)) + ids.shape[1]
            target_tokens, features = target.tree_greedy(ids, positions, torch.cat([depths.new_zeros(m, 1), depths], dim=1), tree_mask, keys)
        elif staged:  # greedy DFlash chains on the CPU: the first drafts of every row, the rest where they all matched
            logits, features = staged_verify(target, ids, positions[:m], first, drafter if in_stages else None)
        else:
            logits, features = target.step(ids, positions[:m], lengths)
        t2 = time.perf_counter()
        if tree:  # accepted [B], path [B, steps] (rows of [root, nodes]), bonus [B], all on the device
            accepted, path, new_token = accept_trees(tree_tokens, parents, depths, tree_mask, target_tokens, block - 1)
            # a path holds at most the tree's nodes: a tree smaller than it is deep (--tree-tokens 8 under a block of 16)
            # had path entries past the verify's rows (an index error in the gather below)
            path = path[:, :ids.shape[1] - 1]
            target.move_paths(path, positions)
            # the root and the accepted path, padded to the block the drafter appends (past the accepted count: never seen)
            kept = torch.cat([path.new_zeros(m, 1), path, path.new_zeros(m, block - 1 - path.shape[1])], dim=1)
            kept_features = features.gather(1, kept[:, :, None].expand(m, kept.shape[1], features.shape[2]))
            if isinstance(drafter, StaticDFlashDrafter):  # the context at positions pos .. pos + block - 1, as a chain's block
                drafter.append(kept_features, positions)
            else:  # EAGLE-3's pending block
                drafter.append(kept_features, positions, ids.gather(1, kept))
            draft_tokens = ids.gather(1, path)  # the path's tokens, as a chain's drafts
        elif drafter is None:
            if sampling.greedy:
                new_token = logits[:, 0].argmax(-1)
            else:
                new_token = torch.stack([choose(logits[r, :1], sampling, row.generator)[0][0] if row else logits.new_zeros((), dtype=torch.long)
                                         for r, row in enumerate(rows[:m])])
            accepted = torch.zeros(m, dtype=torch.long, device=device)
        elif sampling.greedy:
            target_tokens = logits.argmax(-1)  # [B, k+1]
            accepted = (draft_tokens == target_tokens[:, :-1]).long().cumprod(1).sum(1)
            if lengths is not None:  # at most the real drafts, whatever the padding matched (batch 1 verifies only those)
                accepted = torch.minimum(accepted, lengths - 1)
            new_token = target_tokens.gather(1, accepted[:, None])[:, 0]
        else:  # each row's real drafts only (prompt lookup: the first num_drafts[r]; the others: all k)
            real = num_drafts or [draft_tokens.shape[1]] * draft_tokens.shape[0]
            verified = [verify(draft_tokens[r, :real[r]], draft_probs[r], logits[r, :real[r] + 1], sampling, row.generator) if row else
                        (torch.zeros((), dtype=torch.long, device=device),) * 2 for r, row in enumerate(rows[:m])]
            accepted = torch.stack([v[0].long() for v in verified])
            new_token = torch.stack([v[1].long() for v in verified])
        if isinstance(drafter, StaticDFlashDrafter) and not tree:
            drafter.append(features, positions[:m])
        elif isinstance(drafter, StaticEagle3Drafter) and not tree:  # the whole verify block (appends_whole_block), the next draft reads it
            drafter.append(features, positions, ids)
        values = torch.cat([accepted[:, None], draft_tokens if draft_tokens is not None else accepted[:, None][:, :0],
                            new_token[:, None]], dim=1).tolist()  # the step's one host sync
        t3 = time.perf_counter()
        for r, row in enumerate(rows[:m]):
            if row is None:
                continue
            acc = values[r][0]
            new = values[r][1:1 + acc] + [values[r][-1]]
            row.stats.accepted_per_step.append(acc)
            row.stats.steps_without_drafts += bool(num_drafts) and num_drafts[r] == 0  # prompt lookup without a match
            row.stats.draft_s += t1 - t0
            row.stats.verify_s += t2 - t1
            row.stats.other_s += t3 - t2
            if row.drafter is not None:
                row.drafter.append_context(None, row.pos, ids[r, :acc + 1])
            row.pos += len(new)
            row.out.extend(new)
            row.ended = bool(eos.intersection(new))
        tokens[:m].copy_(new_token)
        positions.copy_(torch.tensor([row.pos if row else parked(r) for r, row in enumerate(rows)]))
        settle()


def finish(r: int, row: Row, max_new_tokens: int, eos: set, next_request, with_ids: bool = False) -> None:
    """Trim the row's output as ``generate`` does (first end-of-sequence token, the budget), hand it on, refill the row.
    ``with_ids``: the generation carries the tokens its row's caches hold (``Generation.cache_ids``, the batch-1 protocol)."""
    stats = row.stats
    out = trim_output(row.out, stats, eos, max_new_tokens)
    stats.decode_s = stats.draft_s + stats.verify_s + stats.other_s
    next_request(r, Generation(tokens=out, stats=stats, cache_ids=row.seen() if with_ids else []), row.stream)


def generate_batch(target: StaticTarget, drafter, prompts: list[list[int]], max_new_tokens: int = 256, *, batch_size: int = 8,
                   sampling: SamplingConfig = SamplingConfig(), eos_token_ids: int | Iterable[int] | None = (), prefill_chunk: int = 4096,
                   refill_wave: int | None = None, run_steps: int = 8, seeds: Sequence[int] | None = None,
                   verify_first: int | None | str = "auto", cached_ids: Sequence[int] | None = None,
                   run_ahead: bool = False) -> list[Generation]:
    """``generate`` for many prompts, ``batch_size`` in flight; results in the prompts' order. ``seeds``: one sampling
    seed per prompt (default ``sampling.seed`` for every one); ``verify_first``, ``cached_ids``, ``run_ahead``:
    ``generate_streams``'."""
    if not prompts:
        raise ValueError("prompts: none given; expected at least one prompt")
    results: list[Generation | None] = [None] * len(prompts)

    def driver(stream: int, finished: Generation | None):
        if finished is None:
            return list(prompts[stream])
        results[stream] = finished
        return None

    verify_len = drafter.verify_tokens if drafter is not None else 1
    capacity = max(len(p) for p in prompts) + max_new_tokens + verify_len
    generate_streams(target, drafter, driver, len(prompts), batch_size=batch_size, capacity=capacity, max_new_tokens=max_new_tokens,
                     sampling=sampling, eos_token_ids=eos_token_ids, prefill_chunk=prefill_chunk, refill_wave=refill_wave,
                     run_steps=run_steps, stream_seeds=seeds, verify_first=verify_first, cached_ids=cached_ids,
                     run_ahead=run_ahead)
    return results
