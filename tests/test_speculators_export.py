"""The export to vLLM speculators' (0.9.0) trainer format, read back by speculators' own code: its prepare-data
gives our rows in our order, its ArrowDataset yields our token ids, loss masks and split, and the hidden
states equal an independent Hugging Face forward (aux slot k = HF hidden_states[k], the last slot the final
layer's output before the final norm). Its trainer accepts the printed command (``--dry-run``, which builds
the drafter on the CPU; training itself moves the model to an accelerator and refuses without one)."""

from __future__ import annotations

import importlib.util
import importlib.util
import json
import shlex
from pathlib import Path

import pytest
import torch
from compose import compose_train

# speculators is imported by the tests that use it (its import takes ~5 s, paid by every xdist worker collecting)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("speculators") is None,
                                reason="speculators is not installed (the README's test command installs it)")

from train.data import prepare_data  # noqa: E402
from train.data.readers import DataError  # noqa: E402
from train.data.speculators_export import (  # noqa: E402
    PREPARED_DIR, ROWS_FILE, export_hidden_states, export_rows, hidden_state_layer_ids, main, prepared_order, samples_seen,
    speculators_commands, to_speculators_layer_ids, train_data_ratio)
from train.engines import engine_layer_ids  # noqa: E402
from models.target import TargetModel  # noqa: E402

SMALL_DATA = ["data.path=builtin:sharegpt-sample", "data.max_records=40", "data.max_length=128", "data.num_eval=8",
              "data.regenerate.enabled=false", "trainer.device=cpu", "trainer.progress=false", "logger=none"]


def overrides(target: Path, kind: str) -> list[str]:
    return [f"experiment={kind}_swa_small", f"target.path={target}", *SMALL_DATA]


