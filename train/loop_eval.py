"""How τ is measured during training: the greedy loop replayed on teacher-forced acceptances
(``walk_tau``, ``tau_summaries``: ``eval/block_tau``, both drafters) and run for real (``LoopEval``:
``eval/loop_*``).

``eval/loop_*``: the real speculative-decoding loop on held-out prompts, during training.

Teacher-forced metrics answer "how often is each draft right at a uniformly drawn position"; the
decoding loop answers "how many tokens per target pass", and the two differ (``tau_summaries``
below). So every ``trainer.eval_every`` steps the trainer also runs the loop that
serving runs (``infer.generate``: greedy, the drafter being trained, its trained window) on a fixed
set of held-out prompts, the first user turns of the eval split, and logs beside it:

    eval/loop_tau, eval/loop_acc_pos_k      the loop's τ and acceptance of draft k (per verify step)
    eval/loop_same_as_greedy                fraction of prompts whose output equals the target's greedy output
    eval/loop_tf_block_tau                  the training side's eval/block_tau (the loop replayed on teacher-forced
                                            acceptances) on the target's own greedy continuations of the same
                                            prompts: equal to eval/loop_tau up to numerics (tests/test_loop_eval.py)
    eval/loop_tf_anchor_tau                 the per-anchor mean there, which overstates it
    eval/loop_pld_tau                       prompt lookup (n-gram drafting, no training) on the same prompts

The greedy continuations and prompt lookup's τ depend on the target only: computed once at start-up.
"""

from __future__ import annotations

import contextlib
import logging
import time

import torch

from infer.generate import generate, pooled_acceptance
from infer.loading import decoding_target, eos_ids
from infer.prompt_lookup import PromptLookupDrafter
from models.dflash import DFlashDrafter
from models.eagle3 import Eagle3Drafter
from models.target import CachedTarget


log = logging.getLogger(__name__)


def held_out_prompts(eval_ds, num_prompts: int) -> list[list[int]]:
    """The first ``num_prompts`` eval rows cut before their first loss token: system + first user turn +
    the assistant header, exactly as training rendered them (the loop's prompt for that turn)."""
    prompts = []
    for row in eval_ds:
        if len(prompts) == num_prompts:
            break
        loss = row["loss_mask"]
        first = next((i for i, m in enumerate(loss) if m), None)
        if first:  # a row with no loss token, or one starting at 0, has no prompt to give
            prompts.append(list(row["input_ids"][:first]))
    return prompts


# ----------------------------------------------------------------------------- the loop replayed

def tau_summaries(prefix: str, accepted_sum: torch.Tensor, count: torch.Tensor, walk_tokens: torch.Tensor,
                  walk_steps: torch.Tensor) -> dict[str, float]:
    """Acceptance length from teacher forcing, two ways (both drafters use this).

    ``anchor_tau`` = 1 + mean over anchors of the leading correct drafts: every position weighs the
    same. The decoding loop does not visit positions uniformly: a step that accepts a drafts moves
    a + 1 positions on, so a run of easy positions (a repetition loop, a code block) is crossed in a
    few steps while every hard position costs a whole step, and ``anchor_tau`` overstates the loop's
    τ (BENCHMARKS.md "τ you can trust"). ``block_tau`` replays the loop instead (``walk_tau``) over
    whole assistant turns with a block at every position, which evaluation computes
    (``walk_tokens`` / ``walk_steps``; training batches draw random anchors and have no walk). On the
    target's own greedy output the replay is the loop's τ exactly (``tests/test_loop_eval.py``).
    """
    out = {f"{prefix}/anchor_tau": float(1 + accepted_sum / count.clamp(min=1))}
    if float(walk_steps) > 0:
        out[f"{prefix}/block_tau"] = float(walk_tokens / walk_steps)
    return out


