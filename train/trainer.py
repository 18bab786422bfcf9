"""``train(cfg) -> metrics``: drafter training (DFlash or EAGLE-3) as one plain loop, readable top to bottom.

    train()                    config check -> target -> data -> drafter -> resume -> loop -> export
      train_step()             one optimizer step over grad_accum micro-batches
        step_ctx.forward()     target features -> drafter -> loss and stats
                               (DFlashStep below: anchors, blocks, decayed CE;
                                Eagle3Step in eagle3_objective.py: the training-time-test unroll, soft CE)
      evaluate()               held-out loss, per-slot/per-step accuracy, block_tau (the loop replayed at every position)
      LoopEval (loop_eval.py)  the real decoding loop on held-out prompts: eval/loop_tau beside prompt lookup

The loss is normalised by the number of labels in the whole optimizer step (all micro-batches), so
accumulation does not change the objective. Random choices (DFlash anchors) come from a generator
seeded by (seed, step) and the data order from (seed, epoch): a resumed run repeats an
uninterrupted one exactly.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from kernels.window_attention import fa4_available

from . import checkpoint as ckpt
from .atomic import atomic_dir, atomic_open
from .config import TrainConfig
from .data import prepare_data
from .dflash_objective import (IGNORE, BlockStats, block_loss, build_blocks, default_gamma, dense_anchor_chunks, layer_masks,
                               sample_anchors, walk_segments)
from .eagle3_objective import Eagle3Step
from .distributed import Ranks, barrier, init_process_group, local_device, rank0_first, ranks_from_env
from .features.spec import open_store
from .loop_eval import LoopEval, held_out_prompts
from . import deepspeed_engine
from .step import TrainStep
from .models.dflash import DFlashDraftModel, make_dflash_config
from .models.eagle3 import Eagle3DraftModel, build_draft_vocab, make_eagle3_config
from .target import TargetModel, default_layer_ids
from .tiny_target import resolve_target_path

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- set-up helpers

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
    """Missing local paths fail in a second, before the target (or its first-use build) loads."""
    from .data.dataset import resolve_source
    from .data.readers import looks_local_but_missing

    if not cfg.data.path.startswith("builtin:") and looks_local_but_missing(resolve_source(cfg.data.path)):
        raise ValueError(f"data.path={cfg.data.path!r}: no such file or folder")
    path = cfg.target.path
    if not path.startswith("builtin:") and (Path(path).is_absolute() or path.startswith(".")) and not Path(path).is_dir():
        raise ValueError(f"target.path={path!r}: no such folder")


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"trainer.device={name!r} but no CUDA device is visible")
    return torch.device(name)


def target_layer_ids(cfg: TrainConfig, target: TargetModel) -> list[int]:
    drafter = cfg.drafter
    if drafter.target_layer_ids is not None:
        ids = list(drafter.target_layer_ids)
    else:
        ids = default_layer_ids(drafter.kind.value, target.num_layers, drafter.num_target_features or drafter.num_hidden_layers)
    target.check_layer_ids(ids)
    return ids


def resolve_mask_token_id(configured: int | None, target: TargetModel) -> int:
    """The DFlash mask token: the configured id, else an embedding row no text ever produces."""
    vocab = target.vocab_size
    if configured is not None:
        if not 0 <= configured < vocab:
            raise ValueError(f"drafter.mask_token_id={configured} is outside the target's vocabulary (0..{vocab - 1})")
        return configured
    tokenizer = target.tokenizer
    if vocab > len(tokenizer):
        return len(tokenizer)  # first embedding row with no token (z-lab's choice: 151669 for Qwen3)
    used = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    template = tokenizer.chat_template or ""
    for token_id, token in sorted(tokenizer.added_tokens_decoder.items()):
        if token.special and token_id not in used and token.content not in template:
            return token_id
    raise ValueError("drafter.mask_token_id is null and the target has no unused special token; set drafter.mask_token_id")


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


def loss_token_counts(rows, vocab_size: int) -> torch.Tensor:
    """[V] how often each token id appears under the loss mask (the tokens a drafter must predict)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for row in rows:
        ids = torch.as_tensor(row["input_ids"])[torch.as_tensor(row["loss_mask"], dtype=torch.bool)]
        counts += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
    return counts


