"""Packed documents (``data.pack_documents``): several conversations in one training row, each read as if alone.

References, each independent of the code it checks: masks built element by element; the target's features of each
conversation captured on its own row; EAGLE-3's loss of each conversation on its own row (the packed row's loss must be
their sum, its label count theirs).
"""

from __future__ import annotations

import pytest
import torch

from models.target import TargetModel, document_mask, document_starts
from train.eagle3 import label_mask, ttt_dense_mask, ttt_loss, ttt_tile_structure, unroll
from test_eagle3_masks import reference_mask
from test_eagle3_train import small_drafter


def test_document_starts_by_hand() -> None:
    starts = document_starts([[3, 2], [4], []], 7)
    assert starts.tolist() == [[0, 0, 0, 3, 3, 5, 6], [0, 0, 0, 0, 4, 5, 6], [0, 1, 2, 3, 4, 5, 6]]
    with pytest.raises(ValueError, match=r"row 0: documents \[5, 3\] cover 8 tokens; the row holds 7"):
        document_starts([[5, 3]], 7)


@pytest.mark.parametrize("window", [None, 1, 3])
def test_document_mask_matches_a_mask_built_element_by_element(window: int | None) -> None:
    segments = [[4, 1, 3], [8], [2, 3]]
    starts = document_starts(segments, 9)
    got = document_mask(starts, window)
    assert got.shape == (3, 1, 9, 9)
    for b, lengths in enumerate(segments):
        doc = []  # each position's document number; padding positions one each
        for i, n in enumerate(lengths):
            doc += [i] * n
        doc += [100 + p for p in range(len(doc), 9)]
        for q in range(9):
            for k in range(9):
                want = k <= q and doc[k] == doc[q] and (window is None or q - k < window)
                assert bool(got[b, 0, q, k]) == want, (b, q, k)


