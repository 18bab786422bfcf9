"""DFlash training on the tiny builtin target: learning, exact resume, accumulation, export, errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from compose import compose_train
from safetensors.torch import load_file

from train.trainer import train

FAST = ["experiment=dflash_swa_tiny", "trainer.progress=false", "trainer.log_every=1", "data.num_eval=16"]


def compose_fast(overrides: list[str]):
    return compose_train(FAST + overrides)


def exported(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "export" / "model.safetensors")


@pytest.mark.slow
def test_loss_falls_and_export_is_complete(tmp_path: Path) -> None:
    metrics = train(compose_fast(["trainer.max_steps=40", "trainer.eval_every=0", f"output_dir={tmp_path}"]))
    history = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [h["train/loss"] for h in history if "train/loss" in h]
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5, losses
    assert {"eval/loss", "eval/sim_tau", "eval/block_tau", "eval/acc_slot_1"} <= set(metrics)
    assert metrics["eval/sim_tau"] >= 1.0
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["layer_types"] == ["sliding_attention", "sliding_attention"]  # experiment=dflash_swa_tiny
    assert config["sliding_window"] == 64 and config["use_sliding_window"] is True
    assert config["dflash_config"] == {"target_layer_ids": [1, 5], "block_size": 8, "mask_token_id": 3}
    assert config["block_size"] == 8 and config["num_target_layers"] == 8
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["export"] == str(tmp_path / "export") and record["target"]["path"] == "builtin:tiny-qwen3"
    # The engine export ran at the end of training, through the validation gate.
    assert record["engine_exports"]["dflash"]["max_abs_logit_diff"] <= 1e-2
    assert json.loads((tmp_path / "export_dflash" / "config.json").read_text())["dflash_config"]["target_layer_ids"] == [1, 5]


@pytest.mark.slow  # the quick tier keeps EAGLE-3's (tests/test_eagle3_train.py)
def test_resume_reproduces_an_uninterrupted_run_bit_for_bit(tmp_path: Path) -> None:
    common = ["trainer.max_steps=6", "trainer.batch_size=2", "trainer.grad_accum=2", "trainer.eval_every=0", "data.num_eval=0", "trainer.checkpoint_every=2"]
    train(compose_fast(common + [f"output_dir={tmp_path / 'straight'}"]))
    interrupted = train(compose_fast(common + ["trainer.interrupt_after=3", f"output_dir={tmp_path / 'resumed'}"]))
    assert interrupted["interrupted"] and interrupted["steps"] == 3
    assert not (tmp_path / "resumed" / "export").exists()
    assert (tmp_path / "resumed" / "checkpoints" / "step_00000003" / "state.pt").exists()
    resumed = train(compose_fast(common + [f"output_dir={tmp_path / 'resumed'}"]))
    assert resumed["steps"] == 6 and not resumed["interrupted"]
    a, b = exported(tmp_path / "straight"), exported(tmp_path / "resumed")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_gradient_accumulation_matches_a_larger_batch(tmp_path: Path) -> None:
    """Loss normalised by the step's global label count: 2 x 2 micro-batches == one batch of 4. Compared after one AdamW
    step with the paper's slot decay, where 1e-6 holds: Muon (the tiny recipe's optimizer) orthogonalises in bf16,
    which turns the gradients' fp32 summation-order differences into 1e-5 weight differences, and D-PACE's
    confidence-dependent weights move one weight of 8,192 by 1.8e-6. Neither normalises across micro-batches."""
    common = ["trainer.max_steps=1", "trainer.eval_every=0", "data.num_eval=0", "trainer.warmup_ratio=0", "trainer.optimizer=adamw",
              "drafter.loss_weighting=exp"]
    train(compose_fast(common + ["trainer.batch_size=4", f"output_dir={tmp_path / 'big'}"]))
    train(compose_fast(common + ["trainer.batch_size=2", "trainer.grad_accum=2", f"output_dir={tmp_path / 'accum'}"]))
    a, b = exported(tmp_path / "big"), exported(tmp_path / "accum")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("override,message", [
    ("drafter.mask_token_id=5000", r"drafter.mask_token_id=5000 is outside the target's vocabulary \(0..1023\)"),
    ("drafter.target_layer_ids=[1,8]", r"drafter.target_layer_ids=\[1, 8\]: ids must lie in 0..6"),
    ("trainer.attention_backend=flex", r"trainer.attention_backend=flex needs a GPU \(trainer.device=cpu\); use sdpa"),
    ("trainer.resume=/nonexistent/step_1", r"trainer.resume='/nonexistent/step_1': no checkpoint there"),
    ("trainer.resume=Never", r"trainer.resume='Never': no checkpoint there \(expected Never\); expected auto, never or a checkpoint"),
])
def test_start_up_errors_need_the_target(tmp_path: Path, override: str, message: str, monkeypatch) -> None:
    """Each refused before the data is prepared (regeneration takes minutes to hours on a real recipe; these were refused
    after it)."""
    import train.trainer as trainer_module

    if torch.cuda.is_available() and "attention_backend" in override:
        pytest.skip("the CPU's refusal")

    def prepared(*args, **kwargs):
        raise AssertionError("the data was prepared before the check")

    monkeypatch.setattr(trainer_module, "prepare_data", prepared)
    with pytest.raises(ValueError, match=message):
        train(compose_fast([override, f"output_dir={tmp_path}"]))
    assert not (tmp_path / "run.json").exists()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_unreadable_checkpoint_is_a_one_line_error(tmp_path: Path, damage: str) -> None:
    """A cut or overwritten state.pt was torch's RuntimeError / UnpicklingError traceback at resume."""
    from train.checkpoint import load_checkpoint

    folder = tmp_path / "checkpoints" / "step_00000002"
    folder.mkdir(parents=True)
    torch.save({"model": {"w": torch.zeros(1000)}, "train_state": {"step": 2}}, folder / "state.pt")
    data = (folder / "state.pt").read_bytes()
    (folder / "state.pt").write_bytes({"truncate": data[: len(data) // 2], "garbage": b"garbage\n", "empty": b""}[damage])
    with pytest.raises(ValueError, match=r"trainer.resume: .*step_00000002/state.pt is not a readable checkpoint \(.+\); delete") as e:
        load_checkpoint(folder)
    assert "\n" not in str(e.value)


def test_step_folder_without_state_is_skipped_with_a_warning(tmp_path: Path, caplog) -> None:
    """Checkpoints are written whole, so a step folder without state.pt is not one: resume skips it, and says so."""
    from train.checkpoint import list_checkpoints

    for step in (1, 3):
        (tmp_path / "checkpoints" / f"step_{step:08d}").mkdir(parents=True)
        torch.save({"train_state": {"step": step}}, tmp_path / "checkpoints" / f"step_{step:08d}" / "state.pt")
    (tmp_path / "checkpoints" / "step_00000005").mkdir()
    with caplog.at_level("WARNING", logger="train.checkpoint"):
        found = list_checkpoints(tmp_path)
    assert [p.name for p in found] == ["step_00000001", "step_00000003"]
    assert "step_00000005 without state.pt, not a checkpoint: skipped" in caplog.text


@pytest.mark.slow
def test_compiled_whole_step_equals_eager(tmp_path: Path) -> None:
    """trainer.compile_scope=step's function (drafter, head and loss as one torch.compile graph; on the CPU with SDPA's
    dense masks, flex being GPU-only here) against the same function eager: loss and every gradient. The compiled
    regions stay set on the drafter, so this also checks that the enclosing compile traces through them."""
    from train.dflash import drafter_and_loss
    from train.trainer import build, to_train_config

    cfg = to_train_config(compose_train(["experiment=dflash_swa_tiny", "trainer.progress=false", "data.num_eval=0", "trainer.loop_eval_prompts=0",
                                         "trainer.precision=fp32", "trainer.attention_backend=sdpa", f"output_dir={tmp_path}"]))
    run = build(cfg)
    step = run.step
    step.drafter.compile_regions()  # what a GPU run holds; the enclosing compile must not call them as compiled pieces
    batch = step.ctx.to_device(step.ctx.collate([run.train_ds[i] for i in range(4)], run.target.pad_id))
    blocks = step.plan(batch, torch.Generator().manual_seed(0))

    def loss_and_grads(fn):
        step.drafter.zero_grad()
        embeds, features, masks = step.drafter_inputs(batch, blocks, step.ctx.backend)
        stats = fn(step.drafter, embeds, features, blocks.positions, masks, step.head, step.head_labels(blocks.labels), blocks.anchor_valid,
                   step.block_size, step.gamma, step.dpace_alpha)
        (stats.loss_sum / stats.num_labels).backward()
        return stats.loss_sum.detach(), {n: p.grad.clone() for n, p in step.drafter.named_parameters() if p.grad is not None}

    eager_loss, eager_grads = loss_and_grads(drafter_and_loss)
    compiled_loss, compiled_grads = loss_and_grads(torch.compile(drafter_and_loss, dynamic=False))
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=1e-4)
    assert eager_grads.keys() == compiled_grads.keys() and eager_grads
    for name, grad in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("override,message", [
    ("trainer.compile_scope=graph", "trainer.compile_scope='graph'; expected regions or step"),
    ("drafter.sliding_window=0", "drafter.sliding_window=0"),
    ("drafter.block_size=1", "drafter.block_size=1"),
    ("drafter.layer_types=[sliding_attention]", "drafter.layer_types has 1 entries"),
])
def test_start_up_errors_from_the_config(tmp_path: Path, override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        train(compose_fast([override, f"output_dir={tmp_path}"]))


def test_a_run_folder_resumed_with_another_drafter_is_one_line(tmp_path: Path) -> None:
    """The same output_dir, a deeper drafter (or the other kind): load_state_dict's traceback listed every tensor. Now one
    line naming the checkpoint and the first difference, and the folder's record, export and checkpoints left as they were."""
    common = ["trainer.max_steps=1", "trainer.eval_every=0", "data.num_eval=0", "trainer.checkpoint_every=1", f"output_dir={tmp_path}"]
    train(compose_fast(common))
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and ".hydra" not in p.parts}
    deeper = ["drafter.num_hidden_layers=3", "drafter.layer_types=[sliding_attention,sliding_attention,sliding_attention]"]
    with pytest.raises(ValueError) as err:
        train(compose_fast(common + deeper + ["trainer.max_steps=2"]))
    message = str(err.value)
    assert message.startswith(f"trainer.resume: {tmp_path / 'checkpoints' / 'step_00000001'} holds another drafter than this "
                              "config builds (") and "drafter setting(s) differ: " in message and "\n" not in message
    assert "layer_types ['sliding_attention', 'sliding_attention'] there, ['sliding_attention', 'sliding_attention', 'sliding_attention'] here" in message
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and ".hydra" not in p.parts} == before
    # settings that keep every tensor's shape resumed silently, and the export labelled the weights with the new ones
    for changed, named in ((["drafter.sliding_window=8"], "sliding_window 64 there, 8 here"),
                           (["drafter.block_size=6"], "block_size 8 there, 6 here")):
        with pytest.raises(ValueError, match="holds another drafter than this config builds") as err:
            train(compose_fast(common + changed + ["trainer.max_steps=2"]))
        assert named in str(err.value) and "\n" not in str(err.value)
    # another optimizer: a KeyError ('param_groups') from the optimizer's load_state_dict; named as a setting, before the
    # target loads (a checkpoint without recorded settings: by its optimizer state's keys, Checkpointer.check_compatible)
    other = "trainer.optimizer=adamw" if compose_fast(common).trainer.optimizer == "muon" else "trainer.optimizer=muon"
    with pytest.raises(ValueError, match=r"was trained with other settings \(trainer.optimizer '\w+' there, '\w+' here\)"):
        train(compose_fast(common + [other, "trainer.max_steps=2"]))
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and ".hydra" not in p.parts} == before
    unrecorded = tmp_path.parent / "unrecorded" / "step_00000001"  # saved before the settings were recorded
    unrecorded.mkdir(parents=True)
    state = torch.load(tmp_path / "checkpoints" / "step_00000001" / "state.pt", weights_only=True)
    torch.save({k: v for k, v in state.items() if k != "settings"}, unrecorded / "state.pt")
    with pytest.raises(ValueError, match=r"holds another optimizer's state \(keys .*trainer.optimizer differs\)"):
        train(compose_fast(common[:-1] + [other, "trainer.max_steps=2", f"trainer.resume={unrecorded}",
                                          f"output_dir={tmp_path.parent / 'elsewhere'}"]))


