"""The speculative-decoding loop (batch size 1) and its autoregressive baseline.

    prefill:  the prompt in chunks through the target; each chunk's features go to the drafter's caches (the target
              alone and prompt lookup: only past the prefix the target's cache already holds, ``cached_ids``)
    step:     draft B-1 tokens in one drafter pass (prompt lookup: 0 .. B-1, what it found) -> verify [last token,
              drafts] in one target pass -> accept a prefix + one target token -> append the accepted positions' features
    stop:     an end-of-sequence token or the token budget

Caches need no rollback: the target's next forward starts at the first unaccepted position and
overwrites it (``models/target.py``), and the drafter's context only ever receives accepted positions
(static drafters, ``appends_whole_block``: the whole verify block, queued before the host sync; a block query
never sees the rejected tail, which the next append writes over). One host sync per step (marked), reading the
accepted count and the new tokens together.

EAGLE-3 (``models/eagle3.py``): the same loop with a chain of k drafts (block size k + 1):
the drafter runs step 0 over the newly accepted positions (index t = features of t + token t+1, so
the last accepted position waits for the bonus token) and k - 1 chain steps, each fed the previous
step's token and hidden state; chain keys are scratch, only accepted positions enter its context,
re-extended with the target's true features. Speculative sampling is unchanged: the draft
distributions are scattered from the draft vocabulary into the target's. With a dynamic tree
(EAGLE-2: top-k expansion per depth, the best ``tree_tokens`` nodes by cumulative log-prob), all
nodes are verified in one target forward under a tree mask at positions ``pos + depth``; the
longest path that matches the target's argmax is accepted, its keys/values move to consecutive
cache slots and its features go to the drafter. Trees are greedy only (temperature > 0 is refused).
With ``tree_lookup`` prompt lookup's chain joins each tree as one more branch (a hybrid of the two).

Batching is ``infer/batch.py``: the same step for many rows over per-row static caches, each row's output and
accepted counts this loop's.
"""

from __future__ import annotations

import functools
import operator
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Sequence

import torch

from models.dflash import DFlashDrafter, StaticDFlashDrafter
from models.eagle3 import Eagle3Drafter, StaticEagle3Drafter
from models.trees import accept_tree, merge_chain
from infer.prompt_lookup import GrowingLookup, PromptLookupDrafter
from models.sampling import SamplingConfig, choose, verify
from models.static_target import DECODE_MAX_TOKENS, StaticTarget
from models.target import CachedTarget


class PhaseTimer:
    """Wall time per phase: CUDA events on GPU (read once at the end), perf_counter on CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object]] = []

    def mark(self, name: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((name, event))
        else:
            self.marks.append((name, time.perf_counter()))

    def totals(self) -> dict[str, float]:
        """Seconds spent between each mark and the next, summed by the later mark's name."""
        if self.cuda:
            torch.cuda.synchronize()
        out: dict[str, float] = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:]):
            dt = a.elapsed_time(b) / 1000 if self.cuda else b - a
            out[name] = out.get(name, 0.0) + dt
        return out


def pooled_acceptance(accepted_per_step: list[int], block_size: int) -> tuple[float, list[float]]:
    """τ (mean over verify steps of accepted drafts + 1) and, entry k-1, the fraction of steps that accepted
    draft k (k = 1 .. block_size-1); one run's steps or many runs' pooled."""
    n = max(len(accepted_per_step), 1)
    return (sum(a + 1 for a in accepted_per_step) / n,
            [sum(a >= k for a in accepted_per_step) / n for k in range(1, block_size)])


