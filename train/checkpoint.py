"""Checkpoints: one folder per step under ``<output_dir>/checkpoints``, written atomically, and the
``Checkpointer`` that owns save and resume for the plain and the DeepSpeed paths.

A checkpoint holds everything a resume needs under fixed keys: ``model``, ``optimizer``,
``lr_scheduler``, ``dataloader`` (epoch and position), ``train_state`` (step, token counts, the open log
window) and ``rng``, and what a resume checks against this run: ``model_config`` and ``settings``
(``RESUME_SETTINGS``) and ``max_steps`` (the step count its schedule ran towards). It is written to a hidden temporary
folder, its files and the folder fsynced, then renamed (and the parent folder fsynced), so a folder named ``step_*`` is
always complete, also after a crash of the machine; resuming picks the newest one.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from common.atomic import atomic_dir, fsync_dir, fsync_tree
from common.metrics_logger import drop_metrics_after
from common.tensor_shapes import shape_differences

from .config import refuse_fresh_start_over_a_run

log = logging.getLogger(__name__)

STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_dir(output_dir: Path) -> Path:
    return Path(output_dir) / "checkpoints"


def save_checkpoint(output_dir: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    root = checkpoint_dir(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:08d}"
    with atomic_dir(final) as tmp:  # fsynced before and after its rename (common/atomic.py)
        torch.save(state, tmp / "state.pt")
    prune_checkpoints(output_dir, keep)
    return final


def prune_checkpoints(output_dir: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints (0 = keep all), and the hidden temporary folders of saves a kill
    cut short (``.step_*``: never resumed from, never deleted before; a drafter's optimizer state in each). Called right
    after a save, by the one process that saves: no save of its own is in flight."""
    root = checkpoint_dir(output_dir)
    if root.is_dir():
        for stale in root.glob(".step_*"):
            shutil.rmtree(stale, ignore_errors=True)
    if keep > 0:
        for old in list_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


def list_checkpoints(output_dir: Path) -> list[Path]:
    root = checkpoint_dir(output_dir)
    if not root.is_dir():
        return []
    steps = [p for p in root.iterdir() if STEP_DIR.match(p.name)]
    found = [p for p in steps if (p / "state.pt").exists()]
    if len(found) < len(steps):  # checkpoints are written whole (temp name, then rename): such a folder is not ours
        log.warning("%s: %s without state.pt, not a checkpoint: skipped (resuming from the newest complete one)", root,
                    ", ".join(sorted(p.name for p in steps if p not in found)))
    return sorted(found, key=lambda p: int(STEP_DIR.match(p.name).group(1)))


def checkpoint_file(path: Path | str) -> Path:
    """``trainer.resume``'s checkpoint file (a ``step_*`` folder's ``state.pt``, or the file itself), or one line saying
    there is none (checked at start-up by ``config.check_paths``, before the data is prepared, and again at resume)."""
    file = Path(path) / "state.pt" if Path(path).is_dir() else Path(path)
    if not file.is_file():
        raise ValueError(f"trainer.resume={str(path)!r}: no checkpoint there (expected {file}); expected auto, never or a "
                         "checkpoint folder (checkpoints/step_*)")
    return file


def load_checkpoint(path: Path, mmap: bool = False) -> dict[str, Any]:
    """``mmap``: the file mapped, its tensors not read (torch maps only its zip format: another one is loaded plainly)."""
    file = checkpoint_file(path)
    try:
        state = read_state(file, mmap)
    except UnreadableCheckpoint as e:
        if mmap:
            return load_checkpoint(path)
        raise ValueError(f"trainer.resume: {file} is not a readable checkpoint ({e}); delete its folder "
                         "to resume from an older one, or start over in another output_dir") from None
    # a torch file that loads but is no checkpoint of this trainer (a model's weights, a bare tensor): the resume read
    # its keys as KeyError / AttributeError tracebacks
    missing = checkpoint_missing(state)
    if missing:
        raise ValueError(f"trainer.resume: {file} is not a checkpoint of python -m train ({missing}); expected a "
                         f"checkpoint folder (checkpoints/step_*) as python -m train writes it, or auto")
    return state