def packed_rows(target: TargetModel, lengths: list[list[int]], width: int, seed: int = 0):
    """Rows of random token documents of ``lengths`` (each row right-padded to ``width``) and each document's ids."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    docs = []
    for b, row in enumerate(lengths):
        at = 0
        for n in row:
            doc = torch.randint(3, target.vocab_size, (n,), generator=generator)
            ids[b, at:at + n] = doc
            docs.append((b, at, doc))
            at += n
    return ids, docs


@pytest.mark.parametrize("which", ["reference-qwen3", "tiny-llama3", "reference-qwen3-eager", "tiny-gpt-oss"])
def test_capture_of_packed_documents_equals_each_document_alone(which: str, reference_target_path, tiny_llama3_path, tiny_gpt_oss_path) -> None:
    """One forward over packed rows with ``doc_start`` gives every document the features and final hidden state it has
    when captured alone on a row of its own: Qwen3's stack takes the masks prebuilt, Llama's (SmolLM2's architecture)
    builds them from the prepared 4D mask, the eager attention takes them as additive floats, and gpt-oss's sliding
    layers (window 8, with sinks) take a mask of their own, documents longer than the window."""
    path = {"tiny-llama3": tiny_llama3_path, "tiny-gpt-oss": tiny_gpt_oss_path}.get(which, reference_target_path)
    target = TargetModel.from_pretrained(str(path), "cpu", attn_implementation="eager" if which.endswith("eager") else "auto")
    lengths = [[7, 5, 9], [13], [4, 6]] if which != "tiny-gpt-oss" else [[11, 14], [25], [9, 12]]
    ids, docs = packed_rows(target, lengths, 25)
    layer_ids = [0, 1, 2]
    got = target.capture(ids, layer_ids, with_final_hidden=True, doc_start=document_starts(lengths, 25))
    for b, at, doc in docs:
        alone = target.capture(doc[None], layer_ids, with_final_hidden=True)
        torch.testing.assert_close(got.features[b, at:at + len(doc)], alone.features[0], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(got.final_hidden[b, at:at + len(doc)], alone.final_hidden[0], atol=2e-5, rtol=1e-5)
    # not a no-op: read whole, the second document's features differ (it sees the first)
    second = slice(lengths[0][0], lengths[0][0] + lengths[0][1])
    whole = target.capture(ids[:1], layer_ids)
    assert not torch.allclose(whole.features[0, second], got.features[0, second], atol=1e-3)



def test_packed_capture_restarts_positions_at_each_document(tiny_llama3_path) -> None:
    """The stack's rotary embedding receives positions that restart at 0 at each document (found by review: plain
    positions passed every test, since RoPE's attention sees only relative positions; rope types that read the
    largest position, longrope and dynamic scaling, do not)."""
    target = TargetModel.from_pretrained(str(tiny_llama3_path), "cpu")
    lengths = [[7, 5, 9], [13], [4, 6]]
    ids, _ = packed_rows(target, lengths, 25)
    seen = []
    hook = target.stack.rotary_emb.register_forward_hook(lambda module, args, kwargs, out: seen.append(
        kwargs["position_ids"] if "position_ids" in kwargs else args[1]), with_kwargs=True)
    try:
        target.capture(ids, [0, 1], with_final_hidden=True, doc_start=document_starts(lengths, 25))
    finally:
        hook.remove()
    assert len(seen) == 1
    for b, row in enumerate(lengths):
        want = [p for n in row for p in range(n)]
        assert seen[0][b, :len(want)].tolist() == want, b


@pytest.mark.parametrize("documents", [True, False])
def test_only_packed_document_batches_carry_document_starts(documents: bool) -> None:
    """The trainer's collate adds ``doc_start`` to packed rows under ``data.pack_documents`` only: rows marked for
    ``data.pack_fresh_fraction`` hold several segments too, and there the drafter's attention spans the whole row
    (found by review: collating document starts for them passed every test)."""
    from compose import compose_train
    from train.config import to_train_config
    from train.trainer import StepContext

    extra = ["data.pack_documents=true"] if documents else ["data.pack_fresh_fraction=1.0"]
    cfg = to_train_config(compose_train(["experiment=eagle3_swa_tiny", "data.pack_length=2048"] + extra))
    context = StepContext(cfg, None, None, [], torch.device("cpu"))
    rows = [{"input_ids": list(range(3, 13)), "loss_mask": [1] * 10, "segments": [6, 4]},
            {"input_ids": list(range(3, 10)), "loss_mask": [1] * 7, "segments": [7]}]
    batch = context.collate(rows, 0)
    if documents:
        assert torch.equal(batch["doc_start"], document_starts([[6, 4], [7]], 10))
    else:
        assert "doc_start" not in batch and batch["segments"] == [[6, 4], [7]]

def test_targets_a_prepared_mask_cannot_serve_are_read_piece_by_piece() -> None:
    """A stack that builds its own sliding-window masks (Mistral with a window) and layers that read no attention mask
    (Qwen3-Next's linear attention) are refused by ``capture(doc_start=...)`` in one line, and ``capture_segments``
    reads their packed rows piece by piece instead, each piece equal to its document read alone."""
    import transformers

    from models.builtin_targets import build_tokenizer

    tokenizer = build_tokenizer("chatml")
    vocab = len(tokenizer)
    torch.manual_seed(0)
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, pad_token_id=0)
    models = {
        "mistral with a window": transformers.MistralForCausalLM(transformers.MistralConfig(**common, sliding_window=4)),
        "qwen3-next": transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(
            **common, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
            layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"])),
    }
    for name, model in models.items():
        model.config._attn_implementation = "sdpa"
        target = TargetModel(model.eval(), tokenizer, name)
        assert target.document_mask_refusal() is not None, name
        ids = torch.randint(3, vocab, (2, 12), generator=torch.Generator().manual_seed(1))
        with pytest.raises(ValueError, match="packed documents: "):
            target.capture(ids, [0, 1], doc_start=document_starts([[5, 7], [12]], 12))
        got = target.capture_segments(ids, [0, 1, 2], torch.ones_like(ids), [[5, 7], [12]])
        for start, n in ((0, 5), (5, 7)):
            alone = target.capture(ids[:1, start:start + n], [0, 1, 2], compiled=False)
            torch.testing.assert_close(got.features[0, start:start + n], alone.features[0], atol=1e-5, rtol=1e-5, msg=name)


def doc_reference_mask(valid: list[bool], starts: list[int], step: int, window: int | None) -> torch.Tensor:
    """``test_eagle3_masks.reference_mask`` with documents: a step-0 key u is visible to index t only in t's document."""
    mask = reference_mask(valid, step, window)
    seq_len = len(valid)
    for t in range(seq_len):
        for u in range(seq_len):
            if u < starts[t]:
                mask[t, u] = False  # step 0's keys; later steps' keys are at index t itself
    return mask


SEGMENTS = [[4, 3, 4], [5, 3], [11]]  # row 1 right-padded by 3


@pytest.mark.parametrize("window", [None, 1, 2, 4, 64])
@pytest.mark.parametrize("step", [0, 1, 3])
def test_ttt_dense_mask_with_documents_matches_the_reference(window: int | None, step: int) -> None:
    starts = document_starts(SEGMENTS, 11)
    ctx_valid = torch.arange(11)[None, :] < torch.tensor([[11], [8], [11]])
    dense = ttt_dense_mask(ctx_valid, step, window, starts)
    for b in range(3):
        assert torch.equal(dense[b, 0], doc_reference_mask(ctx_valid[b].tolist(), starts[b].tolist(), step, window)), (b, step, window)


@pytest.mark.parametrize("window", [None, 1, 3, 5, 40])
@pytest.mark.parametrize("tile", [1, 3, 4, 8])
def test_tile_structure_with_documents_equals_the_dense_masks_tiles(window: int | None, tile: int) -> None:
    """The kept and full tiles with documents are exactly those of the element-by-element mask (flex runs the mask
    inside kept tiles and skips it in full ones: a full tile with a hidden pair would leak across documents)."""
    seq_len = 13
    segments = [[5, 4, 4], [2, 6], [13], [1, 1, 1]]
    starts = document_starts(segments, seq_len)
    ctx_valid = torch.arange(seq_len)[None, :] < torch.tensor([[13], [8], [13], [3]])
    for step in range(4):
        kept, full = ttt_tile_structure(ctx_valid, step, window, tile, starts)
        dense = ttt_dense_mask(ctx_valid, step, window, starts)[:, 0].float()
        q_tiles, kv_tiles = kept.shape[1:]
        padded = torch.nn.functional.pad(dense, (0, kv_tiles * tile - dense.shape[2], 0, q_tiles * tile - seq_len), value=-1)
        tiles = padded.view(4, q_tiles, tile, kv_tiles, tile).transpose(2, 3).flatten(3)
        assert torch.equal(kept, (tiles == 1).any(-1)), (step, window, tile)
        assert torch.equal(full, ((tiles == 1) | (tiles < 0)).all(-1) & (tiles == 1).any(-1)), (step, window, tile)


@pytest.mark.parametrize("layer_types", [["full_attention", "sliding_attention"], ["sliding_attention"]])
def test_eagle3_unroll_on_flex_block_masks_with_documents_gives_the_dense_masks_outputs(layer_types: list[str]) -> None:
    """The TTT unroll on flex's block masks (``step_masks``; eager flex on the CPU, the CUDA test runs the compiled
    kernels) gives the dense SDPA masks' outputs on packed documents (found by review: dropping the documents from the
    flex masks passed every CPU test)."""
    from train.eagle3 import unroll

    model = small_drafter(layer_types, 4)
    generator = torch.Generator().manual_seed(0)
    segments, width = [[6, 5, 7], [9, 4]], 20
    ids = torch.randint(0, 40, (2, width), generator=generator)
    features = torch.randn(2, width, 96, generator=generator)
    ctx_valid = torch.arange(width)[None, :] < torch.tensor([[18], [13]])
    starts = document_starts(segments, width)
    with torch.no_grad():
        dense = unroll(model, features, ids, ctx_valid, 3, backend="sdpa", doc_start=starts)
        flex = unroll(model, features, ids, ctx_valid, 3, backend="flex", doc_start=starts)
        whole = unroll(model, features, ids, ctx_valid, 3, backend="sdpa")
    assert not torch.allclose(whole[1][ctx_valid], dense[1][ctx_valid], atol=1e-3)  # the documents matter here
    for j, (a, b) in enumerate(zip(dense, flex)):
        torch.testing.assert_close(b[ctx_valid], a[ctx_valid], atol=1e-5, rtol=1e-5, msg=f"step {j}")


@pytest.mark.parametrize("layer_types,window", [(["sliding_attention"], 4), (["full_attention", "sliding_attention"], 2)])
@torch.no_grad()
def test_eagle3_loss_of_packed_documents_is_the_sum_of_each_alone(layer_types: list[str], window: int) -> None:
    """The TTT unroll and loss over rows of packed documents equal the same documents each on a row of its own: the
    loss sums, label counts, per-step correct counts and accepted chains add up (sdpa's dense masks; labels past a
    document's end are none, so a document's last tokens never learn the next one's first)."""
    model = small_drafter(layer_types, window)
    generator = torch.Generator().manual_seed(4)
    lengths, width, steps = [[6, 5, 7], [9, 4]], 20, 3
    ids = torch.zeros(2, width, dtype=torch.long)
    features = torch.zeros(2, width, 96)
    target_logits = torch.zeros(2, width, 40)
    loss_mask = torch.zeros(2, width, dtype=torch.long)
    docs = []
    for b, row in enumerate(lengths):
        at = 0
        for n in row:
            piece = (torch.randint(0, 40, (n,), generator=generator), torch.randn(n, 96, generator=generator),
                     torch.randn(n, 40, generator=generator), (torch.rand(n, generator=generator) < 0.8).long())
            piece[3][0] = 1  # a document's first token labelled: it must not become the previous document's label
            ids[b, at:at + n], features[b, at:at + n], target_logits[b, at:at + n], loss_mask[b, at:at + n] = piece
            docs.append(piece)
            at += n
    attention_mask = (torch.arange(width)[None, :] < torch.tensor([[18], [13]])).long()
    starts = document_starts(lengths, width)
    outputs = unroll(model, features, ids, attention_mask.bool(), steps, doc_start=starts)
    packed = ttt_loss(model, outputs, target_logits, ids, loss_mask, attention_mask, doc_start=starts)
    alone = None
    for doc_ids, doc_features, doc_logits, doc_mask in docs:
        ones = torch.ones(1, len(doc_ids), dtype=torch.long)
        out = unroll(model, doc_features[None], doc_ids[None], ones.bool(), steps)
        stats = ttt_loss(model, out, doc_logits[None], doc_ids[None], doc_mask[None], ones)
        alone = stats if alone is None else alone + stats
    for name in ("loss_sum", "num_labels", "step_loss", "step_correct", "step_count", "accepted_sum", "num_starts"):
        torch.testing.assert_close(getattr(packed, name), getattr(alone, name), rtol=1e-5, atol=1e-5, msg=name)
    # without the document boundaries the same rows count labels across them
    for j in range(steps):
        assert label_mask(ids, loss_mask, attention_mask, j).sum() > label_mask(ids, loss_mask, attention_mask, j, starts).sum()


def test_training_on_packed_documents_reads_fewer_rows_with_the_same_labels(tmp_path) -> None:
    """``python -m train ... data.pack_documents=true``: the run packs its conversations into fewer rows (its data summary
    and one epoch's steps), and its first batch holds as many labels as its conversations hold one per row (the same
    conversations: counted with the row-per-conversation label rule on each alone)."""
    import json

    from compose import compose_train
    from train.eagle3 import label_mask as one_label_mask
    from train.trainer import build, to_train_config, train

    common = ["experiment=eagle3_swa_tiny", "trainer.progress=false", "data.num_eval=16", "data.max_length=192", "trainer.eval_every=0",
              "trainer.export_formats=[]", "trainer.loop_eval_prompts=0", "trainer.batch_size=4"]
    packed = common + ["data.pack_documents=true", "data.pack_length=384"]
    run = build(to_train_config(compose_train(packed + [f"output_dir={tmp_path / 'build'}"])))
    summary = run.data_summary
    assert summary["train_packed_rows"] < summary["train_conversations"] / 1.5
    batch = run.next_micro_batches()[0]
    assert "doc_start" in batch and batch["input_ids"].shape == (4, 384)
    got = run.step.num_labels(batch, None)
    want = 0
    for b, lengths in enumerate(batch["segments"]):
        at = 0
        for n in lengths:
            ids, mask = batch["input_ids"][b:b + 1, at:at + n], batch["loss_mask"][b:b + 1, at:at + n]
            want += int(one_label_mask(ids, mask, torch.ones_like(ids), 0).sum())
            at += n
    assert int(got) == want > 0
    metrics = train(compose_train(packed + ["trainer.max_steps=3", "trainer.log_every=1", "data.num_eval=0", f"output_dir={tmp_path / 'run'}"]))
    history = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len([h for h in history if "train/loss" in h]) == 3 and metrics["steps"] == 3
    assert all(torch.isfinite(torch.tensor(h["train/loss"])) for h in history if "train/loss" in h)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_compiled_tile_structure_and_flex_unroll_with_documents() -> None:
    """On a GPU the flex masks' tiles come from the compiled ``ttt_tile_structure`` (dynamic shapes): with documents it
    equals the eager one; and the TTT unroll on flex's block masks gives the outputs of the dense sdpa masks (fp32)."""
    from train.eagle3 import tile_structure_fn

    compiled = tile_structure_fn("cuda")
    for seq_len, segments in ((13, [[5, 4, 4], [2, 6], [13]]), (300, [[120, 100, 80], [299], [1, 1, 1]]), (517, [[200, 317], [17, 400], [500]])):
        starts = document_starts(segments, seq_len)
        ctx_valid = torch.arange(seq_len)[None, :] < torch.tensor([[sum(s)] for s in segments])
        for step in range(3):
            for window in (None, 3, 64):
                want = ttt_tile_structure(ctx_valid, step, window, 4, starts)
                got = compiled(ctx_valid.cuda(), step, window, 4, starts.cuda())
                assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1]), (seq_len, step, window)
    from transformers import LlamaConfig

    from models.eagle3 import Eagle3DraftModel, build_draft_vocab, make_eagle3_config

    # flex's Triton kernels take head dimensions of 16 and up (small_drafter's are 8)
    target_config = LlamaConfig(vocab_size=40, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=512)
    config = make_eagle3_config(target_config, num_hidden_layers=1, target_layer_ids=[1, 2, 3], layer_types=["sliding_attention"],
                                sliding_window=64, draft_vocab_size=24)
    torch.manual_seed(0)
    model = Eagle3DraftModel(config).eval()
    model.set_draft_vocab(*build_draft_vocab({i: (i * 7) % 11 for i in range(40)}, 40, 24))
    model = model.cuda()
    generator = torch.Generator().manual_seed(6)
    segments, width = [[150, 90, 40], [256]], 300
    ids = torch.randint(0, 40, (2, width), generator=generator).cuda()
    features = torch.randn(2, width, 3 * 64, generator=generator).cuda()
    ctx_valid = (torch.arange(width)[None, :] < torch.tensor([[280], [256]])).cuda()
    starts = document_starts(segments, width).cuda()
    with torch.no_grad():
        dense = unroll(model, features, ids, ctx_valid, 3, backend="sdpa", doc_start=starts)
        flex = unroll(model, features, ids, ctx_valid, 3, backend="flex", doc_start=starts)
    for j, (a, b) in enumerate(zip(dense, flex)):
        torch.testing.assert_close(b[ctx_valid], a[ctx_valid], atol=2e-4, rtol=1e-4, msg=f"step {j}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_packed_capture_in_bf16_with_compiled_layers_equals_each_document_alone(reference_target_path) -> None:
    """The trainer's GPU capture (bf16, each layer compiled, SDPA with the prepared document mask) against each
    document captured alone the same way: equal to bf16's rounding."""
    target = TargetModel.from_pretrained(str(reference_target_path), "cuda", "bfloat16")
    target.compile_layers()
    lengths = [[300, 500, 200], [1024], [700, 1]]
    ids, docs = packed_rows(target, lengths, 1024)
    got = target.capture(ids.cuda(), [1, 3, 5], with_final_hidden=True, doc_start=document_starts(lengths, 1024).cuda())
    for b, at, doc in docs:
        alone = target.capture(doc[None].cuda(), [1, 3, 5], with_final_hidden=True)
        a, g = alone.features[0].float(), got.features[b, at:at + len(doc)].float()
        assert torch.nn.functional.cosine_similarity(a, g, dim=-1).min() > 0.999, (b, at)
        assert (a - g).abs().max() <= 0.05 * a.abs().max(), (b, at)


# ----------------------------------------------------------------------------- DFlash on packed documents

def dflash_doc_cases(seed: int = 3):
    """Rows of packed documents (right-padded), anchors drawn inside them (sorted, padded slots 0) and each anchor's
    document start."""
    generator = torch.Generator().manual_seed(seed)
    segments = [[20, 13, 17], [9, 31], [50]]
    width = 56
    starts = document_starts(segments, width)
    ctx_valid = torch.arange(width)[None, :] < torch.tensor([[sum(s)] for s in segments])
    anchors = torch.zeros(3, 7, dtype=torch.long)
    for row, lengths in enumerate(segments):
        picked = torch.randperm(sum(lengths) - 1, generator=generator)[:int(torch.randint(2, 8, (), generator=generator))].sort().values
        anchors[row, :len(picked)] = picked
    return anchors, ctx_valid, starts, starts.gather(1, anchors)


@pytest.mark.parametrize("spec_name", ["full", "sliding_causal_w5", "sliding_noncausal_w5", "sliding_w1", "sliding_w_ge_len"])
def test_dflash_masks_with_documents_match_the_reference_and_each_other(spec_name: str) -> None:
    """With each block's context starting at its anchor's document (``ctx_lo``): the dense mask equals the element-by-element
    reference with context keys before that start removed; the key intervals FlashAttention-4 runs equal it; the tile
    tables flex skips and trusts are exactly its tiles."""
    from swa_kernels.key_intervals import ctx_keys_for, dense_mask_from_intervals, dflash_key_intervals
    from models.dflash import dense_mask as dflash_dense_mask, dflash_tile_structure
    from test_dflash_masks import SPECS, reference_mask as dflash_reference

    spec, block = SPECS[spec_name], 4
    anchors, ctx_valid, starts, ctx_lo = dflash_doc_cases()
    got = dflash_dense_mask(anchors, ctx_valid, block, spec, ctx_lo)
    width = ctx_valid.shape[1]
    for b in range(3):
        want = dflash_reference(anchors[b].tolist(), ctx_valid[b].tolist(), block, spec)
        for n in range(anchors.shape[1]):
            want[n * block:(n + 1) * block, :int(ctx_lo[b, n])] = False
        assert torch.equal(got[b, 0], want), b
    if spec.window != 1:  # W = 1 sees no context key at all
        assert not torch.equal(got, dflash_dense_mask(anchors, ctx_valid, block, spec))  # the documents cut something
    ctx_keys = ctx_keys_for(width)
    rows = dflash_key_intervals(anchors, ctx_valid.sum(1), block, spec.window, spec.block_causal, ctx_keys, ctx_lo)
    keep = torch.cat([torch.arange(width), torch.arange(ctx_keys, ctx_keys + anchors.shape[1] * block)])
    assert torch.equal(dense_mask_from_intervals(rows, ctx_keys + anchors.shape[1] * block)[..., keep], got)
    for q_rows, kv_tile in ((8, 8), (4, 16), (12, 4)):
        kept, full = dflash_tile_structure(anchors, ctx_valid, block, spec, q_rows, kv_tile, ctx_lo)
        q_len, kv_len = got.shape[2:]
        q_tiles, kv_tiles = kept.shape[1:]
        tiles = torch.nn.functional.pad(got[:, 0].float(), (0, kv_tiles * kv_tile - kv_len, 0, q_tiles * q_rows - q_len), value=-1)
        tiles = tiles.view(3, q_tiles, q_rows, kv_tiles, kv_tile).transpose(2, 3).flatten(3)
        exact_full = ((tiles == 1) | (tiles < 0)).all(-1) & (tiles == 1).any(-1)
        assert torch.equal(kept, (tiles == 1).any(-1)), (q_rows, kv_tile)
        assert not (full & ~exact_full).any(), (q_rows, kv_tile)  # never a hidden pair in a tile flex trusts
        context_tiles = width // kv_tile  # block-key tiles are never marked full (dflash_tile_structure), context ones exactly
        assert torch.equal(full[..., :context_tiles], exact_full[..., :context_tiles]), (q_rows, kv_tile)


@pytest.mark.parametrize("spec", ["window_100_causal", "window_3", "full"])
def test_dflash_gpu_masks_with_documents_equal_the_dense_one(spec: str) -> None:
    """The masks a GPU trains on, built on the CPU with each block's document start (found by review: dropping it from
    them passed every test): flex's plain and packed-query BlockMasks keep exactly the dense mask's tiles, mark full
    exactly the context tiles whose pairs are all visible, and attend as the dense mask does; FlashAttention-4's key
    intervals (through ``attention``'s reference path) attend as it does too; ``layer_masks`` hands the documents to each."""
    from torch.nn.attention.flex_attention import BlockMask

    from models.dflash import LayerMaskSpec, dense_mask as dflash_dense_mask, flex_block_mask, flex_packed_block_mask, key_interval_mask
    from swa_kernels.attention import attention
    from train.dflash import Blocks, layer_masks

    spec = {"window_100_causal": LayerMaskSpec(100, True), "window_3": LayerMaskSpec(3, False), "full": LayerMaskSpec(None, False)}[spec]
    groups, block, tile = 2, 8, 32
    segments = [[60, 45, 95], [120, 50]]
    starts = document_starts(segments, 200)
    ctx_valid = torch.arange(200)[None, :] < torch.tensor([[200], [170]])
    anchors = torch.tensor([[30, 70, 101, 110], [70, 150, 160, 0]])
    ctx_lo = starts.gather(1, anchors)
    dense = dflash_dense_mask(anchors, ctx_valid, block, spec, ctx_lo)[:, 0]  # [2, 32, 232]
    assert spec.window == 3 or not torch.equal(dense, dflash_dense_mask(anchors, ctx_valid, block, spec)[:, 0])
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 32, 8), torch.randn(2, 2, 232, 8), torch.randn(2, 2, 232, 8)
    want = attention(q, k, v, dense[:, None])
    plain = flex_block_mask(anchors, ctx_valid, block, spec, tile=16, ctx_lo=ctx_lo)
    tiles = torch.nn.functional.pad(dense, (0, 240 - 232)).reshape(2, 2, 16, 15, 16)
    assert torch.equal(plain.to_dense()[:, 0].bool(), tiles.any(-1).any(2))
    torch.testing.assert_close(attention(q, k, v, plain), want, rtol=1e-5, atol=1e-5)
    packed = flex_packed_block_mask(anchors, ctx_valid, block, spec, groups, tile=tile, q_tile=32, ctx_lo=ctx_lo)
    rows = torch.tensor([n * block + j for n in range(4) for g in range(groups) for j in range(block)])
    dense_packed = torch.nn.functional.pad(dense[:, rows], (0, 256 - 232)).reshape(2, 2, 32, 8, tile)
    kept = packed.block_mask.to_dense()[:, 0].bool()
    full = BlockMask.from_kv_blocks(packed.block_mask.full_kv_num_blocks, packed.block_mask.full_kv_indices,
                                    BLOCK_SIZE=(32, tile), seq_lengths=(64, 232)).to_dense()[:, 0].bool()
    assert torch.equal(kept, dense_packed.any(-1).any(2))
    assert not (full & ~dense_packed.all(-1).all(2)).any()
    torch.testing.assert_close(attention(q, k, v, packed), want, rtol=1e-5, atol=1e-5)
    intervals = key_interval_mask(anchors, ctx_valid, block, spec, groups, head_dim=8, ctx_lo=ctx_lo)
    torch.testing.assert_close(attention(q, k, v, intervals), want, rtol=1e-5, atol=1e-5)
    blocks = Blocks(anchors, anchors > 0, anchors.repeat_interleave(block, 1), anchors.repeat_interleave(block, 1), anchors.repeat_interleave(block, 1))
    layer_type = "full_attention" if spec.window is None else "sliding_attention"
    # fa4's masks ask for q's heads group-major (g * Hkv + h; the drafter permutes its projections): standard head h * G + g
    group_major = torch.tensor([h * groups + g for g in range(groups) for h in range(2)])
    for backend in ("sdpa", "fa4", "flex"):
        masks = layer_masks(blocks, ctx_valid, block, [layer_type], spec.window, spec.block_causal, backend, query_groups=groups,
                            head_dim=8, ctx_lo=ctx_lo)
        if backend == "fa4":
            got = torch.empty_like(want)
            got[:, group_major] = attention(q[:, group_major], k, v, masks[layer_type])
        else:
            got = attention(q, k, v, masks[layer_type])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=backend)