@dataclass
class GenerationStats:
    prompt_tokens: int
    new_tokens: int
    block_size: int  # most tokens one step can produce (drafts + 1): 1 for the autoregressive baseline, depth + 1 for trees
    accepted_per_step: list[int] = field(default_factory=list)  # accepted drafts per verify step
    prefill_s: float = 0.0
    draft_s: float = 0.0  # drafter: context projection + block pass
    verify_s: float = 0.0  # target forward on the block
    other_s: float = 0.0  # choosing, acceptance, bookkeeping, the per-step host sync
    decode_s: float = 0.0  # all decode steps (draft + verify + other)
    # drafts the last step accepted past the budget or an end-of-sequence token: cut from the output, so not in
    # accepted_per_step (vLLM's counters do count them: ``untrimmed_steps`` is what they compare with)
    accepted_past_end: int = 0
    reused_tokens: int = 0  # leading prompt tokens whose keys/values the cache held already (not prefilled; ``cached_ids``)
    # verify steps that proposed no draft (prompt lookup without an n-gram match: one token decoded, counted accepted 0
    # in τ; vLLM's counters leave such a step out of its mean acceptance length: ``tau_drafting_steps``)
    steps_without_drafts: int = 0

    @property
    def untrimmed_steps(self) -> list[int]:
        """Accepted drafts per step as an engine that also counts the last step's drafts past the end reports them."""
        steps = list(self.accepted_per_step)
        if steps:
            steps[-1] += self.accepted_past_end
        return steps

    @property
    def steps(self) -> int:
        return len(self.accepted_per_step)

    @property
    def tau(self) -> float:
        """Mean over verify steps of (accepted drafts + 1); 0.0 when no step verified anything (the output the prefill's
        one token), where τ is undefined: ``tau_or_none`` is None there (``to_dict``'s null, ``python -m infer``'s "n/a")."""
        return pooled_acceptance(self.accepted_per_step, self.block_size)[0]

    @property
    def acceptance_by_position(self) -> list[float]:
        """Entry k-1: fraction of steps that accepted draft k (k = 1 .. B-1)."""
        return pooled_acceptance(self.accepted_per_step, self.block_size)[1]

    @property
    def decoded_tokens(self) -> int:
        """The new tokens the decode steps made: all but the first, which the prefill's forward makes (its time is
        ``prefill_s``, not ``decode_s``)."""
        return max(self.new_tokens - 1, 0)

    @property
    def tokens_per_s(self) -> float:
        """Decoding speed: ``decoded_tokens`` over ``decode_s`` (counting the prefill's token in ``decode_s``'s window
        overstated it by N/(N-1): 0.4% at 256 tokens, 3% at 32)."""
        return self.decoded_tokens / self.decode_s if self.decode_s else 0.0

    @property
    def tau_or_none(self) -> float | None:
        """``tau``, or None when no step verified anything (τ undefined: JSON null, printed "n/a")."""
        return self.tau if self.steps else None

    def to_dict(self) -> dict:
        return {**asdict(self), "steps": self.steps, "tau": self.tau_or_none, "acceptance_by_position": self.acceptance_by_position,
                "tokens_per_s": self.tokens_per_s}


@dataclass
class Generation:
    tokens: list[int]  # new tokens only (up to and including an end-of-sequence token)
    stats: GenerationStats
    # the token ids whose keys/values the target's cache (row 0) holds at positions 0 .. len-1 when the generation ends:
    # the prompt and every output token the target has seen (all but the newest); the next ``generate``'s ``cached_ids``
    cache_ids: list[int] = field(default_factory=list)


def eos_id_set(eos_token_ids: int | Iterable[int] | None) -> set[int]:
    """The end-of-sequence ids as a set: one id (an int, as Hugging Face's ``generation_config.eos_token_id`` often is;
    a NumPy integer or a 0-d integer tensor too), an iterable of them, or None (none). Anything else, a bool or a float
    included, is refused: no token id."""
    if eos_token_ids is None:
        return set()
    one = token_id(eos_token_ids)
    if one is not None:
        return {one}
    try:
        ids = list(eos_token_ids)
    except TypeError:
        ids = [eos_token_ids]  # not iterable and no integer (a float): refused below
    out = set()
    for t in ids:
        i = token_id(t)
        if i is None:
            raise ValueError(f"eos_token_ids={eos_token_ids!r}: {t!r} is no token id; expected an integer id or a list of them")
        out.add(i)
    return out


