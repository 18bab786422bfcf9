"""Prompt-lookup decoding (n-gram drafting, no training): the free baseline every τ is compared to.

At each step the drafter looks for the last ``max_ngram`` tokens of the sequence so far (prompt +
accepted output + the token about to be verified) earlier in the same sequence, trying n =
``max_ngram`` down to ``min_ngram``, and proposes the ``num_draft_tokens`` tokens that followed the
most recent earlier match (Saxena's prompt-lookup decoding; vLLM's ``method: ngram`` with
``prompt_lookup_max/min`` and ``num_speculative_tokens``). Like vLLM it proposes only what it found:
0 .. k tokens (none without a match, fewer when the match sits near the end of the sequence), so a
step verifies the real drafts + 1 and its accepted count is at most the real count, in every loop
and at every batch size. Loops that need a fixed block (captured GPU graphs, the batch's [B, k+1]
layout) pad it and verify only the real part (on 16 MT-Bench conversations, 7 drafts, batch 1:
6,152 of the 9,672 tokens a padded block verified were real drafts + 1, and no step ever accepted
a filler token past the real ones).

It speaks the loop's chain protocol (``infer/generate.py``): ``reset``, ``append_context`` (only the
token ids are read), ``draft`` (greedy: the tokens; sampling: one-hot proposals, so speculative
sampling over the real drafts accepts draft x with probability p(x) and stays exact).
"""

from __future__ import annotations

import torch

from models.sampling import SamplingConfig


class PromptLookupDrafter:
    """n-gram drafting over the sequence itself.

    Args:
        num_draft_tokens: k, the most drafts one step proposes (a step verifies at most k + 1 tokens).
        max_ngram, min_ngram: longest and shortest suffix to look up.
    """

    tree = False
    target_layer_ids: list[int] = []  # reads no target features

    def __init__(self, num_draft_tokens: int = 15, max_ngram: int = 3, min_ngram: int = 1, vocab_size: int | None = None):
        if num_draft_tokens < 1:
            raise ValueError(f"prompt lookup: num_draft_tokens={num_draft_tokens}; expected >= 1")
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"prompt lookup: ngram sizes min={min_ngram}, max={max_ngram}; expected 1 <= min <= max")
        self.num_draft_tokens, self.max_ngram, self.min_ngram = num_draft_tokens, max_ngram, min_ngram
        self.vocab_size = vocab_size
        self.block_size = num_draft_tokens + 1
        self.index = NgramIndex(min_ngram, max_ngram)

    @property
    def tokens(self) -> list[int]:
        """The context so far (every position before the next anchor)."""
        return self.index.tokens

    @property
    def verify_tokens(self) -> int:
        return self.block_size

    def with_window(self, window) -> "PromptLookupDrafter":
        return self  # no attention, no window

    def reset(self, max_positions: int) -> None:
        self.index = NgramIndex(self.min_ngram, self.max_ngram)

    def append_context(self, features, start: int, token_ids: torch.Tensor) -> None:
        assert start == len(self.tokens), "context positions must arrive in order"
        self.index.extend(token_ids.reshape(-1).tolist())

    def propose(self, sequence: list[int]) -> list[int]:
        """The proposal for any ``sequence`` (a scan of it; ``draft`` reads the context's index instead)."""
        return lookup_drafts(sequence, self.num_draft_tokens, self.max_ngram, self.min_ngram)

    def draft(self, token: torch.Tensor, anchor: int, sampling: SamplingConfig,
              generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft tokens [m] for ``anchor+1 ..`` (m = 0 .. k: ``propose``'s answer for the context and ``token``, read from
        the index) and, when sampling, their one-hot proposals [m, V]."""
        assert anchor == len(self.tokens), "the context must hold every position before the anchor"
        drafts = self.index.drafts_after(int(token), self.num_draft_tokens)  # int(token): the host sync
        drafts = torch.tensor(drafts, dtype=torch.long, device=token.device)
        if sampling.greedy:
            return drafts, None
        if self.vocab_size is None:
            raise ValueError("prompt lookup with sampling needs vocab_size (the one-hot proposals' width)")
        return drafts, torch.nn.functional.one_hot(drafts, self.vocab_size).float()


class NgramIndex:
    """A token list that only grows, with the latest end position of each of its n-grams (n = ``min_ngram`` ..
    ``max_ngram``): ``lookup_drafts``' answer for the list plus one more token in ``max_ngram`` dictionary reads, where
    the scan reads the whole list (on real text 0.1 ms a call at 1K tokens and 5 ms at 32K, per row and step; behind
    31K-token prompts on an H200 the index made prompt lookup 11-37% faster: BENCHMARKS.md). Appending costs
    ``max_ngram`` dictionary writes a token. tests/test_prompt_lookup.py checks every step's drafts against a plain
    reference."""

    def __init__(self, min_ngram: int, max_ngram: int):
        self.sizes = range(max_ngram, min_ngram - 1, -1)  # longest first, as the scan tries them
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], int] = {}  # n-gram -> where its latest occurrence ends (sizes never collide)

    def extend(self, new: list[int]) -> None:
        tokens, ends = self.tokens, self.ends
        for t in new:
            tokens.append(int(t))
            end = len(tokens) - 1
            for n in self.sizes:
                if n <= end + 1:
                    ends[tuple(tokens[end - n + 1:])] = end

    def drafts_after(self, token: int, k: int) -> list[int]:
        """``lookup_drafts(self.tokens + [token], k, max_ngram, min_ngram)``: the list's n-grams all end before ``token``,
        so their latest occurrence is the scan's most recent earlier match."""
        tokens = self.tokens
        length = len(tokens)  # the sequence is tokens + [token]: its suffixes of n <= length tokens
        for n in self.sizes:
            if n > length:
                continue
            end = self.ends.get(tuple(tokens[length - n + 1:]) + (token,))
            if end is not None:
                drafts = tokens[end + 1:end + 1 + k]
                if end + 1 + k > length:  # the copied span reaches the sequence's end: ``token`` follows
                    drafts.append(token)
                return drafts
        return []


class GrowingLookup:
    """``lookup_drafts`` over one generation's prompt and output, a sequence that only grows between calls (the trees'
    lookup branch, ``--tree-lookup``, drafts over it every step): an ``NgramIndex`` of all but its newest token catches
    up with the tokens added since the last call. One per generation (a row's next request gets a new one)."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.index = NgramIndex(min_ngram, max_ngram)

    def __call__(self, prompt: list[int], out: list[int], k: int) -> list[int]:
        """``lookup_drafts(prompt + out, k)``; ``prompt + out`` extends the sequence of the call before."""
        length, seen = len(prompt) + len(out), len(self.index.tokens)
        if seen < length - 1:
            new = prompt[seen:] + out if seen < len(prompt) else out[seen - len(prompt):]
            self.index.extend(new[:length - 1 - seen])
        return self.index.drafts_after(out[-1] if out else prompt[-1], k)


def lookup_drafts(sequence: list[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """The (up to) k tokens that followed the most recent earlier occurrence of the longest matching suffix of
    ``sequence``; [] when no suffix of ``min_ngram`` .. ``max_ngram`` tokens occurs earlier."""
    for n in range(min(max_ngram, len(sequence) - 1), min_ngram - 1, -1):
        suffix = sequence[-n:]
        for start in range(len(sequence) - n - 1, -1, -1):  # most recent match first, never the suffix itself
            if sequence[start:start + n] == suffix:
                return sequence[start + n:start + n + k]  # at least one token: the match ends before the suffix does
    return []
