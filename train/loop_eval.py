"""``eval/loop_*``: the real speculative-decoding loop on held-out prompts, during training.

Teacher-forced metrics answer "how often is each draft right at a uniformly drawn position"; the
decoding loop answers "how many tokens per target pass", and the two differ (``tau_summaries`` in
``dflash_objective.py``). So every ``trainer.eval_every`` steps the trainer also runs the loop that
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

from infer.drafter import DFlashDrafter
from infer.eagle3_drafter import Eagle3Drafter
from infer.generate import generate, pooled_acceptance
from infer.loading import eos_ids
from infer.prompt_lookup import PromptLookupDrafter
from infer.target import CachedTarget


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
    steps = [a for run in accepted_runs for a in run]
    tau, acceptance = pooled_acceptance(steps, block_size)
    return {f"{prefix}_tau": tau, f"{prefix}_steps": float(len(steps)),
            **{f"{prefix}_acc_pos_{k + 1}": a for k, a in enumerate(acceptance)}}


class LoopEval:
    """The loop on fixed held-out prompts: built once at start-up, called at every eval for ``eval/loop_*``.

    Args:
        step_ctx: the run's ``DFlashStep`` or ``Eagle3Step`` (its target, drafter, layer ids, device).
        prompts: token ids of each prompt (``held_out_prompts``).
        max_new_tokens: the loop's budget per prompt.
    """

    def __init__(self, step_ctx, prompts: list[list[int]], max_new_tokens: int):
        if not prompts:
            raise ValueError("trainer.loop_eval_prompts: the eval split has no row with a prompt before its first loss token")
        self.step_ctx, self.prompts, self.max_new_tokens = step_ctx, prompts, max_new_tokens
        target = step_ctx.target
        self.eos = eos_ids(target.tokenizer, target.model)
        self.cached = CachedTarget(target.model, step_ctx.layer_ids)
        start = time.perf_counter()
        self.greedy = [generate(self.cached, None, p, max_new_tokens, eos_token_ids=self.eos).tokens for p in prompts]
        pld = PromptLookupDrafter(num_draft_tokens=self.block_size() - 1)
        pld_runs = [generate(self.cached, pld, p, max_new_tokens, eos_token_ids=self.eos) for p in prompts]
        self.pld = pooled([r.stats.accepted_per_step for r in pld_runs], pld.block_size, "eval/loop_pld")
        # bf16 on the GPU: a verify pass of k + 1 tokens and a one-token step can break near-ties differently
        self.pld["eval/loop_pld_same_as_greedy"] = sum(r.tokens == g for r, g in zip(pld_runs, self.greedy)) / len(prompts)
        log.info("loop eval: %d held-out prompts, %d greedy tokens, prompt lookup tau %.3f (%.1f s)",
                 len(prompts), sum(map(len, self.greedy)), self.pld["eval/loop_pld_tau"], time.perf_counter() - start)

    def repetition(self, n: int = 4) -> float:
        """Fraction of the greedy continuations' n-grams that repeat an earlier one of the same continuation
        (a degenerate target loops; prompt lookup then wins by copying)."""
        total = repeated = 0
        for tokens in self.greedy:
            seen = set()
            for i in range(len(tokens) - n + 1):
                gram = tuple(tokens[i:i + n])
                repeated += gram in seen
                seen.add(gram)
                total += 1
        return repeated / max(total, 1)

    def block_size(self) -> int:
        cfg = self.step_ctx.cfg.drafter
        return cfg.block_size if cfg.kind.value == "dflash" else cfg.ttt_length + 1

    def inference_drafter(self):
        model = self.step_ctx.drafter
        if self.step_ctx.cfg.drafter.kind.value == "dflash":
            return DFlashDrafter(model, self.step_ctx.target.embed_tokens, self.step_ctx.target.lm_head, window="trained")
        return Eagle3Drafter(model, window="trained")

    @torch.no_grad()
    def __call__(self) -> dict[str, float]:
        model = self.step_ctx.drafter
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
        ctx = self.step_ctx
        total = None
        for prompt, continuation in zip(self.prompts, self.greedy):
            row = (prompt + continuation)[:ctx.cfg.data.max_length]
            batch = ctx.collate([{"input_ids": row, "loss_mask": [0] * len(prompt) + [1] * (len(row) - len(prompt))}], ctx.target.pad_id)
            stats = ctx.evaluate_batch(batch)
            total = stats if total is None else total + stats
        summary = total.summary("eval")
        return {"eval/loop_tf_block_tau": summary["eval/block_tau"], "eval/loop_tf_anchor_tau": summary["eval/anchor_tau"]}