def token_id(value) -> int | None:
    """``value`` as an int when it is one integer (``operator.index``: an int, a NumPy integer, a 0-d integer tensor),
    else None (a bool too: an int to Python, no token id)."""
    if isinstance(value, bool) or (torch.is_tensor(value) and value.dtype == torch.bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def common_prefix(a, b) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def reuses_prefixes(drafter) -> bool:
    """Whether a prompt's cached prefix can skip the prefill with this drafter: the target alone, prompt lookup (tokens
    only) and the static drafters, whose context caches hold the prefix as the target's cache holds its keys
    (``kept_prefix``: how much, 0 where a sliding layer's ring no longer holds what the prompt's window reads; EAGLE-3
    resumes a position earlier, its keys being made with the next token). The eager drafters prefill whole prompts."""
    return drafter is None or isinstance(drafter, (PromptLookupDrafter, StaticDFlashDrafter, StaticEagle3Drafter))


def reusable_prefix(target, drafter, cached_ids, prompt_ids: list[int]) -> int:
    """How many leading prompt tokens a prefill can skip because the target's cache holds them (``cached_ids``): their
    common prefix, less one (the last prompt token runs for the first new token's logits). Static targets only, with a
    drafter that ``reuses_prefixes``."""
    if not cached_ids or not isinstance(target, StaticTarget) or not reuses_prefixes(drafter):
        return 0
    return min(common_prefix(cached_ids, prompt_ids), len(prompt_ids) - 1)


def trees_on_rows(drafter) -> bool:
    """A static drafter's trees: drafted by the batched loop's tree step at every batch size (``generate_tree_row`` at
    batch 1). On a GPU, callers with many prompts at batch 1 run them through ``infer.batch`` on one row: one capacity
    for all of them, so the tree step is compiled and captured once, not again each time a prompt outgrows the caches
    (an H200 spent 30-75 s on each)."""
    return isinstance(drafter, (StaticDFlashDrafter, StaticEagle3Drafter)) and drafter.tree


def generate_tree_row(target: StaticTarget, drafter: StaticDFlashDrafter | StaticEagle3Drafter, prompt: torch.Tensor,
                      max_new_tokens: int, eos_token_ids: Iterable[int], prefill_chunk: int, cached_ids) -> Generation:
    """``generate`` for a static drafter's trees: the batched loop's tree step (``infer.batch``) on one row, so batch 1
    drafts trees on the same static (on a GPU captured) caches as any batch, with the same tokens and accepted counts
    as the eager drafters' ``tree_step`` (on the CPU as fast on one thread, 25% faster on two). The batch-1 protocol holds:
    ``cached_ids`` (bounded by the drafter's ``context_ids``) is reused, and the result's ``cache_ids`` is what the
    row's caches hold."""
    from infer.batch import generate_batch  # infer.batch builds on this module

    prompt_list = prompt.tolist()
    cached = []
    if cached_ids and reuses_prefixes(drafter):  # what both the target's cache and the drafter's context hold
        cached = list(cached_ids[:min(common_prefix(cached_ids, prompt_list), common_prefix(drafter.context_ids, prompt_list))])
    result = generate_batch(target, drafter, [prompt_list], max_new_tokens, batch_size=1, eos_token_ids=eos_token_ids,
                            prefill_chunk=prefill_chunk, cached_ids=cached)[0]  # cached_ids given: the result carries cache_ids
    drafter.context_ids = result.cache_ids
    return result


VERIFY_FIRST = 4  # drafts a staged verify checks in its first pass (``verify_stages``)


def verify_stages(target, drafter, sampling: SamplingConfig) -> int | None:
    """How many drafts a verify checks before the rest (``staged_verify``), or None for one pass over the block.

    On the CPU a verify pass costs per token (its products are compute-bound), and a DFlash chain of 15 drafts accepts
    few of them (the recipe's drafter on 12 MT-Bench first turns: 22% of steps accept 4 or more, 10% 7 or more). Greedy
    acceptance is the longest prefix of drafts the target's argmax matches, so checking the first ``VERIFY_FIRST`` and
    verifying the rest only where all of them matched gives the same tokens and counts over fewer verified tokens.
    Prompt lookup's chains stay one pass: staged (its rows' own draft counts as ``lengths``), batch 8 gained 2-5% and
    batch 1 lost 8-12% on all 80 MT-Bench conversations (BENCHMARKS.md, tried and not kept).
    A GPU's verify is memory-bound (16 tokens cost about one), so it runs one pass; sampling draws its acceptance
    in order over the whole block, and trees and short chains have no long tail to skip. EAGLE-3 chains are left out:
    its static drafter takes the whole verify block (``appends_whole_block``) into a pending block, which has not been
    checked to ignore the rejected tail's features (DFlash's block never sees past the accepted context).
    A block-causal static DFlash drafter (``drafts_in_stages``: the recipes') drafts in the same two stages: its first
    ``VERIFY_FIRST`` slots, and the rest of the block only for the rows the second pass verifies (``staged_verify``'s
    drafter)."""
    if drafter is None or drafter.tree or not sampling.greedy or not isinstance(target, StaticTarget) or target.capture:
        return None
    if target.device.type != "cpu" or not isinstance(drafter, (DFlashDrafter, StaticDFlashDrafter)):
        return None
    return VERIFY_FIRST if drafter.verify_tokens - 1 >= 2 * VERIFY_FIRST else None


def staged_verify(target: StaticTarget, ids: torch.Tensor, pos: torch.Tensor, first: int,
                  drafter: StaticDFlashDrafter | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``target.step(ids, pos)`` for greedy chains in two passes: ``ids`` [B, n] (each row's token and its n - 1 drafts)
    first [B, first] (the predictions that check drafts 1 .. ``first``), then the rest only for the rows whose checked
    drafts all matched (``step``'s ``lengths``: the other rows run one token, their outputs unused); when no row matched,
    no second pass. Returns logits [B, n, V] and features [B, n, k*H] whose positions past a row's first mismatch may be
    zeros or another row's padding: greedy acceptance never reads past the first mismatch, and the drafter's context
    never shows a position past the accepted ones (its next append writes over them). One host sync (whether any row
    matched) between the passes.

    drafter: a block-causal DFlash drafter whose drafts past ``first`` are not drafted yet (``ids`` holds placeholders
    there, after its ``first_drafts``): its ``rest_drafts`` drafts them for the matched rows only, written into ``ids``
    in place before the second pass. The other rows' placeholders stay: acceptance stops at their first mismatch, among
    the checked drafts."""
    logits, features = target.step(ids[:, :first], pos)
    matched = (logits.argmax(-1) == ids[:, 1:first + 1]).all(1)  # [B]
    rest = ids.shape[1] - first
    if bool(matched.any()):
        if drafter is not None:
            rows = matched.nonzero()[:, 0]
            ids[rows, first + 1:] = drafter.rest_drafts(pos[rows], rows, first)
        lengths = torch.where(matched, rest, 1)
        more_logits, more_features = target.step(ids[:, first:], pos + first, lengths)
    else:
        more_logits = logits.new_zeros(ids.shape[0], rest, logits.shape[2])
        more_features = None if features is None else features.new_zeros(ids.shape[0], rest, features.shape[2])
    return torch.cat([logits, more_logits], 1), None if features is None else torch.cat([features, more_features], 1)


def read_back(values: torch.Tensor, launch_ahead: Callable[[], object] | None, timer: PhaseTimer,
              phase: str) -> tuple[list[int], object]:
    """``values`` (1-D) read on the host with ``launch_ahead`` (the next step's work, or None) queued before the host
    waits (its phase marked ``phase``): on a GPU the values are copied back first and the host waits on that copy alone,
    not on the stream, whose queue by then holds the next step; the host launches the step after while the GPU runs it.
    (Waiting on the stream, ``.item()`` / ``.tolist()`` on the device tensor, waited for the queued step too, and the GPU
    then idled through the host's turn: BENCHMARKS.md "The autoregressive baseline's run-ahead waited for the step it had
    queued".) Returns the values and what ``launch_ahead`` returned (None without it)."""
    ready, launched = None, None
    if launch_ahead is not None:
        if values.is_cuda:
            values, ready = values.to("cpu", non_blocking=True), torch.cuda.Event()
            ready.record()
        launched = launch_ahead()  # reads the device values (the closure's own reference), not the host copy
        timer.mark(phase)
    if ready is not None:
        ready.synchronize()
    return values.tolist(), launched  # host sync


def read_step(values: torch.Tensor, launch_ahead: Callable[[], object] | None, timer: PhaseTimer) -> tuple[int, list[int], object]:
    """A step's ``values`` [accepted, drafts.., token after them] read on the host (``read_back``), with ``launch_ahead``
    (the next step's drafting, or None) queued before the host waits: the host waits for the verify alone and launches
    the next verify while the GPU drafts (after the drafting, the GPU idled through the host's launch). Returns the
    accepted count, the new tokens and what ``launch_ahead`` returned (None without it)."""
    values, launched = read_back(values, launch_ahead, timer, "draft")
    accepted = values[0]
    return accepted, values[1:1 + accepted] + [values[-1]], launched


@functools.lru_cache(maxsize=None)
def forced_count(count: int, device: torch.device) -> torch.Tensor:
    """The benchmark mode's accepted count as a device constant, the same tensor every generation: a verify graph that
    reads it in place (``StaticTarget.greedy_forward(at=)``) is captured once, not once per generation."""
    return torch.tensor(count, device=device)


@functools.lru_cache(maxsize=None)
def trace_slot(device: torch.device) -> torch.Tensor:
    """The one buffer a replayed trace writes each step's count into (``ForcedAcceptance``): the same tensor every
    generation, so a verify graph reading it in place is captured once."""
    return torch.zeros((), dtype=torch.long, device=device)


class ForcedAcceptance:
    """The benchmark mode's accepted counts (``generate(accept_per_step=)``): one count every step, or a trace of counts
    measured on a real run (``eval.acceptance_trace``) replayed in order, from its start again when a generation
    outlasts it. ``count`` is the device tensor the verify reads: for one count a cached constant (nothing launched a
    step); for a trace one persistent buffer per device, filled with the step's count before its verify (one fill
    kernel a step on a GPU, which a fixed count's rows do not pay: a trace's speed is the stricter of the two)."""

    def __init__(self, counts: int | Sequence[int], device: torch.device):
        self.trace = None if isinstance(counts, int) else [int(c) for c in counts]
        self.count = trace_slot(device) if self.trace else forced_count(counts, device)
        self.value = counts if self.trace is None else None  # the fixed count on the host: no read of ``count`` a step
        self.steps = 0

    def next(self) -> int:
        """The next step's count, on the host; a trace's is written to ``count`` first (stream-ordered after every
        kernel queued so far, so a verify or drafting step already queued reads its own step's count)."""
        if self.trace is None:
            return self.value
        k = self.trace[self.steps % len(self.trace)]
        self.steps += 1
        self.count.fill_(k)
        return k


def check_forced(accept_per_step: int | Sequence[int], drafter) -> None:
    """``generate``'s check of the benchmark mode: a chain drafter, every count 0 .. its drafts."""
    if isinstance(accept_per_step, int):
        if drafter is None or drafter.tree or not 0 <= accept_per_step < drafter.block_size:
            raise ValueError(f"accept_per_step={accept_per_step}: needs a chain drafter and 0 <= it < its block size")
        return
    counts = list(accept_per_step)
    if drafter is None or drafter.tree:
        raise ValueError(f"accept_per_step: a trace of {len(counts)} counts needs a chain drafter (got {type(drafter).__name__}"
                         f"{' with trees' if drafter is not None else ''})")
    if not counts:
        raise ValueError("accept_per_step: an empty trace; expected at least one accepted count")
    for i, c in enumerate(counts):
        if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < drafter.block_size:
            raise ValueError(f"accept_per_step: the trace's step {i} accepts {c!r}; expected an integer 0 .. "
                             f"{drafter.block_size - 1} (the drafter's {drafter.block_size - 1} drafts a step)")


def next_token(target: CachedTarget, token: torch.Tensor, pos: int, sampling: SamplingConfig, generator: torch.Generator,
               fused_greedy: bool) -> torch.Tensor:
    """The target's token [] after ``token`` at ``pos`` (a plain decode step): through ``greedy_step`` (argmax in the
    graph; cloned, since a run-ahead step replays the same graph before the host reads this one) or a forward and
    ``choose``."""
    if fused_greedy:
        return target.greedy_forward(token[None], pos)[0][-1].clone()
    logits, _ = target.forward(token[None], pos)
    return choose(logits, sampling, generator)[0][0]


def trim_output(out: list[int], stats: GenerationStats, eos: set, max_new_tokens: int) -> list[int]:
    """A generation's tokens up to its first end-of-sequence token and the budget; ``stats`` counts what is kept. The
    last step may accept drafts past the budget or an end-of-sequence token: those are cut from the output, so they are
    not counted as accepted either (1 prefill token + sum of (accepted + 1) = output), but kept in
    ``accepted_past_end`` (an engine's counters include them: ``GenerationStats.untrimmed_steps``)."""
    for i, t in enumerate(out):
        if t in eos:
            out = out[:i + 1]
            break
    out = out[:max_new_tokens]
    stats.new_tokens = len(out)
    excess = 1 + sum(a + 1 for a in stats.accepted_per_step) - len(out)
    if excess > 0 and stats.accepted_per_step:
        kept = max(0, stats.accepted_per_step[-1] - excess)
        stats.accepted_past_end = stats.accepted_per_step[-1] - kept
        stats.accepted_per_step[-1] = kept
    return out


@torch.no_grad()
def generate(target: CachedTarget, drafter: DFlashDrafter | Eagle3Drafter | PromptLookupDrafter | None, prompt_ids, max_new_tokens: int = 256,
             sampling: SamplingConfig = SamplingConfig(), eos_token_ids: int | Iterable[int] | None = (), prefill_chunk: int = 4096,
             accept_per_step: int | Sequence[int] | None = None, run_ahead: bool | None = None, cached_ids=None,
             verify_first: int | None | str = "auto") -> Generation:
    """Speculative decoding with ``drafter``, or plain autoregressive decoding when it is None.

    Args:
        prompt_ids: the prompt's token ids (list or 1-D tensor), at least one.
        max_new_tokens: budget of new tokens.
        eos_token_ids: ids that end the generation (kept in the output): one id or several (``eos_id_set``).
        prefill_chunk: prompt tokens per prefill forward (bounds activation memory on long prompts).
        accept_per_step: speed benchmarks only (a random-weight target at a real shape, where nothing would be
            accepted): every step accepts this many drafts whatever the verification says, and takes the target's
            token after them; the work per step is the real loop's, the output is not the target's. Chains only.
            A sequence: a trace of accepted counts (a real run's, ``eval.acceptance_trace``), step i accepting entry i,
            from the start again past its end.
        run_ahead: launch work before the host reads the previous step's result (default: on a GPU, where the host's
            sync and launch would otherwise leave it idle; the output is the same either way): the target alone, each
            step; with a drafter that takes a device anchor (``draft_at``: the static DFlash and EAGLE-3 drafters), the
            next block or chain; a greedy chain of a drafter with ``append_and_draft`` (the static DFlash drafter) runs
            its append and next block as one step the verify's graph hands its outputs to in place.
        cached_ids: the token ids whose keys/values row 0 of the target's cache holds at positions 0 .. (the previous
            generation's ``Generation.cache_ids``, nothing written to the target since): the prompt's common prefix with
            them is not prefilled again (a conversation's next turn holds the earlier turns and answers). A static
            target with the target alone, prompt lookup or a static drafter, whose context keeps the prefix likewise
            (``reusable_prefix``); ignored otherwise.
    """
    device = target.device
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=device).reshape(-1)
    n = prompt.shape[0]
    if n == 0:
        raise ValueError("prompt is empty; expected at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}; expected >= 1")
    # as ``infer.batch`` refuses it: 0 was range()'s own error, a negative chunk prefilled nothing and failed on an unset
    # variable (UnboundLocalError), a float a TypeError
    if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 1:
        raise ValueError(f"prefill_chunk={prefill_chunk!r}; expected an integer >= 1")
    eos = eos_id_set(eos_token_ids)  # before anything runs (one int was a TypeError, 'int' object is not iterable)
    if drafter is not None and drafter.target_layer_ids and list(drafter.target_layer_ids) != list(target.feature_layer_ids):
        # in order: the features are concatenated in the target's order, and a drafter reads them in its own
        raise ValueError(f"drafter reads target layers {drafter.target_layer_ids}, the target captures {target.feature_layer_ids} "
                         "(in that order); expected the same list")
    if drafter is not None and drafter.tree and not sampling.greedy:
        raise ValueError(f"tree drafting is greedy only (temperature={sampling.temperature}); leave out the tree options to sample with chains")
    if accept_per_step is not None:
        check_forced(accept_per_step, drafter)
    block = drafter.block_size if drafter is not None else 1
    verify_len = drafter.verify_tokens if drafter is not None else 1
    first = verify_stages(target, drafter, sampling) if verify_first == "auto" else verify_first
    if first is not None and (not sampling.greedy or not isinstance(target, StaticTarget) or drafter is None or drafter.tree or first < 1):
        raise ValueError(f"verify_first={first}: a staged verify checks >= 1 drafts of a greedy chain on a static target")
    if trees_on_rows(drafter):
        if not isinstance(target, StaticTarget):  # its tree step verifies on the static target's tree_greedy
            raise ValueError(f"{type(drafter).__name__}'s trees run on a StaticTarget; with a {type(target).__name__} draft trees "
                             "with the eager drafter (Eagle3Drafter / DFlashDrafter)")
        return generate_tree_row(target, drafter, prompt, max_new_tokens, eos, prefill_chunk, cached_ids)
    prompt_list = prompt_ids.reshape(-1).tolist() if torch.is_tensor(prompt_ids) else [int(t) for t in prompt_ids]  # once
    lookup = GrowingLookup()  # the trees' lookup branch (``tree_lookup``) over the prompt and the output so far
    reuse = reusable_prefix(target, drafter, cached_ids, prompt_list)
    if reuse:
        reuse = min(reuse, target.allocate(n + max_new_tokens + verify_len, keep=reuse))
    else:
        target.allocate(n + max_new_tokens + verify_len)
    if isinstance(drafter, (StaticDFlashDrafter, StaticEagle3Drafter)):
        # its context holds the features of the tokens its last generation saw (``context_ids``; not the target's cache:
        # a baseline run in between moves that alone), kept where its rings still hold what the prompt's window reads
        # a prompt the caches hold whole (reuse capped at n - 1): EAGLE-3's key at n - 1 is the prompt's (kept_prefix caps)
        held = min(reuse + (0 < reuse == n - 1), common_prefix(drafter.context_ids, prompt_list))
        drafter.reset(n + max_new_tokens + verify_len, keep=held)
        reuse = drafter.kept_prefix(0, held, n) if held else 0
        drafter.context_ids = []  # until this generation ends
    elif drafter is not None:
        drafter.reset(n + max_new_tokens + verify_len)
    generator = torch.Generator(device=device).manual_seed(sampling.seed)
    stats = GenerationStats(prompt_tokens=n, new_tokens=0, block_size=block, reused_tokens=reuse)

    timer = PhaseTimer(device)
    timer.mark("start")
    if reuse and isinstance(drafter, PromptLookupDrafter):  # the tokens only
        drafter.append_context(None, 0, prompt[:reuse])
    for start in range(reuse, n, prefill_chunk):
        logits, features = target.forward(prompt[start:start + prefill_chunk], start, last_logits_only=True)
        if drafter is not None:
            drafter.append_context(features, start, prompt[start:start + prefill_chunk])
    token = choose(logits, sampling, generator)[0][0]  # [] the first new token, at position n
    timer.mark("prefill")
    out = [int(token)]  # host sync (once, after prefill)
    pos = n  # position of `token`, which the target has not seen yet

    run_ahead = device.type == "cuda" if run_ahead is None else run_ahead
    forced = None if accept_per_step is None else ForcedAcceptance(accept_per_step, device)
    forced_accept = None if forced is None else forced.count  # the count the verify reads (a trace's: rewritten each step)
    # greedy on a static target: each verify (or decode step) and its acceptance run as one captured graph
    # (``StaticTarget.greedy_step``) instead of a forward and a dozen small kernels launched after it; a staged verify
    # and trees keep their own paths
    fused_greedy = (sampling.greedy and isinstance(target, StaticTarget) and target.batch == 1 and first is None
                    and (drafter is None or not drafter.tree))
    fixed_shapes = getattr(target, "capture", False)  # captured steps: a shorter draft is padded to the full block
    # a greedy chain whose drafter takes a whole step in one call (``StaticDFlashDrafter.append_and_draft``): the verify
    # graph reads the drafter's step buffers in place and the drafter's graph the verify's outputs, so a step launches
    # two graphs and the copy of its result, nothing between them (before: ~20 copies and small kernels, ~40 µs at the
    # 8B shape on an H200)
    chained = (fused_greedy and run_ahead and drafter is not None and hasattr(drafter, "append_and_draft")
               and drafter.block_size <= DECODE_MAX_TOKENS)
    chain_inputs = target.chain_inputs(drafter.block_size) if chained else None  # the verify's ids and position
    ahead = None  # run_ahead: the next token (or the next drafts), launched before the host reads this step's result
    while len(out) < max_new_tokens and out[-1] not in eos:
        timer.mark("other")
        if drafter is None:
            if ahead is None:
                ahead = next_token(target, token, pos, sampling, generator, fused_greedy)
            token, ahead = ahead, None
            # run_ahead: the next step queued before the host reads this token (``read_back``: the host waits for this
            # step alone), so the GPU never idles while the host reads a token and launches the step after; after an
            # end-of-sequence token the queued step is discarded (output unchanged)
            launch = ((lambda: next_token(target, token, pos + 1, sampling, generator, fused_greedy))
                      if run_ahead and len(out) + 1 < max_new_tokens else None)
            if launch is None:
                timer.mark("verify")
            new, ahead = read_back(token.reshape(1), launch, timer, "verify")  # marks "verify" after the launch
            stats.accepted_per_step.append(0)
        elif chained:
            if ahead is None:  # the generation's first block; each step's drafter graph writes the next into the same buffers
                ahead = drafter.start_chain(token, pos, *chain_inputs)
                timer.mark("draft")
            ids, at = ahead
            if forced is not None:
                forced.next()  # a trace's count for this verify, written where its graph reads it
            values, features = target.greedy_forward(ids, pos, forced_accept, at=at)  # [accepted, drafts.., next token]
            timer.mark("verify")
            if len(out) + 1 < max_new_tokens:
                step_ahead = lambda: drafter.append_and_draft(features, values, *chain_inputs)  # noqa: E731
            else:  # the budget ends the generation at this step: the append alone (the next turn reuses the context), no block
                step_ahead = lambda: drafter.append(features[None], chain_inputs[1])  # noqa: E731
            accepted, new, _ = read_step(values, step_ahead, timer)
            stats.accepted_per_step.append(accepted)
            timer.mark("other")
        elif drafter.tree:
            new, token = tree_step(target, drafter, token, pos, timer,
                                   (lambda: lookup(prompt_list, out, drafter.tree_lookup)) if drafter.tree_lookup else None)
            stats.accepted_per_step.append(len(new) - 1)
        else:
            # a block-causal DFlash drafter under a staged verify drafts the checked slots first, the rest only if they all
            # match (``staged_verify``'s drafter): the same drafts, most of the block pass skipped on most steps
            in_stages = (first is not None and ahead is None and accept_per_step is None and getattr(drafter, "drafts_in_stages", False)
                         and first < drafter.drafts)
            if in_stages:
                anchor = torch.tensor([pos], device=device)
                head = drafter.first_drafts(token.reshape(1), anchor, first)[0]
                draft_tokens, draft_probs = torch.cat([head, head.new_zeros(drafter.drafts - first)]), None
            else:
                draft_tokens, draft_probs = drafter.draft(token, pos, sampling, generator) if ahead is None else ahead
            ahead = None
            timer.mark("draft")
            num_drafts = draft_tokens.shape[0]  # k; prompt lookup: 0 .. k, what it found
            stats.steps_without_drafts += num_drafts == 0
            block_ids = torch.cat([token[None], draft_tokens])
            if num_drafts < block - 1 and (fixed_shapes or accept_per_step is not None):
                # a captured target replays one graph per block length, and the benchmark mode accepts a fixed count:
                # the block padded to its full length (copies of its last token); only its real part is verified
                block_ids = torch.cat([block_ids, block_ids[-1:].expand(block - 1 - num_drafts)])
            forced_k = None if forced is None else forced.next()  # this step's count (a trace's written to forced_accept)
            # no padded tail to keep out of the count; a short block (a verify, not a prefill chunk)
            fused = fused_greedy and num_drafts == block_ids.shape[0] - 1 and block_ids.shape[0] <= DECODE_MAX_TOKENS
            if fused:
                values, features = target.greedy_forward(block_ids, pos, forced_accept)  # [accepted, drafts.., next token]
                logits = None
            elif first is not None and first < num_drafts and accept_per_step is None:
                at = torch.tensor([pos], device=device)
                logits, features = staged_verify(target, block_ids[None], at, first, drafter if in_stages else None)
                logits, features = logits[0], None if features is None else features[0]
                draft_tokens = block_ids[1:]  # with the rest drafted in the verify, where it was
            else:
                logits, features = target.forward(block_ids, pos)
            timer.mark("verify")
            whole_block = getattr(drafter, "appends_whole_block", False)  # fixed shapes: the rejected tail is written over next step
            if whole_block:  # needs nothing the host sync reads: queued before it, the GPU runs it while the host waits
                drafter.append_context(features, pos, block_ids)  # (launched after it, the GPU sat idle through the launch)
                timer.mark("draft")
            if fused:  # the graph's buffers: read (or copied) before its next replay, as every use below is
                num_accepted, token = values[0], values[-1]
            else:
                # the real drafts only: the accepted count is at most their number, whatever a padded block's tail matched
                num_accepted, token = verify(draft_tokens, draft_probs, logits[:num_drafts + 1], sampling, generator)
                if forced is not None:  # benchmark mode (see the docstring); a fixed count made once, no copy per step
                    num_accepted, token, draft_tokens = forced_accept, logits[forced_k].argmax(), block_ids[1:]
                values = torch.cat([num_accepted[None], draft_tokens, token[None]])
            # the next block at pos + accepted + 1, before the host knows it (same generator order)
            draft_ahead = ((lambda: drafter.draft_at(token, num_accepted + (pos + 1), sampling, generator))
                           if run_ahead and hasattr(drafter, "draft_at") else None)
            accepted, new, ahead = read_step(values, draft_ahead, timer)
            stats.accepted_per_step.append(accepted)
            timer.mark("other")
            if not whole_block:
                drafter.append_context(None if features is None else features[:accepted + 1], pos, block_ids[:accepted + 1])
                timer.mark("draft")
        pos += len(new)
        out.extend(new)
        if eos.intersection(new):  # an end-of-sequence token inside the accepted block ends the generation too
            break
    timer.mark("other")
    cache_ids = prompt_list + out[:pos - n]  # every token the target has seen, the newest (at pos) not yet
    if isinstance(drafter, (StaticDFlashDrafter, StaticEagle3Drafter)):
        drafter.context_ids = cache_ids

    out = trim_output(out, stats, eos, max_new_tokens)
    totals = timer.totals()
    stats.prefill_s = totals.get("prefill", 0.0)
    stats.draft_s, stats.verify_s, stats.other_s = (totals.get(k, 0.0) for k in ("draft", "verify", "other"))
    stats.decode_s = stats.draft_s + stats.verify_s + stats.other_s
    return Generation(tokens=out, stats=stats, cache_ids=cache_ids)


def tree_step(target: CachedTarget, drafter: Eagle3Drafter | DFlashDrafter, token: torch.Tensor, pos: int, timer: PhaseTimer,
              lookup_chain: Callable[[], list[int]] | None = None) -> tuple[list[int], torch.Tensor]:
    """Draft a tree after ``token`` (at ``pos``), verify it in one forward, commit the accepted path.

    lookup_chain: prompt lookup's chain after the token ids at positions 0 .. pos (``token`` last), when the drafter adds
    it to its trees (``tree_lookup``). Returns the new tokens (accepted path + bonus) and the bonus token [] on the device.
    """
    tree = drafter.draft_tree(token, pos)
    if drafter.tree_lookup:
        tree = merge_chain(tree, lookup_chain())
    timer.mark("draft")
    ids = torch.cat([token[None], tree.tokens])  # [N+1], row 0 = the root
    positions = pos + torch.cat([tree.depths.new_zeros(1), tree.depths])
    logits, features = target.forward(ids, pos, positions=positions, mask=tree.mask(drafter.block_size - 1))
    timer.mark("verify")
    n = tree.tokens.shape[0]
    values = torch.cat([logits.argmax(-1), tree.tokens, tree.parents]).tolist()  # host sync
    path, bonus = accept_tree(values[n + 1:2 * n + 1], values[2 * n + 1:], values[:n + 1])
    rows = torch.tensor([0] + path, device=ids.device)
    if path:  # the path's keys/values (written at slots pos + row) move to pos + 1 .. pos + len(path)
        target.move(rows[1:] + pos, pos + 1)
    timer.mark("other")
    drafter.append_context(features[rows], pos, ids[rows])
    timer.mark("draft")
    return [values[n + r] for r in path] + [bonus], torch.tensor(bonus, device=ids.device)