def walk_segments(accepted: torch.Tensor, loss_mask: torch.Tensor) -> tuple[int, int]:
    """``walk_tau`` over each assistant turn of each row: [Bsz, T] leading correct drafts of a block
    anchored at every position (-1 where none) and [Bsz, T] the loss mask; a turn is a run of loss
    positions and the loop's first step there is anchored at its first token. Returns (tokens, steps)."""
    tokens = steps = 0
    for acc_row, mask_row in zip(accepted.tolist(), loss_mask.tolist()):  # host sync: evaluation only
        for start, end in assistant_turns(mask_row):
            n, s = walk_tau([max(a, 0) for a in acc_row[start:end]])
            tokens, steps = tokens + n, steps + s
    return tokens, steps


def assistant_turns(loss_mask: list[int]) -> list[tuple[int, int]]:
    """A row's assistant turns as [start, end) runs of loss positions."""
    turns, t = [], 0
    while t < len(loss_mask):
        if not loss_mask[t]:
            t += 1
            continue
        end = t
        while end < len(loss_mask) and loss_mask[end]:
            end += 1
        turns.append((t, end))
        t = end
    return turns


def drafts_per_step(drafter_cfg) -> int:
    """Drafts one verify checks: DFlash's block less its anchor, EAGLE-3's chain (prompt lookup beside gets as many)."""
    return drafter_cfg.block_size - 1 if drafter_cfg.kind == "dflash" else drafter_cfg.ttt_length


def prompt_lookup_block_tau(batch: dict, max_drafts: int) -> tuple[int, int]:
    """(tokens, steps) of prompt lookup's loop replayed over each assistant turn of a batch's rows, as ``block_tau``
    replays the drafter's: the baseline on the same replies."""
    accepted = [prompt_lookup_acceptance(ids, mask, max_drafts)
                for ids, mask in zip(batch["input_ids"].tolist(), batch["loss_mask"].long().tolist())]
    return walk_segments(torch.tensor(accepted), batch["loss_mask"].cpu())


def prompt_lookup_acceptance(input_ids: list[int], loss_mask: list[int], max_drafts: int, max_ngram: int = 3,
                             min_ngram: int = 1) -> list[int]:
    """Prompt lookup teacher-forced on a row: [T] the leading drafts of ``PromptLookupDrafter(max_drafts)`` a greedy
    verify accepts at each loss position (context ``input_ids[:t+1]``, drafts checked against the rest of that
    assistant turn), -1 elsewhere: ``walk_segments`` turns it into prompt lookup's ``block_tau`` on the same replies.

    One pass with an index of the most recent end of every n-gram seen, so a row costs O(T) and not ``propose``'s
    O(T) per position; equal to ``propose`` at every position (``tests/test_loop_eval.py``)."""
    last_end: dict[tuple[int, ...], int] = {}
    turn_end = [0] * len(loss_mask)  # where each loss position's assistant turn ends
    for start, end in assistant_turns(loss_mask):
        turn_end[start:end] = [end] * (end - start)
    out = [-1] * len(input_ids)
    for t in range(len(input_ids)):
        if t >= 1:  # n-grams ending at t-1 become visible (propose never matches the suffix itself)
            for n in range(min_ngram, max_ngram + 1):
                if t - n >= 0:
                    last_end[(n, *input_ids[t - n:t])] = t - 1
        if not loss_mask[t]:
            continue
        accepted = 0
        for n in range(min(max_ngram, t), min_ngram - 1, -1):
            e = last_end.get((n, *input_ids[t - n + 1:t + 1]))
            if e is not None:
                drafts = input_ids[e + 1:min(e + 1 + max_drafts, t + 1)]
                limit = min(len(drafts), turn_end[t] - t - 1)
                while accepted < limit and drafts[accepted] == input_ids[t + 1 + accepted]:
                    accepted += 1
                break
        out[t] = accepted
    return out


def leading_correct(correct: torch.Tensor) -> torch.Tensor:
    """[..., S] bool (draft k right) -> [...] long: how many leading drafts a greedy verify accepts."""
    return correct.long().cumprod(-1).sum(-1)