# What every checkpoint's state.pt holds (Checkpointer.save), and what a plain (not DeepSpeed) one adds.
CHECKPOINT_KEYS = ("train_state", "dataloader", "rng")
PLAIN_CHECKPOINT_KEYS = ("model", "optimizer", "lr_scheduler")


def checkpoint_missing(state: Any) -> str | None:
    """What a loaded ``state.pt`` lacks to be a checkpoint, in a few words, or None."""
    if not isinstance(state, dict):
        return f"a {type(state).__name__}, not a dict"
    keys = CHECKPOINT_KEYS + (() if state.get("deepspeed") else PLAIN_CHECKPOINT_KEYS)
    missing = [k for k in keys if k not in state]
    if missing:
        return f"no {', '.join(repr(k) for k in missing)}"
    if not isinstance(state["train_state"], dict) or not isinstance(state["train_state"].get("step"), int):
        return "no step in 'train_state'"
    return None


class UnreadableCheckpoint(ValueError):
    """A state.pt torch cannot read back (cut off, overwritten, not a checkpoint); the message is why, in one line."""


def read_state(file: Path, mmap: bool = False) -> Any:
    """``torch.load`` of a checkpoint file (weights only, on the CPU); any failure as one ``UnreadableCheckpoint``: torch's
    errors for a cut-off or foreign file vary (RuntimeError, UnpicklingError, EOFError, KeyError) and run on for lines."""
    try:
        return torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # noqa: BLE001 - see above
        reason = str(e).split(". ")[0].splitlines()[0] if str(e) else ""
        raise UnreadableCheckpoint(f"{type(e).__name__}: {reason}" if reason else type(e).__name__) from None