def build_eagle3_drafter(cfg: TrainConfig, target: TargetModel, layer_ids: list[int], train_ds) -> Eagle3DraftModel:
    """EAGLE-3 drafter: draft vocabulary from the training data's loss-masked token counts, the
    target's embedding (frozen) and its LM-head rows for the draft vocabulary as the head's start."""
    d = cfg.drafter
    config = make_eagle3_config(
        target.config, num_hidden_layers=d.num_hidden_layers, target_layer_ids=layer_ids, layer_types=d.resolved_layer_types(),
        sliding_window=d.sliding_window, draft_vocab_size=d.draft_vocab_size, ttt_length=d.ttt_length, fc_norm=d.fc_norm,
        norm_output=d.norm_output,
    )
    torch.manual_seed(cfg.trainer.seed)
    drafter = Eagle3DraftModel(config)
    counts = loss_token_counts(train_ds, target.vocab_size)
    d2t, t2d = build_draft_vocab({i: int(c) for i, c in enumerate(counts.tolist()) if c}, target.vocab_size, config.draft_vocab_size)
    drafter.set_draft_vocab(d2t, t2d)
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(target.embed_tokens.weight.float())
        drafter.lm_head.weight.copy_(target.lm_head.weight.float()[drafter.draft_ids_in_target().to(target.lm_head.weight.device)].cpu())
    kept = float(counts[t2d].sum() / counts.sum().clamp(min=1))
    log.info("EAGLE-3 draft vocabulary: %d of %d target tokens, covering %.1f%% of loss-masked training tokens",
             config.draft_vocab_size, target.vocab_size, 100 * kept)
    return drafter


def build_drafter(cfg: TrainConfig, target: TargetModel, layer_ids: list[int], mask_token_id: int) -> DFlashDraftModel:
    d = cfg.drafter
    config = make_dflash_config(
        target.config, num_hidden_layers=d.num_hidden_layers, block_size=d.block_size, mask_token_id=mask_token_id,
        target_layer_ids=layer_ids, layer_types=d.resolved_layer_types(), sliding_window=d.sliding_window,
        sliding_block_causal=d.sliding_block_causal,
    )
    torch.manual_seed(cfg.trainer.seed)
    return DFlashDraftModel(config)


def export_drafter(drafter: DFlashDraftModel, out: Path) -> Path:
    """HF-style folder (config.json + model.safetensors), written to a temp name and renamed."""
    with atomic_dir(out) as tmp:
        drafter.save_pretrained(tmp, safe_serialization=True)
    return out


# ----------------------------------------------------------------------------- the step