def walk_tau(accepted: list[int], start: int = 0) -> tuple[int, int]:
    """The greedy loop replayed on teacher-forced acceptances over a reply of ``len(accepted)`` tokens: the token at
    ``start`` is the prefill's (no verify step makes it); a step anchored at position i accepts ``accepted[i]`` drafts
    (already capped at the block's drafts) and makes accepted[i] + 1 tokens, the next step is anchored at
    i + accepted[i] + 1. The reply's last token ends the loop (its end-of-sequence token, or the budget): no step is
    anchored there, and a step whose bonus token would fall past it counts the tokens up to it only, as
    ``infer.generate.trim_output`` cuts the loop's last step. Returns (tokens, steps); tau = tokens / steps, the loop's
    (``GenerationStats.tau``) on the same reply. (Stepping from the last token too and counting a bonus past it gave
    (L, S + 1) or (L, S) where the loop has (L - 1, S): 4.38 for a loop's 4.86 on a 35-token EAGLE-3 reply.)"""
    last = len(accepted) - 1
    i, steps, tokens = start, 0, 0
    while i < last:
        made = min(accepted[i] + 1, last - i)
        steps += 1
        tokens += made
        i += made
    return tokens, steps


# ----------------------------------------------------------------------------- the loop run

@contextlib.contextmanager
def frozen_for_inference(model: torch.nn.Module):
    """The inference drafters put their model in eval mode with gradients off: undo that afterwards."""
    training, flags = model.training, [p.requires_grad for p in model.parameters()]
    try:
        yield
    finally:
        model.train(training)
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)


def pooled(accepted_runs: list[list[int]], block_size: int, prefix: str) -> dict[str, float]:
    """τ and acceptance of draft k over every verify step of the runs (``pooled_acceptance``). Runs with no verify step
    (every output one token, the prefill's: ``loop_eval_max_new_tokens=1``, an end-of-sequence token first) have
    neither: only ``{prefix}_steps`` = 0 (``pooled_acceptance``'s 0.0 for no step was logged as a τ of 0, below 1)."""
    steps = [a for run in accepted_runs for a in run]
    if not steps:
        return {f"{prefix}_steps": 0.0}
    tau, acceptance = pooled_acceptance(steps, block_size)
    return {f"{prefix}_tau": tau, f"{prefix}_steps": float(len(steps)),
            **{f"{prefix}_acc_pos_{k + 1}": a for k, a in enumerate(acceptance)}}