def test_config_mismatch_names_what_differs() -> None:
    from train.checkpoint import config_mismatch

    saved = {"sliding_window": 64, "block_size": 8, "transformers_version": "5.0"}
    assert config_mismatch(saved, {"sliding_window": 64, "block_size": 8, "transformers_version": "5.1"}) is None
    assert config_mismatch(None, {"sliding_window": 8}) is None  # a checkpoint from before configs were saved
    assert config_mismatch(saved, {"sliding_window": 8, "block_size": 8}) == "1 drafter setting(s) differ: sliding_window 64 there, 8 here"


def test_state_mismatch_names_the_first_difference() -> None:
    from train.checkpoint import state_mismatch

    saved = {"a": torch.zeros(2, 3), "b": torch.zeros(4)}
    assert state_mismatch(saved, {"a": torch.ones(2, 3), "b": torch.ones(4)}) is None  # values may differ, shapes not
    assert state_mismatch(saved, {"a": torch.zeros(2, 4), "b": torch.zeros(4)}) == "1 tensors differ, first a [2, 3] there, [2, 4] here"
    assert state_mismatch(saved, {"a": torch.zeros(2, 3), "b": torch.zeros(4), "c": torch.zeros(1)}) == "1 tensors differ, first c not there"
    assert state_mismatch(saved, {"a": torch.zeros(2, 3)}) == "1 tensors differ, first b not here"