def speculators_prepare_data(**kwargs) -> None:
    """``speculators prepare-data``'s own function, loaded from its file: the package's ``speculators.cli`` imports
    every subcommand, and ``regenerate-responses`` needs aiohttp, which the test environment (--no-deps) lacks."""
    path = Path(importlib.util.find_spec("speculators").origin).parent / "cli" / "prepare_data.py"
    spec = importlib.util.spec_from_file_location("speculators_cli_prepare_data", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.prepare_data(num_preprocessing_workers=1, **kwargs)


def run_prepare_data(manifest: dict, out: Path, **extra) -> Path:
    prepared = out / PREPARED_DIR
    speculators_prepare_data(model=manifest["target"], data=[str(out / ROWS_FILE)], output=str(prepared),
                             seq_length=manifest["seq_length"], seed=manifest["seed"], **extra)
    return prepared


@pytest.fixture(scope="module")
def dflash_export(tmp_path_factory, reference_target_path: Path):
    out = tmp_path_factory.mktemp("spec-export") / "dflash"
    cfg = compose_train(overrides(reference_target_path, "dflash"))
    manifest = export_rows(cfg, out)
    run_prepare_data(manifest, out)
    totals = export_hidden_states(cfg, out)
    return cfg, out, manifest, totals


def arrow_split(out: Path, manifest: dict, split: str):
    """The trainer's datasets, built as speculators' ``create_train_val_loaders`` builds them."""
    from speculators.train.data import ArrowDataset

    return ArrowDataset(max_len=manifest["seq_length"], datapath=str(out / PREPARED_DIR), on_missing="raise",
                        train_ratio=manifest["train_data_ratio"], split=split, hidden_states_dtype=torch.float32)


def test_layer_id_mapping() -> None:
    """Ours: output of layer i = HF hidden_states[i + 1]; speculators / vLLM: input of layer k = HF hidden_states[k]."""
    assert to_speculators_layer_ids([1, 3, 4]) == [2, 4, 5] == engine_layer_ids([1, 3, 4], "speculators")
    assert hidden_state_layer_ids([1, 3, 4], num_layers=8) == [1, 3, 4, 7]  # + the last layer's output: speculators id 8 = L
    assert train_data_ratio(33, 36) * 36 // 1 == 33 and int(7 * train_data_ratio(6, 7)) == 6
    order = prepared_order(50, seed=0)
    assert sorted(order) == list(range(50)) and order != list(range(50))


def test_speculators_reads_our_rows_split_and_hidden_states(dflash_export, reference_target_path: Path) -> None:
    cfg, out, manifest, totals = dflash_export
    target = TargetModel.from_pretrained(str(reference_target_path))
    train_ds, eval_ds, _ = prepare_data(cfg.data, target, seed=cfg.trainer.seed, progress=False)  # what our trainer reads
    assert (manifest["train_rows"], manifest["eval_rows"]) == (len(train_ds), len(eval_ds)) == (33, 3)
    assert totals == {"rows": 36, "written": 36, "skipped": 0, "tokens": sum(len(r) for r in [*train_ds["input_ids"], *eval_ds["input_ids"]])}
    train, val = arrow_split(out, manifest, "train"), arrow_split(out, manifest, "val")
    assert (len(train), len(val)) == (len(train_ds), len(eval_ds))

    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(reference_target_path, dtype=torch.float32).eval()
    aux = manifest["speculators_layer_ids"]  # HF hidden_states indices, by speculators' convention
    assert aux == [i + 1 for i in manifest["layer_ids"]] and manifest["hidden_state_slots"] == [*aux, 8]
    checked = 0
    for split, ours in ((train, train_ds), (val, eval_ds)):
        ours = ours.with_format(None)
        for j in range(len(split)):
            item = split[j]
            assert item["input_ids"].tolist() == ours[j]["input_ids"] and item["loss_mask"].tolist() == ours[j]["loss_mask"]
            if j % 8:  # hidden states on every 8th row of each split: a forward each
                continue
            with torch.no_grad():
                hs = hf(torch.tensor([ours[j]["input_ids"]]), output_hidden_states=True).hidden_states
            expected = torch.cat([hs[k][0] for k in aux], dim=-1)
            torch.testing.assert_close(item["hidden_states"], expected, rtol=0, atol=1e-5)
            last = item["verifier_last_hidden_states"]
            torch.testing.assert_close(hf.model.norm(last), hs[-1][0], rtol=0, atol=1e-5)  # HF's last is normed: ours is not
            assert not torch.allclose(last, hs[-1][0], atol=1e-2)
            checked += 1
    assert checked == 5 + 1

    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import CollateFn

    collate = CollateFn(max_len=256, hidden_size=512, num_target_layers=len(aux), dtype=torch.float32)
    batch = collate([train[0], train[1]])  # speculators packs rows into one [1, total_seq_len, ...] sequence
    n0 = len(train_ds[0]["input_ids"])
    assert batch["hidden_states"].shape == (1, 256, len(aux) * 512)
    assert torch.equal(batch["input_ids"][0, :n0], torch.tensor(train_ds[0]["input_ids"]))
    shifted = shift_batch(train[0])  # EAGLE-3's alignment step runs on our items
    assert shifted["input_ids"].shape[0] == n0 - 1


def test_hidden_states_resume_and_atomic_names(dflash_export) -> None:
    cfg, out, _, _ = dflash_export
    hs_dir = out / PREPARED_DIR / "hidden_states"
    (hs_dir / "hs_5.safetensors").unlink()
    assert export_hidden_states(cfg, out)["written"] == 1  # only the missing file
    assert not [p for p in hs_dir.iterdir() if not (p.name.startswith("hs_") and p.suffix == ".safetensors")]


@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_speculators_train_accepts_the_command(tmp_path: Path, reference_target_path: Path, dflash_export, kind: str) -> None:
    """The printed ``speculators train`` command resolves and builds its drafter (``--dry-run``: CPU) with our settings."""
    from speculators.train.cli import main as speculators_train
    from speculators.train.config import TrainConfig

    if kind == "dflash":
        _, out, manifest, _ = dflash_export
    else:
        out = tmp_path / "eagle3"
        manifest = export_rows(compose_train(overrides(reference_target_path, "eagle3")), out)
        run_prepare_data(manifest, out, skip_token_freq=False)  # the draft vocabulary comes from token_freq.pt
    argv = shlex.split(manifest["commands"]["train"].replace("\\\n", " "))
    assert argv[:2] == ["speculators", "train"] and "--on-missing" in argv and "--mask-token-id" in argv
    save = tmp_path / f"dry-{kind}"
    argv = [*argv[2:], "--dry-run", "--save-path", str(save), "--logger", ""]
    speculators_train(TrainConfig.resolve(argv))
    config = json.loads((save / "config.json").read_text())
    layers = config["transformer_layer_config"]
    assert layers["sliding_window"] == 2048
    if kind == "dflash":
        assert config["aux_hidden_state_layer_ids"] == manifest["speculators_layer_ids"] == [2, 3, 4, 5, 6]
        assert layers["layer_types"] == ["sliding_attention"] * 5  # experiment=dflash_swa_small
        assert config["block_size"] == 16 and config["mask_token_id"] == manifest["mask_token_id"]
        assert config["sliding_window_non_causal"] is False  # sliding layers causal in the block, as ours
    else:
        assert config["eagle_aux_hidden_state_layer_ids"] == manifest["speculators_layer_ids"] == [2, 4, 5]
        assert config["draft_vocab_size"] == manifest["draft_vocab_size"] == 8192
        assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 10  # --ttt-steps (the recipe's TTT 10)


def test_sample_count_follows_the_trainer_schedule() -> None:
    cfg = compose_train(["experiment=dflash_swa_small"])
    from train.trainer import to_train_config

    cfg = to_train_config(cfg)
    assert samples_seen(cfg, 7900) == 3000 * 16
    cfg.trainer.num_epochs = 2  # 7900 // 16 = 493 steps an epoch: 986 < 3000
    assert samples_seen(cfg, 7900) == 986 * 16


def test_packed_rows_reach_speculators_whole_with_our_step_budget(tmp_path: Path) -> None:
    """experiment=dflash_swa_small_long: one packed row of 32,768 tokens and 4,096 anchors a step. speculators' trainer
    gets the same budget a step (--total-seq-len, --max-anchors), where the small recipe's is 16 rows of 2,048."""
    from train.trainer import to_train_config

    manifest = {"target": "T", "seq_length": 32768, "seed": 0, "train_data_ratio": 0.9, "speculators_epochs": 1,
                "speculators_layer_ids": [2, 3], "mask_token_id": 3, "draft_vocab_size": 8192}
    for experiment, tokens in (("dflash_swa_small_long", 32768), ("dflash_swa_small", 16 * 2048)):
        train = speculators_commands(to_train_config(compose_train([f"experiment={experiment}"])), manifest, tmp_path)["train"]
        assert f"--total-seq-len {tokens} " in train and "--max-anchors 4096" in train


@pytest.mark.parametrize("overrides,window,full,non_causal", [
    ([], 2048, [], False),
    (["drafter.sliding_block_causal=false"], 2048, [], True),  # was trained causal inside the block by speculators
    (["drafter.sliding_window=null", "drafter.layer_types=null"], None, [0, 1, 2, 3, 4], False),  # was "--sliding-window None"
])
def test_the_train_command_parses_to_the_drafter_we_train(tmp_path: Path, overrides: list[str], window, full, non_causal) -> None:
    """The command's window, full layers and block causality, read back by speculators 0.9.0's own parser."""
    import shlex

    from speculators.train.config.resolution import build_parser
    from train.trainer import to_train_config

    manifest = {"target": "T", "seq_length": 2048, "seed": 0, "train_data_ratio": 0.9, "speculators_epochs": 1,
                "speculators_layer_ids": [2, 3], "mask_token_id": 3, "draft_vocab_size": 8192}
    cfg = to_train_config(compose_train(["experiment=dflash_swa_small", *overrides]))
    assert cfg.drafter.num_hidden_layers == 5
    parsed = build_parser().parse_args(shlex.split(speculators_commands(cfg, manifest, tmp_path)["train"].replace("\\\n", " "))[2:])
    # flags left out are absent from its namespace (its schema's defaults apply: every layer sliding at 2048, causal)
    assert getattr(parsed, "full_attention_indices", []) == full
    assert getattr(parsed, "sliding_window_non_causal", False) == non_causal
    assert getattr(parsed, "sliding_window", None) == window


def test_bad_input_fails_in_one_line(tmp_path: Path, dflash_export, reference_target_path: Path, capsys) -> None:
    cfg, out, manifest, _ = dflash_export
    with pytest.raises(DataError, match="no export.json"):
        export_hidden_states(cfg, tmp_path / "nothing")
    assert main(["hidden-states", str(tmp_path / "nothing"), *overrides(reference_target_path, "dflash")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1

    shuffled = tmp_path / "other-seed"  # prepare-data run with another seed: rows in another order
    speculators_prepare_data(model=manifest["target"], data=[str(out / ROWS_FILE)], output=str(shuffled),
                             seq_length=manifest["seq_length"], seed=1)
    with pytest.raises(DataError, match="row 0 is not the export's row 0"):
        export_hidden_states(cfg, out, prepared_dir=shuffled)

    with pytest.raises(DataError, match="layer ids"):
        export_hidden_states(compose_train([*overrides(reference_target_path, "dflash"), "drafter.target_layer_ids=[1,2]"]), out)
    with pytest.raises(DataError, match="data.pack_fresh_fraction=0.5: speculators' trainer reads every row whole"):
        export_rows(compose_train([*overrides(reference_target_path, "dflash"), "data.pack_length=4096", "data.pack_fresh_fraction=0.5"]),
                    tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()
    with pytest.raises(DataError, match="validation split"):
        export_rows(compose_train([*overrides(reference_target_path, "dflash"), "data.num_eval=0"]), tmp_path / "no-eval")

    tampered = tmp_path / "tampered"
    tampered.mkdir()
    for name in ("export.json", ROWS_FILE):
        (tampered / name).write_bytes((out / name).read_bytes())
    with open(tampered / ROWS_FILE, "a") as f:
        f.write('{"input_ids":[1],"loss_mask":[1]}\n')
    with pytest.raises(DataError, match="sha256"):
        export_hidden_states(cfg, tampered)


@pytest.mark.slow
def test_rows_are_the_regenerated_ones_when_the_experiment_regenerates(tmp_path: Path, reference_target_path: Path) -> None:
    """dflash_swa_small regenerates: the export holds the target's own replies, the rows our trainer reads."""
    from train.data.speculators_export import read_rows

    regen = ["data.max_records=12", "data.num_eval=1", "data.regenerate.enabled=true", "data.regenerate.engine=hf",
             "data.regenerate.max_new_tokens=8"]
    cfg = compose_train([*overrides(reference_target_path, "dflash"), *regen])
    plain = compose_train([*overrides(reference_target_path, "dflash"), *regen[:2]])
    export_rows(cfg, tmp_path)
    manifest, rows = read_rows(tmp_path)
    assert "regenerated_from" in manifest["data"]
    target = TargetModel.from_pretrained(str(reference_target_path))
    train_ds, eval_ds, _ = prepare_data(cfg.data, target, seed=0, progress=False)  # the trainer's call, from the cache now
    assert rows == [{"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]} for r in [*train_ds, *eval_ds]]
    original, _, _ = prepare_data(plain.data, target, seed=0, progress=False)
    assert [r["input_ids"] for r in original] != [r["input_ids"] for r in train_ds]