class LoopEval:
    """The loop on fixed held-out prompts: built once at start-up, called at every eval for ``eval/loop_*``.

    Args:
        step: the run's ``DFlashStep`` or ``Eagle3Step`` (its drafter, and in ``step.ctx`` the target and layer ids).
        prompts: token ids of each prompt (``held_out_prompts``).
        max_new_tokens: the loop's budget per prompt.
        static_target: run the target as the serving loop does (``infer.loading.decoding_target``: static caches,
            captured and compiled steps on a GPU; holds one more copy of its linear weights), else eager (``CachedTarget``).
    """

    def __init__(self, step, prompts: list[list[int]], max_new_tokens: int, static_target: bool = True):
        if not prompts:
            raise ValueError("trainer.loop_eval_prompts: the eval split has no row with a prompt before its first loss token")
        self.step, self.prompts, self.max_new_tokens = step, prompts, max_new_tokens
        target = step.ctx.target
        self.eos = eos_ids(target.tokenizer, target.model)
        # the serving loop's target (static caches; captured, compiled steps on a GPU): the eager CachedTarget took
        # 262 s for 16 prompts x 256 tokens of SmolLM2-135M on an H100, more than half a small recipe's training
        self.cached = decoding_target(target.model, step.ctx.layer_ids) if static_target else CachedTarget(target.model, step.ctx.layer_ids)
        start = time.perf_counter()
        self.greedy = [generate(self.cached, None, p, max_new_tokens, eos_token_ids=self.eos).tokens for p in prompts]
        pld = PromptLookupDrafter(num_draft_tokens=self.block_size() - 1)
        pld_runs = [generate(self.cached, pld, p, max_new_tokens, eos_token_ids=self.eos) for p in prompts]
        self.pld = pooled([r.stats.accepted_per_step for r in pld_runs], pld.block_size, "eval/loop_pld")
        # bf16 on the GPU: a verify pass of k + 1 tokens and a one-token step can break near-ties differently
        self.pld["eval/loop_pld_same_as_greedy"] = sum(r.tokens == g for r, g in zip(pld_runs, self.greedy)) / len(prompts)
        log.info("loop eval: %d held-out prompts, %d greedy tokens, prompt lookup tau %s (%.1f s)", len(prompts),
                 sum(map(len, self.greedy)), f"{self.pld['eval/loop_pld_tau']:.3f}" if "eval/loop_pld_tau" in self.pld else "none",
                 time.perf_counter() - start)
        if all(len(g) < 2 for g in self.greedy):
            log.warning("loop eval: the target's greedy reply to every held-out prompt is one token (trainer.loop_eval_max_new_tokens="
                        "%d, or an end-of-sequence token first): no verify step, so no eval/loop_tau", max_new_tokens)

    def repetition(self, n: int = 4) -> float:
        """Fraction of the greedy continuations' n-grams that repeat an earlier one of the same continuation or
        of its prompt (a degenerate target loops or copies its prompt; prompt lookup then wins by copying)."""
        total = repeated = 0
        for prompt, tokens in zip(self.prompts, self.greedy):
            prompt = list(prompt)
            seen = {tuple(prompt[i:i + n]) for i in range(len(prompt) - n + 1)}
            for i in range(len(tokens) - n + 1):
                gram = tuple(tokens[i:i + n])
                repeated += gram in seen
                seen.add(gram)
                total += 1
        return repeated / max(total, 1)

    def block_size(self) -> int:
        return drafts_per_step(self.step.cfg.drafter) + 1

    def inference_drafter(self):
        model = self.step.drafter
        if self.step.cfg.drafter.kind == "dflash":
            return DFlashDrafter(model, self.step.ctx.target.embed_tokens, self.step.ctx.target.lm_head, window="trained")
        return Eagle3Drafter(model, window="trained")

    @torch.no_grad()
    def __call__(self) -> dict[str, float]:
        model = self.step.drafter
        with frozen_for_inference(model):
            drafter = self.inference_drafter()
            runs = [generate(self.cached, drafter, p, self.max_new_tokens, eos_token_ids=self.eos) for p in self.prompts]
            metrics = pooled([r.stats.accepted_per_step for r in runs], self.block_size(), "eval/loop")
            metrics["eval/loop_same_as_greedy"] = sum(r.tokens == g for r, g in zip(runs, self.greedy)) / len(runs)
            metrics.update(self.teacher_forced())
        metrics.update(self.pld)
        return metrics

    def teacher_forced(self) -> dict[str, float]:
        """The training side's evaluation (``evaluate_batch``: a block at every position, the loop replayed)
        on the greedy continuations: prompt + output, the loss on the output, cut to ``data.max_length``."""
        ctx = self.step.ctx
        total = None
        for prompt, continuation in zip(self.prompts, self.greedy):
            row = (prompt + continuation)[:ctx.cfg.data.max_length]
            batch = ctx.collate([{"input_ids": row, "loss_mask": [0] * len(prompt) + [1] * (len(row) - len(prompt))}], ctx.target.pad_id)
            stats = self.step.evaluate_batch(batch)
            total = stats if total is None else total + stats
        summary = total.summary("eval")
        out = {"eval/loop_tf_anchor_tau": summary["eval/anchor_tau"]}
        if "eval/block_tau" in summary:  # no verify step on any reply (each one token), as eval/loop_tau: none
            out["eval/loop_tf_block_tau"] = summary["eval/block_tau"]
        return out
