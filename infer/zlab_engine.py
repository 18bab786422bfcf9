"""z-lab's reference DFlash loop as an eval engine (``python -m eval ... --engine zlab``).

PyPI ``dflash`` (z-lab's own package) decodes each prompt with ``DFlashDraftModel.spec_generate``: its loader reads
our export in the z-lab layout, its loop drafts, verifies and accepts with the Hugging Face target, in this process.
That is a second loop, written by the method's authors, over the same drafter files: its tokens must be the target's
greedy ones (eval checks them against our target alone) and its τ is what the drafter earns outside our loop.

τ comes from z-lab's loop itself: a forward pre-hook on the target (``register_forward_pre_hook``, public torch API)
records where each of its forwards starts. The first is the prompt's prefill; each later one verifies a block whose
first token is the step's anchor, so step i produced (next anchor - this anchor) tokens: its accepted drafts + 1. The
last step produced what is left of the output. Nothing of z-lab's internals is read.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import sys
import time

import torch

from infer.generate import GenerationStats

TESTED_VERSIONS = ("0.1.0",)  # dflash releases whose spec_generate this engine was checked against (tests/test_zlab_engine.py)
SPEC_GENERATE_PARAMS = ("target", "input_ids", "max_new_tokens", "stop_token_ids", "temperature")


def load_zlab():
    """PyPI ``dflash``'s model module, its version and ``spec_generate``'s parameters checked first."""
    try:
        import dflash.model as zlab
    except ImportError as e:
        raise ValueError(f"--engine zlab needs z-lab's package: pip install --no-deps dflash==0.1.0 ({e})") from None
    version = importlib.metadata.version("dflash")
    params = tuple(inspect.signature(zlab.DFlashDraftModel.spec_generate).parameters)[1:]
    if params[:len(SPEC_GENERATE_PARAMS)] != SPEC_GENERATE_PARAMS:
        raise ValueError(f"--engine zlab: dflash {version}'s DFlashDraftModel.spec_generate takes {params}; this engine calls it with "
                         f"{SPEC_GENERATE_PARAMS} (checked with dflash {', '.join(TESTED_VERSIONS)})")
    if version not in TESTED_VERSIONS:
        print(f"note: --engine zlab was checked with dflash {', '.join(TESTED_VERSIONS)}; {version} is installed "
              "(spec_generate's signature matches)", file=sys.stderr)
    return zlab


def steps_from_anchors(anchors: list[int], prompt_len: int, new_tokens: int) -> list[int]:
    """Accepted drafts per verify step from the positions of the verify blocks' first tokens (the anchors): step i
    produced anchor[i+1] - anchor[i] tokens, the last one the rest of the ``new_tokens`` after the first (the prefill's)."""
    ends = anchors[1:] + [prompt_len + new_tokens - 1]
    return [end - start - 1 for start, end in zip(anchors, ends)]


class ZlabEngine:
    """z-lab's ``spec_generate`` over our export (z-lab layout) and the Hugging Face target, greedy, one prompt at a time.

    Args:
        target_model: the Hugging Face causal LM (our ``StaticTarget.model``: the same weights our loop runs).
        drafter_dir: an export in z-lab's layout (``eval.engines.engine_drafter`` finds a run's ``export_dflash``).
        eos: token ids that end a reply (z-lab's ``stop_token_ids``).
    """

    def __init__(self, target_model: torch.nn.Module, drafter_dir: str, eos: list[int]):
        zlab = load_zlab()
        self.target = target_model
        self.drafter = str(drafter_dir)
        dtype = next(target_model.parameters()).dtype
        self.model = zlab.DFlashDraftModel.from_pretrained(self.drafter, dtype=dtype).to(target_model.device).eval()
        self.block_size = int(self.model.block_size)
        self.eos = list(eos)
        self._starts: list[int] = []
        self._hook = target_model.register_forward_pre_hook(self._record_start, with_kwargs=True)

    def _record_start(self, module, args, kwargs) -> None:
        positions = kwargs.get("position_ids")
        if positions is None:
            raise ValueError("--engine zlab: z-lab's loop called the target without position_ids; this engine reads its steps from them")
        self._starts.append(int(positions[0, 0]))

    @torch.no_grad()
    def generate(self, prompt: list[int], max_new_tokens: int) -> tuple[list[int], dict]:
        """Greedy: (new tokens up to and including an end-of-sequence token, stats in ``GenerationStats.to_dict()``'s keys)."""
        self._starts.clear()
        ids = torch.tensor([prompt], dtype=torch.long, device=self.target.device)
        t0 = time.perf_counter()
        out = self.model.spec_generate(self.target, ids, max_new_tokens, self.eos, temperature=0.0)
        seconds = time.perf_counter() - t0
        tokens = out[0, len(prompt):].tolist()
        if not self._starts or self._starts[0] != 0:
            raise ValueError(f"--engine zlab: expected z-lab's loop to prefill from position 0, saw forwards at {self._starts[:3]}")
        accepted = steps_from_anchors(self._starts[1:], len(prompt), len(tokens))
        stats = GenerationStats(prompt_tokens=len(prompt), new_tokens=len(tokens), block_size=self.block_size, accepted_per_step=accepted,
                                decode_s=seconds)
        return tokens, {**stats.to_dict(), "engine": "zlab"}

    def close(self) -> None:
        self._hook.remove()
