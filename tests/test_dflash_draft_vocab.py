"""DFlash with a draft vocabulary (speculators' ``draft_vocab_size`` / ``d2t`` / ``t2d`` for DFlash): the drafter
decodes with the target's LM-head rows of the draft ids only. References: the same drafter without the draft
vocabulary (the target's whole head), its logits restricted to the kept ids element by element; the target's own
greedy output."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn
from transformers import Qwen3Config

from infer.batch import generate_batch
from infer.generate import generate
from models.dflash import DFlashDrafter, DFlashDraftModel, StaticDFlashDrafter, make_dflash_config
from models.eagle3 import build_draft_vocab
from models.sampling import SamplingConfig

pytestmark = pytest.mark.usefixtures("single_cpu_thread")

VOCAB, DRAFT_VOCAB, HIDDEN = 64, 20, 32


def pair(block: int = 4):
    """(full-head model, the same weights with a draft vocabulary of DRAFT_VOCAB ids, embedding, target head, kept ids)."""
    torch.manual_seed(0)
    target = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8)
    kwargs = dict(num_hidden_layers=2, block_size=block, mask_token_id=1, target_layer_ids=[0, 2],
                  layer_types=["sliding_attention", "full_attention"], sliding_window=5)
    full = DFlashDraftModel(make_dflash_config(target, **kwargs)).eval()
    for p in full.parameters():
        p.data.normal_(0, 0.3) if p.dim() > 1 else None
    reduced = DFlashDraftModel(make_dflash_config(target, draft_vocab_size=DRAFT_VOCAB, **kwargs)).eval()
    missing, unexpected = reduced.load_state_dict(full.state_dict(), strict=False)
    assert set(missing) == {"lm_head.weight", "d2t", "t2d"} and not unexpected
    embed, head = nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, VOCAB, bias=False)
    counts = {i: int(c) for i, c in enumerate(torch.randint(0, 1000, (VOCAB,), generator=torch.Generator().manual_seed(1)).tolist())}
    d2t, t2d = build_draft_vocab(counts, VOCAB, DRAFT_VOCAB)
    reduced.set_draft_vocab(d2t, t2d, head.weight)
    kept = torch.nonzero(t2d)[:, 0]
    return full, reduced, embed, head, kept


def test_the_config_keeps_no_draft_vocabulary_as_wide_as_the_target() -> None:
    target = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8)
    kwargs = dict(num_hidden_layers=1, block_size=4, mask_token_id=1, target_layer_ids=[0], layer_types=["sliding_attention"],
                  sliding_window=5)
    assert not hasattr(make_dflash_config(target, draft_vocab_size=VOCAB, **kwargs), "draft_vocab_size")  # z-lab's layout
    assert not DFlashDraftModel(make_dflash_config(target, **kwargs)).has_draft_vocab
    with pytest.raises(ValueError, match="draft_vocab_size=1"):
        make_dflash_config(target, draft_vocab_size=1, **kwargs)


def test_draft_ids_map_both_ways() -> None:
    _, reduced, _, head, kept = pair()
    assert torch.equal(reduced.draft_ids_in_target(), kept)  # sorted by id, as build_draft_vocab keeps them
    assert torch.equal(reduced.lm_head.weight, head.weight[kept])
    assert not reduced.lm_head.weight.requires_grad
    inverse = reduced.target_to_draft(torch.arange(VOCAB))
    for j in range(VOCAB):
        assert inverse[j] == (kept.tolist().index(j) if j in kept else -1)
    assert reduced.target_to_draft(torch.tensor([-100]))[0] == -1  # an ignored label stays outside


ON_CUDA = pytest.param(True, "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")])


@pytest.mark.parametrize("static, device", [(False, "cpu"), (True, "cpu"), ON_CUDA])  # cuda: captured and compiled
def test_drafts_are_the_target_heads_argmax_over_the_draft_ids(static, device) -> None:
    full, reduced, embed, head, kept = pair()
    g = torch.Generator().manual_seed(2)
    reference = DFlashDrafter(full, embed, head)
    drafter = (StaticDFlashDrafter if static else DFlashDrafter)(copy.deepcopy(reduced).to(device), copy.deepcopy(embed).to(device),
                                                              copy.deepcopy(head).to(device))
    for d in (reference, drafter):
        d.reset(100)
    features = torch.randn(9, 2 * HIDDEN, generator=g)
    reference.append_context(features, 0)
    drafter.append_context(features.to(device), 0)
    pos = 9
    for acc in [0, 3, 1, 2, 0, 3]:
        token = torch.randint(2, VOCAB, (), generator=g)
        want = reference.draft_logits(token, pos)  # [b-1, V] over the target's whole head
        restricted = torch.full_like(want, float("-inf"))
        for j in kept.tolist():
            restricted[:, j] = want[:, j]
        if static:
            logits, greedy = drafter.block_logits(token.reshape(1).to(device), torch.tensor([pos], device=device))
            logits, greedy = logits.cpu(), greedy.cpu()
            torch.testing.assert_close(logits[0], want[:, kept], rtol=1e-4, atol=1e-4)  # Vd wide: the head reads Vd rows
            assert torch.equal(greedy[0], restricted.argmax(-1))
            tokens, probs = drafter.choose(logits[0].to(device), SamplingConfig(temperature=1.0), torch.Generator(device).manual_seed(0))
            tokens, probs = tokens.cpu(), probs.cpu()
        else:
            got = drafter.draft_logits(token, pos)
            torch.testing.assert_close(got, restricted, rtol=1e-5, atol=1e-5)
            assert torch.equal(drafter.draft(token, pos, SamplingConfig(), None)[0], restricted.argmax(-1))
            tokens, probs = drafter.draft(token, pos, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0))
        torch.testing.assert_close(probs, torch.softmax(restricted, -1), rtol=1e-5, atol=1e-6)  # zero outside, exact inside
        assert all(t in kept.tolist() for t in tokens.tolist())
        block_features = torch.randn(reduced.block_size, 2 * HIDDEN, generator=g)
        reference.append_context(block_features[:acc + 1], pos)
        drafter.append_context((block_features if static else block_features[:acc + 1]).to(device), pos)
        pos += acc + 1


@pytest.mark.slow  # 12 s; the quick tier stays under 3 minutes (README); the full suite runs it
def test_a_draft_vocabulary_loop_is_lossless_and_batches_as_batch_one(reference_target_path) -> None:
    from transformers import AutoModelForCausalLM

    from models.static_target import StaticTarget

    from infer_helpers import greedy_continuations, overfit_drafter

    model = AutoModelForCausalLM.from_pretrained(reference_target_path, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    prompts = [torch.randint(10, 8000, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (30, 17, 41)]
    # a drafter overfit on the target's replies (a random one accepted nothing: "batched equals alone" compared zeros),
    # its weights under a 1,024-id draft vocabulary holding the replies' tokens and every third id
    replies = greedy_continuations(model, prompts, 32)
    overfit = overfit_drafter(model, replies, layer_types=["sliding_attention", "sliding_attention"], sliding_window=6, block_size=4,
                              mask_token_id=5, target_layer_ids=(1, 3), steps=100)
    config = make_dflash_config(model.config, num_hidden_layers=2, block_size=4, mask_token_id=5, target_layer_ids=[1, 3],
                                layer_types=["sliding_attention", "sliding_attention"], sliding_window=6, draft_vocab_size=1024)
    drafter_model = DFlashDraftModel(config).eval()
    missing, unexpected = drafter_model.load_state_dict(overfit.state_dict(), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight", "d2t", "t2d"}
    head = model.get_output_embeddings()
    counts = {i: vocab - i for i in range(0, vocab, 3)} | {t: 2 * vocab for seq in replies for t in seq}
    d2t, t2d = build_draft_vocab(counts, vocab, 1024)
    drafter_model.set_draft_vocab(d2t, t2d, head.weight)
    target = StaticTarget(model, [1, 3])
    drafter = StaticDFlashDrafter(drafter_model, model.get_input_embeddings(), head)
    alone = [generate(target, None, p, 24).tokens for p in prompts]
    single = [generate(target, drafter, p, 24) for p in prompts]
    assert [s.tokens for s in single] == alone
    assert max(a for s in single for a in s.stats.accepted_per_step) == 3  # whole blocks accepted through the draft vocabulary
    batched = generate_batch(target, drafter, prompts, 24, batch_size=2)
    assert [b.tokens for b in batched] == alone
    assert [b.stats.accepted_per_step for b in batched] == [s.stats.accepted_per_step for s in single]
    sampling = SamplingConfig(temperature=1.0, seed=7)
    single = [generate(target, drafter, p, 24, sampling=sampling) for p in prompts]
    batched = generate_batch(target, drafter, prompts, 24, batch_size=2, sampling=sampling)
    assert [b.tokens for b in batched] == [s.tokens for s in single]
    # the drafts themselves (two forced per step) are draft-vocabulary ids
    forced = generate(target, drafter, prompts[0], 24, accept_per_step=2).tokens
    drafted = [t for i, t in enumerate(forced) if i % 3 != 0]  # the prefill's token, then two drafts and the target's per step
    assert all(t2d[t] for t in drafted)


def test_the_loss_over_a_draft_vocabulary_follows_an_element_by_element_reference() -> None:
    from train.dflash import IGNORE, OUTSIDE, block_loss

    g = torch.Generator().manual_seed(4)
    block, vd = 4, 6
    logits = torch.randn(2, 3 * block, vd, generator=g)
    labels = torch.randint(0, vd, (2, 3 * block), generator=g)
    labels[0, 1], labels[1, 5], labels[1, 6] = OUTSIDE, OUTSIDE, IGNORE
    labels[:, ::block] = IGNORE  # slot 0 is the known token
    stats = block_loss(logits, labels, torch.ones(2, 3, dtype=torch.bool), block, gamma=7.0)
    loss = count = 0.0
    correct = [0.0] * block
    seen = [0.0] * block
    for b in range(2):
        for q in range(3 * block):
            label, slot = int(labels[b, q]), q % block
            if label == IGNORE:
                continue
            count += 1
            seen[slot] += 1
            if label == OUTSIDE:  # labelled, no CE term, never right
                continue
            weight = torch.exp(-torch.tensor(max(slot - 1, 0) / 7.0))
            loss += float(weight * (torch.logsumexp(logits[b, q], 0) - logits[b, q, label]))
            correct[slot] += float(logits[b, q].argmax() == label)
    assert float(stats.num_labels) == count
    torch.testing.assert_close(float(stats.loss_sum), loss, rtol=1e-5, atol=1e-5)
    assert stats.slot_correct.tolist() == correct and stats.slot_count.tolist() == seen


@pytest.mark.slow  # the quick tier stays under 3 minutes (README); the full suite runs it
def test_training_with_a_draft_vocabulary_exports_in_speculators_layout(tmp_path) -> None:
    from compose import compose_train
    from safetensors.torch import load_file

    from infer.loading import read_drafter_config
    from infer.speculators_checkpoint import load_model
    from models.target import TargetModel
    from train.export import ExportError, export
    from train.trainer import train

    overrides = ["experiment=dflash_swa_tiny", "trainer.progress=false", "data.num_eval=8", "trainer.max_steps=3", "trainer.eval_every=0",
                 "drafter.draft_vocab_size=300", f"output_dir={tmp_path / 'run'}"]
    metrics = train(compose_train(overrides))
    assert metrics["steps"] == 3 and (tmp_path / "run" / "export_speculators" / "model.safetensors").exists()
    weights = load_file(tmp_path / "run" / "export" / "model.safetensors")
    config = json.loads((tmp_path / "run" / "export" / "config.json").read_text())
    assert config["draft_vocab_size"] == 300 and weights["lm_head.weight"].shape[0] == 300 and weights["t2d"].sum() == 300
    resolved = json.loads((tmp_path / "run" / "run.json").read_text())["target"]["resolved_path"]
    target = TargetModel.from_pretrained(resolved, "cpu", dtype="float32")
    kept = torch.nonzero(weights["t2d"])[:, 0]
    assert torch.equal(weights["d2t"] + torch.arange(300), kept)
    # the head stayed the target's rows of the draft ids (frozen), bf16 as exported
    assert torch.equal(weights["lm_head.weight"], target.lm_head.weight[kept].to(weights["lm_head.weight"].dtype))
    spec = tmp_path / "run" / "export_speculators"
    spec_config = json.loads((spec / "config.json").read_text())
    assert spec_config["draft_vocab_size"] == 300 and spec_config["speculators_model_type"] == "dflash"
    reloaded = load_model(spec, read_drafter_config(spec)).float()
    assert reloaded.has_draft_vocab and torch.equal(reloaded.t2d, weights["t2d"])
    assert weights["d2t"].max() > 256  # offsets bf16 cannot hold exactly: an export once cast d2t to --dtype
    assert torch.equal(reloaded.d2t, weights["d2t"])
    assert torch.equal(reloaded.lm_head.weight, weights["lm_head.weight"].to(torch.bfloat16).float())  # exported in bf16
    with pytest.raises(ExportError, match="z-lab's DFlash layout has no draft vocabulary") as error:
        export(tmp_path / "run", tmp_path / "zlab", fmt="dflash")
    assert "\n" not in str(error.value) and not (tmp_path / "zlab").exists()
    with pytest.raises(ValueError, match="trainer.export_formats: 'dflash' is z-lab's DFlash layout"):
        train(compose_train(overrides[:-1] + ["trainer.export_formats=[dflash]", f"output_dir={tmp_path / 'run2'}"]))
    assert not (tmp_path / "run2" / "run.json").exists()
