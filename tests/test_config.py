"""Configs: every experiment composes and validates; bad keys and values fail at start-up."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from compose import compose_train
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from train.config import TrainConfig
from train.trainer import to_train_config

import configs

CONFIG_DIR = Path(configs.__file__).parent
EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))
GROUPS = {g: sorted(p.stem for p in (CONFIG_DIR / g).glob("*.yaml")) for g in ("target", "drafter", "data", "trainer", "logger")}


def test_required_experiments_exist() -> None:
    assert {"dflash_swa", "eagle3_swa", "dflash_swa_tiny", "eagle3_swa_tiny"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_validates(experiment: str) -> None:
    cfg = to_train_config(compose_train([f"experiment={experiment}", "output_dir=/tmp/x"]))
    assert isinstance(cfg, TrainConfig)
    assert cfg.drafter.kind == ("dflash" if experiment.startswith("dflash") else "eagle3")
    assert cfg.drafter.sliding_window is not None
    assert "sliding_attention" in cfg.drafter.resolved_layer_types()


def test_the_long_prompt_recipe_is_the_small_one_on_packed_rows() -> None:
    """experiment=dflash_swa_small_long changes only the row layout: one packed 32K row a step with 16 x 256 anchors, the
    blocks a step of dflash_swa_small's 16 rows, half the rows read by the target one conversation at a time; drafter,
    data source, optimizer and steps stay the small recipe's."""
    from dataclasses import asdict
    small = asdict(to_train_config(compose_train(["experiment=dflash_swa_small", "output_dir=/tmp/x"])))
    long = asdict(to_train_config(compose_train(["experiment=dflash_swa_small_long", "output_dir=/tmp/x"])))
    changed = {(section, key) for section in small if isinstance(small[section], dict)
               for key in small[section] if small[section][key] != long[section][key]}
    assert changed == {("data", "pack_length"), ("data", "pack_fresh_fraction"), ("trainer", "batch_size"), ("drafter", "num_anchors"),
                       ("trainer", "pad_multiple")}
    assert long["drafter"]["num_anchors"] * long["trainer"]["batch_size"] == small["drafter"]["num_anchors"] * small["trainer"]["batch_size"]
    assert (long["data"]["pack_length"], long["data"]["pack_fresh_fraction"]) == (32768, 0.5)


@pytest.mark.parametrize("group,option", [(g, o) for g, options in GROUPS.items() for o in options])
def test_every_group_option_composes(group: str, option: str) -> None:
    cfg = to_train_config(compose_train([f"{group}={option}", "output_dir=/tmp/x"]))
    assert isinstance(cfg, TrainConfig)


def test_public_override_names() -> None:
    cfg = compose_train(["target.path=/m", "data.path=/d.jsonl", "data.max_length=77", "trainer.max_steps=3", "output_dir=/o"])
    cfg = to_train_config(cfg)
    assert (cfg.target.path, cfg.data.path, cfg.data.max_length, cfg.trainer.max_steps, cfg.output_dir) == ("/m", "/d.jsonl", 77, 3, "/o")


