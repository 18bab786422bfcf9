"""The builtin tiny targets: built from shipped weights (models/builtin_weights/), which are what ``pretrain``
makes, and only when the tokenizer rebuilt here reads the sample as the one they were trained with."""

from __future__ import annotations

import logging

import pytest
import torch

from models import builtin_targets as bt


def sample_loss(model, tokenizer, rows: int = 8, seq_len: int = 256) -> float:
    stream = bt.sample_stream(tokenizer)
    batch = torch.tensor(stream[: rows * seq_len]).view(rows, seq_len)
    with torch.no_grad():
        return float(model(input_ids=batch, labels=batch).loss)


@pytest.mark.parametrize("name", list(bt.TINY_MODELS))
def test_shipped_weights_are_a_trained_model(name: str) -> None:
    """Loaded into build_model, the shipped weights predict the sample far better than the random init they replace
    (ln 1024 = 6.93 nats is a uniform guess), and their README loss is the one recorded when they were trained."""
    style, arch = bt.TINY_MODELS[name]
    tokenizer = bt.build_tokenizer(style)
    model = bt.build_model(arch, tokenizer).eval()
    untrained = sample_loss(model, tokenizer)
    final_loss = bt.load_shipped_weights(name, model, tokenizer)
    trained = sample_loss(model, tokenizer)
    assert untrained > 6.5 and trained < 5.5, (untrained, trained)
    assert final_loss == pytest.approx({"tiny-qwen3": 5.03, "tiny-llama3": 4.36}[name])
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied after loading


def test_other_ids_for_the_sample_refuse_the_weights_loudly(caplog) -> None:
    """Weights are only valid for the ids they were trained on: a tokenizer that reads the sample otherwise (here the
    llama3 style's, the same vocabulary size) gets no weights, a warning naming the file, and the model untouched."""
    tokenizer = bt.build_tokenizer("llama3")
    model = bt.build_model("qwen3", tokenizer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with caplog.at_level(logging.WARNING, logger=bt.__name__):
        assert bt.load_shipped_weights("tiny-qwen3", model, tokenizer) is None
    assert str(bt.shipped_weights("tiny-qwen3")) in caplog.text and "training the model here instead" in caplog.text
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.slow  # ~5 s on one core (it trains); the weights ship, the quick tier checks them
def test_missing_weights_fall_back_to_training(tmp_path, monkeypatch, caplog) -> None:
    """Without shipped weights the build trains the model (here for a few steps, cut short): the loss falls."""
    monkeypatch.setattr(bt, "SHIPPED_WEIGHTS", tmp_path / "none")
    calls = []
    real = bt.pretrain

    def short_pretrain(model, tokenizer, **kw):
        calls.append(sample_loss(model, tokenizer))
        loss = real(model, tokenizer, steps=12, seq_len=64, batch_size=8)
        calls.append(sample_loss(model, tokenizer))
        return loss

    monkeypatch.setattr(bt, "pretrain", short_pretrain)
    with caplog.at_level(logging.WARNING, logger=bt.__name__):
        out = bt.build_tiny_target("tiny-qwen3", tmp_path / "built")
    assert "no shipped weights" in caplog.text and (out / "config.json").is_file()
    assert calls[1] < calls[0] - 0.3, calls


@pytest.mark.slow  # and long: only with -m long (the quick tier's -m "not slow" replaces the default -m)
@pytest.mark.long
def test_pretrain_remakes_the_shipped_weights(tmp_path, monkeypatch) -> None:
    """``write-weights`` retrains tiny-qwen3 as the first build did (~4 min on one core): the same final loss and
    sample loss as the shipped weights, to float noise between CPUs (the shipped ones were trained on another)."""
    shipped = bt.shipped_weights("tiny-qwen3")
    tokenizer = bt.build_tokenizer("chatml")
    reference = bt.build_model("qwen3", tokenizer).eval()
    reference_final = bt.load_shipped_weights("tiny-qwen3", reference, tokenizer)
    monkeypatch.setattr(bt, "SHIPPED_WEIGHTS", tmp_path)
    assert bt.main(["write-weights", "tiny-qwen3"]) == 0
    remade = bt.build_model("qwen3", tokenizer).eval()
    remade_final = bt.load_shipped_weights("tiny-qwen3", remade, tokenizer)
    assert shipped.parent != tmp_path and remade_final == pytest.approx(reference_final, abs=0.05)
    assert sample_loss(remade, tokenizer) == pytest.approx(sample_loss(reference, tokenizer), abs=0.05)


def test_a_build_input_that_changes_names_another_folder(monkeypatch) -> None:
    """A builtin target's folder is named by its version and a digest of what its content depends on (this module's
    code, the reading and writing libraries' versions, the shipped weights): a tokenizers upgrade (whose pre-tokenizer can
    make the shipped weights inapplicable, the build then trained here) or a changed weights file builds a folder of its
    own, where the version alone kept reusing the old build."""
    bt.build_digest.cache_clear()
    before = bt.builtin_folder("tiny-qwen3")
    assert before.name.startswith(f"tiny-qwen3-v{bt.BUILD_VERSION}-") and before == bt.builtin_folder("tiny-qwen3")
    assert bt.builtin_folder("tiny-llama3") != before
    real = bt._version
    monkeypatch.setattr(bt, "_version", lambda dist: "99.0" if dist == "tokenizers" else real(dist))
    bt.build_digest.cache_clear()
    upgraded = bt.builtin_folder("tiny-qwen3")
    monkeypatch.setattr(bt, "_version", real)
    monkeypatch.setattr(bt, "shipped_weights", lambda name: bt.SAMPLE_DATA)  # another file's bytes as the weights
    bt.build_digest.cache_clear()
    reweighted = bt.builtin_folder("tiny-qwen3")
    monkeypatch.undo()
    bt.build_digest.cache_clear()  # the real inputs' digests for the tests after this one
    assert len({before, upgraded, reweighted}) == 3 and bt.builtin_folder("tiny-qwen3") == before
