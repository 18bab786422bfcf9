"""``train(cfg) -> metrics``: drafter training (DFlash or EAGLE-3) as build + loop + checkpointer.

    train()                    build() -> the loop below -> finish() (export, run.json, closing summary)
      train_step()             one optimizer step over grad_accum micro-batches
        step.forward()         target features -> drafter -> loss and stats; ``step`` comes from the
                               drafter's training file, chosen by drafter.kind (train/drafters.py):
                               train/dflash.py (anchors, blocks, decayed CE) or
                               train/eagle3.py (the training-time-test unroll, soft CE)
      evaluate()               held-out loss, per-slot/per-step accuracy, block_tau (the loop replayed at every position)
      LoopEval (loop_eval.py)  the real decoding loop on held-out prompts: eval/loop_tau beside prompt lookup
      Checkpointer             save / resume, plain or DeepSpeed (checkpoint.py)

The loss is normalised by the number of labels in the whole optimizer step (all micro-batches), so
accumulation does not change the objective. Random choices (DFlash anchors) come from a generator
seeded by (seed, step) and the data order from (seed, epoch): a resumed run repeats an
uninterrupted one exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from common.atomic import atomic_dir, atomic_open
from common.metrics_logger import MetricsLogger, logged_records
from common.transfer import to_device_async
from swa_kernels import fa4_adapter
from swa_kernels.fa4_adapter import available as fa4_available
from models.builtin_targets import resolve_target_path
from models.target import TargetModel, document_starts

from . import deepspeed_engine
from .checkpoint import Checkpointer, check_resume_early, resume_settings
from .compile_cache import CompileCache, rank_path
from .config import TrainConfig, check_paths, to_train_config  # noqa: F401  (callers import these from here too)
from .data import prepare_data
from .data.dataset import RowReader, collate_padded, rows_fingerprint
from .distributed import Ranks, any_rank, barrier, init_process_group, launcher_env_restored, local_device, rank0_first, ranks_from_env
from .drafters import DRAFTERS, Drafter
from .features.spec import open_store
from .loop_eval import LoopEval, drafts_per_step, held_out_prompts, prompt_lookup_block_tau
from .optim import build_optimizer

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- set-up helpers

def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"trainer.device={name!r} but no CUDA device is visible")
    try:
        return torch.device(name)
    except RuntimeError:  # torch's message lists twenty device types this trainer does not run on
        raise ValueError(f"trainer.device={name!r}; expected auto, cpu, cuda or cuda:N") from None


def bf16_autocast(precision: str, device: torch.device) -> bool:
    """``trainer.precision``: the step under bf16 autocast (``bf16``, or ``auto`` on a GPU), else in fp32."""
    return precision == "bf16" or (precision == "auto" and device.type == "cuda")


def target_dtype(precision: str, dtype: str, device: torch.device) -> str:
    """``target.dtype`` for this run. A step in fp32 (no autocast) multiplies the target's tensors as they are (DFlash's
    drafts go through the target's LM head, EAGLE-3's fc reads its features), so the target must be fp32 too: ``auto``
    resolves to float32 there (on a GPU it means bfloat16 otherwise); an explicit lower precision is refused at
    start-up, where a GPU run failed at its first step."""
    if bf16_autocast(precision, device) or dtype == "float32":
        return dtype
    if dtype == "auto":
        return "float32"
    raise ValueError(f"trainer.precision={precision} runs the step in fp32 on {device.type}, target.dtype={dtype}: the drafter's "
                     f"fp32 activations would meet the target's {dtype} weights; use target.dtype=float32 (or auto), or trainer.precision=bf16")


def target_layer_ids(cfg: TrainConfig, target: TargetModel) -> list[int]:
    d = cfg.drafter
    ids = list(d.target_layer_ids) if d.target_layer_ids is not None else DRAFTERS[d.kind].module.feature_layer_ids(d, target.num_layers)
    target.check_layer_ids(ids)
    return ids


def write_json_atomic(path: Path, obj: Any) -> None:
    with atomic_open(path) as f:
        json.dump(obj, f, indent=2, default=str)


def warmup_cosine(warmup_steps: int, max_steps: int, min_ratio: float):
    def factor(step: int) -> float:  # step counts optimizer steps already taken
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


def check_backend_device(backend: str, device: torch.device) -> None:
    if backend != "sdpa" and device.type != "cuda":
        raise ValueError(f"trainer.attention_backend={backend} needs a GPU (trainer.device={device.type}); use sdpa")


class EpochBatches:
    """Shuffled batches of indices; the order depends only on (seed, epoch): resumable by position."""

    def __init__(self, num_rows: int, batch_size: int, seed: int):
        self.num_rows, self.batch_size, self.seed = num_rows, batch_size, seed
        self.epoch, self.index = 0, 0
        self.batches_per_epoch = max(1, num_rows // batch_size)

    def next(self) -> list[int]:
        if self.index >= self.batches_per_epoch:
            self.epoch, self.index = self.epoch + 1, 0
        order = torch.randperm(self.num_rows, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch))
        start = self.index * self.batch_size
        self.index += 1
        return order[start : start + self.batch_size].tolist()

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.index = state["epoch"], state["index"]


def export_drafter(drafter: torch.nn.Module, out: Path) -> Path:
    """HF-style folder (config.json + model.safetensors), written to a temp name and renamed."""
    with atomic_dir(out) as tmp:
        drafter.save_pretrained(tmp, safe_serialization=True)
    return out


class StepContext:
    """What every drafter's step shares, fixed at start-up: device, attention backend, precision, batch
    padding and the target's features (from the target, or from the offline feature store)."""

    def __init__(self, cfg: TrainConfig, target: TargetModel, drafter: torch.nn.Module, layer_ids: list[int], device: torch.device,
                 store=None):
        self.cfg, self.target, self.layer_ids, self.device = cfg, target, layer_ids, device
        self.store = store  # a train.features.store.FeatureStore: read features instead of running the target
        backend = cfg.trainer.attention_backend
        if backend == "auto":
            backend = DRAFTERS[cfg.drafter.kind].module.fastest_gpu_backend(cfg, drafter) if device.type == "cuda" else "sdpa"
        check_backend_device(backend, device)
        if backend in ("fa4", "flex-flash") and not fa4_available():
            raise ValueError(f"trainer.attention_backend={backend} needs FlashAttention-4 {fa4_adapter.PINNED_VERSION} "
                             f"(pip install '.[fa4]') on a Hopper or newer GPU: {fa4_adapter.check().reason}")
        self.backend = backend
        self.bf16 = bf16_autocast(cfg.trainer.precision, device)
        # Compiled flex attention wants one shape, and cuDNN and FlashAttention-4 build a kernel per shape:
        # pad every batch to the longest row, data.max_length or data.pack_length (DFlash also pads its anchors to num_anchors).
        self.static_shapes = backend != "sdpa"
        self.pad_to = cfg.data.longest_row if self.static_shapes else None
        # trainer.pad_multiple: a few static shapes instead of one (the feature store's rows are max_length long)
        self.pad_multiple = cfg.trainer.pad_multiple if self.static_shapes and store is None else 0

    def padded_length(self, longest: int) -> int | None:
        """The length a micro-batch whose longest row holds ``longest`` tokens is padded to (None: to that row)."""
        if self.pad_to is None or not self.pad_multiple:
            return self.pad_to
        return min(self.pad_to, -(-longest // self.pad_multiple) * self.pad_multiple)

    def collate(self, rows: list[dict], pad_id: int, split: str | None = None, indices: list[int] | None = None) -> dict:
        """Padded tensors; with ``split`` and ``indices`` (the rows' places in their split) also
        ``split`` and ``rows``, which the feature store looks rows up by."""
        batch = collate_padded(rows, pad_id, self.padded_length(max(len(r["input_ids"]) for r in rows)))
        if self.cfg.data.pack_documents and "segments" in batch:  # training rows (held-out ones are one conversation each)
            batch["doc_start"] = document_starts(batch["segments"], batch["input_ids"].shape[1])
        if split is not None:
            batch["split"], batch["rows"] = split, list(indices)
        return batch

    def to_device(self, batch: dict) -> dict:
        """The batch's tensors on the device (copies queued through pinned memory on a GPU: no wait for the previous
        step's kernels, ``common.transfer``); other entries as they are."""
        return {k: to_device_async(v, self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def target_features(self, batch: dict, with_final_hidden: bool = False):
        """The target's features for a batch: from the store when there is one, else a target forward."""
        input_ids = batch["input_ids"]
        if self.store is not None:
            if "rows" not in batch:
                raise ValueError("a batch without row indices cannot be read from the feature store")
            return self.store.gather(batch["split"], batch["rows"], input_ids.shape[1], self.device)
        if "segments" in batch:  # packed rows: those data.pack_fresh_fraction marked are read one conversation at a time
            return self.target.capture_segments(input_ids.to(self.device), self.layer_ids, batch["attention_mask"].to(self.device),
                                                batch["segments"], with_final_hidden=with_final_hidden)
        # No padding mask: collate_padded pads on the right, so under the target's causal attention no real token sees
        # a pad, and the mask would change only the pads' own features, which no loss or drafter key reads
        # (tests/test_target.py). With it, a compiled capture materialises a [B, 1, T, T] mask and SDPA runs a
        # masked kernel instead of its causal flash one (BENCHMARKS.md, issue 25: 0.52 ms a target layer on the H100).
        return self.target.capture(input_ids.to(self.device), self.layer_ids, attention_mask=None, with_final_hidden=with_final_hidden)

    def autocast(self):
        if self.bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()


def build_step(cfg: TrainConfig, target: TargetModel, layer_ids: list[int], device: torch.device, train_ds=None, store=None):
    """The drafter of ``drafter.kind``, freshly built on ``device`` in train mode, inside its step."""
    drafter_type: Drafter = DRAFTERS[cfg.drafter.kind]
    drafter = drafter_type.module.build_drafter(cfg, target, layer_ids, train_ds).to(device).train()
    return drafter_type.step(StepContext(cfg, target, drafter, layer_ids, device, store), drafter)


# ----------------------------------------------------------------------------- one step, one evaluation

def train_step(step, micro_batches: list[dict[str, torch.Tensor]], step_num: int, optimizer, scheduler, engine=None,
               ranks: Ranks = Ranks()) -> tuple[Any, torch.Tensor | float]:
    """One optimizer step over the global step's micro-batches (every rank's, in order); this rank runs
    its own consecutive share. Returns the stats summed over all ranks and the pre-clip gradient norm
    (a tensor on the plain path: nothing here waits for the GPU, so the host queues the next step meanwhile).

    Every rank plans the whole step, so the anchors and the label count (the loss's denominator) are
    those a single process would draw for the same micro-batches, with no communication.
    """
    generator = torch.Generator().manual_seed(step.cfg.trainer.seed * 1_000_003 + step_num)
    micro_batches = [step.ctx.to_device(b) for b in micro_batches]
    plans = [step.plan(b, generator) for b in micro_batches]
    num_labels = sum(step.num_labels(b, p) for b, p in zip(micro_batches, plans))  # global count for the step
    # a device tensor (no host sync) or an int
    num_labels = num_labels.clamp(min=1) if isinstance(num_labels, torch.Tensor) else max(1, num_labels)
    per_rank = len(micro_batches) // ranks.world_size
    mine = slice(ranks.rank * per_rank, (ranks.rank + 1) * per_rank)
    total = None
    for batch, plan in zip(micro_batches[mine], plans[mine]):
        stats = step.forward(batch, plan)
        loss = stats.loss_sum / num_labels
        if engine is None:
            loss.backward()
        else:  # DeepSpeed divides by its accumulation steps and averages over ranks: this loss is already per global label
            engine.backward(loss * per_rank * ranks.world_size)
            engine.step()  # an optimizer step (clip, AdamW, schedule) at the step's last micro-batch only
        stats = type(stats)(*(t.detach() for t in vars(stats).values()))
        total = stats if total is None else total + stats
    if engine is None:
        clip = step.cfg.trainer.grad_clip
        trainable = [p for p in step.drafter.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable, clip if clip > 0 else float("inf"))  # a tensor: read when logged
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    else:
        grad_norm = float(engine.get_global_grad_norm())
    if ranks.distributed:
        for t in vars(total).values():
            torch.distributed.all_reduce(t)
    return total, grad_norm


@torch.no_grad()
def evaluate(step, eval_ds, pad_id: int, max_batches: int | None) -> dict[str, float]:
    step.drafter.eval()
    total, pld_tokens, pld_steps = None, 0, 0
    bs, read = step.cfg.trainer.batch_size, RowReader(eval_ds)
    for i, start in enumerate(range(0, len(eval_ds), bs)):
        if max_batches is not None and i >= max_batches:
            break
        rows = list(range(start, min(start + bs, len(eval_ds))))
        batch = step.ctx.collate(read(rows), pad_id, "eval", rows)
        stats = step.evaluate_batch(batch)
        total = stats if total is None else total + stats
        tokens, steps = prompt_lookup_block_tau(batch, drafts_per_step(step.cfg.drafter))
        pld_tokens, pld_steps = pld_tokens + tokens, pld_steps + steps
    step.drafter.train()
    if total is None:
        return {}
    # prompt lookup replayed on the same replies: block_tau's baseline (later turns of a small target's conversations
    # repeat earlier replies, which lifts both far above a first turn's)
    return {**total.summary("eval"), **({"eval/pld_block_tau": pld_tokens / pld_steps} if pld_steps else {})}


# ----------------------------------------------------------------------------- build

@dataclasses.dataclass
class Run:
    """Everything the loop touches, built once by ``build``."""

    cfg: TrainConfig
    ranks: Ranks
    device: torch.device
    output_dir: Path
    target: TargetModel
    target_path: str
    layer_ids: list[int]
    train_ds: Any
    eval_ds: Any
    data_summary: dict
    step: Any  # the drafter's step (train/dflash.py::DFlashStep or train/eagle3.py::Eagle3Step)
    optimizer: Any
    scheduler: Any
    engine: Any  # DeepSpeed's, or None
    batches: EpochBatches
    checkpointer: Checkpointer
    logger: MetricsLogger
    loop_eval: LoopEval | None
    max_steps: int
    steps_per_epoch: float
    micro_per_step: int
    num_params: int
    run_config: dict
    compile_cache: CompileCache

    def __post_init__(self) -> None:
        self.read_train = RowReader(self.train_ds)  # one Arrow take a micro-batch, off Python lists

    @property
    def drafter(self) -> torch.nn.Module:
        return self.step.drafter

    def next_micro_batches(self) -> list[dict]:
        """The next optimizer step's micro-batches (every rank's, in order), collated as the step's backend pads them."""
        pad_id = self.target.pad_id
        return [self.step.ctx.collate(self.read_train(rows), pad_id, "train", rows)
                for rows in (self.batches.next() for _ in range(self.micro_per_step))]


def set_coordinate_descent_tuning(enabled: bool) -> None:
    """``trainer.coordinate_descent_tuning``: Inductor's flag of that name (the process's compiles from here on, as
    ``TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1``). Checked first: a torch without it is told, not silently skipped."""
    import torch._inductor.config as inductor_config

    if not hasattr(inductor_config, "coordinate_descent_tuning"):
        log.warning("trainer.coordinate_descent_tuning: torch %s's Inductor has no coordinate_descent_tuning; "
                    "compiling with its defaults", torch.__version__)
        return
    inductor_config.coordinate_descent_tuning = enabled


def load_target(cfg: TrainConfig, device: torch.device) -> tuple[str, TargetModel]:
    """``target.path`` resolved (a builtin built on first use) and loaded in the run's dtype: (its folder, the target)."""
    target_path = resolve_target_path(cfg.target.path)
    return target_path, TargetModel.from_pretrained(target_path, device, target_dtype(cfg.trainer.precision, cfg.target.dtype, device),
                                                    cfg.target.attn_implementation)


def build(cfg: TrainConfig) -> Run:
    """Set-up, every check before anything heavy: device (and DeepSpeed), target, data, drafter and its
    step, optimizer, schedule, checkpointer, metrics logger, the loop evaluation."""
    check_paths(cfg)
    tc = cfg.trainer
    ranks = ranks_from_env()  # torchrun / deepspeed launches: one process per GPU
    device = local_device(pick_device(tc.device), ranks)
    if tc.attention_backend != "auto":  # here too, not only after the data is prepared
        check_backend_device(tc.attention_backend, device)
    if device.type == "cuda" and tc.compile_drafter and tc.coordinate_descent_tuning:
        set_coordinate_descent_tuning(True)  # false leaves Inductor's own setting (its environment variable) alone
    # before anything compiles (a bad file stops here, before the target loads); a file per process on several GPUs
    compile_cache = CompileCache(rank_path(tc.compile_cache, ranks.local_rank, ranks.world_size), device)
    compile_cache.load()
    ds_config = None
    if tc.deepspeed is not None or ranks.distributed:
        ds_config = deepspeed_engine.deepspeed_config(tc.deepspeed or "zero2", tc.batch_size, tc.grad_accum, tc.grad_clip, ranks.world_size)
        if tc.optimizer == "muon":
            raise ValueError("trainer.optimizer=muon runs without DeepSpeed (one process); DeepSpeed brings its own AdamW")
    # the checkpoint a resume picks, against this run's DeepSpeed layout and settings (the data's among them), before the
    # target loads and the data is prepared (a regeneration: minutes to hours)
    check_resume_early(cfg, None if ds_config is None else ds_config.get("zero_optimization", {}).get("stage", 0), ranks.world_size)
    if ds_config is not None:
        init_process_group(device, ranks, single_process=True)
    torch.manual_seed(tc.seed)
    output_dir = Path(cfg.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    target_path, target = load_target(cfg, device)
    layer_ids = target_layer_ids(cfg, target)
    log.info("target %s: %d layers, hidden %d; drafter reads layers %s", cfg.target.path, target.num_layers, target.hidden_size, layer_ids)
    if cfg.drafter.kind == "dflash":  # the mask token against the target's vocabulary, before the data is prepared
        from .dflash import resolve_mask_token_id

        resolve_mask_token_id(cfg.drafter.mask_token_id, target)

    with rank0_first(ranks):  # rank 0 tokenizes and fills the cache, the others then read it
        train_ds, eval_ds, data_summary = prepare_data(cfg.data, target, seed=tc.seed, progress=tc.progress and ranks.is_main)
    train_ds = train_ds.with_format(None)
    store = None
    if cfg.features.path is not None:  # offline features: checked against this run's inputs, then the layers go
        store = open_store(cfg, target, layer_ids, {"train": train_ds, **({"eval": eval_ds} if eval_ds is not None else {})})
        target.release_layers()
    elif device.type == "cuda":  # after data preparation: regeneration decodes token by token
        if cfg.target.compile_layers:
            target.compile_layers()
        if cfg.target.compile_capture:
            target.compile_capture(layer_ids)
    batches = EpochBatches(len(train_ds), tc.batch_size, tc.seed)
    micro_per_step = tc.grad_accum * ranks.world_size  # the global step's micro-batches, all ranks together
    # fractional: the data position carries on across epochs (a step's micro-batches may straddle two), so rounding per
    # epoch read 5.33 epochs for num_epochs=3 at 36 rows, batch 4, grad_accum 8
    steps_per_epoch = batches.batches_per_epoch / micro_per_step
    max_steps = tc.max_steps
    if tc.num_epochs is not None:
        by_epochs = max(1, math.ceil(tc.num_epochs * steps_per_epoch))
        max_steps = by_epochs if max_steps is None else min(max_steps, by_epochs)

    step = build_step(cfg, target, layer_ids, device, train_ds, store)
    trainable = [p for p in step.drafter.parameters() if p.requires_grad]  # EAGLE-3's embedding is the target's, frozen
    # fused: one kernel for every parameter's update on the GPU (DeepSpeed brings its own)
    optimizer = build_optimizer(cfg, step.drafter, fused=device.type == "cuda" and ds_config is None)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(int(tc.warmup_ratio * max_steps), max_steps, tc.min_lr_ratio))
    engine = None if ds_config is None else deepspeed_engine.initialize(step.drafter, optimizer, scheduler, ds_config, device, ranks)
    steps_setting = (f"trainer.max_steps={max_steps}" if tc.num_epochs is None or max_steps == tc.max_steps
                     else f"trainer.num_epochs={tc.num_epochs} ({max_steps} steps)")
    checkpointer = Checkpointer(output_dir, step.drafter, optimizer, scheduler, batches, engine, tc.keep_checkpoints,
                                ranks.world_size, ranks.is_main, resume_settings(tc, len(train_ds), rows_fingerprint(train_ds), cfg.data), max_steps,
                                steps_setting)

    num_params = sum(getattr(p, "ds_numel", p.numel()) for p in trainable)  # ZeRO-3 has split them across the ranks
    run_config = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    logger = MetricsLogger(cfg.logger, {**run_config, "drafter_params": num_params, "target_layer_ids": layer_ids,
                                        "world_size": ranks.world_size}, output_dir, enabled=ranks.is_main)
    log.info("drafter: %.2fM parameters, %d steps (%.4g per epoch), attention %s, %s",
             num_params / 1e6, max_steps, steps_per_epoch, step.ctx.backend, "bf16 autocast" if step.ctx.bf16 else "fp32")
    loop_eval = None
    if tc.loop_eval_prompts and eval_ds is not None and ranks.is_main:
        if store is not None:
            log.warning("trainer.loop_eval_prompts=%d skipped: features.path frees the target's layers the loop needs", tc.loop_eval_prompts)
        else:
            loop_eval = LoopEval(step, held_out_prompts(eval_ds, tc.loop_eval_prompts), tc.loop_eval_max_new_tokens,
                                 tc.loop_eval_static_target)
    return Run(cfg, ranks, device, output_dir, target, target_path, layer_ids, train_ds, eval_ds, data_summary, step, optimizer,
               scheduler, engine, batches, checkpointer, logger, loop_eval, max_steps, steps_per_epoch, micro_per_step, num_params,
               run_config, compile_cache)


# ----------------------------------------------------------------------------- the loop

def train(cfg: DictConfig | TrainConfig) -> dict[str, Any]:
    """Train the drafter described by ``cfg``; returns the final metrics (also in ``run.json``)."""
    with launcher_env_restored():
        return _train(to_train_config(cfg))


def prepare_only(cfg: TrainConfig) -> dict[str, Any]:
    """``data.prepare_only``: the target loaded for its tokenizer (and, to regenerate, its replies), the data prepared
    as a training run prepares it (``prepare_data``: the replies and tokens cached in ``data.cache_dir``; packing is
    redone by each run, in seconds), its summary written to ``output_dir/data.json``; no drafter, compile cache,
    checkpoint or step. One process: the cache is what several ranks of a later run read."""
    check_paths(cfg)
    tc, ranks = cfg.trainer, ranks_from_env()
    if ranks.distributed:
        raise ValueError(f"data.prepare_only=true under a launcher of {ranks.world_size} processes; expected one process "
                         "(the data is prepared once, on one device, and cached for every rank of a later run)")
    device = local_device(pick_device(tc.device), ranks)
    output_dir = Path(cfg.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    _, target = load_target(cfg, device)
    train_ds, eval_ds, summary = prepare_data(cfg.data, target, seed=tc.seed, progress=tc.progress)
    # the training rows' ids and loss masks, hashed: the same data prepared on another machine (or read from the
    # regenerated file itself) hashes the same
    summary["train_rows_fingerprint"] = rows_fingerprint(train_ds)
    record = {"data": summary, "seconds": time.perf_counter() - start, "device": str(device),
              "config": OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)}
    write_json_atomic(output_dir / "data.json", record)
    log.info("data prepared in %.1f min (data.prepare_only): %d training %s, %d held out; replies and tokens cached in %s%s; a run "
             "with the same data and target settings reads them", record["seconds"] / 60, len(train_ds),
             "rows" if cfg.data.pack_length else "conversations", 0 if eval_ds is None else len(eval_ds), Path(cfg.data.cache_dir).expanduser(),
             f"; regenerated replies: {summary['regenerated_from']}" if "regenerated_from" in summary else "")
    return record


def _train(cfg: TrainConfig) -> dict[str, Any]:
    """``train``'s loop, inside the launcher variables' scope (``train`` is what callers use)."""
    from tqdm.auto import tqdm

    if cfg.data.prepare_only:
        return prepare_only(cfg)
    run = build(cfg)
    tc, step, pad_id = cfg.trainer, run.step, run.target.pad_id
    train_state = run.checkpointer.resume(tc.resume) or {"step": 0, "tokens": 0, "seconds": 0.0}
    # the log window open at the checkpoint (steps since the last log): without it, the first record after a resume
    # averaged only the steps run since, not those of an uninterrupted run (a checkpoint off the log_every grid)
    saved_window = train_state.pop("window", None)
    start_step = train_state["step"]
    if run.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    run_start = time.perf_counter()
    history, eval_metrics, interrupted = [], {}, False
    bar = tqdm(total=run.max_steps, initial=train_state["step"], desc="train", unit="step", disable=not (tc.progress and run.ranks.is_main))
    window_stats, window_tokens, window_start = None, 0, time.perf_counter()
    if saved_window is not None:
        window_tokens, window_start = saved_window["tokens"], window_start - saved_window["seconds"]

    def window_state() -> dict[str, Any]:
        """The open log window, for the checkpoint: its stats' sums (on the CPU), tokens and seconds."""
        return {"stats": None if window_stats is None else {k: v.cpu() for k, v in vars(window_stats).items()},
                "tokens": window_tokens, "seconds": time.perf_counter() - window_start}

    for n in range(train_state["step"] + 1, run.max_steps + 1):
        micro = run.next_micro_batches()
        lr = run.scheduler.get_last_lr()[0]  # the rate this step trains with (train_step advances the schedule after it)
        stats, grad_norm = train_step(step, micro, n, run.optimizer, run.scheduler, run.engine, run.ranks)
        tokens = int(sum(b["attention_mask"].sum() for b in micro))
        train_state.update(step=n, tokens=train_state["tokens"] + tokens)
        if window_stats is None and saved_window is not None and saved_window["stats"] is not None:
            window_stats = type(stats)(**{k: v.to(vars(stats)[k].device) for k, v in saved_window["stats"].items()})
        saved_window = None
        window_stats = stats if window_stats is None else window_stats + stats
        window_tokens += tokens
        bar.update(1)
        if n % tc.log_every == 0 or n == run.max_steps:
            elapsed = time.perf_counter() - window_start
            metrics = {**window_stats.summary("train"), "train/lr": lr, "train/grad_norm": float(grad_norm),
                       "train/tokens_per_s": window_tokens / elapsed, "train/tokens": train_state["tokens"],
                       "train/epoch": n / run.steps_per_epoch}
            if run.device.type == "cuda":
                metrics["train/peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
            run.logger.log(metrics, n)
            history.append({"step": n, **metrics})
            bar.set_postfix(loss=f"{metrics['train/loss']:.3f}", acc=f"{metrics['train/acc']:.3f}", tok_s=f"{metrics['train/tokens_per_s']:.0f}")
            train_state["seconds"] += elapsed
            window_stats, window_tokens, window_start = None, 0, time.perf_counter()
        if run.eval_ds is not None and ((tc.eval_every and n % tc.eval_every == 0) or n == run.max_steps):
            eval_metrics = evaluate(step, run.eval_ds, pad_id, tc.eval_batches)
            with deepspeed_engine.gathered_parameters(run.engine):  # ZeRO-3: the loop needs whole weights (rank 0 runs it)
                if run.loop_eval is not None:
                    with deepspeed_engine.plain_drafter(step, run.engine):
                        eval_metrics.update(run.loop_eval())
            run.logger.log(eval_metrics, n)
            history.append({"step": n, **eval_metrics})
            report_eval(n, eval_metrics, bar)
            run.compile_cache.save()  # the evaluation's own graphs (compile_cache keeps each save)
        saved = (tc.checkpoint_every and n % tc.checkpoint_every == 0) or n == run.max_steps
        if saved:
            run.checkpointer.save(n, {**train_state, "window": window_state()})
        if n == start_step + 1:  # the first step compiled the step's graphs, forward and backward (compile_cache)
            run.compile_cache.save()
        out_of_time = tc.time_limit_minutes is not None and time.perf_counter() - run_start > 60 * tc.time_limit_minutes
        if tc.time_limit_minutes is not None and run.ranks.distributed:
            # every rank stops at the same step: each clock started apart (rank 0 alone sets up W&B and runs the loop
            # eval), and a rank out of time waited at the checkpoint's barrier while the others stepped on (a deadlock)
            out_of_time = any_rank(out_of_time, run.device)
        if n < run.max_steps and (out_of_time or (tc.interrupt_after is not None and n >= tc.interrupt_after)):
            if not saved:  # a step on the checkpoint_every grid is saved already (it was written twice)
                run.checkpointer.save(n, {**train_state, "window": window_state()})
            interrupted = True
            # the same command alone starts a new folder where output_dir holds the time (every experiment's default)
            log.warning("stopping after step %d (trainer.%s); resume with the same command and output_dir=%s", n,
                        "time_limit_minutes" if out_of_time else "interrupt_after", run.output_dir)
            break
    bar.close()
    summary = finish(run, train_state, history, eval_metrics, interrupted, time.perf_counter() - run_start, start_step)
    run.compile_cache.save()  # whatever the end compiled (the export's checks, the loop's evaluation)
    return summary


def report_eval(n: int, metrics: dict[str, float], bar) -> None:
    loop = "eval/loop_tau" in metrics
    loop_note = f", loop tau {metrics['eval/loop_tau']:.3f} (prompt lookup {metrics['eval/loop_pld_tau']:.3f})" if loop else ""
    pld_note = f" (prompt lookup {metrics['eval/pld_block_tau']:.3f})" if "eval/pld_block_tau" in metrics else ""
    log.info("step %d: eval loss %.4f, acc %.3f, block_tau %.3f%s%s", n, metrics["eval/loss"], metrics["eval/acc"],
             metrics.get("eval/block_tau", metrics["eval/anchor_tau"]), pld_note, loop_note)
    if loop:
        bar.set_postfix(loss=f"{metrics['eval/loss']:.3f}", loop_tau=f"{metrics['eval/loop_tau']:.2f}", pld_tau=f"{metrics['eval/loop_pld_tau']:.2f}")


# ----------------------------------------------------------------------------- the end: export, record, summary

def earlier_record(output_dir: Path, start_step: int) -> dict[str, Any] | None:
    """The run folder's ``run.json`` when this run resumed it (None for a fresh start or an unreadable record)."""
    path = output_dir / "run.json"
    if start_step == 0 or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def finish(run: Run, train_state: dict, history: list[dict], eval_metrics: dict, interrupted: bool, seconds: float,
           start_step: int = 0) -> dict[str, Any]:
    cfg, tc, output_dir = run.cfg, run.cfg.trainer, run.output_dir
    earlier = earlier_record(output_dir, start_step) if run.ranks.is_main else None
    finished_before = [earlier is not None and start_step >= run.max_steps and not earlier.get("metrics", {}).get("interrupted", True)]
    if run.ranks.distributed:  # rank 0 read the record: every rank takes the same branch (the export below has barriers)
        torch.distributed.broadcast_object_list(finished_before, src=0)
    if finished_before[0]:
        # the same command again on a finished run: nothing trained, its record (history, eval metrics) and export kept
        # (rewritten, they lost the history and the eval metrics)
        if run.engine is not None and run.ranks.distributed:
            deepspeed_engine.leave_process_group()
        if not run.ranks.is_main:
            return {}
        log.info("%s finished at step %d already: nothing to train; run.json and the export kept", output_dir, start_step)
        run.logger.finish()
        return earlier["metrics"]
    if run.ranks.is_main and start_step > 0:  # resumed: the steps logged before the checkpoint it resumed from come first
        # from metrics.jsonl, which holds every step up to the checkpoint (the resume trimmed it there): run.json holds
        # them only up to the last graceful stop, so a run killed after it lost the steps between from its history
        before = logged_records(output_dir / "metrics.jsonl", start_step)
        history = (before or [h for h in (earlier or {}).get("history", []) if h.get("step", 0) <= start_step]) + history
    final = {**(history[-1] if history else {}), **eval_metrics}
    final.update({"steps": train_state["step"], "max_steps": run.max_steps, "tokens": train_state["tokens"],
                  "drafter_params": run.num_params, "interrupted": interrupted})
    if run.device.type == "cuda":
        final["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    export_path = None
    engine_exports = {}
    with deepspeed_engine.gathered_parameters(run.engine):  # ZeRO-3: the whole weights, on every rank, for the export
        if tc.export and not interrupted and run.ranks.is_main:
            export_path = export_drafter(run.drafter, output_dir / "export")
            log.info("exported drafter to %s", export_path)
            from .export import export as export_for_engine

            for fmt in tc.export_formats:
                report = export_for_engine(export_path, output_dir / f"export_{fmt}", fmt, target=run.target_path, target_model=run.target)
                engine_exports[fmt] = report
                log.info("%s export: %s (reload max |Δ logits| %.3g); serve: %s", fmt, report["output"], report["max_abs_logit_diff"],
                         " | ".join(report["commands"].values()))
        barrier()
    if run.engine is not None and run.ranks.distributed:  # a one-process group stays: DeepSpeed keeps it for the next run in this process
        deepspeed_engine.leave_process_group()
    if not run.ranks.is_main:
        return final
    run.logger.summary({k: v for k, v in final.items() if isinstance(v, (int, float))})
    run.logger.finish()
    write_json_atomic(output_dir / "run.json", {
        "target": {"path": cfg.target.path, "resolved_path": run.target_path, "num_layers": run.target.num_layers,
                   "hidden_size": run.target.hidden_size},
        "target_layer_ids": run.layer_ids,
        "mask_token_id": getattr(run.drafter, "mask_token_id", None),
        "export": str(export_path) if export_path else None,
        "engine_exports": engine_exports,
        "data": run.data_summary,
        "metrics": final,
        "history": history,
        "config": run.run_config,
    })
    for line in closing_summary(cfg, final, output_dir, export_path, run.loop_eval, seconds):
        log.info("%s", line)
    return final


def closing_summary(cfg: TrainConfig, final: dict, output_dir: Path, export_path: Path | None, loop_eval, seconds: float) -> list[str]:
    """What was trained, how good it is in the loop beside prompt lookup, where it went, what to run next."""
    lines = [f"done: {DRAFTERS[cfg.drafter.kind].name} drafter, {final['steps']} steps, {final['drafter_params'] / 1e6:.2f}M parameters, "
             f"{seconds / 60:.1f} min"]
    if "eval/loop_tau" in final:
        lines.append(f"  decoding loop: tau {final['eval/loop_tau']:.2f} on {len(loop_eval.prompts)} held-out prompts, prompt lookup "
                     f"{final['eval/loop_pld_tau']:.2f} on the same prompts (tau = tokens per target pass; 1.0 = no gain)")
        repeated = loop_eval.repetition()
        if repeated > 0.5:
            lines.append(f"  note: {100 * repeated:.0f}% of the target's greedy 4-grams on these prompts repeat earlier ones or the prompt's: "
                         "tau here mostly measures copying, not prediction")
    if "eval/block_tau" in final:
        pld = f", prompt lookup {final['eval/pld_block_tau']:.2f} on the same replies" if "eval/pld_block_tau" in final else ""
        lines.append(f"  held-out replies: block_tau {final['eval/block_tau']:.2f} (the loop replayed){pld}, loss {final['eval/loss']:.3f}")
    if final.get("interrupted"):
        lines.append(f"  stopped early; the same command resumes from {output_dir}/checkpoints")
    elif export_path is not None:
        lines.append(f"  export: {export_path}")
        lines.append(f"  next: python -m eval mtbench --drafter {output_dir}")
    return lines