def test_unknown_key_and_bad_values_fail_at_composition() -> None:
    with pytest.raises(ConfigCompositionException) as err:
        compose_train(["trainer.max_stesp=5"])
    assert "max_stesp" in str(err.value.__cause__) or "max_stesp" in str(err.value)
    with pytest.raises((ConfigCompositionException, ValidationError), match="max_steps"):
        compose_train(["trainer.max_steps=abc"])
    with pytest.raises((ConfigCompositionException, ValidationError), match="overflow"):
        compose_train(["data.overflow=cut"])


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["drafter.num_hidden_layers=2", "drafter.layer_types=[full_attention]"], "drafter.layer_types has 1 entries"),
        (["drafter.layer_types=[sliding_attention]", "drafter.num_hidden_layers=1", "drafter.sliding_window=null"], "sliding_window is null"),
        (["drafter.layer_types=[windowed]", "drafter.num_hidden_layers=1"], "'windowed' is not one of"),
        (["drafter.sliding_window=0"], "drafter.sliding_window=0"),
        (["drafter.target_layer_ids=[1,1]"], "has repeats"),
        (["drafter.num_target_features=0"], "drafter.num_target_features=0; expected >= 1 or null"),  # was read as null
        (["data.max_length=1"], "data.max_length=1"),
        (["data.max_length=64", "data.pack_length=32"], "data.pack_length=32; expected >= data.max_length"),
        (["data.pack_length=4096", "features.path=/tmp/store"], "data.pack_length=4096 with features.path=/tmp/store"),
        (["data.pack_fresh_fraction=0.5"], "data.pack_fresh_fraction=0.5 without data.pack_length"),
        (["data.pack_length=4096", "data.pack_fresh_fraction=1.5"], "data.pack_fresh_fraction=1.5; expected a share in"),
        (["experiment=eagle3_swa_tiny", "data.pack_documents=true"], "data.pack_documents=true without data.pack_length"),
        (["experiment=eagle3_swa_tiny", "data.pack_documents=true", "data.pack_length=4096", "data.pack_fresh_fraction=0.5"],
         "data.pack_fresh_fraction=0.5 with data.pack_documents=true"),
        (["experiment=eagle3_swa_tiny", "data.pack_documents=true", "data.pack_length=4096", "trainer.attention_backend=fa4"],
         "trainer.attention_backend=fa4 with data.pack_documents=true"),
        (["trainer.max_steps=0"], "trainer.max_steps=0"),
        (["trainer.log_every=0"], "trainer.log_every=0; expected >= 1"),  # was a ZeroDivisionError traceback at step 1
        (["trainer.eval_every=-5"], "trainer.eval_every=-5; expected >= 0"),
        (["trainer.checkpoint_every=-1"], "trainer.checkpoint_every=-1; expected >= 0"),
        (["trainer.keep_checkpoints=-1"], "trainer.keep_checkpoints=-1; expected >= 0"),
        (["trainer.time_limit_minutes=-1"], "trainer.time_limit_minutes=-1.0; expected > 0 or null"),
        (["trainer.eval_batches=0"], "trainer.eval_batches=0; expected >= 1 or null"),  # was KeyError: 'eval/loss'
        (["trainer.min_lr_ratio=2"], "trainer.min_lr_ratio=2.0; expected in [0, 1]"),
        (["trainer.grad_clip=-1"], "trainer.grad_clip=-1.0; expected >= 0"),
        (["trainer.weight_decay=-0.1"], "trainer.weight_decay=-0.1; expected >= 0"),
        (["logger.mode=sometimes"], "logger.mode='sometimes'"),
        (["target.dtype=int8"], "target.dtype='int8'"),
        (["trainer.attention_backend=triton"], "trainer.attention_backend='triton'"),
        (["trainer.attention_backend=cudnn"], "trainer.attention_backend=cudnn serves EAGLE-3"),
        (["trainer.optimizer=sgd"], "trainer.optimizer='sgd'; expected adamw or muon"),
        (["trainer.optimizer=muon", "trainer.muon_lr=0"], "trainer.muon_lr=0"),
        (["trainer.optimizer=muon", "trainer.muon_ns_dtype=fp16"], "trainer.muon_ns_dtype='fp16'; expected auto, bfloat16 or float32"),
        (["drafter.loss_weighting=linear"], "drafter.loss_weighting='linear'; expected exp or dpace"),
        (["drafter.loss_weighting=dpace", "drafter.dpace_alpha=0"], "drafter.dpace_alpha=0"),
        (["drafter.reveal_prob=1.5"], "drafter.reveal_prob=1.5; expected in [0, 1]"),
        (["drafter.block_size=4", "drafter.reveal_max=3"], "drafter.reveal_max=3; expected 1 .. block_size - 2"),
        (["experiment=eagle3_swa_tiny", "drafter.fc_norm=true", "drafter.norm_before_fc=true"], "drafter.fc_norm and drafter.norm_before_fc are both true"),
        (["experiment=eagle3_swa_tiny", "drafter.norm_before_fc=true"], "drafter.norm_before_fc=true, which SGLang's"),
        (["experiment=eagle3_swa_tiny", "drafter.norm_output=true", "trainer.export_formats=[sglang]"], "drafter.norm_output=true"),
    ],
)
def test_cross_field_checks_name_the_field(overrides: list[str], message: str) -> None:
    cfg = compose_train(overrides + ["output_dir=/tmp/x"])
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        to_train_config(cfg)


