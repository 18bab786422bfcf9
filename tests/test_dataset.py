"""Tokenized data: length policy counts, the cache and its key, padding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from train.config import DataConfig, Overflow
from train.data import dataset as dataset_module
from train.data.chat import ChatRenderer
from train.data.dataset import collate_padded, load_tokenized, resolve_source
from train.data.readers import read_conversations


def data_cfg(**kw) -> DataConfig:
    return DataConfig(path=kw.pop("path", "builtin:sharegpt-sample"), **kw)


def reference_lengths(tokenizer, max_records: int) -> list[tuple[int, int]]:
    """(tokens, loss tokens) per conversation, tokenized one at a time."""
    conversations, _ = read_conversations(resolve_source("builtin:sharegpt-sample"), max_records=max_records)
    renderer = ChatRenderer(tokenizer)
    return [(len(t.input_ids), sum(t.loss_mask), t.loss_mask) for t in (renderer.tokenize(c.messages) for c in conversations)]


@pytest.mark.parametrize("overflow", [Overflow.truncate, Overflow.drop])
def test_length_policy_counts(reference_tokenizer, tmp_path: Path, overflow: Overflow) -> None:
    max_length = 256
    ds, summary = load_tokenized(data_cfg(max_length=max_length, overflow=overflow, max_records=80), reference_tokenizer, tmp_path)
    ref = reference_lengths(reference_tokenizer, 80)
    too_long = [r for r in ref if r[0] > max_length]
    assert too_long, "the sample must exercise the length policy"
    stats = summary["tokenize"]
    if overflow == Overflow.drop:
        assert stats["dropped_too_long"] == len(too_long)
        assert stats["truncated"] == 0
        kept = [r for r in ref if r[0] <= max_length and r[1] > 0]
    else:
        no_loss_after_cut = [r for r in too_long if not any(r[2][:max_length])]
        assert stats["truncated"] == sum(1 for r in too_long if any(r[2][:max_length]))
        assert stats["dropped_no_assistant_token"] == len(no_loss_after_cut) + sum(1 for r in ref if r[1] == 0)
        kept = [r for r in ref if any(r[2][:max_length])]
    assert len(ds) == stats["kept"] == len(kept)
    assert all(len(row) <= max_length for row in ds["input_ids"])
    assert all(any(m) for m in ds["loss_mask"])
    assert summary["read"]["records"] == 80


def test_second_run_loads_from_cache(reference_tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = data_cfg(max_length=128, max_records=20)
    first, _ = load_tokenized(cfg, reference_tokenizer, tmp_path)

    def must_not_read(*a, **k):
        raise AssertionError("cache miss: the source was read again")

    monkeypatch.setattr(dataset_module, "read_conversations", must_not_read)
    second, summary = load_tokenized(cfg, reference_tokenizer, tmp_path)
    assert second["input_ids"] == first["input_ids"] and second["loss_mask"] == first["loss_mask"]
    # Anything that changes the tokens changes the key.
    with pytest.raises(AssertionError, match="cache miss"):
        load_tokenized(data_cfg(max_length=129, max_records=20), reference_tokenizer, tmp_path)
    with pytest.raises(AssertionError, match="cache miss"):
        load_tokenized(data_cfg(max_length=128, max_records=20, chat_template=reference_tokenizer.chat_template + " "), reference_tokenizer, tmp_path)
    # Only complete caches exist: no temporary folder is left behind.
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_cache_key_follows_the_source_file(reference_tokenizer, tmp_path: Path) -> None:
    src = tmp_path / "d.jsonl"
    row = {"id": "a", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "first"}]}
    src.write_text(json.dumps(row) + "\n")
    ds1, _ = load_tokenized(data_cfg(path=str(src)), reference_tokenizer, tmp_path / "cache")
    row["messages"][1]["content"] = "second answer"
    src.write_text(json.dumps(row) + "\n")
    ds2, _ = load_tokenized(data_cfg(path=str(src)), reference_tokenizer, tmp_path / "cache")
    assert ds1["input_ids"] != ds2["input_ids"]


def test_collate_padded() -> None:
    rows = [{"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}, {"input_ids": [8], "loss_mask": [1]}]
    batch = collate_padded(rows, pad_token_id=0)
    assert torch.equal(batch["input_ids"], torch.tensor([[5, 6, 7], [8, 0, 0]]))
    assert torch.equal(batch["loss_mask"], torch.tensor([[False, True, True], [True, False, False]]))
    assert torch.equal(batch["attention_mask"], torch.tensor([[1, 1, 1], [1, 0, 0]]))
