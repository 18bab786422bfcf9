"""The feature store and checkpoint/resume: bad inputs that were tracebacks or silent, each against a reference
(what an independent write or the trainer's own one-line contract gives)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from compose import compose_train

from train.features.store import FeatureStore, StoreError
from train.features.write import write_features
from train.trainer import train

SMALL_DATA = ["data.max_records=40", "data.max_length=128", "data.num_eval=0"]


def write_cfg(store: Path, out: Path, extra: list[str] = ()):
    return compose_train(["experiment=dflash_swa_tiny", *SMALL_DATA, "trainer.batch_size=2", "trainer.progress=false",
                          f"features.path={store}", "features.rows_per_shard=16", f"output_dir={out}", *extra])


def test_a_store_folder_without_its_spec_does_not_keep_another_stores_shards(tmp_path: Path) -> None:
    """store.json gone (deleted as store.json's own error advises, "delete it and rerun"), the shards and marks of the
    store it described stay: the writer made a new store.json for this run's inputs and took every old shard as done,
    so a store labelled with this run's layers held another layer set's features (same shapes: trained on silently).
    Reference: a store written afresh for the same inputs. Either the folder is refused, or it must read the same."""
    store = tmp_path / "store"
    write_features(write_cfg(store, tmp_path / "w1"))  # the tiny recipe's layers [1, 5]
    (store / "store.json").unlink()
    other = ["drafter.target_layer_ids=[2,4]"]
    try:
        write_features(write_cfg(store, tmp_path / "w2", other))
    except StoreError as e:  # refused: one line naming the folder's leftovers
        assert "store.json" in str(e) and "\n" not in str(e), str(e)
        return
    fresh = tmp_path / "fresh"
    write_features(write_cfg(fresh, tmp_path / "w3", other))
    reused, reference = FeatureStore(store), FeatureStore(fresh)
    assert reused.spec == reference.spec
    for row in (0, 5, 17):
        assert torch.equal(reused.row("train", row), reference.row("train", row)), f"row {row}: another store's features"


TINY = ["experiment=dflash_swa_tiny", "trainer.progress=false", "trainer.log_every=1", "trainer.eval_every=0",
        "data.max_records=40", "data.max_length=128", "data.num_eval=0", "trainer.batch_size=2", "trainer.max_steps=2",
        "trainer.checkpoint_every=1", "trainer.export=false"]


@pytest.mark.parametrize("content", ["weights", "tensor", "no_model"])
def test_a_readable_state_pt_that_is_not_a_checkpoint_is_one_line(tmp_path: Path, content: str) -> None:
    """trainer.resume at a torch file that loads but holds no checkpoint (a model's weights, e.g. a pytorch_model.bin, a
    bare tensor, a state without the model): KeyError / AttributeError tracebacks (python -m train exits 1 with a
    traceback, not its one line). Expected: a ValueError naming the file and what a checkpoint holds."""
    folder = tmp_path / "elsewhere" / "step_00000001"
    folder.mkdir(parents=True)
    state = {"weights": {"fc.weight": torch.zeros(2, 2)}, "tensor": torch.zeros(3),
             "no_model": {"train_state": {"step": 1}}}[content]
    torch.save(state, folder / "state.pt")
    with pytest.raises(ValueError) as err:
        train(compose_train(TINY + [f"trainer.resume={folder}", f"output_dir={tmp_path / 'run'}"]))
    assert str(folder / "state.pt") in str(err.value) and "\n" not in str(err.value), repr(err.value)


def test_a_store_spec_that_is_not_text_is_one_line_naming_it(tmp_path: Path) -> None:
    """store.json overwritten with binary bytes: UnicodeDecodeError's message ('utf-8' codec can't decode...) named no file
    (the writer's reader names it: common.json_file)."""
    from train.features.store import StoreSpec, StoreWriter

    spec = StoreSpec(target={"config": "c", "weights": "w"}, layer_ids=[1], with_final_hidden=False, dtype="float32", hidden_size=4,
                     max_length=8, batch_size=1, data={"train": "d"}, rows={"train": 1}, rows_per_shard=1)
    writer = StoreWriter(tmp_path / "store", spec)
    writer.write_shard("train", 0, {"0.features": torch.ones(3, 4)}, 3)
    writer.finish()
    (tmp_path / "store" / "store.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(StoreError) as err:
        FeatureStore(tmp_path / "store")
    assert str(tmp_path / "store" / "store.json") in str(err.value), str(err.value)