def test_unknown_device_fails_in_one_line() -> None:
    """trainer.device=tpu was a RuntimeError traceback listing torch's twenty device types."""
    from train.trainer import pick_device

    with pytest.raises(ValueError, match=r"trainer.device='tpu'; expected auto, cpu, cuda or cuda:N"):
        pick_device("tpu")


def test_resolved_layer_types() -> None:
    cfg = to_train_config(compose_train(["drafter.num_hidden_layers=3", "drafter.sliding_window=128", "output_dir=/tmp/x"]))
    assert cfg.drafter.resolved_layer_types() == ["sliding_attention"] * 3
    cfg = to_train_config(compose_train(["drafter.num_hidden_layers=2", "output_dir=/tmp/x"]))
    assert cfg.drafter.resolved_layer_types() == ["full_attention"] * 2


@pytest.mark.parametrize("experiment,override,schema", [
    ("dflash_swa_tiny", "drafter.ttt_length=3", "DFlashConfig"),
    ("dflash_swa_tiny", "drafter.fc_norm=true", "DFlashConfig"),
    ("eagle3_swa_tiny", "drafter.num_anchors=7", "Eagle3Config"),
    ("eagle3_swa_tiny", "drafter.block_size=4", "Eagle3Config"),
])
def test_a_key_of_the_other_drafter_fails_at_composition_naming_it(experiment: str, override: str, schema: str) -> None:
    """Each drafter has its own schema (train/dflash.py, train/eagle3.py): the issue's four examples were accepted in silence."""
    key = override.split("=")[0].split(".")[1]
    with pytest.raises(ConfigCompositionException) as err:
        compose_train([f"experiment={experiment}", override])
    assert f"Key '{key}' not in '{schema}'" in f"{err.value} {err.value.__cause__}"
    with pytest.raises(ValueError, match=rf"unknown config key drafter.{key}: not in the schema"):  # and appended with +
        to_train_config(compose_train([f"experiment={experiment}", "+" + override]))


def test_dead_keys_are_gone() -> None:
    with pytest.raises(ConfigCompositionException, match="num_workers"):
        compose_train(["trainer.num_workers=2"])


def test_each_drafter_gets_its_own_schema() -> None:
    from train.dflash import DFlashConfig
    from train.eagle3 import Eagle3Config

    assert type(to_train_config(compose_train(["experiment=dflash_swa_tiny", "output_dir=/x"])).drafter) is DFlashConfig
    assert type(to_train_config(compose_train(["experiment=eagle3_swa_tiny", "output_dir=/x"])).drafter) is Eagle3Config


