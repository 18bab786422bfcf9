"""The cached DFlash drafter (``models/dflash.py``) against the training forward, and the sliding
buffer against a full cache under the same windowed mask.

Reference for a block anchored at a: ``DFlashDraftModel.forward`` (the training path) on the
features of positions 0..a-1 with one anchor and the training masks of ``models/dflash.py``.
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import Qwen3Config

from models.dflash import DFlashDrafter
from models.target import ContextKV
from models.dflash import LayerMaskSpec, dense_mask
from models.dflash import DFlashDraftModel, make_dflash_config

VOCAB, HIDDEN = 96, 32

pytestmark = pytest.mark.usefixtures("single_cpu_thread")


def make_drafter(layer_types, window, block_size=4, block_causal=True, seed=0) -> tuple[DFlashDraftModel, torch.nn.Embedding, torch.nn.Linear]:
    torch.manual_seed(seed)
    target = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=48, num_hidden_layers=8, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=512)
    config = make_dflash_config(target, num_hidden_layers=len(layer_types), block_size=block_size, mask_token_id=5,
                                target_layer_ids=[1, 3], layer_types=layer_types, sliding_window=window, sliding_block_causal=block_causal)
    model = DFlashDraftModel(config).eval()
    for p in model.parameters():  # larger weights than the init's 0.02, so the window matters in the logits
        p.data.normal_(0, 0.3) if p.dim() > 1 else None
    return model, torch.nn.Embedding(VOCAB, HIDDEN), torch.nn.Linear(HIDDEN, VOCAB, bias=False)


def training_logits(model, embed, lm_head, features, token, anchor, window):
    cfg = model.config
    specs = {"full_attention": LayerMaskSpec(None, False),
             "sliding_attention": LayerMaskSpec(window, cfg.sliding_block_causal)}
    b = model.block_size
    block = torch.tensor([[token] + [model.mask_token_id] * (b - 1)])
    anchors = torch.tensor([[anchor]])
    masks = {name: dense_mask(anchors, torch.ones(1, anchor, dtype=torch.bool), b, spec) for name, spec in specs.items()}
    with torch.no_grad():
        hidden = model(embed(block), features[None, :anchor], torch.arange(anchor, anchor + b)[None], masks)
        return lm_head(hidden)[0, 1:]


def walk(drafter: DFlashDrafter, features: torch.Tensor, first_chunk: int, seed: int):
    """Prefill in chunks, then alternate drafting and appending 1..B accepted positions, as the loop does."""
    rng = random.Random(seed)
    total = features.shape[0]
    drafter.reset(total + drafter.block_size)
    pos = 0
    while pos < first_chunk:
        n = min(7, first_chunk - pos)
        drafter.append_context(features[pos:pos + n], pos)
        pos += n
    while pos < total:
        token = rng.randrange(6, VOCAB)
        yield pos, token, drafter.draft_logits(torch.tensor(token), pos)
        n = min(rng.randint(1, drafter.block_size), total - pos)
        drafter.append_context(features[pos:pos + n], pos)
        pos += n


@pytest.mark.parametrize("layer_types,trained_window,block_causal,override", [
    (["sliding_attention", "full_attention"], 6, True, "trained"),
    (["sliding_attention", "sliding_attention"], 6, False, "trained"),
    (["sliding_attention", "full_attention"], 6, True, None),
    (["sliding_attention", "full_attention"], 6, True, 11),
    (["sliding_attention"], 6, True, 3),  # window smaller than the block
    (["sliding_attention"], 6, False, 2),
    (["full_attention", "full_attention"], None, False, "trained"),
    (["sliding_attention"], 6, True, 1),
])
@pytest.mark.parametrize("keep_slack", [1, 5, 10_000])  # compacting every append, now and then, never
def test_cached_drafting_equals_training_forward(layer_types, trained_window, block_causal, override, keep_slack) -> None:
    model, embed, lm_head = make_drafter(layer_types, trained_window, block_causal=block_causal)
    window = trained_window if override == "trained" else override
    drafter = DFlashDrafter(model, embed, lm_head, window=override, keep_slack=keep_slack)
    features = torch.randn(60, 2 * HIDDEN)
    checked = 0
    for anchor, token, got in walk(drafter, features, first_chunk=19, seed=1):
        want = training_logits(model, embed, lm_head, features, token, anchor, window)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        checked += 1
    assert checked >= 10
    if window is not None and keep_slack < 100 and "sliding_attention" in layer_types:
        sliding = drafter.caches[layer_types.index("sliding_attention")]
        assert sliding.capacity < 60 and sliding.first_pos > 0  # it really dropped old positions


def test_sliding_buffer_equals_full_cache_with_windowed_mask() -> None:
    """Same drafter, same window: a cache that keeps W-1 positions vs one that keeps all of them."""
    model, embed, lm_head = make_drafter(["sliding_attention", "sliding_attention"], 8, block_size=4)
    features = torch.randn(200, 2 * HIDDEN)
    ring = DFlashDrafter(model, embed, lm_head, keep_slack=3)
    full = DFlashDrafter(model, embed, lm_head, keep_slack=10_000)
    for (a1, t1, got), (a2, t2, want) in zip(walk(ring, features, 50, seed=3), walk(full, features, 50, seed=3)):
        assert (a1, t1) == (a2, t2)
        assert torch.equal(got, want)
    assert max(c.capacity for c in ring.caches) == 7 + 3 and all(c.capacity == 204 for c in full.caches)


def test_context_buffer_keeps_the_last_positions() -> None:
    cache = ContextKV(num_kv_heads=1, head_dim=1, capacity=6, keep=4, block_size=2, dtype=torch.float32, device=torch.device("cpu"))
    pos = 0
    for n in [3, 2, 1, 5, 9, 1, 2]:
        values = torch.arange(pos, pos + n, dtype=torch.float32)[:, None, None]
        cache.append(values, values)
        pos += n
        assert cache.end_pos == pos
        k, _ = cache.with_block(torch.full((2, 1, 1), -1.0), torch.full((2, 1, 1), -1.0), from_pos=pos - 4)
        assert k.flatten().tolist() == [float(p) for p in range(max(pos - 4, 0), pos)] + [-1.0, -1.0]


def test_bad_window_is_refused() -> None:
    model, embed, lm_head = make_drafter(["sliding_attention"], 6)
    with pytest.raises(ValueError, match="window=0"):
        DFlashDrafter(model, embed, lm_head, window=0)


def test_a_broken_drafter_folder_is_one_line(tmp_path) -> None:
    """config.json fields of the wrong type, and a model.safetensors that is truncated, short of a tensor or mis-shaped, used
    to end in a traceback, or (a missing tensor) in a drafter drafting from random weights."""
    import json

    from safetensors.torch import load_file, save_file

    from infer.loading import load_drafter_model, read_drafter_config

    model, _, _ = make_drafter(["sliding_attention"], 16)
    good = tmp_path / "good"
    model.save_pretrained(good)
    config = json.loads((good / "config.json").read_text())

    def folder(name, config_text=None, weights=None, raw=None):
        path = tmp_path / name
        model.save_pretrained(path)
        if config_text is not None:
            (path / "config.json").write_text(config_text)
        if weights is not None:
            save_file(weights, str(path / "model.safetensors"))
        if raw is not None:
            (path / "model.safetensors").write_bytes(raw)
        return path

    with pytest.raises(ValueError, match=r"config\.json: a JSON list; expected an object"):
        read_drafter_config(folder("list", "[1, 2]"))
    no_ids = {**config, "dflash_config": {k: v for k, v in config["dflash_config"].items() if k != "target_layer_ids"}}
    with pytest.raises(ValueError, match=r"dflash_config\.target_layer_ids=None; expected a non-empty list"):
        read_drafter_config(folder("no_ids", json.dumps(no_ids)))
    with pytest.raises(ValueError, match=r"dflash_config='x'; expected an object"):
        read_drafter_config(folder("str", json.dumps({**config, "dflash_config": "x"})))
    with pytest.raises(ValueError, match=r"drafter .*config\.json: a file, not a folder"):
        read_drafter_config(good / "config.json")

    weights = load_file(good / "model.safetensors")
    cases = {
        "truncated": (dict(raw=(good / "model.safetensors").read_bytes()[:5000]), r"not a readable safetensors file .*truncated or corrupt"),
        "missing": (dict(weights={k: v for k, v in weights.items() if k != "fc.weight"}), r"missing tensor 'fc\.weight'"),
        "shape": (dict(weights={**weights, "norm.weight": torch.ones(7)}), r"tensor 'norm\.weight' has shape \(7,\), expected \(32,\)"),
        "extra": (dict(weights={**weights, "extra.weight": torch.ones(2)}), r"unexpected tensor 'extra\.weight'"),
    }
    for name, (change, message) in cases.items():
        with pytest.raises(ValueError, match=message):
            load_drafter_model(folder(name, **change), config, torch.float32)
    (folder("none") / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"no model\.safetensors there"):
        load_drafter_model(tmp_path / "none", config, torch.float32)
    assert load_drafter_model(good, read_drafter_config(good), torch.float32).fc.weight.shape == (32, 64)


def test_a_drafter_config_out_of_range_is_one_line_at_load(tmp_path) -> None:
    """Fields of the right type but out of range loaded silently (the export refused them): ``sliding_window`` 0 or
    negative drafted NaN, a layer type other than the two ran as full attention (training refuses it), a sliding layer
    whose ``use_sliding_window`` was false or absent lost its window (Qwen3Config drops it), a mask token outside the
    vocabulary failed at the first draft, block size 1 was refused as a tree option, and EAGLE-3's missing
    ``layer_types`` or ``ttt_length`` 0 as an attribute error or "draft steps=None". Each is one line naming the field."""
    import json

    from infer.loading import read_drafter_config
    from models.eagle3 import Eagle3DraftModel, make_eagle3_config

    model, _, _ = make_drafter(["sliding_attention", "full_attention"], 6)
    eagle = Eagle3DraftModel(make_eagle3_config(model.config, num_hidden_layers=2, target_layer_ids=[1, 3, 4],
                                                layer_types=["sliding_attention", "full_attention"], sliding_window=6,
                                                draft_vocab_size=64, ttt_length=3))

    def folder(name, drafter, **edits):
        path = tmp_path / name
        drafter.save_pretrained(path)
        config = json.loads((path / "config.json").read_text())
        for key, value in edits.items():
            where = config["dflash_config"] if key.startswith("dflash_config.") else config
            key = key.removeprefix("dflash_config.")
            where.pop(key) if value is ... else where.__setitem__(key, value)
        (path / "config.json").write_text(json.dumps(config))
        return path

    cases = [
        (model, dict(sliding_window=0), r"sliding_window=0; expected a positive integer"),
        (model, dict(sliding_window=-4), r"sliding_window=-4; expected a positive integer"),
        (eagle, dict(sliding_window=0), r"sliding_window=0; expected a positive integer"),
        (model, dict(layer_types=["chunked_attention", "full_attention"]), r"layer_types=\['chunked_attention', .*; expected a list"),
        (eagle, dict(layer_types=["chunked_attention", "full_attention"]), r"layer_types=.*; expected a list"),
        (eagle, dict(layer_types=...), r"layer_types=None; expected a list of num_hidden_layers=2"),
        (model, dict(use_sliding_window=...), r"use_sliding_window=None; expected true where layer_types has sliding layers"),
        (model, dict(use_sliding_window=False), r"use_sliding_window=False; expected true"),
        (model, {"dflash_config.mask_token_id": VOCAB}, rf"dflash_config\.mask_token_id={VOCAB}; expected a token id in 0\.\.{VOCAB - 1}"),
        (model, {"dflash_config.mask_token_id": -1}, r"dflash_config\.mask_token_id=-1; expected a token id"),
        (model, {"dflash_config.block_size": 1}, r"dflash_config\.block_size=1; expected an integer >= 2"),
        (eagle, dict(ttt_length=0), r"ttt_length=0; expected a positive integer"),
        # found by review (2026-12-06's sixth session): "yes" read as true; EAGLE-3's blamed on the weights (a missing fc_norm)
        (model, dict(sliding_block_causal="yes"), r"sliding_block_causal='yes'; expected true, false or absent"),
        (eagle, dict(fc_norm="yes"), r"fc_norm='yes'; expected true, false or absent"),
        (eagle, dict(norm_output="false"), r"norm_output='false'; expected true, false or absent"),
    ]
    for i, (drafter, edits, message) in enumerate(cases):
        with pytest.raises(ValueError, match=r"config\.json: " + message):
            read_drafter_config(folder(f"case{i}", drafter, **edits))
    assert read_drafter_config(folder("good", model))["sliding_window"] == 6
    assert read_drafter_config(folder("good_eagle", eagle))["sliding_window"] == 6


def test_the_rule_builders_refuse_what_they_cannot_run() -> None:
    """The same rules where a model is built without the loader: an unknown layer type, a window below 1 and a sliding
    layer whose window Qwen3Config dropped are errors, not full attention or NaN."""
    from models.dflash import layer_attention
    from models.eagle3 import Eagle3DraftModel, layer_windows, make_eagle3_config

    model, _, _ = make_drafter(["sliding_attention", "full_attention"], 6)
    assert [r.window for r in layer_attention(model)] == [6, None]
    model.config.layer_types = ["chunked_attention", "full_attention"]
    with pytest.raises(ValueError, match=r"layer_types\[0\]='chunked_attention'; expected sliding_attention or full_attention"):
        layer_attention(model)
    model.config.layer_types = ["sliding_attention", "full_attention"]
    model.config.sliding_window = 0
    with pytest.raises(ValueError, match=r"sliding_window=0; expected a positive int"):
        layer_attention(model)
    model.config.sliding_window = None
    with pytest.raises(ValueError, match=r"sliding_window=None .*expected the window the sliding layers were trained with"):
        layer_attention(model)
    assert [r.window for r in layer_attention(model, None)] == [None, None]  # --window none: full attention asked for
    eagle = Eagle3DraftModel(make_eagle3_config(model.config, num_hidden_layers=2, target_layer_ids=[1, 3, 4],
                                                layer_types=["chunked_attention", "full_attention"], sliding_window=6,
                                                draft_vocab_size=64, ttt_length=3))
    with pytest.raises(ValueError, match=r"layer_types\[0\]='chunked_attention'"):
        layer_windows(eagle)
    eagle.config.layer_types, eagle.config.sliding_window = ["sliding_attention", "full_attention"], -4
    with pytest.raises(ValueError, match=r"sliding_window=-4; expected a positive int"):
        layer_windows(eagle)


def test_a_zlab_published_dflash_checkpoint_loads_as_zlab_reads_it(tmp_path) -> None:
    """z-lab's published DFlash checkpoints (Qwen3-4B/8B-DFlash-b16) keep block_size at the top level and dflash_config
    {mask_token_id, target_layer_ids}: refused before (no dflash_config.block_size). Now read where z-lab's own loader (PyPI
    dflash) reads them, giving the drafter that was saved; z-lab's variants we do not implement are refused in one line."""
    import json

    import dflash.model as zlab  # a dev dependency: a missing package fails, it does not skip

    from infer.loading import load_drafter_model, read_drafter_config

    model, embed, lm_head = make_drafter(["sliding_attention", "full_attention"], 16, block_size=8)
    saved = json.loads(json.dumps(model.config.to_dict()))

    def published(name: str, **changes) -> tuple:
        path = tmp_path / name
        model.save_pretrained(path)
        config = json.loads((path / "config.json").read_text())
        config["dflash_config"] = {k: v for k, v in config["dflash_config"].items() if k != "block_size"}  # z-lab's placement
        for key, value in changes.items():
            if value is None:
                config.pop(key, None)
            else:
                config[key] = value
        (path / "config.json").write_text(json.dumps(config))
        return path, config

    path, on_disk = published("zlab")
    assert "block_size" not in on_disk["dflash_config"] and on_disk["block_size"] == 8
    config = read_drafter_config(path)
    assert config["dflash_config"] == saved["dflash_config"]  # block_size 8 from the top level, as saved
    loaded = load_drafter_model(path, config, torch.float32).eval()
    theirs = zlab.DFlashDraftModel.from_pretrained(path, dtype=torch.float32)
    assert (loaded.block_size, loaded.mask_token_id, loaded.target_layer_ids) == (theirs.block_size, theirs.mask_token_id,
                                                                                 theirs.target_layer_ids) == (8, 5, [1, 3])
    features = torch.randn(40, 2 * HIDDEN)
    torch.testing.assert_close(training_logits(loaded, embed, lm_head, features, 7, 30, 16),
                               training_logits(model, embed, lm_head, features, 7, 30, 16), atol=0, rtol=0)

    path, _ = published("no_block_size", block_size=None)  # nowhere: z-lab's default, 16
    assert read_drafter_config(path)["dflash_config"]["block_size"] == 16 == zlab.DFlashDraftModel.from_pretrained(path).block_size
    path, _ = published("selector", dflash_config={**on_disk["dflash_config"], "selector_rank": 256})
    with pytest.raises(ValueError, match=r"config\.json: selector_rank=256, a z-lab DFlash variant this loop does not implement"):
        read_drafter_config(path)
    path, _ = published("softcap", final_logit_softcapping=20.0)
    with pytest.raises(ValueError, match=r"final_logit_softcapping=20\.0, a z-lab DFlash variant"):
        read_drafter_config(path)
    path, _ = published("dflash2", architectures=["DFlash2DraftModel"])
    with pytest.raises(ValueError, match=r"architectures \['DFlash2DraftModel'\]; this loop builds DFlash"):
        read_drafter_config(path)
