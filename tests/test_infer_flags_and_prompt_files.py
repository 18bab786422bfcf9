"""Edge cases of ``python -m infer`` found in review (2026-12-06): flags a run ignored with exit 0, and a prompts file whose
bad input was not one line naming the file. Each test failed before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("single_cpu_thread")


def last_error(capsys) -> str:
    lines = [line.split("\r")[-1] for line in capsys.readouterr().err.strip().splitlines()]
    return next((line for line in reversed(lines) if line.startswith("error:")), "")


@pytest.mark.parametrize("flags, named", [
    (["--drafter", "pld", "--window", "5"], "--window"),          # prompt lookup has no attention: the window was ignored
    (["--drafter", "pld", "--window", "none"], "--window"),
    (["--tree-topk", "2", "--tree-tokens", "4"], "--tree-topk"),  # no drafter: plain decoding, the tree flags ignored
    (["--tree-tokens", "4"], "--tree-tokens"),
    (["--tree-redraft", "1"], "--tree-redraft"),
    (["--tree-lookup", "2"], "--tree-lookup"),
])
def test_flags_the_run_would_ignore_are_refused(tiny_qwen3_path, capsys, flags, named) -> None:
    """Were rc 0 with the flag silently ignored, as --window / --draft-steps without a drafter were before they were refused."""
    from infer.__main__ import main

    rc = main(["--target", tiny_qwen3_path, "--prompt", "hi", "--max-new-tokens", "2", *flags])
    assert rc == 2
    assert named in last_error(capsys)


def test_a_prompts_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    """A Latin-1 (or UTF-16) file was "error: 'utf-8' codec can't decode byte 0xe9 in position 15: ...", naming no file."""
    from infer.prompts import prompts_file

    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(b'{"prompt": "hi"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"latin1\.jsonl:2: not UTF-8 text"):
        prompts_file(latin1)
    utf16 = tmp_path / "utf16.jsonl"
    utf16.write_bytes('{"prompt": "hi"}\n'.encode("utf-16"))
    with pytest.raises(ValueError, match=r"utf16\.jsonl:1: not UTF-8 text"):
        prompts_file(utf16)
    marked = tmp_path / "marked.jsonl"  # after a byte-order mark: the same line, the offset the file's own
    marked.write_bytes(b'\xef\xbb\xbf{"prompt": "hi"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"marked\.jsonl:2: not UTF-8 text \(byte 0xe9 at byte offset 35\)"):
        prompts_file(marked)
    ok = tmp_path / "ok.jsonl"  # UTF-8 with a byte-order mark and CRLF line ends still reads
    ok.write_bytes(b'\xef\xbb\xbf{"prompt": "caf\xc3\xa9"}\r\n{"prompt": "b"}\r\n')
    assert [c.turns for c in prompts_file(ok)] == [("café",), ("b",)]


def test_cli_names_a_non_utf8_prompts_file(tmp_path: Path, capsys) -> None:
    from infer.__main__ import main

    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "caf\xe9"}\n')
    assert main(["--target", "never-loaded", "--prompts", str(path)]) == 2
    assert last_error(capsys).startswith(f"error: {path}:1: not UTF-8 text")


def test_a_blank_prompt_in_a_prompts_file_is_refused_as_on_the_command_line(tmp_path: Path) -> None:
    """--prompt '   ' is refused ("is empty"); the same prompt in a --prompts file was decoded."""
    from infer.prompts import prompts_file

    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hi"}\n{"turns": ["ok", " \\n\\t "]}\n')
    with pytest.raises(ValueError, match=r"p\.jsonl:2: the user turns must be non-empty strings"):
        prompts_file(path)


def test_a_negative_prefill_is_named_by_its_flag_before_loading(capsys) -> None:
    """Was "prefill_tokens=-1; expected >= 0" after the target loaded (here: an error about the target, never reached)."""
    from infer.__main__ import main

    assert main(["--target", "never-loaded", "--prompt", "hi", "--prefill-tokens", "-1"]) == 2
    assert last_error(capsys) == "error: --prefill-tokens -1; expected >= 0 (filler tokens before the question)"


def test_a_window_on_a_drafter_without_sliding_layers_is_said_to_change_nothing(tiny_qwen3_path) -> None:
    """A window applies to a drafter's sliding layers only (``layer_attention``): on a drafter whose layers all attend fully
    ``--window W`` decoded exactly what the drafter decodes without it, and said nothing (a sweep over windows repeated one
    cell). Said in one line now; a drafter with a sliding layer, ``--window none`` and the trained window stay quiet."""
    from types import SimpleNamespace

    from transformers import AutoConfig

    from infer.loading import window_warning
    from models.dflash import DFlashDraftModel, layer_attention, make_dflash_config

    def drafter(layer_types, window):
        config = make_dflash_config(AutoConfig.from_pretrained(tiny_qwen3_path), num_hidden_layers=len(layer_types), block_size=4,
                                    mask_token_id=1, target_layer_ids=[1], layer_types=layer_types, sliding_window=window)
        return SimpleNamespace(model=DFlashDraftModel(config))

    full = drafter(["full_attention", "full_attention"], None)
    assert layer_attention(full.model, 16) == layer_attention(full.model, "trained")  # the window changes no layer's rule
    warning = window_warning(full, 16)
    assert warning == "warning: --window 16 changes nothing: every layer of this drafter attends fully (layer_types: 2 x full_attention)"
    assert window_warning(full, None) is None and window_warning(full, "trained") is None
    mixed = drafter(["sliding_attention", "full_attention"], 64)
    assert window_warning(mixed, 16) is None and window_warning(mixed, 64) is None


@pytest.mark.parametrize("command", ["infer", "eval"])
@pytest.mark.parametrize("flags, named", [(["--top-k", "5"], "--top-k 5"), (["--top-p", "0.9"], "--top-p 0.9")])
def test_a_sampling_filter_without_a_temperature_is_refused(tiny_qwen3_path, capsys, command, flags, named) -> None:
    """``--top-k`` / ``--top-p`` filter sampling; at the default ``--temperature 0`` the run decoded greedily with them
    ignored, exit 0. Refused in one line naming the flag, before any model loads; with a temperature they run."""
    from eval.__main__ import main as eval_main
    from infer.__main__ import main as infer_main

    if command == "infer":
        assert infer_main(["--target", "never-loaded", "--prompt", "hi", *flags]) == 2
    else:
        assert eval_main(["mtbench", "--target", "never-loaded", "--drafter", "pld", "--num-questions", "1", *flags]) == 2
    error = last_error(capsys)
    assert named in error and "--temperature 0" in error and "never-loaded" not in error, error
    assert infer_main(["--target", tiny_qwen3_path, "--prompt", "hi", "--max-new-tokens", "2", "--temperature", "0.7", *flags]) == 0
