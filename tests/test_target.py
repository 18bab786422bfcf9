"""Target features: captured layer i == the model's own hidden_states[i + 1], bit for bit."""

from __future__ import annotations

import pytest
import torch

from train.data.chat import ChatRenderer
from train.data.readers import read_conversations
from train.data.dataset import collate_padded, resolve_source
from models.target import TargetModel, default_layer_ids


@pytest.fixture(scope="module")
def reference_target(reference_target_path) -> TargetModel:
    return TargetModel.from_pretrained(str(reference_target_path), "cpu")


def padded_batch(target: TargetModel, n: int = 3, max_len: int = 200) -> dict[str, torch.Tensor]:
    conversations, _ = read_conversations(resolve_source("builtin:sharegpt-sample"), max_records=n)
    renderer = ChatRenderer(target.tokenizer)
    rows = []
    for c in conversations:
        tok = renderer.tokenize(c.messages)
        rows.append({"input_ids": tok.input_ids[:max_len], "loss_mask": tok.loss_mask[:max_len]})
    assert len({len(r["input_ids"]) for r in rows}) > 1, "want rows of different lengths (padding)"
    return collate_padded(rows, target.tokenizer.pad_token_id)


def test_layer_id_defaults() -> None:
    assert default_layer_ids("dflash", 36, 5) == [1, 9, 17, 25, 33]  # z-lab Qwen3-8B-DFlash-b16
    assert default_layer_ids("dflash", 8, 1) == [4]
    assert default_layer_ids("eagle3", 32) == [1, 15, 28]  # Llama-3.1-8B: hidden_states 2, 16, 29
    assert default_layer_ids("eagle3", 8) == [1, 3, 4]
    with pytest.raises(ValueError, match="drafter='medusa'"):
        default_layer_ids("medusa", 8)


@pytest.mark.parametrize("drafter,k", [("eagle3", None), ("dflash", 5), ("dflash", 3)])
def test_capture_equals_hidden_states(reference_target: TargetModel, drafter: str, k: int | None) -> None:
    batch = padded_batch(reference_target)
    layer_ids = default_layer_ids(drafter, reference_target.num_layers, k)
    got = reference_target.capture(batch["input_ids"], layer_ids, attention_mask=batch["attention_mask"])
    with torch.no_grad():
        ref = reference_target.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
    H = reference_target.hidden_size
    assert got.features.shape == (*batch["input_ids"].shape, len(layer_ids) * H)
    for j, layer_id in enumerate(layer_ids):
        assert torch.equal(got.features[..., j * H : (j + 1) * H], ref.hidden_states[layer_id + 1]), layer_id
    assert got.logits is None


def test_capture_with_logits_and_unsorted_ids(reference_target: TargetModel) -> None:
    batch = padded_batch(reference_target, n=2)
    got = reference_target.capture(batch["input_ids"], [5, 0, 2], attention_mask=batch["attention_mask"], with_logits=True)
    with torch.no_grad():
        ref = reference_target.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
    H = reference_target.hidden_size
    for j, layer_id in enumerate([5, 0, 2]):
        assert torch.equal(got.features[..., j * H : (j + 1) * H], ref.hidden_states[layer_id + 1])
    assert torch.equal(got.logits, ref.logits)


def test_layers_after_the_deepest_never_run(reference_target: TargetModel) -> None:
    calls = []
    handles = [layer.register_forward_hook(lambda m, a, o, i=i: calls.append(i)) for i, layer in enumerate(reference_target.layers)]
    try:
        reference_target.capture(torch.tensor([[5, 6, 7]]), [1, 3])
    finally:
        for h in handles:
            h.remove()
    assert calls == [0, 1, 2, 3]


def test_bad_layer_ids(reference_target: TargetModel) -> None:
    for bad in ([7], [-1], []):  # 7 = last layer: HF reports it normed, so it is not a valid id
        with pytest.raises(ValueError, match=r"ids must lie in 0\.\.6"):
            reference_target.capture(torch.tensor([[5, 6]]), bad)