def test_dflash_anchors_and_blocks_stay_inside_their_document() -> None:
    """``sample_anchors`` never picks a document's last token (its next one is another document's); ``build_blocks``
    labels and reveals no slot past the anchor's document, as it labels none past the row's end."""
    from train.dflash import IGNORE, build_blocks, sample_anchors

    segments, width = [[6, 5, 7], [9]], 20
    starts = document_starts(segments, width)
    loss_mask = torch.zeros(2, width, dtype=torch.bool)
    loss_mask[0, :18] = True
    loss_mask[1, :9] = True
    anchors, valid = sample_anchors(loss_mask, 40, torch.Generator().manual_seed(0), doc_start=starts)
    picked = set(anchors[0][valid[0]].tolist())
    assert picked == set(range(17)) - {5, 10}  # every eligible position but the two documents' last tokens
    ids = torch.arange(2 * width).view(2, width)
    anchors = torch.tensor([[3, 7, 14]])  # documents [0, 6), [6, 11), [11, 18)
    blocks = build_blocks(ids[:1], loss_mask[:1], anchors, torch.ones(1, 3, dtype=torch.bool), 4, 999,
                          reveal=torch.tensor([[3, 1, 0]]), doc_start=starts[:1])
    labels = blocks.labels.view(3, 4).tolist()
    assert labels[0] == [IGNORE, IGNORE, IGNORE, IGNORE]  # anchor 3: 4, 5 revealed; 6 is the next document's
    assert blocks.block_ids.view(3, 4)[0].tolist() == [3, 4, 5, 999]  # so 6 is not revealed either
    assert labels[1] == [IGNORE, IGNORE, 9, 10]  # anchor 7: 8 revealed, 9 and 10 labelled
    assert labels[2] == [IGNORE, 15, 16, 17]
    plain = build_blocks(ids[:1], loss_mask[:1], anchors, torch.ones(1, 3, dtype=torch.bool), 4, 999, reveal=torch.tensor([[3, 1, 0]]))
    assert plain.block_ids.view(3, 4)[0].tolist() == [3, 4, 5, 6]  # without documents the row's next tokens show


