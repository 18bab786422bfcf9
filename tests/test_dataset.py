"""Tokenized data: length policy counts, the cache and its key, padding."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
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


def test_row_reader_and_collate_equal_an_element_by_element_reference() -> None:
    """Rows read in one Arrow take as NumPy arrays (``RowReader``), collated, equal a batch written element by element
    from the rows as Python lists: ids, loss mask, attention mask, packed rows' segments; padded to the longest row or
    to ``pad_to``; a plain list of rows is read row by row."""
    import datasets

    from train.data.dataset import RowReader

    rng = np.random.default_rng(0)
    rows = []
    for n in (7, 1, 12, 5):
        ids = rng.integers(1, 500, n).tolist()
        rows.append({"input_ids": ids, "loss_mask": rng.integers(0, 2, n).tolist(), "segments": [n] if n % 2 else [n - 3, 3]})
    ds = datasets.Dataset.from_list(rows, features=datasets.Features({
        "input_ids": datasets.Sequence(datasets.Value("int32")), "loss_mask": datasets.Sequence(datasets.Value("int8")),
        "segments": datasets.Sequence(datasets.Value("int32"))}))
    order = [2, 0, 3, 1, 2]
    for reader in (RowReader(ds), RowReader(rows)):
        for pad_to in (None, 16):
            batch = collate_padded(reader(order), pad_token_id=9, pad_to=pad_to)
            width = pad_to or 12
            for b, i in enumerate(order):
                r = rows[i]
                for t in range(width):
                    real = t < len(r["input_ids"])
                    assert batch["input_ids"][b, t].item() == (r["input_ids"][t] if real else 9)
                    assert batch["loss_mask"][b, t].item() == (bool(r["loss_mask"][t]) if real else False)
                    assert batch["attention_mask"][b, t].item() == int(real)
                assert batch["segments"][b] == r["segments"] and all(type(x) is int for x in batch["segments"][b])
            assert batch["input_ids"].dtype == torch.long and batch["loss_mask"].dtype == torch.bool
            assert batch["input_ids"].shape == (len(order), width)


def test_rows_are_read_without_datasets_numpy_formatter(monkeypatch) -> None:
    """``RowReader`` and ``split_train_eval`` read through Arrow, not ``with_format("numpy")``: datasets 4.4.1's NumPy
    formatter imports ``torchvision.io.VideoReader`` once torchvision is imported, which recent torchvision lacks (an
    ImportError on a GPU image). With the formatter made to raise that error, both still read every row as written."""
    import datasets
    from datasets.formatting import np_formatter

    from train.data.dataset import RowReader, split_train_eval

    def no_video_reader(self, value):
        raise ImportError("cannot import name 'VideoReader' from 'torchvision.io'")

    monkeypatch.setattr(np_formatter.NumpyFormatter, "_tensorize", no_video_reader)
    rows = [{"id": f"c{i}", "input_ids": [100 + i, 7, 1, 2, i], "loss_mask": [0, 0, 1, 1, 1]} for i in range(30)]
    ds = datasets.Dataset.from_list(rows)
    with pytest.raises(ImportError):  # the formatter is the path that fails
        ds.with_format("numpy")[[0]]
    read = RowReader(ds)([4, 0, 29])
    assert [r["input_ids"].tolist() for r in read] == [rows[i]["input_ids"] for i in (4, 0, 29)]
    assert [r["loss_mask"].tolist() for r in read] == [rows[i]["loss_mask"] for i in (4, 0, 29)]
    train, held, _ = split_train_eval(ds, num_eval=3, seed=0)
    assert len(held) == 3 and len(train) == 27


def test_split_holds_out_prompts_no_training_row_shares() -> None:
    """Rows built by hand: prompt groups (same tokens before the first loss token), exact duplicates among them. The
    split must drop the duplicates, and no training row may open with a held-out prompt (checked row by row against
    the prompts written out here, not through ``prompt_key``)."""
    import datasets

    from train.data.dataset import split_train_eval

    rows, prompts = [], []
    for g in range(40):  # 40 prompts; groups 0..9 have three conversations, two of them identical
        prompt = [100 + g, 7, 7 + g % 3]
        replies = [[1, 2, g], [1, 2, g], [3, g, 4]] if g < 10 else [[5, g]]
        for j, reply in enumerate(replies):
            rows.append({"id": f"c{g}_{j}", "input_ids": prompt + reply, "loss_mask": [0] * len(prompt) + [1] * len(reply)})
            prompts.append(tuple(prompt))
    ds = datasets.Dataset.from_list(rows)
    train, held, counts = split_train_eval(ds, num_eval=8, seed=3)
    assert counts["duplicates_dropped"] == 10
    assert counts["train_rows_sharing_an_eval_prompt"] == 4  # seed 3 holds out four twinned prompts' conversations
    assert len(held) == 5  # 50 rows after the duplicates: a tenth
    held_prompts = {tuple(r["input_ids"][:3]) for r in held}
    assert len(held_prompts) == 5  # one conversation per held-out prompt
    train_prompts = [tuple(r["input_ids"][:3]) for r in train]
    assert not held_prompts & set(train_prompts)
    whole = [tuple(r["input_ids"]) for r in train] + [tuple(r["input_ids"]) for r in held]
    assert len(whole) == len(set(whole)) == len(rows) - 10 - counts["train_rows_sharing_an_eval_prompt"]
    # every prompt is on exactly one side, and nothing but duplicates and held-out twins is lost
    assert set(train_prompts) | held_prompts == set(prompts)
    # the same seed draws the same split
    again = split_train_eval(ds, num_eval=5, seed=3)
    assert [r["id"] for r in again[1]] == [r["id"] for r in held]


def marked_conversations(seed: int, count: int, longest: int) -> list[dict]:
    """Tokenized conversations of random lengths in [3, longest), conversation c's first token 1000 + c (marks it)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = []
    for c in range(count):
        n = int(rng.integers(3, longest))
        rows.append({"input_ids": [1000 + c] + rng.integers(0, 50, n - 1).tolist(), "loss_mask": rng.integers(0, 2, n).tolist()})
    return rows