def state_mismatch(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """How a checkpoint's model tensors differ from the drafter's (names, shapes), in a few words, or None when they
    match: a run folder resumed with another drafter kind, depth or width."""
    differences = shape_differences({k: tuple(v.shape) for k, v in saved.items()}, {k: tuple(v.shape) for k, v in current.items()})
    if not differences:
        return None
    name, there, here = differences[0]
    first = (f"{name} not there" if there is None else f"{name} not here" if here is None
             else f"{name} {list(there)} there, {list(here)} here")
    return f"{len(differences)} tensors differ, first {first}"


# Bookkeeping keys of a Hugging Face config that do not change what the drafter computes.
CONFIG_BOOKKEEPING = {"transformers_version", "_name_or_path", "architectures", "torch_dtype", "dtype"}


def config_mismatch(saved: dict[str, Any] | None, current: dict[str, Any]) -> str | None:
    """How a checkpoint's drafter config differs from this run's, in a few words, or None: settings that keep every
    tensor's shape (the window, the block size, the layer types, the mask token) would otherwise resume silently, and
    the export would then label weights trained one way with the other's settings."""
    if saved is None:
        return None
    keys = sorted((set(saved) | set(current)) - CONFIG_BOOKKEEPING)
    differ = [k for k in keys if saved.get(k) != current.get(k)]
    if not differ:
        return None
    shown = ", ".join(f"{k} {saved.get(k)!r} there, {current.get(k)!r} here" for k in differ[:3])
    return f"{len(differ)} drafter setting(s) differ: {shown}" + (", ..." if len(differ) > 3 else "")


# The trainer's settings a checkpoint's state holds or is counted in: the optimizer's state restores its learning rates
# and weight decays over this run's (trainer.lr changed at a resume was ignored, silently), and the data position
# (epoch, micro-batch index) counts micro-batches of batch_size in the order seed draws over the training rows
# (another batch size, seed or data set skipped or repeated rows, silently). grad_accum sets what a step is. The schedule's
# shape (warmup_ratio, min_lr_ratio; lr and muon_lr above set its height) is this run's LambdaLR applied from the resumed
# step on: changed at a resume, the learning rate jumped to another curve mid-run, silently.
# trainer.max_steps (and num_epochs, which sets it) stays out, deliberately: raising it is how a finished or stopped run is
# extended (the optimizer state and data position stay valid). The warmup + cosine is laid over max_steps, so the curve is
# then stretched from the resumed step on (the rate steps up or down there): allowed, with a warning at resume
# (Checkpointer.check_steps_left); a lowered max_steps the checkpoint has already reached is refused there.
RESUME_SETTINGS = ("seed", "batch_size", "grad_accum", "optimizer", "lr", "muon_lr", "weight_decay", "muon_weight_decay",
                   "warmup_ratio", "min_lr_ratio")


# The data settings a regeneration's cache key holds (train.data.regenerated_key): changed at a resume, the rows' count
# or hash refused them only once the data had been regenerated again (minutes to hours). They are compared before the
# target loads (``check_resume_early``); the settings applied after regeneration (num_eval, packing, overflow, ...) are
# cheap to prepare again and left to the rows' hash, as data.path and target.path are (the same files under another path,
# a run folder carried to another machine, resume; other files are caught by the hash): ``data_resume_settings``.
# The regeneration's settings that change the replies: the sampling ones only when it samples (greedy replies ignore them)
REGENERATE_SAMPLING = ("seed", "top_p", "top_k")


def data_resume_settings(data_cfg: Any) -> dict[str, Any]:
    """The data settings the regenerated replies depend on (``REPLY_DATA_SETTINGS``, the chat template) and the
    regeneration's (those that change the replies), one key each."""
    from .data import REPLY_DATA_SETTINGS, regenerate_key  # here: the data package imports datasets

    settings = {f"data.{k}": getattr(data_cfg, k) for k in (*REPLY_DATA_SETTINGS, "chat_template")}
    regen = data_cfg.regenerate
    replies = regenerate_key(regen) if regen.enabled else {"enabled": False}
    settings.update({f"data.regenerate.{k}": v for k, v in replies.items()
                     if not (k in REGENERATE_SAMPLING and regen.temperature == 0)})
    return settings


def resume_settings(trainer_cfg: Any, train_rows: int | None = None, rows_fingerprint: str | None = None,
                    data_cfg: Any = None) -> dict[str, Any]:
    """What ``settings_mismatch`` compares, as a checkpoint records it: the settings above, the data's settings, the
    training rows' count and a hash of them (``train.data.dataset.rows_fingerprint``: other rows of the same count, from
    another data file or replies regenerated otherwise, resumed silently at a data position counted over the old ones).
    Before the data is prepared, without the rows (``check_resume_early``)."""
    settings = {f"trainer.{k}": getattr(trainer_cfg, k) for k in RESUME_SETTINGS}
    if data_cfg is not None:
        settings.update(data_resume_settings(data_cfg))
    if train_rows is not None:
        settings["training rows"] = int(train_rows)
    if rows_fingerprint is not None:
        settings["training rows' hash"] = rows_fingerprint
    return settings


def settings_mismatch(saved: dict[str, Any] | None, current: dict[str, Any] | None) -> str | None:
    """How a checkpoint's ``resume_settings`` differ from this run's, in a few words, or None (None for a checkpoint
    written before they were recorded)."""
    if saved is None or current is None:
        return None
    differ = [k for k in current if k in saved and saved[k] != current[k]]
    if not differ:
        return None
    shown = ", ".join(f"{k} {saved[k]!r} there, {current[k]!r} here" for k in differ[:3])
    return shown + (", ..." if len(differ) > 3 else "")


def refuse_other_settings(path: Path, state: dict[str, Any], settings: dict[str, Any] | None) -> None:
    mismatch = settings_mismatch(state.get("settings"), settings)
    if mismatch:
        raise ValueError(f"trainer.resume: {path} was trained with other settings ({mismatch}); its optimizer state, data "
                         "position and learning-rate schedule would override, misread or bend them: resume it with the "
                         "settings it was trained with, or start over in another output_dir")


def check_resume_early(cfg: Any, stage: int | None = None, world_size: int = 1) -> None:
    """The checkpoint ``trainer.resume`` picks, against this run's DeepSpeed layout (``stage`` None: none; the world
    size), trainer and data settings, before the target loads and the data is prepared: a resume with another
    ``data.max_records``, regeneration or number of GPUs was refused only after the data had been regenerated (minutes
    to hours). The rows themselves, the drafter and the step count are checked at resume."""
    if cfg.trainer.resume == "never":
        return
    found = list_checkpoints(cfg.output_dir) if cfg.trainer.resume == "auto" else [Path(cfg.trainer.resume)]
    if not found:
        return
    state = load_checkpoint(found[-1], mmap=True)  # the settings are read, not the weights and optimizer state
    check_deepspeed_layout(found[-1], state, stage, world_size)
    refuse_other_settings(found[-1], state, resume_settings(cfg.trainer, data_cfg=cfg.data))


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_deepspeed_checkpoint(output_dir: Path, step: int, engine, state: dict[str, Any], keep: int, is_main: bool) -> Path:
    """Under DeepSpeed (every rank calls this): the engine writes the model, its optimizer shards and the
    scheduler into a hidden folder, rank 0 adds ``state.pt`` (data position, counters, RNG) and renames
    the folder to ``step_*``: as in one-process runs, a ``step_*`` folder is always complete."""
    import torch.distributed as dist

    root = checkpoint_dir(output_dir)
    final = root / f"step_{step:08d}"
    tmp_tag = f".{final.name}.partial"  # one name on every rank (a random temp name would differ)
    if is_main:
        shutil.rmtree(root / tmp_tag, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    engine.save_checkpoint(str(root), tag=tmp_tag, save_latest=False)
    dist.barrier()
    if is_main:
        torch.save({**state, "deepspeed": True}, root / tmp_tag / "state.pt")
        fsync_tree(root / tmp_tag)  # every rank's shards and state.pt on the disk before the rename (the ranks wrote theirs before the barrier)
        if final.exists():
            shutil.rmtree(final)
        (root / tmp_tag).rename(final)
        fsync_dir(root)
        prune_checkpoints(output_dir, keep)
    dist.barrier()
    return final


def check_deepspeed_state(path: Path, engine, state: dict[str, Any]) -> None:
    """Refuse, in one line, a checkpoint this run's engine (None: no DeepSpeed) cannot load: written with or without
    DeepSpeed against this run, over another world size or ZeRO stage. Cheap (``state.pt``'s fields only): it runs
    before the other resume checks, whose messages would otherwise name a symptom (a ``num_epochs`` run on more GPUs has
    fewer steps) rather than the cause."""
    if engine is None:
        check_deepspeed_layout(path, state, None, 1)
    else:
        check_deepspeed_layout(path, state, engine.zero_optimization_stage(), engine.world_size)


def check_deepspeed_layout(path: Path, state: dict[str, Any], stage: int | None, world_size: int) -> None:
    """``check_deepspeed_state`` for a run without its engine yet: ``stage`` None for no DeepSpeed."""
    if stage is None:
        if state.get("deepspeed"):
            raise ValueError(f"trainer.resume: {path} was written under DeepSpeed; resume it with trainer.deepspeed set "
                             "(or start over in another output_dir)")
        return
    if not state.get("deepspeed"):
        raise ValueError(f"trainer.resume: {path} was written without DeepSpeed; resume it the same way "
                         "(no trainer.deepspeed, one process) or start over in another output_dir")
    if state.get("world_size", world_size) != world_size:
        raise ValueError(f"trainer.resume: {path} holds optimizer shards of {state['world_size']} ranks; this run has "
                         f"{world_size} (relaunch on {state['world_size']} GPUs, or start over in another output_dir)")
    folder = Path(path) if Path(path).is_dir() else Path(path).parent
    saved_stage = state.get("zero_stage")
    if saved_stage is not None and saved_stage != stage:  # DeepSpeed's loader: an AssertionError traceback (no files of its stage)
        raise ValueError(f"trainer.resume: {folder} was written under ZeRO stage {saved_stage}; this run's trainer.deepspeed "
                         f"runs stage {stage} (resume it with the DeepSpeed config it was trained with, or start over in "
                         "another output_dir)")


def load_deepspeed_checkpoint(path: Path, engine, state: dict[str, Any]) -> dict[str, Any]:
    """Model, optimizer and scheduler into the engine, from the checkpoint whose ``state.pt`` (``load_checkpoint``) is
    ``state``, already through ``check_deepspeed_state`` (``Checkpointer.resume``); returns it."""
    path = Path(path) if Path(path).is_dir() else Path(path).parent
    loaded, _ = engine.load_checkpoint(str(path.parent), tag=path.name)
    if loaded is None:
        raise ValueError(f"trainer.resume: DeepSpeed could not load {path}")
    return state


def state_step(path: Path) -> int:
    """The step in a ``step_*`` folder's name."""
    return int(STEP_DIR.match(Path(path).name).group(1))


class Checkpointer:
    """Save and resume for one run (torchtitan's ``CheckpointManager``): the objects it saves are fixed at
    start-up, each through ``state_dict``/``load_state_dict`` under a fixed key. Under DeepSpeed the
    engine holds the model, optimizer and scheduler (sharded under ZeRO); otherwise this does.

    Args:
        batches: the data order (``EpochBatches``): its position is saved and restored.
        engine: the DeepSpeed engine, or None.
        keep: checkpoints kept (0 = all).
    """

    def __init__(self, output_dir: Path, drafter: torch.nn.Module, optimizer, scheduler, batches, engine=None, keep: int = 2,
                 world_size: int = 1, is_main: bool = True, settings: dict[str, Any] | None = None, max_steps: int | None = None,
                 max_steps_setting: str | None = None):
        self.output_dir, self.drafter, self.optimizer, self.scheduler = Path(output_dir), drafter, optimizer, scheduler
        self.batches, self.engine, self.keep, self.world_size, self.is_main = batches, engine, keep, world_size, is_main
        self.settings = settings  # resume_settings: recorded in every checkpoint, compared at resume
        # the run's step count (recorded in every checkpoint, checked at resume) and the setting it comes from, as the
        # refusal names it (trainer.max_steps=N, or trainer.num_epochs=E for N steps)
        self.max_steps = max_steps
        self.max_steps_setting = max_steps_setting or f"trainer.max_steps={max_steps}"

    def check_compatible(self, path: Path, state: dict[str, Any]) -> None:
        """Refuse, in one line, a checkpoint of another drafter (its config and tensor shapes, before any tensor loads:
        DeepSpeed's loader answered with a traceback), another optimizer (Muon with AdamW against AdamW alone: a
        KeyError) or other ``RESUME_SETTINGS`` (learning rate, batch, seed, data: ignored or misread, silently)."""
        how = "resume it with the settings it was trained with, or start over in another output_dir"
        # the tensors too, for checkpoints saved without a config (load_state_dict's answer: a traceback listing every tensor)
        mismatch = (config_mismatch(state.get("model_config"), self.drafter.config.to_dict())
                    or ("model" in state and state_mismatch(state["model"], self.drafter.state_dict())))
        if mismatch:
            raise ValueError(f"trainer.resume: {path} holds another drafter than this config builds ({mismatch}); {how}")
        if self.engine is None and "optimizer" in state:
            saved, here = sorted(state["optimizer"]), sorted(self.optimizer.state_dict())
            if saved != here:
                raise ValueError(f"trainer.resume: {path} holds another optimizer's state (keys {saved}; this run's {here}: "
                                 f"trainer.optimizer differs); {how}")
        refuse_other_settings(path, state, self.settings)

    def check_steps_left(self, path: Path, state: dict[str, Any]) -> None:
        """Refuse, in one line, a checkpoint at or past this run's ``max_steps`` (a lowered one): the loop trained nothing
        and the run exported the checkpoint's weights (or, a finished run, kept its record) as if it had ended there,
        exit 0. The same command again on a finished run (its step is the ``max_steps`` it was saved under, this run's
        too) stays what it was: nothing trained, its record kept. A ``max_steps`` changed otherwise resumes (how a run is
        extended), with a warning: the schedule is stretched over it from this step on."""
        if self.max_steps is None:
            return
        step, saved = int(state["train_state"]["step"]), state.get("max_steps")
        finished_rerun = step == self.max_steps and saved in (None, self.max_steps)  # None: saved before max_steps was recorded
        if step >= self.max_steps and not finished_rerun:
            of = f" of a run to {saved} steps" if saved is not None else ""
            raise_it = ("trainer.num_epochs (and trainer.max_steps, if set)" if self.max_steps_setting.startswith("trainer.num_epochs")
                        else "trainer.max_steps")
            raise ValueError(f"trainer.resume: {path} is at step {step}{of}, and this run's {self.max_steps_setting} leaves "
                             f"nothing to train from it (it would be exported or kept as it is, as if finished); expected "
                             f"{raise_it} above {step} steps to train on from it, or a new run in another output_dir")
        if saved is not None and saved != self.max_steps:  # below max_steps here: extended (or shortened), resumed
            log.warning("trainer.resume: %s was trained towards %d steps, this run's %s: the warmup + cosine schedule is "
                        "stretched over %d steps from step %d on (the learning rate steps to the new curve there)",
                        path, saved, self.max_steps_setting, self.max_steps, step)

    def save(self, step: int, train_state: dict[str, Any]) -> Path:
        common = {"dataloader": self.batches.state_dict(), "train_state": dict(train_state), "rng": rng_state(),
                  "model_config": self.drafter.config.to_dict(), **({"settings": self.settings} if self.settings else {}),
                  **({"max_steps": self.max_steps} if self.max_steps is not None else {})}
        if self.engine is not None:
            return save_deepspeed_checkpoint(self.output_dir, step, self.engine, {**common, "world_size": self.world_size,
                                                                                  "zero_stage": self.engine.zero_optimization_stage()},
                                             keep=self.keep, is_main=self.is_main)
        return save_checkpoint(self.output_dir, step, {"model": self.drafter.state_dict(), "optimizer": self.optimizer.state_dict(),
                                                       "lr_scheduler": self.scheduler.state_dict(), **common}, keep=self.keep)

    def resume(self, resume: str) -> dict[str, Any] | None:
        """``trainer.resume``: auto (the newest checkpoint in the run folder, if any), never (refused where the folder
        holds a run), or a checkpoint folder. Restores everything and returns the saved ``train_state``; None when
        starting afresh. ``metrics.jsonl`` keeps only the steps up to the one resumed from (none when starting afresh):
        the steps after it are logged again."""
        if resume == "never":
            refuse_fresh_start_over_a_run(self.output_dir)
        found = list_checkpoints(self.output_dir) if resume == "auto" else []
        if resume == "never" or (resume == "auto" and not found):
            if self.is_main:  # a run killed before its first checkpoint logged steps this one logs again
                drop_metrics_after(self.output_dir, 0)
            return None
        if resume == "auto":
            path = found[-1]
        else:
            path = Path(resume)
            folder = path if path.is_dir() else path.parent  # resume may name the folder's state.pt itself
            newer = [p.name for p in list_checkpoints(self.output_dir)
                     if state_step(p) > state_step(folder)] if STEP_DIR.match(folder.name) else []
            if newer:  # rolled back inside the run folder: pruning deleted the source, resume=auto picked the abandoned run
                raise ValueError(f"trainer.resume={resume!r}: {self.output_dir} holds checkpoints newer than it ({', '.join(newer)}), "
                                 "of the run it branches from; resume it into another output_dir (the checkpoint stays where it is)")
        state = load_checkpoint(path)
        check_deepspeed_state(path, self.engine, state)
        self.check_compatible(path, state)
        self.check_steps_left(path, state)  # before anything loads or metrics.jsonl is trimmed: a refusal changes nothing
        if self.engine is not None:
            load_deepspeed_checkpoint(path, self.engine, state)
        else:
            self.drafter.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["lr_scheduler"])
        self.batches.load_state_dict(state["dataloader"])
        set_rng_state(state["rng"])
        if self.is_main:
            drop_metrics_after(self.output_dir, state["train_state"]["step"])
        log.info("resumed from %s at step %d", path, state["train_state"]["step"])
        return state["train_state"]