def test_dflash_block_states_of_packed_documents_equal_each_document_alone() -> None:
    """The DFlash drafter's training forward on packed rows (each block's context cut at its document's start) gives
    every block the hidden states it gets with its document alone on a row (the same anchors, shifted)."""
    from transformers import Qwen3Config

    from models.dflash import DFlashDraftModel, LayerMaskSpec, dense_mask as dflash_dense_mask, make_dflash_config

    target = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=256)
    config = make_dflash_config(target, num_hidden_layers=2, block_size=4, mask_token_id=63, target_layer_ids=[1, 2],
                                layer_types=["sliding_attention", "full_attention"], sliding_window=6)
    torch.manual_seed(0)
    drafter = DFlashDraftModel(config).eval()
    specs = {t: LayerMaskSpec.for_layer(t, 6, True) for t in ("sliding_attention", "full_attention")}
    generator = torch.Generator().manual_seed(1)
    lengths = [11, 9, 14]
    features = torch.randn(1, 40, 2 * 32, generator=generator)
    starts = document_starts([lengths], 40)
    ctx_valid = torch.arange(40)[None, :] < 34
    anchors = torch.tensor([[2, 7, 12, 15, 20, 24, 29]])  # documents at 0, 11, 20
    embeds = torch.randn(1, 7 * 4, 32, generator=generator)
    positions = (anchors[:, :, None] + torch.arange(4)).flatten(1)
    ctx_lo = starts.gather(1, anchors)
    masks = {t: dflash_dense_mask(anchors, ctx_valid, 4, spec, ctx_lo) for t, spec in specs.items()}
    with torch.no_grad():
        packed = drafter(embeds, features, positions, masks)
        at = 0
        for doc, n in enumerate(lengths):
            mine = [i for i, a in enumerate(anchors[0].tolist()) if at <= a < at + n]
            a = anchors[:, mine] - at
            rows = torch.tensor([4 * i + k for i in mine for k in range(4)])
            alone_masks = {t: dflash_dense_mask(a, torch.ones(1, n, dtype=torch.bool), 4, spec) for t, spec in specs.items()}
            alone = drafter(embeds[:, rows], features[:, at:at + n], (a[:, :, None] + torch.arange(4)).flatten(1), alone_masks)
            torch.testing.assert_close(packed[:, rows], alone, atol=1e-5, rtol=1e-5, msg=f"document {doc}")
            at += n