def test_embeddings_and_lm_head_exposed(reference_target: TargetModel) -> None:
    assert reference_target.embed_tokens.weight.shape == (8192, 512)
    assert reference_target.lm_head.weight.shape == (8192, 512)
    assert reference_target.model.dtype == torch.float32  # fp32 on CPU
    assert not any(p.requires_grad for p in reference_target.model.parameters())


def test_missing_target_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(ValueError, match="target.path=.*cannot load a causal LM"):
        TargetModel.from_pretrained(str(tmp_path / "nothing-here"))


def test_folder_that_is_not_a_model_is_a_one_line_error(tmp_path) -> None:
    """transformers' ValueError (five lines on the tokenizer, none naming target.path) used to pass through as it was."""
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"target.path=.*: cannot load a causal LM and tokenizer there \(") as e:
        TargetModel.from_pretrained(str(tmp_path))
    assert "\n" not in str(e.value)


def test_capture_leaves_the_model_whole(reference_target: TargetModel) -> None:
    """The cut stack is put back: a plain HF forward after capture (and after a failing one) is unchanged."""
    ids = torch.randint(0, reference_target.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    before = reference_target.model(input_ids=ids).logits
    layers, norm = reference_target.stack.layers, reference_target.stack.norm
    reference_target.capture(ids, [1])
    with pytest.raises(Exception):
        reference_target.capture(ids.float(), [2])  # float ids fail inside the cut stack
    assert reference_target.stack.layers is layers and reference_target.stack.norm is norm
    assert len(reference_target.stack.layers) == reference_target.num_layers
    torch.testing.assert_close(reference_target.model(input_ids=ids).logits, before, rtol=0, atol=0)


@pytest.mark.parametrize("one_pass", [True, False], ids=["document-mask", "pieces"])
def test_capture_segments_reads_each_piece_alone_from_position_zero(reference_target: TargetModel, one_pass: bool, monkeypatch) -> None:
    """data.pack_fresh_fraction and data.pack_documents: a packed row read in pieces equals each conversation captured
    on its own (the reference: the plain ``capture`` of that conversation alone), both in one document-masked pass and
    piece by piece (the path past ``DOCUMENT_MASK_BYTES``); a row of one segment in the same batch equals its plain
    capture at its real tokens; padding past the pieces is zero; ``final_hidden`` follows the features."""
    import models.target as target_module

    monkeypatch.setattr(target_module, "DOCUMENT_MASK_BYTES", 1 << 40 if one_pass else 0)
    passes = []
    real_capture = reference_target.capture
    monkeypatch.setattr(reference_target, "capture", lambda ids, *a, **k: passes.append((tuple(ids.shape), k.get("doc_start") is not None))
                        or real_capture(ids, *a, **k))
    convs = padded_batch(reference_target, n=3)
    lengths = convs["attention_mask"].sum(1).tolist()
    row = torch.cat([convs["input_ids"][i, :n] for i, n in enumerate(lengths)])  # three conversations packed
    width = row.shape[0] + 5  # and 5 tokens of padding
    ids = torch.zeros(2, width, dtype=torch.long)
    ids[0, :row.shape[0]] = row
    ids[1, :row.shape[0]] = row  # the same text read whole: its later conversations see the earlier ones
    mask = (torch.arange(width) < row.shape[0]).long().expand(2, width)
    layer_ids = [1, 3, 5]
    got = reference_target.capture_segments(ids, layer_ids, mask, [lengths, [row.shape[0]]], with_final_hidden=True)
    start = 0
    for i, n in enumerate(lengths):
        alone = reference_target.capture(convs["input_ids"][i:i + 1, :n], layer_ids, with_final_hidden=True)
        torch.testing.assert_close(got.features[0, start:start + n], alone.features[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.final_hidden[0, start:start + n], alone.final_hidden[0], atol=1e-5, rtol=1e-5)
        start += n
    assert got.features[0, start:].abs().sum() == 0 and got.final_hidden[0, start:].abs().sum() == 0
    assert passes[0] == ((2, width), True) if one_pass else all(not doc for _, doc in passes) and passes[0][0][0] == 3
    whole = reference_target.capture(ids[1:], layer_ids, attention_mask=mask[1:], with_final_hidden=True)
    torch.testing.assert_close(got.features[1, :start], whole.features[0, :start], atol=1e-5, rtol=1e-5)
    # read whole, the second conversation's features differ from its own (it has context): the pieces are not a no-op
    assert not torch.allclose(got.features[0, lengths[0]:lengths[0] + lengths[1]], whole.features[0, lengths[0]:lengths[0] + lengths[1]], atol=1e-3)
    with pytest.raises(ValueError, match="cover"):
        reference_target.capture_segments(ids, layer_ids, mask, [[width, 7], [1]])


def test_capture_segments_runs_past_the_compiled_capture(reference_target: TargetModel, monkeypatch) -> None:
    """``compile_capture``'s graph has static shapes, and the pieces of packed rows (their count and longest length,
    the whole rows' count) change every batch: each new shape compiled it again. ``capture_segments`` runs eagerly (a
    stand-in for the graph records every call; the plain ``capture`` of the same layers still takes it)."""
    calls = []
    width = len([1, 3]) * reference_target.config.hidden_size

    def graph(input_ids, attention_mask):  # compile_capture's features function, recorded
        calls.append(tuple(input_ids.shape))
        return input_ids.new_zeros(*input_ids.shape, width, dtype=torch.float32)

    monkeypatch.setattr(reference_target, "_compiled_capture", ([1, 3], {"on": False}, graph, graph), raising=False)
    batch = padded_batch(reference_target, n=3)
    lengths = batch["attention_mask"].sum(1).tolist()
    got = reference_target.capture_segments(batch["input_ids"], [1, 3], batch["attention_mask"], [[lengths[0] // 2, lengths[0] - lengths[0] // 2], [lengths[1]], [lengths[2]]])
    assert calls == [] and got.features[0, :lengths[0]].abs().sum() > 0
    reference_target.capture(batch["input_ids"], [1, 3])
    assert calls == [tuple(batch["input_ids"].shape)]


@pytest.mark.slow
def test_compiled_capture_equals_capture_without_recompiling(reference_target_path) -> None:
    """``compile_capture`` (one compiled graph for the features; hooks registered once) against HF's own
    ``output_hidden_states`` on two batches with other padding: the same features, one graph, no recompile, and a
    forward outside the compiled capture records nothing."""
    import torch._dynamo

    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")  # its own: hooks stay registered
    layer_ids = [3, 1, 5]
    target.compile_capture(layer_ids)
    batch = padded_batch(target)
    shorter = {k: v.clone() for k, v in batch.items()}
    shorter["attention_mask"][0, 40:] = 0
    with torch.no_grad():  # first: transformers' output_hidden_states leaves hooks of its own on the layers (a guard)
        refs = [target.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], output_hidden_states=True).hidden_states
                for b in (batch, shorter)]
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    H = target.hidden_size
    for b, ref in zip((batch, shorter), refs):
        got = target.capture(b["input_ids"], layer_ids, attention_mask=b["attention_mask"]).features
        for j, layer_id in enumerate(layer_ids):
            torch.testing.assert_close(got[..., j * H:(j + 1) * H], ref[layer_id + 1], rtol=1e-5, atol=1e-5, msg=str(layer_id))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert not torch._dynamo.utils.counters["graph_break"]
    # other layer ids and the logits take the hook path, and the once-registered hooks stay quiet there
    plain = target.capture(batch["input_ids"], [0, 2], attention_mask=batch["attention_mask"], with_logits=True)
    assert plain.logits is not None and plain.features.shape[-1] == 2 * H
    assert target._compiled_capture[1] == {"on": False}


@pytest.mark.parametrize("with_final_hidden", [False, True])
def test_trainer_capture_without_padding_mask_equals_masked_on_real_tokens(reference_target: TargetModel, with_final_hidden: bool) -> None:
    """The trainer reads the target with no padding mask (``StepContext.target_features``: SDPA keeps its causal
    kernels): on the right-padded batches ``collate_padded`` builds, every real token's features (and final hidden
    state) equal a masked forward's; only the pads' own differ. Left padding would break it (checked: the rule is
    the padding side's, not the model's)."""
    from types import SimpleNamespace

    from train.trainer import StepContext

    batch = padded_batch(reference_target)
    layer_ids = default_layer_ids("dflash", reference_target.num_layers, 3)
    ctx = SimpleNamespace(store=None, target=reference_target, layer_ids=layer_ids, device=torch.device("cpu"))
    got = StepContext.target_features(ctx, batch, with_final_hidden=with_final_hidden)
    ref = reference_target.capture(batch["input_ids"], layer_ids, attention_mask=batch["attention_mask"], with_final_hidden=with_final_hidden)
    real = batch["attention_mask"].bool()
    assert not real.all(), "want padding"
    torch.testing.assert_close(got.features[real], ref.features[real], rtol=1e-5, atol=1e-5)
    if with_final_hidden:
        torch.testing.assert_close(got.final_hidden[real], ref.final_hidden[real], rtol=1e-5, atol=1e-5)
    # the same batch padded on the left: without the mask its real tokens read the pads, so they differ
    lengths = batch["attention_mask"].sum(1)
    shift = [int(batch["input_ids"].shape[1] - n) for n in lengths]
    left = {k: torch.stack([v[i].roll(s) for i, s in enumerate(shift)]) for k, v in batch.items() if isinstance(v, torch.Tensor)}
    unmasked = reference_target.capture(left["input_ids"], layer_ids).features
    masked = reference_target.capture(left["input_ids"], layer_ids, attention_mask=left["attention_mask"]).features
    assert not torch.allclose(unmasked[left["attention_mask"].bool()], masked[left["attention_mask"].bool()], atol=1e-3)


def test_capture_without_padding_mask_builds_no_mask_where_the_stack_takes_prebuilt_masks(reference_target: TargetModel,
                                                                                         monkeypatch) -> None:
    """With no padding mask (the trainer's captures) a Qwen3 stack gets ``{"full_attention": None}``: transformers builds
    no mask, so it never checks the position ids for packed sequences on the host (``find_packed_sequence_indices``: a
    GPU synchronisation per forward), and SDPA runs causal. The same features, final hidden state and logits as a
    forward given an all-ones padding mask (a mask transformers builds). A Llama stack, which builds its mask itself,
    keeps the check (counted), with the same results."""
    import transformers.masking_utils as masking
    from transformers import LlamaConfig, LlamaForCausalLM

    from models.target import takes_prebuilt_masks

    calls = []
    original = masking.find_packed_sequence_indices
    monkeypatch.setattr(masking, "find_packed_sequence_indices", lambda *a, **k: calls.append(1) or original(*a, **k))
    ids = padded_batch(reference_target)["input_ids"][:, :64]  # rows without padding inside the first 64 tokens
    ones = torch.ones_like(ids)
    llama_model = LlamaForCausalLM(LlamaConfig(vocab_size=reference_target.vocab_size, hidden_size=64, intermediate_size=128,
                                               num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                               attn_implementation="sdpa")).eval()
    llama = TargetModel(llama_model, reference_target.tokenizer, "llama-random")
    for target, prebuilt in ((reference_target, True), (llama, False)):
        assert takes_prebuilt_masks(type(target.stack)) is prebuilt
        for options in ({}, {"with_final_hidden": True}, {"with_logits": True}):
            calls.clear()
            got = target.capture(ids, [1, 2], **options)
            assert bool(calls) is not prebuilt, (type(target.stack).__name__, options)
            want = target.capture(ids, [1, 2], attention_mask=ones, **options)
            for name in ("features", "final_hidden", "logits"):
                if getattr(want, name) is not None:
                    torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=1e-5, atol=1e-5, msg=name)


def test_causal_sdpa_mask_is_dropped_only_for_a_whole_unpadded_causal_pass() -> None:
    """``CAUSAL_SDPA``'s mask function: None (SDPA's is_causal) only inside ``whole_causal_pass()`` and there only with
    no padding mask, no offsets, as many queries as keys and no window (transformers' compiled tracing passes
    allow_is_causal_skip=False: it is not read); every other call gets SDPA's own mask, the same tensor."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, causal_mask_function

    from models.target import CAUSAL_SDPA, register_causal_sdpa, whole_causal_pass

    assert register_causal_sdpa()
    ours, sdpa = ALL_MASK_ATTENTION_FUNCTIONS[CAUSAL_SDPA], ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]
    base = dict(batch_size=2, q_length=6, kv_length=6, q_offset=0, kv_offset=0, mask_function=causal_mask_function,
                attention_mask=None, allow_is_causal_skip=False, device="cpu")
    with whole_causal_pass():
        assert ours(**base) is None
    assert torch.equal(ours(**base), sdpa(**base))  # outside the scope: SDPA's mask
    padding = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    for change in (dict(attention_mask=padding), dict(q_length=2, q_offset=4), dict(local_size=3)):
        kwargs = {**base, **change}
        with whole_causal_pass():
            got = ours(**kwargs)
        want = sdpa(**kwargs)
        assert got is not None and torch.equal(got, want), change


@pytest.mark.slow  # compiles the capture on the CPU (~40 s): the quick tier stays under 3 minutes (README)
def test_compiled_capture_without_a_mask_runs_causal_and_keeps_masks_when_given(reference_target_path) -> None:
    """After ``compile_capture`` (the model on ``CAUSAL_SDPA``): the compiled capture of a right-padded batch with no
    padding mask equals HF's masked ``output_hidden_states`` on every real token (with the final hidden state too,
    EAGLE-3's capture), and a plain forward with a left-padding mask still honours the mask (equal to a fresh SDPA
    model's)."""
    from models.target import CAUSAL_SDPA

    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    fresh = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    layer_ids = [1, 4]
    target.compile_capture(layer_ids)
    assert target.config._attn_implementation == CAUSAL_SDPA
    batch = padded_batch(target)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        ref = fresh.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True).hidden_states
    got = target.capture(batch["input_ids"], layer_ids).features
    H = target.hidden_size
    for j, layer_id in enumerate(layer_ids):
        torch.testing.assert_close(got[..., j * H:(j + 1) * H][real], ref[layer_id + 1][real], rtol=1e-5, atol=1e-5)
    # EAGLE-3's capture (with_final_hidden) compiled too: every layer and the final norm, against a fresh model's masked one
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    with_final = target.capture(batch["input_ids"], layer_ids, with_final_hidden=True)
    assert counters["stats"]["unique_graphs"] == graphs + 1  # its own graph, not the eager stack
    fresh_final = fresh.capture(batch["input_ids"], layer_ids, attention_mask=batch["attention_mask"], with_final_hidden=True)
    torch.testing.assert_close(with_final.features[real], fresh_final.features[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(with_final.final_hidden[real], fresh_final.final_hidden[real], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(with_final.final_hidden[real], with_final.features[..., -H:][real], atol=1e-3)  # past layer 4, normed
    assert target._compiled_capture[1] == {"on": False}
    shift = [int(batch["input_ids"].shape[1] - n) for n in batch["attention_mask"].sum(1)]
    left = {k: torch.stack([v[i].roll(s) for i, s in enumerate(shift)]) for k, v in batch.items() if isinstance(v, torch.Tensor)}
    with torch.no_grad():
        mine = target.model(input_ids=left["input_ids"], attention_mask=left["attention_mask"]).logits
        theirs = fresh.model(input_ids=left["input_ids"], attention_mask=left["attention_mask"]).logits
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