def test_pack_conversations_keeps_every_conversation_whole_and_in_order() -> None:
    """Packed rows, read one after another, are the conversations in the seeded order, masks with their tokens; each row
    holds at most ``pack_length`` tokens and closes only when the next conversation would not fit."""
    import datasets
    import numpy as np

    from train.data.dataset import pack_conversations

    rows = marked_conversations(seed=0, count=30, longest=40)
    ds = datasets.Dataset.from_list(rows)
    packed = pack_conversations(ds, pack_length=64, seed=5)
    order = np.random.default_rng(5).permutation(len(rows)).tolist()
    assert [t for r in packed for t in r["input_ids"]] == [t for i in order for t in rows[i]["input_ids"]]
    assert [m for r in packed for m in r["loss_mask"]] == [m for i in order for m in rows[i]["loss_mask"]]
    lengths = [len(r["input_ids"]) for r in packed]
    assert max(lengths) <= 64 and 1 < len(packed) < len(rows)
    firsts = [[t for t in r["input_ids"] if t >= 1000] for r in packed]  # each conversation's first token marks it
    for row, nxt in zip(firsts, firsts[1:]):
        row_len = sum(len(rows[t - 1000]["input_ids"]) for t in row)
        assert row_len + len(rows[nxt[0] - 1000]["input_ids"]) > 64  # the next one did not fit
    with pytest.raises(ValueError, match="data.pack_length=20: conversation .* holds .* tokens"):
        pack_conversations(ds, pack_length=20, seed=5)
    assert all(r["segments"] == [len(r["input_ids"])] for r in packed)  # read whole by default
    # data.pack_fresh_fraction: the same rows; about that share lists its conversations' lengths, drawn with the seed
    fresh = pack_conversations(ds, pack_length=64, seed=5, fresh_fraction=0.5)
    assert fresh["input_ids"] == packed["input_ids"] and fresh["loss_mask"] == packed["loss_mask"]
    by_first = {1000 + c: len(r["input_ids"]) for c, r in enumerate(rows)}
    marked = [r for r in fresh if r["segments"] != [len(r["input_ids"])]]
    for r in fresh:
        if r["segments"] != [len(r["input_ids"])]:
            assert r["segments"] == [by_first[t] for t in r["input_ids"] if t >= 1000]
    assert 0 < len(marked) < len(fresh) and fresh["segments"] == pack_conversations(ds, 64, 5, 0.5)["segments"]
    every = pack_conversations(ds, pack_length=64, seed=5, fresh_fraction=1.0)
    assert [sum(s) for s in every["segments"]] == lengths and sum(len(s) for s in every["segments"]) == len(rows)