def test_a_step_in_fp32_loads_the_target_in_fp32_and_refuses_a_lower_one(tmp_path: Path) -> None:
    """trainer.precision runs the step in fp32 (``fp32``, or ``auto`` on the CPU) with no autocast, where DFlash's drafts
    go through the target's LM head and EAGLE-3's fc reads its features as they are: ``target.dtype=auto`` resolves
    to float32 there (a GPU's auto is bfloat16, which failed at the first step), and an explicit bfloat16 is refused
    at start-up in one line naming both settings."""
    from train.trainer import build, target_dtype, to_train_config

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert target_dtype("fp32", "auto", cuda) == "float32" and target_dtype("auto", "auto", cpu) == "float32"
    assert target_dtype("auto", "auto", cuda) == "auto" and target_dtype("bf16", "bfloat16", cpu) == "bfloat16"
    assert target_dtype("fp32", "float32", cuda) == "float32"
    for precision, device in (("fp32", cuda), ("auto", cpu)):
        with pytest.raises(ValueError, match=f"trainer.precision={precision} runs the step in fp32 on {device.type}, target.dtype=bfloat16"):
            target_dtype(precision, "bfloat16", device)
    cfg = to_train_config(compose_train(["experiment=dflash_swa_tiny", "trainer.progress=false", "trainer.precision=fp32",
                                         "target.dtype=bfloat16", f"output_dir={tmp_path}"]))
    with pytest.raises(ValueError, match="use target.dtype=float32"):
        build(cfg)