@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_dflash_flex_masks_with_documents_give_the_dense_masks_outputs() -> None:
    """On a GPU the DFlash drafter's forward on packed documents runs flex's compiled Triton kernels on masks built
    from CUDA tensors (the packed-query BlockMask where tiles hold whole blocks, else the plain one): its block states
    equal those of the dense SDPA masks with each block's context cut at its document's start (fp32)."""
    from transformers import Qwen3Config

    from models.dflash import DFlashDraftModel, make_dflash_config
    from train.dflash import Blocks, layer_masks

    # flex's Triton kernels take head dimensions of 16 and up
    target = Qwen3Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, max_position_embeddings=1024)
    config = make_dflash_config(target, num_hidden_layers=2, block_size=8, mask_token_id=63, target_layer_ids=[1, 2],
                                layer_types=["sliding_attention", "full_attention"], sliding_window=48)
    torch.manual_seed(0)
    drafter = DFlashDraftModel(config).eval().cuda()
    generator = torch.Generator().manual_seed(2)
    segments, width, n = [[150, 90, 40], [256], [30, 200]], 300, 12
    starts = document_starts(segments, width)
    ctx_valid = torch.arange(width)[None, :] < torch.tensor([[sum(s)] for s in segments])
    anchors = torch.stack([torch.randperm(sum(s) - 1, generator=generator)[:n].sort().values for s in segments])
    ctx_lo = starts.gather(1, anchors)
    features = torch.randn(3, width, 2 * 64, generator=generator).cuda()
    embeds = torch.randn(3, n * 8, 64, generator=generator).cuda()
    positions = (anchors[:, :, None] + torch.arange(8)).flatten(1).cuda()
    anchors, ctx_valid, ctx_lo = anchors.cuda(), ctx_valid.cuda(), ctx_lo.cuda()
    blocks = Blocks(anchors, torch.ones_like(anchors, dtype=torch.bool), positions, positions, positions)
    out = {}
    for backend in ("sdpa", "flex"):
        masks = layer_masks(blocks, ctx_valid, 8, config.layer_types, 48, True, backend, query_groups=2, head_dim=16, ctx_lo=ctx_lo)
        if backend == "flex":
            assert not any(isinstance(m, torch.Tensor) for m in masks.values())
        with torch.no_grad():
            out[backend] = drafter(embeds, features, positions, masks)
    assert not torch.equal(out["sdpa"], drafter(embeds, features, positions, layer_masks(
        blocks, ctx_valid, 8, config.layer_types, 48, True, "sdpa")).detach())  # the documents matter on these rows
    torch.testing.assert_close(out["flex"], out["sdpa"], atol=2e-4, rtol=1e-4)