@pytest.mark.slow  # a Hydra subprocess each; the quick tier keeps the typo one
def test_cli_other_drafters_key_fails_naming_it(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "train", "experiment=eagle3_swa_tiny", "drafter.block_size=4", f"output_dir={tmp_path / 'run'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "Key 'block_size' not in 'Eagle3Config'" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_cli_typo_fails_in_seconds_naming_the_key(tmp_path: Path) -> None:
    """The issue's example, run as users run it, from a directory outside the checkout."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "train", "experiment=dflash_swa_tiny", "trainer.max_stesp=5"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    elapsed = time.perf_counter() - start
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: Could not override 'trainer.max_stesp': Key 'max_stesp' not in 'TrainerConfig' "
                                   "(full_key: trainer.max_stesp)")
    assert elapsed < 20
    assert not any(tmp_path.iterdir()), "a failed start must not leave a run folder"


@pytest.mark.parametrize("override,message", [
    ("experiment=nope", "In 'train': Could not find 'experiment/nope'; Available options in 'experiment': dflash_swa, "
                        "dflash_swa_small, dflash_swa_small_long, dflash_swa_tiny, eagle3_swa, eagle3_swa_small, eagle3_swa_tiny"),
    ("trainer.batch_size=abc", "Error merging override trainer.batch_size=abc: Value 'abc' of type 'str' could not be "
                               "converted to Integer (full_key: trainer.batch_size)"),
    ("drafter=nope", "In 'train': Could not find 'drafter/nope'; Available options in 'drafter': dflash, eagle3"),
    ("trainer.batch_size", "Error parsing override 'trainer.batch_size'; missing EQUAL at '<EOF>'"),
    ("data.path=a=b", "data.path=a=b: mismatched input '=' expecting <EOF>"),
])
def test_a_bad_override_is_one_line_with_exit_2(capsys, override: str, message: str) -> None:
    """Hydra printed these in 4-15 lines (its search path, a link, a ``+key`` hint the schema then refuses) and exited 1;
    ``refuse_bad_overrides`` composes first and says the same in one line. Good overrides pass through to Hydra."""
    from train.config import refuse_bad_overrides

    with pytest.raises(SystemExit) as exit_:
        refuse_bad_overrides(["experiment=dflash_swa_tiny", override] if not override.startswith("experiment") else [override])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    refuse_bad_overrides(["experiment=eagle3_swa_tiny", "trainer.lr=1e-3", "hydra.job.chdir=true", "output_dir=/x"])  # no exit
    refuse_bad_overrides(["--cfg", "job", "trainer.bogus=1"])  # Hydra's own flags: Hydra answers
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("sub", ["", "run"])
def test_cli_output_dir_that_is_a_file_fails_in_one_line(tmp_path: Path, sub: str) -> None:
    """Hydra makes the run folder before the config is checked: a FileExistsError / NotADirectoryError traceback."""
    file = tmp_path / "notes.txt"
    file.write_text("x")
    out = file / sub if sub else file
    proc = subprocess.run([sys.executable, "-m", "train", "experiment=dflash_swa_tiny", f"output_dir={out}"],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"output_dir={str(out)!r}: {file} is a file; expected a folder for the run (new, or a run's to resume)"
    assert file.read_text() == "x"


@pytest.mark.parametrize("override", ["+trainer.max_step=10", "+data.regenerate.tempreature=1", "+foo=1"])
def test_appended_key_the_schema_lacks_fails_naming_it(override: str) -> None:
    """Hydra's own hint for a missing key is ``+key=value``; a typed node then takes any name in silence."""
    name = override[1:].split("=")[0]
    with pytest.raises(ValueError, match=rf"unknown config key {name}: not in the schema"):
        to_train_config(compose_train(["experiment=dflash_swa_tiny", override]))


@pytest.mark.slow  # the quick tier stays under 3 minutes (README); the full suite runs it
def test_cli_unknown_key_leaves_no_run_folder(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "train", "experiment=dflash_swa_tiny", "+trainer.max_step=10",
                           f"output_dir={tmp_path / 'run'}"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "unknown config key trainer.max_step" in proc.stdout + proc.stderr
    assert not (tmp_path / "run").exists(), "a run that failed at start-up must not leave its folder behind"


@pytest.mark.slow  # two CLI start-ups (~8 s each on 2 cores); the quick tier keeps the other CLI error tests
@pytest.mark.parametrize("override,message", [
    ("data.path=/nonexistent/data.json", "data.path='/nonexistent/data.json': no such file or folder"),
    ("target.path=./no-such-model", "target.path='./no-such-model': no such folder"),
])
def test_missing_paths_fail_before_the_target_loads(tmp_path: Path, override: str, message: str) -> None:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "train", "experiment=dflash_swa_tiny", override, f"output_dir={tmp_path / 'run'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stdout + proc.stderr
    assert "target builtin" not in proc.stdout + proc.stderr  # failed before the target was loaded or built
    assert time.perf_counter() - start < 30 and not (tmp_path / "run").exists()


def test_target_folder_without_config_json_fails_before_the_target_loads(tmp_path: Path) -> None:
    """A folder that is not a model (empty, or the wrong one) used to reach transformers: five lines about tokenizers."""
    from train.config import check_paths

    (tmp_path / "readme.txt").write_text("x")
    cfg = to_train_config(compose_train([f"target.path={tmp_path}", "output_dir=/tmp/x"]))
    with pytest.raises(ValueError, match=rf"target.path='{tmp_path}': no config.json there; expected a Hugging Face model folder"):
        check_paths(cfg)


def test_an_unknown_builtin_dataset_is_named_before_the_target_loads() -> None:
    """Found by review (2026-12-06's sixth session): data.path=builtin:nope reached Hugging Face's dataset loader ("Repo
    id must use alphanumeric chars ...: 'builtin:nope'")."""
    from train.config import check_paths

    cfg = to_train_config(compose_train(["experiment=dflash_swa_tiny", "data.path=builtin:nope", "output_dir=/tmp/x"]))
    with pytest.raises(ValueError, match=r"data.path='builtin:nope': no such built-in dataset; expected builtin:sharegpt-sample"):
        check_paths(cfg)


def test_feature_store_that_is_missing_or_unfinished_fails_before_the_target_loads(tmp_path: Path) -> None:
    """features.path was opened after the target had loaded (and its data had been tokenized): minutes, then the error."""
    from train.config import check_paths

    store = tmp_path / "store"
    cfg = to_train_config(compose_train(["experiment=dflash_swa_tiny", f"features.path={store}", "output_dir=/tmp/x"]))
    with pytest.raises(ValueError, match=rf"features.path='{store}': no feature store there \(expected {store}/store.json"):
        check_paths(cfg)
    store.mkdir()
    (store / "store.json").write_text("{}")
    with pytest.raises(ValueError, match=rf"features.path='{store}': the store is unfinished \(no complete.json\)"):
        check_paths(cfg)
    (store / "complete.json").write_text("{}")
    check_paths(cfg)  # complete as far as the start-up check goes; the store itself reads and checks its files


@pytest.mark.slow
def test_cli_cross_field_error_is_one_line_and_nonzero(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "train", "drafter.num_hidden_layers=2", "drafter.layer_types=[full_attention]", f"output_dir={tmp_path / 'run'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "drafter.layer_types has 1 entries" in errors[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_train_step_benchmark_rejects_an_override_read_as_a_window() -> None:
    """``--windows`` takes a list: a Hydra override after it used to become a window and fail deep in Hydra's parser."""
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "benchmarks/train_step.py", "--device", "cpu", "--windows", "2048", "trainer.compile_scope=step"],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "argument --windows: expected full or a positive integer, got 'trainer.compile_scope=step'" in proc.stderr


def test_coordinate_descent_tuning_sets_inductors_flag() -> None:
    import torch._inductor.config as inductor_config

    from train.trainer import set_coordinate_descent_tuning

    before = inductor_config.coordinate_descent_tuning
    try:
        for value in (True, False, True):
            set_coordinate_descent_tuning(value)
            assert inductor_config.coordinate_descent_tuning is value
    finally:
        inductor_config.coordinate_descent_tuning = before


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_a_seed_out_of_range_fails_at_config_time_naming_it(seed: int) -> None:
    """trainer.seed=-1 passed the config and failed after the target loaded, in numpy's words ("expected non-negative
    integer"), naming no setting; a seed past 2**32 overflowed torch's generator seeds (seed * 1_000_003 + step)."""
    with pytest.raises(ValueError, match=rf"^trainer.seed={seed}; expected an integer in 0 .. 4294967295$"):
        to_train_config(compose_train(["experiment=dflash_swa_tiny", f"trainer.seed={seed}", "output_dir=/tmp/x"]))
    assert to_train_config(compose_train(["experiment=dflash_swa_tiny", f"trainer.seed={2**32 - 1}", "output_dir=/tmp/x"])).trainer.seed == 2**32 - 1


# --- found by review (2026-12-05's fifth session): each was a traceback, a run trained then refused at export, or a
# --- silent change of what was asked

@pytest.mark.parametrize("overrides, chosen", [(["drafter.kind=eagle3"], "dflash"), (["drafter=eagle3", "drafter.kind=dflash"], "eagle3")])
def test_a_drafter_kind_that_disagrees_with_the_drafter_group_is_one_line(overrides, chosen) -> None:
    """drafter.kind=eagle3 over drafter=dflash: an AttributeError traceback (a field of the other drafter's schema)."""
    other = "eagle3" if chosen == "dflash" else "dflash"
    with pytest.raises(ValueError, match=rf"^drafter.kind={other} disagrees with drafter={chosen}; the drafter is chosen with drafter={other}"):
        to_train_config(compose_train(overrides))


def test_an_empty_data_path_is_refused_naming_the_key() -> None:
    """data.path= (an unset $DATA) read the current folder's .jsonl files as the data."""
    with pytest.raises(ValueError, match=r"^data\.path='': empty"):
        to_train_config(compose_train(["data.path="]))


@pytest.mark.parametrize("override", ["trainer.lr=nan", "trainer.lr=inf", "trainer.num_epochs=inf", "trainer.grad_clip=nan",
                                      "trainer.time_limit_minutes=nan", "data.regenerate.temperature=nan", "drafter.loss_gamma=nan"])
def test_non_finite_numbers_are_refused_at_start_up(override) -> None:
    """NaN passed every "<= 0" check (trainer.lr=nan failed after the target loaded, in torch's words); num_epochs=inf
    overflowed in a traceback."""
    key = override.split("=")[0]
    with pytest.raises(ValueError, match=rf"^{re.escape(key)}=(nan|inf); expected a finite number"):
        to_train_config(compose_train([override]))


def test_eagle3_with_sglang_export_needs_three_target_layers_at_start_up() -> None:
    """Trained, then refused by the SGLang export (its fc reads exactly 3 layers)."""
    with pytest.raises(ValueError, match=r"^drafter.target_layer_ids=\[1\] with trainer.export_formats=\['sglang', 'speculators'\]"):
        to_train_config(compose_train(["experiment=eagle3_swa_tiny", "drafter.target_layer_ids=[1]"]))
    to_train_config(compose_train(["experiment=eagle3_swa_tiny", "drafter.target_layer_ids=[1]", "trainer.export_formats=[speculators]"]))


@pytest.mark.parametrize("drafter, layers, features, message", [
    ("dflash", 8, 6, r"the drafter reads 6 target layers .* a target of 8 layers spaces at most 5 distinct ones \(1\.\.5\)"),
    ("eagle3", 6, None, r"target has 6 layers: EAGLE-3's default low/mid/high layers \[1, 2, 2\] repeat"),
])
def test_default_target_layers_that_would_repeat_are_refused(drafter, layers, features, message) -> None:
    """The spacing computed for a null target_layer_ids repeated layers ([1, 2, 3, 3, 4, 5] for 6 of 8): the run trained,
    then the export refused it. Every count that fits gives distinct layers inside 1 .. L-3 (checked against a loop)."""
    from models.target import default_layer_ids

    with pytest.raises(ValueError, match=message):
        default_layer_ids(drafter, layers, features)
    for num_layers in range(4, 40):
        for k in range(1, num_layers - 2):
            ids = default_layer_ids("dflash", num_layers, k)
            assert len(set(ids)) == k and all(0 <= i <= num_layers - 2 for i in ids), (num_layers, k, ids)
        if num_layers >= 7:
            assert len(set(default_layer_ids("eagle3", num_layers))) == 3


def test_num_eval_cut_to_a_tenth_is_said(caplog) -> None:
    """data.num_eval=100000 held out 3 conversations, data.max_records=5 none (no eval at all), without a word."""
    import logging

    from datasets import Dataset

    from train.data.dataset import split_train_eval

    ds = Dataset.from_dict({"input_ids": [[7, i, i + 1, i + 2] for i in range(40)], "loss_mask": [[0, 0, 1, 1]] * 40})
    with caplog.at_level(logging.WARNING):
        _, held, _ = split_train_eval(ds, 16, 0)
    assert len(held) == 4 and "data.num_eval=16: 40 conversations after duplicates; at most a tenth are held out, so 4" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _, held, _ = split_train_eval(ds, 4, 0)
    assert len(held) == 4 and "data.num_eval" not in caplog.text
