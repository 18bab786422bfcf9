"""Three small gaps, each fail-first: ``generate(eos_token_ids=<int>)`` was a TypeError; ``python -m infer`` printed
"tau 0.000" (and wrote 0.0 to --json) for a run with no verify step, where τ is undefined; the data readers refused a
JSON or JSONL file that starts with a UTF-8 byte-order mark (as Windows tools write them)."""

from __future__ import annotations

import codecs
import json
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from models.dflash import DFlashDraftModel, make_dflash_config
from train.data.readers import DataError, read_conversations

pytestmark = pytest.mark.usefixtures("single_cpu_thread")

LAYERS = [1, 3, 5]
BOM = codecs.BOM_UTF8


# -- 1. eos_token_ids as one int ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def loop_setup(reference_target_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from infer.generate import generate
    from infer.prompts import long_prompt_ids, mt_bench_questions
    from models.static_target import StaticTarget

    model = AutoModelForCausalLM.from_pretrained(reference_target_path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(reference_target_path)
    target = StaticTarget(model, LAYERS)
    prompt = long_prompt_ids(tokenizer, mt_bench_questions()[0]["turns"][0])
    free = generate(target, None, prompt, 16).tokens  # no end-of-sequence id: the whole budget
    return model, target, prompt, free


def test_generate_takes_one_int_as_its_end_of_sequence_id(loop_setup) -> None:
    """An int meant ``[int]`` to a caller (HF's ``generation_config.eos_token_id`` is often one), and was a TypeError
    ('int' object is not iterable); now it ends the generation as the one-element list does, with or without a drafter,
    and batched."""
    from infer.batch import generate_batch
    from infer.generate import generate
    from infer.prompt_lookup import PromptLookupDrafter

    model, target, prompt, free = loop_setup
    stop = free[5]
    want = free[:free.index(stop) + 1]
    assert len(want) < len(free)  # the id really ends the generation early
    vocab = model.get_output_embeddings().weight.shape[0]
    for drafter in (None, PromptLookupDrafter(num_draft_tokens=4, vocab_size=vocab)):
        as_list = generate(target, drafter, prompt, 16, eos_token_ids=[stop])
        as_int = generate(target, drafter, prompt, 16, eos_token_ids=stop)
        assert as_int.tokens == as_list.tokens == want
        assert as_int.stats.accepted_per_step == as_list.stats.accepted_per_step
    batched = generate_batch(target, None, [prompt, prompt], 16, batch_size=2, eos_token_ids=stop)
    assert [g.tokens for g in batched] == [want, want]


def test_generate_refuses_an_end_of_sequence_id_that_is_not_an_integer(loop_setup) -> None:
    """``True`` is an int to Python, but no token id; a float or a string neither: one clear ValueError each."""
    from infer.generate import generate

    _, target, prompt, _ = loop_setup
    for bad in (True, 2.0, "7", [1, 2.5]):
        with pytest.raises(ValueError, match=r"eos_token_ids="):
            generate(target, None, prompt, 4, eos_token_ids=bad)


# -- 2. no verify step: tau n/a, not 0.000 -------------------------------------------------------------------------------

def random_dflash(target_path: Path, folder: Path) -> Path:
    """An untrained one-layer DFlash drafter for the reference target (a trained drafter's CLI paths: the baseline, the
    prompt lookup run beside it)."""
    config = make_dflash_config(AutoConfig.from_pretrained(target_path), num_hidden_layers=1, block_size=4, mask_token_id=3,
                                target_layer_ids=[1, 3], layer_types=["sliding_attention"], sliding_window=16)
    torch.manual_seed(0)
    DFlashDraftModel(config).save_pretrained(folder)
    return folder


def tau_fields(err: str) -> list[str]:
    """What follows each "tau " on stderr."""
    return re.findall(r"tau (\S+)", err)


def test_cli_says_tau_is_undefined_without_a_verify_step(reference_target_path, tmp_path, capsys) -> None:
    """``--max-new-tokens 1``: the prefill makes the one token, no step verifies anything. τ (mean over verify steps of
    accepted + 1) is undefined there; it printed "tau 0.000" (below any real τ's 1) and --json held 0.0. Now stderr says
    "n/a (no verify step)" and the JSON holds null, for the drafter, the baseline and prompt lookup beside it; a run
    with steps prints and writes its number as before."""
    from infer.__main__ import main

    common = ["--target", str(reference_target_path), "--prompt", "Tell me about cats. Cats are", "--max-new-tokens"]
    out = tmp_path / "pld.json"
    assert main([*common, "1", "--drafter", "pld", "--json", str(out)]) == 0
    err = capsys.readouterr().err
    assert tau_fields(err) == ["n/a"] and "tau n/a (no verify step)" in err, err
    report = json.loads(out.read_text())
    assert report["speculative"]["tau"] is None and report["speculative"]["steps"] == 0

    drafter = random_dflash(reference_target_path, tmp_path / "dflash")
    out = tmp_path / "dflash.json"
    assert main([*common, "1", "--drafter", str(drafter), "--baseline", "--json", str(out)]) == 0
    err = capsys.readouterr().err
    assert tau_fields(err) == ["n/a"] * 3, err  # the drafter's, prompt lookup's beside it, the baseline's
    assert "[prompt lookup] tau n/a (no verify step)" in err and "the drafter's n/a (no verify step)" in err, err
    report = json.loads(out.read_text())
    assert [report[k]["tau"] for k in ("speculative", "prompt_lookup", "autoregressive")] == [None, None, None]
    # no token decoded past the prefill's: no speedup either (it printed "speedup 0.00x" and wrote 0.0)
    assert "speedup n/a" in err and report["speedup"] is None, err

    # with verify steps: a number, as before
    out = tmp_path / "steps.json"
    assert main([*common, "6", "--drafter", "pld", "--json", str(out)]) == 0
    (tau,) = tau_fields(capsys.readouterr().err)
    report = json.loads(out.read_text())["speculative"]
    assert report["steps"] > 0 and float(tau) == pytest.approx(report["tau"], abs=5e-4) and report["tau"] >= 1.0


def test_cli_prompts_file_says_tau_is_undefined_without_a_verify_step(reference_target_path, tmp_path, capsys) -> None:
    """``--prompts``: the pooled "tau 0.000 over 0 steps" line and its JSON's "tau": 0.0 likewise."""
    from infer.__main__ import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Tell me about cats. Cats are"}\n{"prompt": "List three colors: red, green,"}\n')
    out = tmp_path / "many.json"
    assert main(["--target", str(reference_target_path), "--drafter", "pld", "--prompts", str(prompts), "--max-new-tokens", "1",
                 "--json", str(out)]) == 0
    err = capsys.readouterr().err
    assert tau_fields(err) == ["n/a"] and "tau n/a (no verify step) over 0 steps" in err, err
    report = json.loads(out.read_text())
    assert report["tau"] is None and [r["tau"] for r in report["per_prompt"]] == [None, None]


# -- 3. a UTF-8 byte-order mark ------------------------------------------------------------------------------------------

def records(n: int = 3) -> list[dict]:
    return [{"id": f"r{i}", "conversations": [{"from": "human", "value": f"q{i} é"}, {"from": "gpt", "value": f"a{i}"}]}
            for i in range(n)]


@pytest.mark.parametrize("layout", ["array", "object", "jsonl", "jsonl-crlf"])
def test_readers_accept_a_utf8_byte_order_mark(tmp_path: Path, layout: str) -> None:
    """A file a Windows tool saved starts with EF BB BF: the JSON reader refused it ("not valid JSON (Unexpected UTF-8
    BOM ...)"), the JSONL reader refused its first line (and with skip_bad_lines dropped that record silently)."""
    rows = records()
    if layout == "array":
        name, text = "d.json", json.dumps(rows, ensure_ascii=False, indent=1)
    elif layout == "object":
        name, text, rows = "d.json", json.dumps(rows[0], ensure_ascii=False), rows[:1]
    else:
        newline = "\r\n" if layout == "jsonl-crlf" else "\n"
        name, text = "d.jsonl", "".join(json.dumps(r, ensure_ascii=False) + newline for r in rows)
    path = tmp_path / name
    path.write_bytes(BOM + text.encode("utf-8"))
    for skip in (False, True):
        conversations, stats = read_conversations(path, skip_bad_lines=skip)
        assert [c.id for c in conversations] == [r["id"] for r in rows]
        assert conversations[0].messages[0]["content"] == "q0 é"  # no U+FEFF left in the text
        assert stats.bad_lines_skipped == 0 and stats.truncated_at_byte is None


def test_readers_with_a_byte_order_mark_keep_their_errors_and_byte_offsets(tmp_path: Path) -> None:
    """Bad input after a BOM is refused (or read as cut) as it is without one; byte offsets count the BOM, as the file's
    own bytes do."""
    text = json.dumps(records(), ensure_ascii=False)
    start = len(BOM) + text.encode("utf-8").index(b'{"id": "r2"')
    path = tmp_path / "cut.json"
    path.write_bytes(BOM + text.encode("utf-8")[:start - len(BOM) + 20])  # cut inside the last record
    conversations, stats = read_conversations(path)
    assert [c.id for c in conversations] == ["r0", "r1"] and stats.truncated_at_byte == start

    refused = [  # (file, its bytes after the mark, the error; columns as an editor counts them, the mark unseen)
        ("two.json", b'[]\n[{"id": "b", "conversations": []}]', r"two\.json: text after the array's closing '\]' at byte 6"),
        ("bad.json", b'{"id": "a" "conversations": []}', r"bad\.json: not valid JSON \(Expecting ',' delimiter at line 1 column 12\)"),
        ("bad_array.json", b'[{"id": "a" "conversations": []}, {"id": "b", "conversations": []}]',  # a closed array, a broken record
         r"bad_array\.json: record 0 is not valid JSON \(Expecting ',' delimiter at line 1 column 13\)"),
        ("bad.jsonl", b'{"id": "a" "conversations": []}\n', r"bad\.jsonl:1: malformed JSON line \(Expecting ',' delimiter at column 12\)"),
    ]
    for name, body, error in refused:
        path = tmp_path / name
        path.write_bytes(BOM + body)
        with pytest.raises(DataError, match=error):
            read_conversations(path)

    # a BOM before a later line is not a file's mark: still a malformed line there
    path = tmp_path / "mid.jsonl"
    lines = [json.dumps(r).encode() for r in records(2)]
    path.write_bytes(lines[0] + b"\n" + BOM + lines[1] + b"\n")
    with pytest.raises(DataError, match=r"mid\.jsonl:2: malformed JSON line"):
        read_conversations(path)


def test_prompts_file_accepts_a_utf8_byte_order_mark(tmp_path: Path) -> None:
    """``python -m infer --prompts`` / ``eval prompts`` read their JSONL with their own reader: the same mark accepted."""
    from infer.prompts import prompts_file

    path = tmp_path / "p.jsonl"
    path.write_bytes(BOM + b'{"id": "x", "prompt": "hi"}\n{"prompt": "there"}\n')
    assert [(c.id, c.turns) for c in prompts_file(path)] == [("x", ("hi",)), ("2", ("there",))]