def test_best_fit_packing_places_every_conversation_once_and_fills_rows() -> None:
    """data.pack_documents packs by best fit decreasing: every conversation in exactly one row, whole, with its mask and
    its length in ``segments``; no row over ``pack_length``; no conversation could have gone into an earlier-closed row
    with less room left (checked against a brute-force best fit); fewer rows than next fit; the same rows for the seed."""
    import datasets
    import numpy as np

    from train.data.dataset import best_fit_rows, pack_conversations

    rows = marked_conversations(seed=1, count=60, longest=60)
    ds = datasets.Dataset.from_list(rows)
    packed = pack_conversations(ds, pack_length=64, seed=5, fresh_fraction=1.0, best_fit=True)
    seen = []
    for r in packed:
        assert len(r["input_ids"]) <= 64 and sum(r["segments"]) == len(r["input_ids"])
        at = 0
        for n in r["segments"]:
            c = r["input_ids"][at] - 1000
            assert r["input_ids"][at:at + n] == rows[c]["input_ids"] and r["loss_mask"][at:at + n] == rows[c]["loss_mask"]
            seen.append(c)
            at += n
    assert sorted(seen) == list(range(60))
    # brute force: longest first, each into the fitting row with the least room left (ties: the earliest row)
    lengths = [len(r["input_ids"]) for r in rows]
    order = np.random.default_rng(5).permutation(60).tolist()
    want: list[list[int]] = []
    for i in sorted(range(60), key=lambda i: (-lengths[i], order.index(i))):
        fits = [(64 - sum(lengths[j] for j in row), k) for k, row in enumerate(want) if sum(lengths[j] for j in row) + lengths[i] <= 64]
        if fits:
            want[min(fits)[1]].append(i)
        else:
            want.append([i])
    assert best_fit_rows(lengths, 64, order) == want
    next_fit = pack_conversations(ds, pack_length=64, seed=5)
    assert len(packed) < len(next_fit) and len(packed) <= -(-sum(lengths) // 64) + 2
    assert pack_conversations(ds, 64, 5, 1.0, best_fit=True)["segments"] == packed["segments"]


def test_few_prompts_sampled_many_times_keep_training_rows() -> None:
    """Data with fewer distinct first prompts than data.num_eval (3 prompts, 20 replies each): holding out every prompt
    group removed every training row, and the run died at its first batch ("max() arg is an empty sequence"). The
    held-out groups are then a tenth of the groups."""
    import datasets

    from train.data.dataset import split_train_eval

    rows = [{"id": f"c{g}_{j}", "input_ids": [100 + g, 7, 1, 2, j], "loss_mask": [0, 0, 1, 1, 1]} for g in range(3) for j in range(20)]
    train, held, _ = split_train_eval(datasets.Dataset.from_list(rows), num_eval=5, seed=0)
    assert held is None and len(train) == 60
    rows = [{"id": f"c{g}_{j}", "input_ids": [100 + g, 7, 1, 2, j], "loss_mask": [0, 0, 1, 1, 1]} for g in range(20) for j in range(20)]
    train, held, _ = split_train_eval(datasets.Dataset.from_list(rows), num_eval=25, seed=0)  # every one of the 20 groups asked
    assert len(held) == 2 and len(train) == 400 - 2 * 20  # 2 groups held out: one row each held, the group's others dropped
    rows = [{"id": f"c{g}_{j}", "input_ids": [100 + g, 7, 1, 2, j], "loss_mask": [0, 0, 1, 1, 1]} for g in range(30) for j in range(4)]
    train, held, _ = split_train_eval(datasets.Dataset.from_list(rows), num_eval=8, seed=0)  # fewer than the groups: as asked
    assert len(held) == 8 and len(train) == 120 - 8 * 4