@pytest.mark.slow  # two short runs (~20 s)
def test_the_logged_rate_and_epoch_are_those_the_steps_trained_with(tmp_path: Path) -> None:
    """``train/lr`` at step n is the rate step n's update used (it logged the next step's: the schedule had advanced),
    checked against the optimizer's own rate read inside each step; ``trainer.num_epochs`` reads that many epochs of
    micro-batches (rounded up per epoch, 3 epochs of 36 rows at batch 4 x 8 read 5.33) and ``train/epoch`` says so."""
    import train.trainer as trainer_module

    used = []
    real_step = trainer_module.train_step

    def recording_step(step, micro, n, optimizer, *args, **kwargs):
        used.append(optimizer.param_groups[0]["lr"])
        return real_step(step, micro, n, optimizer, *args, **kwargs)

    trainer_module.train_step = recording_step
    try:
        metrics = train(compose_fast(["trainer.max_steps=5", "trainer.log_every=1", "trainer.warmup_ratio=0.4",
                                      "trainer.eval_every=0", "data.num_eval=0", "data.max_records=36", "trainer.batch_size=4",
                                      "trainer.grad_accum=2", f"output_dir={tmp_path / 'lr'}"]))
    finally:
        trainer_module.train_step = real_step
    logged = [json.loads(line)["train/lr"] for line in (tmp_path / "lr" / "metrics.jsonl").read_text().splitlines()
              if "train/lr" in line]
    assert len(logged) == 5 and logged == pytest.approx(used, rel=1e-9), (logged, used)
    assert used[0] < used[1]  # warming up: the first step trains at half the peak, not the peak
    assert metrics["steps"] == 5
    rows = json.loads((tmp_path / "lr" / "run.json").read_text())["data"]["train_conversations"]
    epochs = train(compose_fast(["trainer.max_steps=null", "trainer.num_epochs=3", "trainer.log_every=1", "trainer.eval_every=0",
                                 "data.num_eval=0", "data.max_records=36", "trainer.batch_size=2", "trainer.grad_accum=8",
                                 f"output_dir={tmp_path / 'epochs'}"]))
    batches_per_epoch = max(1, rows // 2)  # EpochBatches: whole batches only
    assert batches_per_epoch % 8, "a case where an epoch is not a whole number of steps"
    assert epochs["steps"] == -(-3 * batches_per_epoch // 8)  # ceil(3 epochs of micro-batches / 8 a step)
    assert epochs["train/epoch"] == pytest.approx(epochs["steps"] * 8 / batches_per_epoch)
    assert 3 <= epochs["train/epoch"] < 3 + 8 / batches_per_epoch


@pytest.mark.slow  # three short runs (~15 s)
def test_a_resumed_or_rerun_finished_run_keeps_its_record(tmp_path: Path) -> None:
    """``run.json`` of a resumed run holds the steps logged before the interrupt too (it held only those after), and the
    same command again on a finished run trains nothing and leaves the record, its eval metrics and history, as it was
    (it was rewritten with an empty history and no eval metrics)."""
    common = ["trainer.max_steps=4", "trainer.log_every=1", "trainer.eval_every=0", "trainer.checkpoint_every=1",
              f"output_dir={tmp_path}"]
    train(compose_fast(common + ["trainer.interrupt_after=2"]))
    final = train(compose_fast(common))
    record = json.loads((tmp_path / "run.json").read_text())
    assert [h["step"] for h in record["history"] if "train/loss" in h] == [1, 2, 3, 4]
    assert "eval/loss" in record["metrics"] and final["eval/loss"] == record["metrics"]["eval/loss"]
    before = (tmp_path / "run.json").read_bytes()
    again = train(compose_fast(common))
    assert (tmp_path / "run.json").read_bytes() == before
    assert again == record["metrics"]


def test_a_save_cut_short_leaves_nothing_behind_the_next_save(tmp_path: Path) -> None:
    """A kill inside a save leaves its hidden temporary folder (``.step_*``); never resumed from, it was never deleted
    either (a drafter's optimizer state each). The next save removes it; the complete checkpoints are pruned as before."""
    from train.checkpoint import list_checkpoints, save_checkpoint

    root = tmp_path / "checkpoints"
    (root / ".step_00000003.k2j4").mkdir(parents=True)
    (root / ".step_00000003.k2j4" / "state.pt").write_bytes(b"half")
    for step in (1, 2, 4):
        save_checkpoint(tmp_path, step, {"train_state": {"step": step}}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000002", "step_00000004"]
    assert sorted(p.name for p in root.iterdir()) == ["step_00000002", "step_00000004"]


def test_resuming_an_older_checkpoint_inside_its_own_run_folder_is_refused(tmp_path: Path) -> None:
    """A rollback (``trainer.resume=.../step_2`` while the folder holds step_3 and step_4): the run pruned its own source
    and ``resume=auto`` then picked the abandoned run's newest checkpoint. Refused in one line; resumed into another
    output_dir, it runs."""
    common = ["trainer.max_steps=4", "trainer.eval_every=0", "data.num_eval=0", "trainer.checkpoint_every=1",
              "trainer.keep_checkpoints=3"]
    train(compose_fast(common + [f"output_dir={tmp_path / 'run'}"]))
    source = tmp_path / "run" / "checkpoints" / "step_00000002"
    with pytest.raises(ValueError, match=r"holds checkpoints newer than it \(step_00000003, step_00000004\)") as err:
        train(compose_fast(common + [f"output_dir={tmp_path / 'run'}", f"trainer.resume={source}"]))
    assert "\n" not in str(err.value) and source.is_dir()
    with pytest.raises(ValueError, match=r"holds checkpoints newer than it"):  # its state.pt named: was resumed from, unrefused
        train(compose_fast(common + [f"output_dir={tmp_path / 'run'}", f"trainer.resume={source / 'state.pt'}"]))
    branched = train(compose_fast(common + [f"output_dir={tmp_path / 'branch'}", f"trainer.resume={source}"]))
    assert branched["steps"] == 4 and source.is_dir()


SHORT_DATA = ["data.max_records=60", "data.max_length=256"]  # steps of a second, not several, on a busy 2-core machine


def test_a_resume_off_the_log_grid_logs_what_the_uninterrupted_run_logs(tmp_path: Path) -> None:
    """A checkpoint between two logged steps (log_every=2, resumed from step 1): the record at step 2 averaged only step 2
    after the resume (the log window's step 1 was lost with the process), not steps 1 and 2 as the uninterrupted run's."""
    common = ["trainer.max_steps=2", "trainer.log_every=2", "trainer.batch_size=2", "trainer.eval_every=0", "data.num_eval=0",
              "trainer.checkpoint_every=1", "trainer.export=false", *SHORT_DATA]
    train(compose_fast(common + [f"output_dir={tmp_path / 'straight'}"]))
    source = tmp_path / "straight" / "checkpoints" / "step_00000001"  # what a run stopped after step 1 leaves
    train(compose_fast(common + [f"trainer.resume={source}", f"output_dir={tmp_path / 'resumed'}"]))
    straight, resumed = (json.loads((tmp_path / run / "metrics.jsonl").read_text()) for run in ("straight", "resumed"))
    assert straight["step"] == resumed["step"] == 2
    del straight["train/tokens_per_s"], resumed["train/tokens_per_s"]  # wall time
    assert resumed == straight


def test_a_resume_with_other_trainer_settings_is_one_line(tmp_path: Path) -> None:
    """The checkpoint's optimizer state restores its learning rate and weight decay over this run's (trainer.lr changed
    at a resume trained on at the old rate, silently), and its data position counts micro-batches of its batch size in
    its seed's order (another one skipped or repeated rows). Refused in one line, naming the setting; the same settings
    resume."""
    common = ["trainer.max_steps=2", "trainer.eval_every=0", "data.num_eval=0", "trainer.checkpoint_every=1", "trainer.interrupt_after=1",
              "trainer.warmup_ratio=0", "trainer.export=false", *SHORT_DATA, f"output_dir={tmp_path}"]
    train(compose_fast(common + ["trainer.lr=1e-3"]))
    for changed, named in (("trainer.lr=1e-2", "trainer.lr 0.001 there, 0.01 here"), ("trainer.seed=7", "trainer.seed 0 there, 7 here"),
                           ("trainer.batch_size=2", "trainer.batch_size 4 there, 2 here"),
                           ("data.max_records=40", "data.max_records 60 there, 40 here")):
        with pytest.raises(ValueError, match="was trained with other settings") as err:
            train(compose_fast(common + ["trainer.lr=1e-3", "trainer.interrupt_after=null", changed]))
        assert named in str(err.value) and "\n" not in str(err.value), str(err.value)
    resumed = train(compose_fast(common + ["trainer.lr=1e-3", "trainer.interrupt_after=null"]))
    assert resumed["steps"] == 2 and resumed["train/lr"] == pytest.approx(0.5e-3 * (1 + math.cos(math.pi / 2)))


def test_a_run_killed_after_a_graceful_stop_keeps_every_step_in_its_record(tmp_path: Path) -> None:
    """Stopped gracefully after step 1 (run.json written), resumed, killed after its step-3 checkpoint (no run.json of its
    own), resumed again: run.json's history came from the step-1 record, [1, 4]; steps 2 and 3 were in metrics.jsonl only."""
    common = ["trainer.max_steps=4", "trainer.log_every=1", "trainer.eval_every=0", "data.num_eval=0", "trainer.checkpoint_every=1",
              "trainer.export=false", *SHORT_DATA, f"output_dir={tmp_path}"]
    train(compose_fast(common + ["trainer.interrupt_after=1"]))
    first_record = (tmp_path / "run.json").read_bytes()
    train(compose_fast(common + ["trainer.interrupt_after=3"]))
    (tmp_path / "run.json").write_bytes(first_record)  # what a kill after the step-3 checkpoint leaves
    train(compose_fast(common))
    history = json.loads((tmp_path / "run.json").read_text())["history"]
    assert [h["step"] for h in history] == [1, 2, 3, 4]
    assert history == [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