class DFlashStep(TrainStep):
    """What every DFlash step needs, fixed at start-up (the EAGLE-3 twin is eagle3_objective.Eagle3Step)."""

    def __init__(self, cfg: TrainConfig, target: TargetModel, drafter: DFlashDraftModel, layer_ids: list[int], device: torch.device, store=None):
        super().__init__(cfg, target, drafter, layer_ids, device, store)  # static shapes also pad anchors to num_anchors
        if self.backend == "fa4" and torch.cuda.get_device_capability(device)[0] != 9:
            raise ValueError("trainer.attention_backend=fa4 trains DFlash with FlashAttention-4's SM90 kernels (key intervals): "
                             "it needs a Hopper GPU; use flex-flash or flex")
        self.block_size = cfg.drafter.block_size
        self.gamma = cfg.drafter.loss_gamma or default_gamma(self.block_size)

    def fastest_gpu_backend(self, cfg) -> str:
        # At 32K, W=2048 (BENCHMARKS.md, issue 8): FA4 with key intervals 1.3-1.4x flex's block masks on FA4's
        # kernels, which are 1.3-1.5x Triton flex. The key-interval kernels are FA4's SM90 ones with 128-key
        # tiles: Hopper, head_dim <= 128.
        if fa4_available():
            hopper = torch.cuda.get_device_capability()[0] == 9
            return "fa4" if hopper and self.drafter.config.head_dim <= 128 else "flex-flash"
        return "flex"

    def plan(self, batch: dict[str, torch.Tensor], generator: torch.Generator):
        """The step's random choices for one micro-batch: anchors and their blocks."""
        anchors, valid = sample_anchors(batch["loss_mask"], self.cfg.drafter.num_anchors, generator, pad_to_max=self.static_shapes)
        return build_blocks(batch["input_ids"], batch["loss_mask"], anchors, valid, self.block_size, self.drafter.mask_token_id)

    def num_labels(self, batch: dict[str, torch.Tensor], blocks) -> int:
        return int((blocks.labels != IGNORE).sum())

    def forward(self, batch: dict[str, torch.Tensor], blocks) -> BlockStats:
        """Target features -> drafter -> stats (loss_sum is differentiable)."""
        blocks = type(blocks)(*(t.to(self.device) for t in vars(blocks).values()))
        with self.autocast():
            logits = self.block_logits(batch, blocks, self.backend)
        return block_loss(logits, blocks.labels, blocks.anchor_valid, self.block_size, self.gamma)

    def evaluate_batch(self, batch: dict[str, torch.Tensor]) -> BlockStats:
        """Held-out stats with a block at every eligible position, and the loop replayed over each assistant
        turn: ``block_tau``."""
        total, accepted = self.dense_acceptance(batch)
        tokens, steps = walk_segments(accepted, batch["loss_mask"])
        total.walk_tokens += tokens
        total.walk_steps += steps
        return total

    @torch.no_grad()
    def dense_acceptance(self, batch: dict[str, torch.Tensor]) -> tuple[BlockStats, torch.Tensor]:
        """Stats of blocks at every eligible position (the target runs once, the drafter once per chunk of
        ``num_anchors``) and [Bsz, T] each position's leading correct drafts (-1: no block there)."""
        loss_mask = batch["loss_mask"]
        features = self.target_features(batch).features
        accepted = torch.full(loss_mask.shape, -1, dtype=torch.long)  # [Bsz, T] by anchor position
        total = None
        for anchors, valid in dense_anchor_chunks(loss_mask, self.cfg.drafter.num_anchors, self.static_shapes):
            blocks = build_blocks(batch["input_ids"], loss_mask, anchors, valid, self.block_size, self.drafter.mask_token_id)
            blocks = type(blocks)(*(t.to(self.device) for t in vars(blocks).values()))
            with self.autocast():
                logits = self.block_logits(batch, blocks, self.backend, features)
            stats, per_block = block_loss(logits, blocks.labels, blocks.anchor_valid, self.block_size, self.gamma, per_block=True)
            rows = torch.arange(anchors.shape[0])[:, None].expand_as(anchors)
            accepted[rows[valid.cpu()], anchors.cpu()[valid.cpu()]] = per_block.cpu()[valid.cpu()]
            total = stats if total is None else total + stats
        return total, accepted

    def block_logits(self, batch: dict[str, torch.Tensor], blocks, backend: str, features: torch.Tensor | None = None) -> torch.Tensor:
        """[Bsz, N*B, V] the drafter's logits for every block slot (blocks already on the device)."""
        attention_mask = batch["attention_mask"].to(self.device)  # [Bsz, T]
        if features is None:
            features = self.target_features(batch).features  # [Bsz, T, k*H]
        d = self.cfg.drafter
        heads = self.drafter.config
        masks = layer_masks(blocks, attention_mask.bool(), self.block_size, self.drafter.layer_types, d.sliding_window, d.sliding_block_causal,
                            backend, query_groups=heads.num_attention_heads // heads.num_key_value_heads, head_dim=heads.head_dim)
        block_embeds = self.target.embed_tokens(blocks.block_ids).to(features.dtype)  # [Bsz, Q, H]
        hidden = self.drafter(block_embeds, features, blocks.positions, masks)  # [Bsz, Q, H]
        return self.target.lm_head(hidden)  # [Bsz, Q, V]


def train_step(step_ctx, micro_batches: list[dict[str, torch.Tensor]], step: int, optimizer, scheduler, engine=None,
               ranks: Ranks = Ranks()) -> tuple[Any, float]:
    """One optimizer step over the global step's micro-batches (every rank's, in order); this rank runs
    its own consecutive share. Returns the stats summed over all ranks and the pre-clip gradient norm.

    Every rank plans the whole step, so the anchors and the label count (the loss's denominator) are
    those a single process would draw for the same micro-batches, with no communication.
    """
    generator = torch.Generator().manual_seed(step_ctx.cfg.trainer.seed * 1_000_003 + step)
    plans = [step_ctx.plan(b, generator) for b in micro_batches]
    num_labels = max(1, sum(step_ctx.num_labels(b, p) for b, p in zip(micro_batches, plans)))  # global count for the step
    per_rank = len(micro_batches) // ranks.world_size
    mine = slice(ranks.rank * per_rank, (ranks.rank + 1) * per_rank)
    total = None
    for batch, plan in zip(micro_batches[mine], plans[mine]):
        stats = step_ctx.forward(batch, plan)
        loss = stats.loss_sum / num_labels
        if engine is None:
            loss.backward()
        else:  # DeepSpeed divides by its accumulation steps and averages over ranks: this loss is already per global label
            engine.backward(loss * per_rank * ranks.world_size)
            engine.step()  # an optimizer step (clip, AdamW, schedule) at the step's last micro-batch only
        stats = type(stats)(*(t.detach() for t in vars(stats).values()))
        total = stats if total is None else total + stats
    if engine is None:
        clip = step_ctx.cfg.trainer.grad_clip
        trainable = [p for p in step_ctx.drafter.parameters() if p.requires_grad]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(trainable, clip if clip > 0 else float("inf")))
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
def evaluate(step_ctx, eval_ds, pad_id: int, max_batches: int | None) -> dict[str, float]:
    step_ctx.drafter.eval()
    total = None
    bs = step_ctx.cfg.trainer.batch_size
    for i, start in enumerate(range(0, len(eval_ds), bs)):
        if max_batches is not None and i >= max_batches:
            break
        rows = list(range(start, min(start + bs, len(eval_ds))))
        batch = step_ctx.collate([eval_ds[j] for j in rows], pad_id, "eval", rows)
        stats = step_ctx.evaluate_batch(batch)
        total = stats if total is None else total + stats
    step_ctx.drafter.train()
    return total.summary("eval") if total is not None else {}


