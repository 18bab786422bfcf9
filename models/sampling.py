"""Token choice and draft verification, on the device with no host syncs.

Greedy (temperature 0): a draft token is accepted while it equals the target's argmax at the previous
position; the target's argmax after the accepted prefix is the bonus token.

Sampling (temperature > 0, optional top-k / top-p applied to both models): speculative sampling
(Leviathan et al. 2023, Chen et al. 2023). Draft token x_k ~ q_k is accepted with probability
min(1, p_k(x_k) / q_k(x_k)); at the first rejection the next token is drawn from
norm(max(0, p_k - q_k)); when all are accepted it is drawn from the target's next distribution. The
output then follows the target's (filtered) distribution exactly, whatever q is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Legend: n rows, V vocab, B block size (B - 1 drafts).


MIN_TEMPERATURE = 1e-6  # logits up to ~1e32 stay finite in fp32 after / T; any T this small is greedy in effect


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int = 0

    def __post_init__(self):
        if not self.temperature >= 0 or self.temperature == float("inf"):  # nan passed "< 0" and sampled token 0 forever
            raise ValueError(f"temperature={self.temperature}; expected a finite value >= 0")
        if 0 < self.temperature < MIN_TEMPERATURE:  # 1e-45: logits / T overflowed fp32 to inf, the probs NaN, token 0 forever
            raise ValueError(f"temperature={self.temperature}; expected 0 (greedy) or >= {MIN_TEMPERATURE:g} (below it sampling "
                             "is greedy, and fp32 logits / T overflow)")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k}; expected >= 0 (0 = off)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p}; expected 0 < top_p <= 1")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sampling_from_flags(temperature: float, top_k: int, top_p: float, seed: int) -> SamplingConfig:
    """``python -m infer`` / ``eval``'s sampling flags; ``--top-k`` / ``--top-p`` without a temperature were ignored (greedy
    decoding, exit 0): refused in one line."""
    if temperature == 0 and (top_k or top_p != 1.0):
        flag = f"--top-k {top_k}" if top_k else f"--top-p {top_p}"
        raise ValueError(f"{flag} filters sampling, and --temperature 0 (the default) decodes greedily; expected --temperature > 0 "
                         "with it, or leave it out")
    if not -2**63 <= seed < 2**63:  # was "Overflow when unpacking long long" after the baseline ran; a signed 64-bit seed is
        # what torch's generators and the engines' requests (vLLM's) both take
        raise ValueError(f"--seed {seed}; expected a signed 64-bit integer (-2**63 .. 2**63 - 1)")
    try:
        return SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    except ValueError as e:  # the config names its fields; the user typed flags
        from common.cli_help import named_by_flag

        raise named_by_flag(e, (("temperature=", "--temperature "), ("top_k=", "--top-k "), ("top_p=", "--top-p "))) from None


def logits_to_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus) filtering; [n, V] logits -> [n, V] fp32 probs."""
    logits = logits.float() / sampling.temperature
    if sampling.top_k:
        kth = torch.topk(logits, min(sampling.top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sampling.top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # drop a token when the tokens before it in the sort (ties in the sort's order) already reach top_p; the same
        # function filters the target and the drafter, so speculative sampling stays exact
        drop_sorted = sorted_probs.cumsum(-1) - sorted_probs >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row without a host sync: argmax(p / E), E ~ Exp(1) (the exponential-race trick)."""
    # probs: [n, V] -> [n]
    noise = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / noise).argmax(dim=-1)


def choose(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Tokens [n] for logits [n, V] and, when sampling, the probabilities [n, V] they were drawn from."""
    if sampling.greedy:
        return logits.argmax(dim=-1), None
    probs = logits_to_probs(logits, sampling)
    return sample(probs, generator), probs


def greedy_accepted(draft_tokens: torch.Tensor, target_tokens: torch.Tensor) -> torch.Tensor:
    """How many drafts [..., k] a greedy verify accepts: the length of their prefix equal to the target's tokens
    [..., k] at the same positions (int64 [...], on the device: no host sync)."""
    return (draft_tokens == target_tokens).long().cumprod(-1).sum(-1)


def verify(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
           sampling: SamplingConfig, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted-prefix length and the token after it.

    Args:
        draft_tokens: [B-1] proposed tokens for positions a+1 .. a+B-1.
        draft_probs: [B-1, V] the distributions they were sampled from (None when greedy).
        target_logits: [B, V] target logits at positions a .. a+B-1 (row k predicts position a+k+1).

    Returns:
        num_accepted [] (0 .. B-1) and next_token [] (the bonus or the resampled token), on the device.
    """
    if sampling.greedy:
        target_tokens = target_logits.argmax(dim=-1)  # [B]
        num_accepted = greedy_accepted(draft_tokens, target_tokens[:-1])
        return num_accepted, target_tokens.gather(0, num_accepted[None])[0]  # no host sync (a 0-d tensor index is .item())
    target_probs = logits_to_probs(target_logits, sampling)  # [B, V]
    rows = torch.arange(draft_tokens.shape[0], device=draft_tokens.device)
    p = target_probs[rows, draft_tokens]
    q = draft_probs[rows, draft_tokens]
    u = torch.rand(p.shape, generator=generator, device=p.device)
    num_accepted = (u * q < p).int().cumprod(0).sum()
    residual = (target_probs[:-1] - draft_probs).clamp(min=0)  # [B-1, V]
    # p == q row (nothing left over): a rejection there has probability 0; fall back to p for safety
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, target_probs[:-1])
    next_dist = torch.cat([residual, target_probs[-1:]]).index_select(0, num_accepted[None])  # [1, V], no host sync
    return num_accepted, sample(next_dist, generator)[0]