def test_dflash_training_on_packed_documents_keeps_every_block_in_its_document(tmp_path) -> None:
    """``python -m train experiment=dflash_swa_tiny data.pack_documents=true``: the first batch's blocks label only tokens
    of their anchor's document, their masks see no context key before its start, and three steps train."""
    import json

    from compose import compose_train
    from train.dflash import IGNORE
    from train.trainer import build, to_train_config, train

    overrides = ["experiment=dflash_swa_tiny", "trainer.progress=false", "data.num_eval=16", "data.max_length=192", "trainer.eval_every=0",
                 "trainer.export_formats=[]", "trainer.loop_eval_prompts=0", "trainer.batch_size=4", "data.pack_documents=true",
                 "data.pack_length=384"]
    # every block reveals its first slots (drafter.reveal_prob=1): the step's plan must keep those in the document too
    run = build(to_train_config(compose_train(overrides + ["drafter.reveal_prob=1.0", f"output_dir={tmp_path / 'build'}"])))
    batch = run.next_micro_batches()[0]
    blocks = run.step.plan(batch, torch.Generator().manual_seed(0))
    starts = batch["doc_start"]
    block = run.step.block_size
    labelled = (blocks.labels != IGNORE).nonzero()
    revealed = ((blocks.block_ids != run.step.drafter.mask_token_id) & (torch.arange(blocks.block_ids.shape[1]) % block > 0)).nonzero()
    assert len(labelled) > 0 and len(revealed) > 0
    for b, q in labelled.tolist() + revealed.tolist():
        anchor = int(blocks.anchors[b, q // block])
        assert starts[b, anchor] == starts[b, int(blocks.positions[b, q])], (b, q)
    valid = blocks.anchors[blocks.anchor_valid]
    rows = blocks.anchor_valid.nonzero()[:, 0]
    assert torch.equal(starts[rows, valid], starts[rows, valid + 1])  # no anchor on a document's last token
    crossing = (starts.gather(1, blocks.anchors) > 0) & blocks.anchor_valid
    assert crossing.any()  # some anchors sit in a row's later documents, whose context starts past 0
    assert run.step.ctx.backend == "sdpa"
    _, _, masks = run.step.drafter_inputs(batch, blocks, "sdpa")  # the step's own masks, dense on the CPU
    width = batch["input_ids"].shape[1]
    key = torch.arange(width)
    first = starts.gather(1, blocks.anchors).repeat_interleave(block, 1)  # [B, Q] each query's document start
    for mask in masks.values():
        context = mask[:, 0, :, :width]  # [B, Q, T]
        assert not (context & (key[None, None, :] < first[:, :, None])).any()  # no key of an earlier document
        assert (context & (key[None, None, :] >= first[:, :, None])).any()
    train(compose_train(overrides + ["trainer.max_steps=3", "trainer.log_every=1", "data.num_eval=0", f"output_dir={tmp_path / 'run'}"]))
    history = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [h["train/loss"] for h in history if "train/loss" in h]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))