# ----------------------------------------------------------------------------- the loop

def train(cfg: DictConfig | TrainConfig) -> dict[str, Any]:
    """Train the drafter described by ``cfg``; returns the final metrics (also in ``run.json``)."""
    cfg = to_train_config(cfg)
    check_paths(cfg)
    tc = cfg.trainer
    ranks = ranks_from_env()  # torchrun / deepspeed launches: one process per GPU
    device = local_device(pick_device(tc.device), ranks)
    ds_config = None
    if tc.deepspeed is not None or ranks.distributed:
        ds_config = deepspeed_engine.deepspeed_config(tc.deepspeed or "zero2", tc.batch_size, tc.grad_accum, tc.grad_clip, ranks.world_size)
        init_process_group(device, ranks, single_process=True)
    torch.manual_seed(tc.seed)
    output_dir = Path(cfg.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    # Target, layer ids, mask token: every check before any data work.
    target_path = resolve_target_path(cfg.target.path)
    target = TargetModel.from_pretrained(target_path, device, cfg.target.dtype, cfg.target.attn_implementation)
    layer_ids = target_layer_ids(cfg, target)
    mask_token_id = resolve_mask_token_id(cfg.drafter.mask_token_id, target) if cfg.drafter.kind.value == "dflash" else None
    log.info("target %s: %d layers, hidden %d; drafter reads layers %s; mask token %s",
             cfg.target.path, target.num_layers, target.hidden_size, layer_ids, mask_token_id)

    with rank0_first(ranks):  # rank 0 tokenizes and fills the cache, the others then read it
        train_ds, eval_ds, data_summary = prepare_data(cfg.data, target, seed=tc.seed, progress=tc.progress and ranks.is_main)
    train_ds = train_ds.with_format(None)
    store = None
    if cfg.features.path is not None:  # offline features: checked against this run's inputs, then the layers go
        store = open_store(cfg, target, layer_ids, {"train": train_ds, **({"eval": eval_ds} if eval_ds is not None else {})})
        target.release_layers()
    elif cfg.target.compile_layers and device.type == "cuda":  # after data preparation: regeneration decodes token by token
        target.compile_layers()
    pad_id = target.pad_id
    batches = EpochBatches(len(train_ds), tc.batch_size, tc.seed)
    micro_per_step = tc.grad_accum * ranks.world_size  # the global step's micro-batches, all ranks together
    steps_per_epoch = math.ceil(batches.batches_per_epoch / micro_per_step)
    max_steps = tc.max_steps
    if tc.num_epochs is not None:
        by_epochs = max(1, math.ceil(tc.num_epochs * steps_per_epoch))
        max_steps = by_epochs if max_steps is None else min(max_steps, by_epochs)

    if cfg.drafter.kind.value == "eagle3":
        drafter = build_eagle3_drafter(cfg, target, layer_ids, train_ds).to(device).train()
        step_ctx = Eagle3Step(cfg, target, drafter, layer_ids, device, store)
    else:
        drafter = build_drafter(cfg, target, layer_ids, mask_token_id).to(device).train()
        step_ctx = DFlashStep(cfg, target, drafter, layer_ids, device, store)
    trainable = [p for p in drafter.parameters() if p.requires_grad]  # EAGLE-3's embedding is the target's, frozen
    num_params = sum(p.numel() for p in trainable)
    optimizer = torch.optim.AdamW(trainable, lr=tc.lr, betas=(0.9, 0.95), weight_decay=tc.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(int(tc.warmup_ratio * max_steps), max_steps, tc.min_lr_ratio))
    train_state = {"step": 0, "tokens": 0, "seconds": 0.0}
    engine = None if ds_config is None else deepspeed_engine.initialize(drafter, optimizer, scheduler, ds_config, device, ranks)

    resume_from = None
    if tc.resume == "auto":
        found = ckpt.list_checkpoints(output_dir)
        resume_from = found[-1] if found else None
    elif tc.resume != "never":
        resume_from = Path(tc.resume)
    if resume_from is not None and engine is not None:
        state = ckpt.load_deepspeed_checkpoint(resume_from, engine)
    elif resume_from is not None:
        state = ckpt.load_checkpoint(resume_from)
        if state.get("deepspeed"):
            raise ValueError(f"trainer.resume: {resume_from} was written under DeepSpeed; resume it with trainer.deepspeed set "
                             "(or start over with trainer.resume=never)")
        drafter.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["lr_scheduler"])
    if resume_from is not None:
        batches.load_state_dict(state["dataloader"])
        train_state = state["train_state"]
        ckpt.set_rng_state(state["rng"])
        log.info("resumed from %s at step %d", resume_from, train_state["step"])

    def save(step: int) -> None:
        if engine is not None:
            ckpt.save_deepspeed_checkpoint(output_dir, step, engine, {
                "dataloader": batches.state_dict(), "train_state": dict(train_state), "rng": ckpt.rng_state(),
                "model_config": drafter.config.to_dict(), "world_size": ranks.world_size,
            }, keep=tc.keep_checkpoints, is_main=ranks.is_main)
            return
        ckpt.save_checkpoint(output_dir, step, {
            "model": drafter.state_dict(), "optimizer": optimizer.state_dict(), "lr_scheduler": scheduler.state_dict(),
            "dataloader": batches.state_dict(), "train_state": dict(train_state), "rng": ckpt.rng_state(),
            "model_config": drafter.config.to_dict(),
        }, keep=tc.keep_checkpoints)

    from tqdm.auto import tqdm

    from .metrics_logger import MetricsLogger

    run_config = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    logger = MetricsLogger(cfg.logger, {**run_config, "drafter_params": num_params, "target_layer_ids": layer_ids,
                                        "world_size": ranks.world_size}, output_dir, enabled=ranks.is_main)
    log.info("drafter: %.2fM parameters, %d steps (%d per epoch), attention %s, %s",
             num_params / 1e6, max_steps, steps_per_epoch, step_ctx.backend, "bf16 autocast" if step_ctx.bf16 else "fp32")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()

    loop_eval = None
    if tc.loop_eval_prompts and eval_ds is not None and ranks.is_main:
        if store is not None:
            log.warning("trainer.loop_eval_prompts=%d skipped: features.path frees the target's layers the loop needs", tc.loop_eval_prompts)
        else:
            loop_eval = LoopEval(step_ctx, held_out_prompts(eval_ds, tc.loop_eval_prompts), tc.loop_eval_max_new_tokens)

    run_start = time.perf_counter()
    history: list[dict[str, Any]] = []
    eval_metrics: dict[str, float] = {}
    bar = tqdm(total=max_steps, initial=train_state["step"], desc="train", unit="step", disable=not (tc.progress and ranks.is_main))
    window_stats, window_tokens, window_start = None, 0, time.perf_counter()
    interrupted = False
    for step in range(train_state["step"] + 1, max_steps + 1):
        micro = [step_ctx.collate([train_ds[i] for i in rows], pad_id, "train", rows) for rows in (batches.next() for _ in range(micro_per_step))]
        stats, grad_norm = train_step(step_ctx, micro, step, optimizer, scheduler, engine, ranks)
        tokens = int(sum(b["attention_mask"].sum() for b in micro))
        train_state["step"], train_state["tokens"] = step, train_state["tokens"] + tokens
        window_stats = stats if window_stats is None else window_stats + stats
        window_tokens += tokens
        bar.update(1)
        if step % tc.log_every == 0 or step == max_steps:
            elapsed = time.perf_counter() - window_start
            metrics = window_stats.summary("train")
            metrics.update({"train/lr": scheduler.get_last_lr()[0], "train/grad_norm": grad_norm,
                            "train/tokens_per_s": window_tokens / elapsed, "train/tokens": train_state["tokens"],
                            "train/epoch": step / steps_per_epoch})
            if device.type == "cuda":
                metrics["train/peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
            logger.log(metrics, step)
            history.append({"step": step, **metrics})
            bar.set_postfix(loss=f"{metrics['train/loss']:.3f}", acc=f"{metrics['train/acc']:.3f}", tok_s=f"{metrics['train/tokens_per_s']:.0f}")
            train_state["seconds"] += elapsed
            window_stats, window_tokens, window_start = None, 0, time.perf_counter()
        if eval_ds is not None and ((tc.eval_every and step % tc.eval_every == 0) or step == max_steps):
            eval_metrics = evaluate(step_ctx, eval_ds, pad_id, tc.eval_batches)
            with deepspeed_engine.gathered_parameters(engine):  # ZeRO-3: the loop needs whole weights (rank 0 runs it)
                if loop_eval is not None:
                    eval_metrics.update(loop_eval())
            logger.log(eval_metrics, step)
            history.append({"step": step, **eval_metrics})
            loop_note = (f", loop tau {eval_metrics['eval/loop_tau']:.3f} (prompt lookup {eval_metrics['eval/loop_pld_tau']:.3f})"
                         if loop_eval is not None else "")
            log.info("step %d: eval loss %.4f, acc %.3f, block_tau %.3f%s", step, eval_metrics["eval/loss"], eval_metrics["eval/acc"],
                     eval_metrics.get("eval/block_tau", eval_metrics["eval/anchor_tau"]), loop_note)
            if loop_eval is not None:
                bar.set_postfix(loss=f"{eval_metrics['eval/loss']:.3f}", loop_tau=f"{eval_metrics['eval/loop_tau']:.2f}",
                                pld_tau=f"{eval_metrics['eval/loop_pld_tau']:.2f}")
        if (tc.checkpoint_every and step % tc.checkpoint_every == 0) or step == max_steps:
            save(step)
        out_of_time = tc.time_limit_minutes is not None and time.perf_counter() - run_start > 60 * tc.time_limit_minutes
        if step < max_steps and (out_of_time or (tc.interrupt_after is not None and step >= tc.interrupt_after)):
            save(step)
            interrupted = True
            log.warning("stopping after step %d (trainer.%s); resume with the same command", step, "time_limit_minutes" if out_of_time else "interrupt_after")
            break
    bar.close()

    final = {**(history[-1] if history else {}), **eval_metrics}
    final.update({"steps": train_state["step"], "max_steps": max_steps, "tokens": train_state["tokens"],
                  "drafter_params": num_params, "interrupted": interrupted})
    if device.type == "cuda":
        final["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    export_path = None
    engine_exports = {}
    with deepspeed_engine.gathered_parameters(engine):  # ZeRO-3: the whole weights, on every rank, for the export
        if tc.export and not interrupted and ranks.is_main:
            export_path = export_drafter(drafter, output_dir / "export")
            log.info("exported drafter to %s", export_path)
            from .export import export as export_for_engine

            for fmt in tc.export_formats:
                report = export_for_engine(export_path, output_dir / f"export_{fmt}", fmt, target=target_path, target_model=target)
                engine_exports[fmt] = report
                log.info("%s export: %s (reload max |Δ logits| %.3g); serve: %s", fmt, report["output"], report["max_abs_logit_diff"],
                         " | ".join(report["commands"].values()))
        barrier()
    if engine is not None and ranks.distributed:  # a one-process group stays: DeepSpeed keeps it for the next run in this process
        deepspeed_engine.leave_process_group()
    if not ranks.is_main:
        return final
    logger.summary({k: v for k, v in final.items() if isinstance(v, (int, float))})
    logger.finish()
    write_json_atomic(output_dir / "run.json", {
        "target": {"path": cfg.target.path, "resolved_path": target_path, "num_layers": target.num_layers, "hidden_size": target.hidden_size},
        "target_layer_ids": layer_ids,
        "mask_token_id": mask_token_id,
        "export": str(export_path) if export_path else None,
        "engine_exports": engine_exports,
        "data": data_summary,
        "metrics": final,
        "history": history,
        "config": run_config,
    })
    for line in closing_summary(cfg, final, output_dir, export_path, loop_eval, time.perf_counter() - run_start):
        log.info("%s", line)
    return final


def closing_summary(cfg: TrainConfig, final: dict, output_dir: Path, export_path: Path | None, loop_eval, seconds: float) -> list[str]:
    """What was trained, how good it is in the loop beside prompt lookup, where it went, what to run next."""
    kind = "DFlash" if cfg.drafter.kind.value == "dflash" else "EAGLE-3"
    lines = [f"done: {kind} drafter, {final['steps']} steps, {final['drafter_params'] / 1e6:.2f}M parameters, {seconds / 60:.1f} min"]
    if "eval/loop_tau" in final:
        lines.append(f"  decoding loop: tau {final['eval/loop_tau']:.2f} on {len(loop_eval.prompts)} held-out prompts, prompt lookup "
                     f"{final['eval/loop_pld_tau']:.2f} on the same prompts (tau = tokens per target pass; 1.0 = no gain)")
        repeated = loop_eval.repetition()
        if repeated > 0.5:
            lines.append(f"  note: {100 * repeated:.0f}% of the target's greedy 4-grams on these prompts repeat earlier ones: "
                         "tau here mostly measures copying, not prediction")
    if "eval/block_tau" in final:
        lines.append(f"  held-out replies: block_tau {final['eval/block_tau']:.2f} (the loop replayed), loss {final['eval/loss']:.3f}")
    if final.get("interrupted"):
        lines.append(f"  stopped early; the same command resumes from {output_dir}/checkpoints")
    elif export_path is not None:
        lines.append(f"  export: {export_path}")
        lines.append(f"  next: python -m eval mtbench --drafter {output_dir}")
    return lines
