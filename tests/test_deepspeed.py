"""DeepSpeed ZeRO training on CPU processes (gloo): the reference is the plain one-process trainer.

A 2-process run with micro-batch B and no accumulation must follow a 1-process run with micro-batch
B and 2 accumulation steps (the same global batch: every rank plans the whole step and runs its
share); resume under DeepSpeed must repeat an uninterrupted DeepSpeed run bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from compose import compose_train
from safetensors.torch import load_file

from train.deepspeed_engine import deepspeed_config
from train.distributed import free_port
from train.trainer import train

REPO = Path(__file__).resolve().parents[1]
COMMON = ["trainer.max_steps=6", "trainer.batch_size=2", "trainer.eval_every=0", "data.num_eval=0", "trainer.checkpoint_every=2",
          "trainer.progress=false", "trainer.log_every=1", "data.max_records=60", "data.max_length=256",
          "data.regenerate.enabled=false",  # the launched CLI runs too (the tiny experiments regenerate by default)
          "trainer.optimizer=adamw"]  # DeepSpeed brings AdamW; the plain trainer's must be the same to compare

pytestmark = pytest.mark.slow  # minutes of decoding or multi-process runs: the full suite only


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "export" / "model.safetensors")


def history(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def assert_close_runs(a: Path, b: Path, atol: float) -> None:
    ha, hb = history(a), history(b)
    assert [h["step"] for h in ha] == [h["step"] for h in hb]  # one record per step: only rank 0 logs
    for x, y in zip(ha, hb):
        assert x["train/loss"] == pytest.approx(y["train/loss"], rel=1e-6), x["step"]
        assert x["train/tokens"] == y["train/tokens"]
        assert x["train/grad_norm"] == pytest.approx(y["train/grad_norm"], rel=1e-5)
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.allclose(wa[name].float(), wb[name].float(), atol=atol, rtol=0), name


def launch(args: list[str], tmp_path: Path, launcher: str = "torchrun", processes: int = 2, script: Path | None = None,
           env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """``torchrun -m train ...`` (or ``torchrun script ...``) or ``deepspeed --module train ...`` (which appends
    --local_rank=N)."""
    if launcher == "torchrun":
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}", f"--master_port={free_port()}"]
    else:
        command = [str(Path(sys.executable).parent / "deepspeed"), f"--num_gpus={processes}", f"--master_port={free_port()}"]
    command += [str(script)] if script is not None else ["-m" if launcher == "torchrun" else "--module", "train"]
    command += args
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})}
    result = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tmp_path, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory, tiny_qwen3_path: str) -> Path:
    """The reference: one process, no DeepSpeed, 2 x 2 accumulation."""
    out = tmp_path_factory.mktemp("plain")
    train(compose_train(["experiment=dflash_swa_tiny", *COMMON, "trainer.grad_accum=2", f"output_dir={out}"]))
    return out


# The two-process ZeRO-2 run (torchrun, W&B offline): the run the two-process comparison checks and the uninterrupted
# run the resume must repeat, launched once for both (a two-process launch took 25-30 s on the 2-core machine)
ZERO2_TWO_PROCESSES = ["experiment=dflash_swa_tiny", *COMMON, "trainer.grad_accum=1", "trainer.deepspeed=zero2"]


@pytest.fixture(scope="module")
def zero2_run(tmp_path_factory: pytest.TempPathFactory, tiny_qwen3_path: str) -> Path:
    root = tmp_path_factory.mktemp("zero2")
    launch(ZERO2_TWO_PROCESSES + ["logger=wandb", f"output_dir={root / 'run'}"], root)  # W&B offline (conftest)
    return root / "run"


def test_config_fills_the_trainers_batch_and_refuses_conflicts(tmp_path: Path) -> None:
    config = deepspeed_config("zero2", batch_size=2, grad_accum=4, grad_clip=1.0, world_size=2)
    assert config["train_micro_batch_size_per_gpu"] == 2 and config["gradient_accumulation_steps"] == 4
    assert config["train_batch_size"] == 16 and config["gradient_clipping"] == 1.0
    assert config["zero_optimization"]["stage"] == 2
    assert deepspeed_config("zero3", 1, 1, 0.0, 1)["zero_optimization"]["stage"] == 3
    bad = tmp_path / "ds.json"
    bad.write_text(json.dumps({"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 2}}))
    with pytest.raises(ValueError, match=r"ds.json: field 'train_micro_batch_size_per_gpu' is 8, but the trainer runs 2"):
        deepspeed_config(str(bad), 2, 1, 1.0, 1)
    bad.write_text(json.dumps({"optimizer": {"type": "Adam"}}))
    with pytest.raises(ValueError, match=r"field 'optimizer' is set"):
        deepspeed_config(str(bad), 2, 1, 1.0, 1)
    with pytest.raises(ValueError, match=r"trainer.deepspeed='zero9': no such DeepSpeed config \(shipped: zero2, zero3"):
        deepspeed_config("zero9", 2, 1, 1.0, 1)
    with pytest.raises(ValueError, match=r"trainer.optimizer=muon runs without DeepSpeed"):  # at start-up, before any data
        train(compose_train(["experiment=dflash_swa_tiny", *COMMON, "trainer.optimizer=muon", "trainer.deepspeed=zero2",
                             f"output_dir={tmp_path / 'muon'}"]))


def test_one_process_under_deepspeed_equals_the_plain_trainer(tmp_path: Path, plain_run: Path, monkeypatch) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):  # a plain process, as no launcher started it
        monkeypatch.delenv(name, raising=False)
    train(compose_train(["experiment=dflash_swa_tiny", *COMMON, "trainer.grad_accum=2", "trainer.deepspeed=zero2", f"output_dir={tmp_path}"]))
    assert_close_runs(plain_run, tmp_path, atol=1e-6)
    # the launcher's variables DeepSpeed needed are gone again: left set, they told later code in this process (vLLM
    # speculators' trainer) that torchrun had launched it
    assert not {"RANK", "LOCAL_RANK", "WORLD_SIZE"} & set(os.environ)
    # Its checkpoints are DeepSpeed's: the plain trainer refuses them by name.
    with pytest.raises(ValueError, match="was written under DeepSpeed"):
        train(compose_train(["experiment=dflash_swa_tiny", *COMMON, "trainer.grad_accum=2", "trainer.max_steps=8", f"output_dir={tmp_path}"]))


@pytest.mark.parametrize("stage,launcher", [("zero2", "torchrun"), ("zero3", "deepspeed")])
def test_two_processes_follow_one_at_the_same_global_batch(tmp_path: Path, plain_run: Path, stage: str, launcher: str, request) -> None:
    if stage == "zero2":
        run = request.getfixturevalue("zero2_run")
    else:
        run = tmp_path / "run"
        launch(["experiment=dflash_swa_tiny", *COMMON, "trainer.grad_accum=1", f"trainer.deepspeed={stage}", f"output_dir={run}"], tmp_path, launcher)
    # Gradients are summed in another order (measured up to 1.2e-6 apart after 6 AdamW steps under ZeRO-3,
    # where the weights moved by up to 6e-3).
    assert_close_runs(plain_run, run, atol=1e-5)
    files = {p.name for p in (run / "checkpoints" / "step_00000006").iterdir()}
    assert {"state.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"} <= files


def test_resume_under_deepspeed_repeats_the_uninterrupted_run(tmp_path: Path, zero2_run: Path) -> None:
    args = ZERO2_TWO_PROCESSES
    assert len(list((zero2_run / "wandb").glob("offline-run-*"))) == 1  # rank 0 only
    launch(args + ["trainer.interrupt_after=3", f"output_dir={tmp_path / 'resumed'}"], tmp_path)
    assert not (tmp_path / "resumed" / "export").exists()
    assert sorted(p.name for p in (tmp_path / "resumed" / "checkpoints").glob("step_*")) == ["step_00000002", "step_00000003"]
    launch(args + [f"output_dir={tmp_path / 'resumed'}"], tmp_path)
    a, b = weights(zero2_run), weights(tmp_path / "resumed")
    for name in a:
        assert torch.equal(a[name], b[name]), name
    straight = {h["step"]: h["train/loss"] for h in history(zero2_run)}
    resumed = {h["step"]: h["train/loss"] for h in history(tmp_path / "resumed")}
    assert resumed == straight  # steps 1-3 from the first launch, 4-6 after the resume
    # Optimizer shards of 2 ranks cannot resume on 1: refused by name, before any step.
    with pytest.raises(ValueError, match="holds optimizer shards of 2 ranks; this run has 1"):
        train(compose_train(args + ["trainer.max_steps=8", f"output_dir={tmp_path / 'resumed'}"]))


def test_each_process_makes_its_gpu_the_current_device(monkeypatch) -> None:
    """Triton kernels and FlashAttention-4 launch on the current CUDA device, not their tensors': a rank's GPU
    (cuda:LOCAL_RANK) and one process's explicit cuda:N become current; a bare cuda and the CPU leave it alone.
    (torch.cuda.set_device recorded: no GPU here.)"""
    from train.distributed import Ranks, local_device

    made = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: made.append(str(torch.device("cuda", d) if isinstance(d, int) else d)))
    assert local_device(torch.device("cuda", 1), Ranks(0, 1, 0)) == torch.device("cuda", 1) and made == ["cuda:1"]
    assert local_device(torch.device("cuda"), Ranks(1, 2, 1)) == torch.device("cuda", 1) and made[-1] == "cuda:1"
    made.clear()
    assert local_device(torch.device("cuda"), Ranks(0, 1, 0)) == torch.device("cuda") and made == []
    assert local_device(torch.device("cpu"), Ranks(0, 1, 0)) == torch.device("cpu") and made == []


def test_ranks_wait_for_rank_zeros_data_longer_than_nccls_default(monkeypatch) -> None:
    """A launched run's group waits up to ``PREPARE_TIMEOUT`` in a collective: the other ranks sit in a barrier while rank
    0 regenerates and tokenizes the data (``rank0_first``), minutes to hours, where NCCL's default of 10 minutes
    aborted the job. (``init_process_group`` recorded: no launcher here.)"""
    import datetime

    import torch.distributed as dist

    from train.distributed import PREPARE_TIMEOUT, Ranks, init_process_group

    calls = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.append((backend, kw)))
    init_process_group(torch.device("cpu"), Ranks(1, 2, 1))
    assert calls == [("gloo", {"timeout": PREPARE_TIMEOUT})] and PREPARE_TIMEOUT >= datetime.timedelta(hours=1)


def test_a_resume_under_another_zero_stage_is_one_line(tmp_path: Path, monkeypatch) -> None:
    """A ZeRO-2 checkpoint resumed with trainer.deepspeed=zero3: DeepSpeed's loader found none of its stage's files and
    answered with a bare AssertionError traceback. Refused in one line naming both stages; the same stage resumes."""
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):  # a plain process, as no launcher started it
        monkeypatch.delenv(name, raising=False)
    args = ["experiment=dflash_swa_tiny", *COMMON, "trainer.max_steps=2", "trainer.checkpoint_every=1", "trainer.export=false",
            f"output_dir={tmp_path}"]
    train(compose_train(args + ["trainer.deepspeed=zero2", "trainer.interrupt_after=1"]))
    import models.target

    loaded = models.target.TargetModel.from_pretrained
    with monkeypatch.context() as patch:  # refused before the target loads and the data is prepared (was after both)
        patch.setattr(models.target.TargetModel, "from_pretrained", lambda *a, **k: pytest.fail("the target loaded first"))
        with pytest.raises(ValueError, match=r"step_00000001 was written under ZeRO stage 2; this run's trainer.deepspeed runs stage 3") as err:
            train(compose_train(args + ["trainer.deepspeed=zero3"]))
        assert "\n" not in str(err.value)
        state_path = tmp_path / "checkpoints" / "step_00000001" / "state.pt"
        state = torch.load(state_path, weights_only=True)
        torch.save({**state, "world_size": 2}, state_path)  # as two ranks write it
        with pytest.raises(ValueError, match=r"step_00000001 holds optimizer shards of 2 ranks; this run has 1"):
            train(compose_train(args + ["trainer.deepspeed=zero2"]))
        torch.save(state, state_path)
    assert models.target.TargetModel.from_pretrained == loaded
    assert train(compose_train(args + ["trainer.deepspeed=zero2"]))["steps"] == 2


@pytest.mark.parametrize("text,message", [
    ("[1]", r"ds.json holds a JSON list; expected an object of DeepSpeed's fields"),
    ('{"zero_optimization": 2}', r"ds.json: field 'zero_optimization' is 2; expected an object"),
])
def test_a_config_of_the_wrong_json_shape_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    """Valid JSON of the wrong shape was an AttributeError traceback ('list' object has no attribute 'get')."""
    (tmp_path / "ds.json").write_text(text)
    with pytest.raises(ValueError, match=message) as err:
        deepspeed_config(str(tmp_path / "ds.json"), 2, 1, 1.0, 1)
    assert "\n" not in str(err.value)


def test_ranks_whose_clocks_started_apart_stop_at_the_same_step(tmp_path: Path, tiny_qwen3_path: str) -> None:
    """trainer.time_limit_minutes read each rank's own clock, started when that rank reached the loop (rank 0 alone sets
    up W&B and runs the loop evaluation first): the rank out of time waited at the checkpoint's barrier while the other
    stepped on, a deadlock until the collective timeout (6 h), no checkpoint written. Here rank 1 starts 8 s late: both
    stop at the same step, its checkpoint written and the run marked interrupted."""
    run = tmp_path / "run"
    launch(["experiment=dflash_swa_tiny", *COMMON, "trainer.max_steps=500", "trainer.checkpoint_every=0", "trainer.grad_accum=1",
            "trainer.deepspeed=zero2", "trainer.time_limit_minutes=0.05", f"output_dir={run}"], tmp_path,
           script=REPO / "tests" / "skewed_train.py", env={"SKEW": "8"}, timeout=240)
    record = json.loads((run / "run.json").read_text())["metrics"]
    steps = [p.name for p in (run / "checkpoints").glob("step_*")]  # beside DeepSpeed's zero_to_*.py
    assert record["interrupted"] and steps == [f"step_{record['steps']:08d}"] and record["steps"] < 500, (record, steps)


def test_zero3_on_two_processes_runs_the_loop_evaluation(tmp_path: Path, tiny_qwen3_path: str, plain_run: Path) -> None:
    """Under ZeRO-3 the loop evaluation ran on rank 0 alone through the drafter's ZeRO hooks, whose every forward joins a
    collective: the run hung at its first eval (the default trainer.loop_eval_prompts=8). It runs on a plain copy of the
    gathered weights now; and the drafter's parameter count (ZeRO-3 splits the parameters across the ranks) read 0."""
    run = tmp_path / "run"
    launch(["experiment=dflash_swa_tiny", *COMMON, "trainer.max_steps=2", "trainer.grad_accum=1", "trainer.deepspeed=zero3",
            "data.num_eval=4", "trainer.eval_every=2", "trainer.loop_eval_prompts=2", "trainer.loop_eval_max_new_tokens=16",
            f"output_dir={run}"], tmp_path, timeout=240)
    metrics = json.loads((run / "run.json").read_text())["metrics"]
    assert metrics.get("eval/loop_tau", 0) >= 1 and metrics["eval/loop_same_as_greedy"] == 1.0, metrics
    assert metrics["drafter_params"] == json.loads((plain_run / "run.json").read_text())["metrics"]["drafter_params"] > 0