def test_the_eagle3_step_on_packed_documents_is_the_sum_of_each_document_alone(tmp_path) -> None:
    """The trainer's own EAGLE-3 step (target capture, masks, unroll, labels) on a packed batch equals the step on each of
    its conversations collated alone (found by review: the unit tests above left the step's wiring unchecked). The
    window spans the row (with the tiny recipe's 64, Llama-3.1's headers are longer than the window and no labelled query
    could reach the previous document)."""
    from compose import compose_train
    from train.trainer import build, to_train_config

    common = ["experiment=eagle3_swa_tiny", "trainer.progress=false", "data.num_eval=16", "data.max_length=192", "trainer.eval_every=0",
              "trainer.export_formats=[]", "trainer.loop_eval_prompts=0", "trainer.batch_size=4", "data.pack_documents=true",
              "data.pack_length=384", f"output_dir={tmp_path}", "drafter.sliding_window=384"]
    run = build(to_train_config(compose_train(common)))
    batch = run.next_micro_batches()[0]
    assert any(len(s) > 1 for s in batch["segments"])
    with torch.no_grad():
        packed = run.step.forward(batch)
        alone = None
        for b, lengths in enumerate(batch["segments"]):
            at = 0
            for n in lengths:
                row = {"input_ids": batch["input_ids"][b, at:at + n].tolist(), "loss_mask": batch["loss_mask"][b, at:at + n].tolist()}
                stats = run.step.forward(run.step.ctx.collate([row], run.target.pad_id))
                alone = stats if alone is None else alone + stats
                at += n
    for name in ("loss_sum", "num_labels", "step_count", "step_correct", "accepted_sum"):
        torch.testing.assert_close(getattr(packed, name), getattr(alone, name), rtol=1e-4, atol=1e-3, msg=name)
