"""EAGLE-3: the training-time-test unroll against a plain decoding loop, the loss against a loop over
labels, the draft vocabulary, and training on the tiny builtin target (learning, export, exact resume)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from compose import compose_train
from safetensors.torch import load_file
from transformers import LlamaConfig

import train.eagle3 as eagle3_train
from train.eagle3 import STEP_DECAY, soft_ce_chunk_rows, soft_cross_entropy, step_masks, target_labels, ttt_loss, unroll, unroll_and_loss
from models.target import TargetModel
from models.eagle3 import Eagle3DraftModel, build_draft_vocab, make_eagle3_config
from train.trainer import train

# One intra-op thread: these small steps are dominated by OpenMP wake-ups on 2 cores (40x slower
# with 2 threads while another process runs; tests/conftest.py).
pytestmark = pytest.mark.usefixtures("single_cpu_thread")

# ----------------------------------------------------------------------------- a small drafter


def small_drafter(layer_types: list[str], window: int | None, vocab: int = 40, draft_vocab: int = 24, **options) -> Eagle3DraftModel:
    target = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, max_position_embeddings=256)
    config = make_eagle3_config(target, num_hidden_layers=len(layer_types), target_layer_ids=[1, 2, 3], layer_types=layer_types,
                                sliding_window=window, draft_vocab_size=draft_vocab, **options)
    torch.manual_seed(0)
    model = Eagle3DraftModel(config).eval()
    counts = {i: (i * 7) % 11 for i in range(vocab)}
    model.set_draft_vocab(*build_draft_vocab(counts, vocab, config.draft_vocab_size))
    with torch.no_grad():  # norms away from 1 so a missing or misplaced norm shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return model


# ----------------------------------------------------------------------------- the reference: decode index by index


def reference_step_logits(model: Eagle3DraftModel, features: torch.Tensor, ids: torch.Tensor, length: int, steps: int) -> list[list[torch.Tensor]]:
    """logits[j][t] for one sequence, computed the way a decoder would: index t's step 0 over a
    per-layer cache of the step-0 keys of indices 0..t, then a chain of steps 1..steps-1 from t, each
    step one query at position t+1+j over the cache plus the chain's own keys; windows applied by
    position; attention as an explicit softmax."""
    window = model.sliding_window
    types = model.layer_types
    scale = model.layers[0].self_attn.scaling
    seq_len = ids.shape[0]
    padded = torch.cat([ids, torch.zeros(steps + 1, dtype=ids.dtype)])

    def softmax_attention(q, keys, layer):
        # q [1, Hq, 1, D]; keys: list of (position, k [Hkv, D], v [Hkv, D])
        qpos = keys[-1][0]
        if types[layer] == "sliding_attention":
            keys = [kv for kv in keys if kv[0] > qpos - window]
        k = torch.stack([kv[1] for kv in keys], 1)  # [Hkv, K, D]
        v = torch.stack([kv[2] for kv in keys], 1)
        rep = q.shape[1] // k.shape[0]
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        weights = torch.softmax((q[0] @ k.transpose(1, 2)) * scale, dim=-1)  # [Hq, 1, K]
        return (weights @ v)[None]

    def run(token, hidden, pos, caches):
        def attend(layer, q, k, v):
            caches[layer].append((pos, k[0, :, 0], v[0, :, 0]))
            return softmax_attention(q, caches[layer], layer)

        return model(token.view(1, 1), hidden, torch.tensor([[pos]]), attend)

    logits = [[None] * seq_len for _ in range(steps)]
    context = [[] for _ in model.layers]
    for t in range(length):
        h = run(padded[t + 1], model.project_features(features[t].view(1, 1, -1)), t + 1, context)
        logits[0][t] = model.logits(h)[0, 0]
        chain = [list(c) for c in context]
        for j in range(1, steps):
            h = run(padded[t + j + 1], model.next_hidden(h), t + 1 + j, chain)
            logits[j][t] = model.logits(h)[0, 0]
    return logits


CASES = {
    "full": (["full_attention"], None, {}),
    "sliding_w4": (["sliding_attention"], 4, {}),
    "sliding_w2_lt_chain": (["sliding_attention", "full_attention"], 2, {}),
    "sliding_w1": (["sliding_attention"], 1, {}),
    "eagle31_fc_norm_norm_output": (["sliding_attention", "sliding_attention"], 3, {"fc_norm": True, "norm_output": True}),
    "norm_before_residual": (["full_attention"], None, {"norm_before_residual": True}),
}


@pytest.mark.parametrize("case", list(CASES))
@torch.no_grad()
def test_unroll_equals_decoding_index_by_index(case: str) -> None:
    layer_types, window, options = CASES[case]
    model = small_drafter(layer_types, window, **options)
    steps, seq_len = 4, 10
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(2, seq_len, 3 * 32, generator=generator)
    ids = torch.randint(0, 40, (2, seq_len), generator=generator)
    lengths = [seq_len, 7]
    ctx_valid = torch.arange(seq_len)[None] < torch.tensor(lengths)[:, None]
    outputs = unroll(model, features, ids, ctx_valid, steps)
    for b, length in enumerate(lengths):
        reference = reference_step_logits(model, features[b], ids[b], length, steps)
        for j in range(steps):
            got = model.logits(outputs[j][b, :length])
            torch.testing.assert_close(got, torch.stack(reference[j][:length]), rtol=1e-4, atol=1e-5, msg=f"{case} step {j}")


def real_logits_and_grads(model: Eagle3DraftModel, outputs: list[torch.Tensor], ctx_valid: torch.Tensor):
    """The unroll's logits on real rows [S, B, T, V] (padding rows zeroed) and every parameter's gradient of a loss over
    them (call ``model.zero_grad()`` first): what two attention paths must agree on."""
    real = torch.stack([model.logits(h) for h in outputs]) * ctx_valid[None, :, :, None]
    (real.square().sum() + real.sum()).backward()
    return real.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("case", ["full", "sliding_w4", "eagle31_fc_norm_norm_output"])
def test_window_kernel_backend_equals_dense_masks_with_gradients(case: str) -> None:
    """backend="cudnn" (swa_kernels/window_attention.py; its PyTorch pieces on the CPU) against the dense
    TTT masks: equal logits on real rows and equal parameter gradients of a loss over real rows, with
    right padding (a padding row may see padding keys there, which must change nothing real)."""
    layer_types, window, options = CASES[case]
    model = small_drafter(layer_types, window, **options).double()
    steps, seq_len = 4 if window is None or window >= 4 else 3, 10
    generator = torch.Generator().manual_seed(2)
    features = torch.randn(2, seq_len, 3 * 32, generator=generator, dtype=torch.float64)
    ids = torch.randint(0, 40, (2, seq_len), generator=generator)
    ctx_valid = torch.arange(seq_len)[None] < torch.tensor([seq_len, 6])[:, None]
    results = []
    for backend in ("sdpa", "cudnn"):
        model.zero_grad()
        results.append(real_logits_and_grads(model, unroll(model, features, ids, ctx_valid, steps, backend=backend), ctx_valid))
    (dense, dense_grads), (kernel, kernel_grads) = results
    torch.testing.assert_close(kernel, dense, rtol=1e-9, atol=1e-9)
    assert dense_grads.keys() == kernel_grads.keys()
    for name in dense_grads:
        torch.testing.assert_close(kernel_grads[name], dense_grads[name], rtol=1e-8, atol=1e-9, msg=name)


@pytest.mark.parametrize("backend", ["sdpa", "cudnn"])
def test_checkpointed_steps_give_the_same_gradients(backend: str) -> None:
    model = small_drafter(["sliding_attention", "full_attention"], 5).double()
    generator = torch.Generator().manual_seed(4)
    features = torch.randn(2, 9, 3 * 32, generator=generator, dtype=torch.float64)
    ids = torch.randint(0, 40, (2, 9), generator=generator)
    ctx_valid = torch.arange(9)[None] < torch.tensor([9, 7])[:, None]
    grads = []
    for checkpoint_steps in (False, True):
        model.zero_grad()
        outputs = unroll(model, features, ids, ctx_valid, 4, backend=backend, checkpoint_steps=checkpoint_steps)
        sum((model.logits(h) * ctx_valid[..., None]).square().sum() for h in outputs).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-10, atol=1e-12, msg=name)


# ----------------------------------------------------------------------------- the loss


def reference_loss(model, outputs, target_logits, ids, loss_mask, attention_mask):
    """Loops over (sequence, step, index): soft CE, accuracy, leading-correct chains."""
    draft_ids = model.draft_ids_in_target()
    loss, starts, accepted = 0.0, 0, 0
    correct_at = {}
    for b in range(ids.shape[0]):
        length = int(attention_mask[b].sum())
        for j, h in enumerate(outputs):
            logits = model.logits(h[b])
            for t in range(ids.shape[1]):
                label_pos = t + j + 2
                if label_pos >= length or not loss_mask[b, label_pos]:
                    continue
                soft = torch.softmax(target_logits[b, t + j + 1, draft_ids], -1)
                loss += STEP_DECAY**j * float(-(soft * torch.log_softmax(logits[t], -1)).sum())
                correct_at[b, t, j] = int(draft_ids[logits[t].argmax()]) == int(target_logits[b, t + j + 1].argmax())
        for t in range(ids.shape[1]):
            if (b, t, 0) in correct_at:
                starts += 1
                j = 0
                while correct_at.get((b, t, j), False):
                    accepted, j = accepted + 1, j + 1
    return loss / starts, 1 + accepted / starts


@torch.no_grad()
def test_loss_and_simulated_tau_match_a_loop_over_labels() -> None:
    model = small_drafter(["sliding_attention"], 5)
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 40, (2, 12), generator=generator)
    attention_mask = torch.ones(2, 12, dtype=torch.long)
    attention_mask[1, 9:] = 0
    loss_mask = (torch.rand(2, 12, generator=generator) < 0.8).long() * attention_mask
    outputs = unroll(model, torch.randn(2, 12, 96, generator=generator), ids, attention_mask.bool(), 3)
    # a target whose argmax often equals the drafter's, so chains of every length occur
    target_logits = torch.randn(2, 12, 40, generator=generator)
    for j, h in enumerate(outputs):
        guess = model.draft_ids_in_target()[model.logits(h).argmax(-1)]
        keep = torch.rand(2, 12, generator=generator) < 0.7
        target_logits.scatter_add_(-1, shift(guess, j + 1)[..., None], 20.0 * shift(keep, j + 1)[..., None].float())
    loss, sim_tau = reference_loss(model, outputs, target_logits, ids, loss_mask, attention_mask)
    for chunk_rows in (4096, 5):  # one piece; pieces of 5 rows that cut across sequences
        summary = ttt_loss(model, outputs, target_logits, ids, loss_mask, attention_mask, chunk_rows).summary("x")
        assert math.isclose(summary["x/loss"], loss, rel_tol=1e-5)
        assert math.isclose(summary["x/sim_tau"], sim_tau, rel_tol=1e-6)
    assert 1.3 < sim_tau < 3.5, sim_tau  # chains of several lengths were counted


def test_target_labels_from_the_final_hidden_state_in_chunks(reference_target_path) -> None:
    reference_target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    ids = torch.randint(0, reference_target.vocab_size, (2, 11), generator=torch.Generator().manual_seed(5))
    captured = reference_target.capture(ids, [1, 3], with_final_hidden=True)
    logits = reference_target.model(input_ids=ids).logits
    draft_ids = torch.tensor([5, 0, 17, 300, 2])
    greedy, draft = target_labels(draft_ids, captured.final_hidden, reference_target.lm_head, chunk_rows=4)
    assert torch.equal(greedy, logits.argmax(-1))
    torch.testing.assert_close(draft, logits[..., draft_ids], rtol=1e-5, atol=1e-5)


def test_chunked_soft_cross_entropy_has_the_same_gradients() -> None:
    model = small_drafter(["sliding_attention"], 5)
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 40, (2, 12), generator=generator)
    mask = torch.ones(2, 12, dtype=torch.long)
    features, target_logits = torch.randn(2, 12, 96, generator=generator), torch.randn(2, 12, 40, generator=generator)
    grads = []
    for chunk_rows in (4096, 7):
        model.zero_grad()
        outputs = unroll(model, features, ids, mask.bool(), 3)
        ttt_loss(model, outputs, target_logits, ids, mask, mask, chunk_rows).loss_sum.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and "lm_head.weight" in grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-7, msg=name)


def test_soft_ce_chunks_are_sized_by_bytes() -> None:
    """One checkpointed region a TTT step where the logits fit SOFT_CE_CHUNK_BYTES: SmolLM2's recipe (16 x 2,048 rows, 16K
    draft vocabulary) in one chunk, not eight of 4,096 rows (each chunk is a region the compiled step traces)."""
    assert soft_ce_chunk_rows(16384) == 32768 and soft_ce_chunk_rows(8192) == 65536
    assert -(-32768 // soft_ce_chunk_rows(32000)) == 2  # a 32K draft vocabulary at 32K tokens: two chunks of ~2 GiB
    assert soft_ce_chunk_rows(32000) * 32000 * 4 <= eagle3_train.SOFT_CE_CHUNK_BYTES


def test_one_large_soft_ce_chunk_is_still_recomputed_in_the_backward(monkeypatch) -> None:
    """Past SOFT_CE_KEPT_ROWS rows a single chunk is checkpointed too (its logits not kept for the backward), with the
    values and gradients of the plain computation; at or under it, nothing is checkpointed."""
    model = small_drafter(["sliding_attention"], 5)
    generator = torch.Generator().manual_seed(4)
    h = torch.randn(2, 6, model.config.hidden_size, generator=generator)
    target_draft = torch.randn(2, 6, model.config.draft_vocab_size, generator=generator)
    calls = []
    checkpoint = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", lambda *a, **k: calls.append(1) or checkpoint(*a, **k))
    results = {}
    for kept_rows in (12, 11):  # 12 rows: kept whole; over 11: one checkpointed chunk of 12
        monkeypatch.setattr(eagle3_train, "SOFT_CE_KEPT_ROWS", kept_rows)
        model.zero_grad()
        ce, top = soft_cross_entropy(model, h, target_draft, chunk_rows=4096)
        ce.sum().backward()
        results[kept_rows] = (ce.detach(), top, model.lm_head.weight.grad.clone(), len(calls))
    assert results[12][3] == 0 and results[11][3] == 1
    torch.testing.assert_close(results[11][0], results[12][0], rtol=1e-6, atol=1e-6)
    assert torch.equal(results[11][1], results[12][1])
    torch.testing.assert_close(results[11][2], results[12][2], rtol=1e-6, atol=1e-7)


def test_the_compiled_step_alone_takes_byte_sized_chunks(tiny_qwen3_path, monkeypatch) -> None:
    """``Eagle3Step.forward``: the compiled function (here any function but the eager ``unroll_and_loss``) gets
    ``soft_ce_chunk_rows`` of the draft vocabulary; the eager step (``step.eager()``) and evaluation keep 4,096 rows."""
    from train.trainer import build_step, to_train_config

    cfg = to_train_config(compose_train(["experiment=eagle3_swa_tiny", "drafter.ttt_length=2", "drafter.draft_vocab_size=64"]))
    target = TargetModel.from_pretrained(tiny_qwen3_path)
    torch.manual_seed(0)
    rows = [{"input_ids": torch.randint(20, 200, (24,)).tolist(), "loss_mask": [0] * 6 + [1] * 18} for _ in range(2)]
    step = build_step(cfg, target, [1, 3, 5], torch.device("cpu"), train_ds=rows)
    seen = []
    soft_ce = eagle3_train.soft_cross_entropy
    monkeypatch.setattr(eagle3_train, "soft_cross_entropy", lambda *a: seen.append(a[3]) or soft_ce(*a))
    step.unroll_and_loss = lambda *a, **k: unroll_and_loss(*a, **k)  # stands for torch.compile(unroll_and_loss)
    batch = step.ctx.collate(rows, target.pad_id)
    step.forward(batch)
    with step.eager():
        step.forward(batch)
    with torch.no_grad():
        step.forward(batch, per_start=True)
    assert seen == [soft_ce_chunk_rows(64)] * 2 + [4096] * 4, seen


@pytest.mark.slow  # ~12 s a case on one core (Dynamo and AOTAutograd); the quick tier keeps the eager step's tests
@pytest.mark.parametrize("chunk_rows, kept_rows", [(4096, 4096), (7, 4096), (4096, 5)])  # (4096, 5): one checkpointed chunk
def test_unroll_and_loss_compiles_as_one_graph_with_the_same_gradients(chunk_rows: int, kept_rows: int, monkeypatch) -> None:
    """``trainer.compile_scope=step`` for EAGLE-3 compiles ``unroll_and_loss`` whole: it must trace as one graph
    (``fullgraph=True``: the unroll's growing key lists, the masks as inputs, the soft CE's checkpointed chunks) and
    give the eager function's loss, stats and gradients. Dynamo and AOTAutograd here (backend ``aot_eager``, the
    graph the GPU's Inductor compiles); Inductor's kernels against eager on the GPU: tests/test_gpu.py."""
    model = small_drafter(["sliding_attention", "full_attention"], 5, norm_output=True)
    generator = torch.Generator().manual_seed(6)
    ids = torch.randint(0, 40, (2, 12), generator=generator)
    attention_mask = torch.ones(2, 12, dtype=torch.long)
    attention_mask[1, 9:] = 0
    loss_mask = (torch.rand(2, 12, generator=generator) < 0.8).long() * attention_mask
    features, target_logits = torch.randn(2, 12, 96, generator=generator), torch.randn(2, 12, 40, generator=generator)
    ctx_valid = attention_mask.bool()
    with torch.no_grad():  # a target that often agrees with the drafter, so the accuracy and chain stats count something
        for j, h in enumerate(unroll(model, features, ids, ctx_valid, 3)):
            guess = model.draft_ids_in_target()[model.logits(h).argmax(-1)]
            keep = torch.rand(2, 12, generator=generator) < 0.7
            target_logits.scatter_add_(-1, shift(guess, j + 1)[..., None], 20.0 * shift(keep, j + 1)[..., None].float())
    labels = target_logits.argmax(-1), target_logits.index_select(-1, model.draft_ids_in_target())
    masks = step_masks(ctx_valid, model.layer_types, model.sliding_window, 3, "sdpa")
    monkeypatch.setattr(eagle3_train, "SOFT_CE_KEPT_ROWS", kept_rows)
    torch._dynamo.reset()
    results = []
    for fn in (unroll_and_loss, torch.compile(unroll_and_loss, backend="aot_eager", fullgraph=True, dynamic=False)):
        model.zero_grad()
        stats = fn(model, features, ids, ctx_valid, loss_mask, attention_mask, labels, 3, "sdpa", masks, False, chunk_rows=chunk_rows)
        stats.loss_sum.backward()
        results.append((stats, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (eager, eager_grads), (compiled, compiled_grads) = results
    for field in ("loss_sum", "num_labels", "step_loss", "step_correct", "step_count", "accepted_sum"):
        torch.testing.assert_close(getattr(compiled, field).detach(), getattr(eager, field).detach(), rtol=1e-6, atol=1e-6, msg=field)
    assert eager.accepted_sum > 0 and "lm_head.weight" in eager_grads and eager_grads.keys() == compiled_grads.keys()
    for name, g in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], g, rtol=1e-5, atol=1e-7, msg=name)


def shift(x: torch.Tensor, n: int) -> torch.Tensor:
    """x moved n indices to the right (what the target holds at t + n for index t), zero-filled."""
    out = torch.zeros_like(x)
    out[:, n:] = x[:, :-n]
    return out


# ----------------------------------------------------------------------------- the draft vocabulary


def test_draft_vocabulary_keeps_the_most_frequent_tokens() -> None:
    counts = {5: 10, 2: 10, 9: 3, 7: 1}
    d2t, t2d = build_draft_vocab(counts, 12, 5)
    kept = torch.arange(5) + d2t
    assert kept.tolist() == [0, 2, 5, 7, 9]  # 2, 5 (ties by id), 9, 7, then unseen id 0; sorted by id
    assert t2d.nonzero().flatten().tolist() == kept.tolist()
    d2t, t2d = build_draft_vocab(counts, 12, 32000)  # capped at the target's vocabulary: identity
    assert d2t.tolist() == [0] * 12 and bool(t2d.all())


# ----------------------------------------------------------------------------- training

FAST = ["experiment=eagle3_swa_tiny", "trainer.progress=false", "trainer.log_every=1", "data.num_eval=16", "data.max_length=192"]


@pytest.mark.slow
def test_training_learns_and_exports_windowed_layers(tmp_path: Path) -> None:
    metrics = train(compose_train(FAST + ["trainer.max_steps=40", "trainer.eval_every=0", "trainer.export_formats=[]", f"output_dir={tmp_path}"]))
    history = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [h["train/loss"] for h in history if "train/loss" in h]
    assert len(losses) == 40
    # soft CE against the target's distribution has the target's entropy as its floor: a smaller drop
    assert sum(losses[-5:]) / 5 < 0.95 * sum(losses[:5]) / 5, losses
    assert {"eval/loss", "eval/sim_tau", "eval/acc_step_0", "eval/acc_step_3"} <= set(metrics)
    assert metrics["eval/sim_tau"] > 1.2
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["architectures"] == ["Eagle3DraftModel"]
    assert config["layer_types"] == ["sliding_attention"] and config["sliding_window"] == 64
    assert config["target_layer_ids"] == [1, 3, 4] and config["draft_vocab_size"] == 512 and config["ttt_length"] == 4
    weights = load_file(tmp_path / "export" / "model.safetensors")
    assert weights["lm_head.weight"].shape == (512, 128) and weights["t2d"].sum() == 512
    assert weights["layers.0.self_attn.q_proj.weight"].shape[1] == 256  # [embedding ; hidden]


def test_resume_reproduces_an_uninterrupted_run_bit_for_bit(tmp_path: Path) -> None:
    common = FAST + ["trainer.max_steps=4", "trainer.batch_size=2", "trainer.grad_accum=2", "trainer.eval_every=0", "data.num_eval=0",
                     "trainer.checkpoint_every=2", "trainer.export_formats=[]"]
    train(compose_train(common + [f"output_dir={tmp_path / 'straight'}"]))
    interrupted = train(compose_train(common + ["trainer.interrupt_after=2", f"output_dir={tmp_path / 'resumed'}"]))
    assert interrupted["interrupted"] and interrupted["steps"] == 2
    resumed = train(compose_train(common + [f"output_dir={tmp_path / 'resumed'}"]))
    assert resumed["steps"] == 4
    a = load_file(tmp_path / "straight" / "export" / "model.safetensors")
    b = load_file(tmp_path / "resumed" / "export" / "model.safetensors")
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_gradient_accumulation_matches_a_larger_batch(tmp_path: Path) -> None:
    common = FAST + ["trainer.max_steps=1", "trainer.eval_every=0", "data.num_eval=0", "trainer.warmup_ratio=0", "trainer.export_formats=[]"]
    train(compose_train(common + ["trainer.batch_size=4", f"output_dir={tmp_path / 'big'}"]))
    train(compose_train(common + ["trainer.batch_size=2", "trainer.grad_accum=2", f"output_dir={tmp_path / 'accum'}"]))
    a = load_file(tmp_path / "big" / "export" / "model.safetensors")
    b = load_file(tmp_path / "accum" / "export" / "model.safetensors")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-6)


UNIFORM_KEYS_REFUSED = "trainer.ttt_uniform_keys=true serves EAGLE-3's TTT masks on flex or sdpa"


@pytest.mark.parametrize("override,message", [
    ("drafter.ttt_length=0", "drafter.ttt_length=0"),
    ("drafter.draft_vocab_size=1", "drafter.draft_vocab_size=1"),
    ("drafter.target_layer_ids=[1,3,7]", r"drafter.target_layer_ids=\[1, 3, 7\]: ids must lie in 0..6"),
    ("trainer.attention_backend=cudnn", "trainer.attention_backend=cudnn needs a GPU"),
    ("trainer.attention_backend=fa4", "trainer.attention_backend=fa4 needs a GPU"),
    ("trainer.attention_backend=flex-flash", "trainer.attention_backend=flex-flash serves DFlash's block masks"),
    ("trainer.ttt_uniform_keys=true trainer.attention_backend=fa4", UNIFORM_KEYS_REFUSED),
    ("experiment=dflash_swa_tiny trainer.ttt_uniform_keys=true", UNIFORM_KEYS_REFUSED),
])
def test_start_up_errors(tmp_path: Path, override: str, message: str) -> None:
    """Each case's overrides (space-separated) are refused before the run writes anything."""
    with pytest.raises(ValueError, match=message):
        train(compose_train(FAST + override.split() + [f"output_dir={tmp_path}"]))
    assert not (tmp_path / "run.json").exists()


@pytest.mark.parametrize("case", ["full", "sliding_w2_lt_chain"])
@pytest.mark.parametrize("packed", [False, True])
def test_uniform_key_lengths_give_the_same_unroll_and_gradients(case: str, packed: bool) -> None:
    """``step_masks(uniform_keys=True)``: every step attends over the last step's key length, its later keys zeros that
    no mask shows (one flex kernel pair for all steps on a GPU). Dense masks: the same logits and parameter gradients
    as the step's own key lengths (fp64), right padding and packed documents; flex on the CPU (forward only there): the
    same logits as the dense masks."""
    from torch.nn.attention.flex_attention import flex_attention  # noqa: F401  (the CPU's eager flex)

    layer_types, window, options = CASES[case]
    model = small_drafter(layer_types, window, **options).double()
    steps, seq_len = 4, 12
    generator = torch.Generator().manual_seed(5)
    features = torch.randn(2, seq_len, 3 * 32, generator=generator, dtype=torch.float64)
    ids = torch.randint(0, 40, (2, seq_len), generator=generator)
    ctx_valid = torch.arange(seq_len)[None] < torch.tensor([seq_len, 9])[:, None]
    doc_start = torch.tensor([[0] * 5 + [5] * 7, [0] * 12]) if packed else None
    results = []
    # the last: uniform keys inside checkpointed TTT steps (trainer.activation_checkpointing), the padding recomputed
    for uniform, checkpoint_steps in ((False, False), (True, False), (True, True)):
        model.zero_grad()
        masks = step_masks(ctx_valid, model.layer_types, model.sliding_window, steps, "sdpa", doc_start, uniform_keys=uniform)
        assert {m.shape[-1] for step in masks for m in step.values()} == ({steps * seq_len} if uniform else
                                                                            {(j + 1) * seq_len for j in range(steps)})
        outputs = unroll(model, features, ids, ctx_valid, steps, backend="sdpa", masks=masks, doc_start=doc_start,
                         checkpoint_steps=checkpoint_steps)
        results.append(real_logits_and_grads(model, outputs, ctx_valid))
    (own, own_grads), *uniform_results = results
    for uniform, uniform_grads in uniform_results:
        torch.testing.assert_close(uniform, own, rtol=1e-12, atol=1e-12)
        assert own_grads.keys() == uniform_grads.keys()
        for name in own_grads:
            torch.testing.assert_close(uniform_grads[name], own_grads[name], rtol=1e-10, atol=1e-12, msg=name)

    with torch.no_grad():
        masks = step_masks(ctx_valid, model.layer_types, model.sliding_window, steps, "flex", doc_start, uniform_keys=True)
        outputs = unroll(model, features, ids, ctx_valid, steps, backend="flex", masks=masks, doc_start=doc_start)
        flex = torch.stack([model.logits(h) for h in outputs]) * ctx_valid[None, :, :, None]
    torch.testing.assert_close(flex, own, rtol=1e-9, atol=1e-9)


def test_uniform_key_lengths_are_refused_for_the_window_kernels() -> None:
    with pytest.raises(ValueError, match="uniform key lengths are for the flex and sdpa attention backends, not cudnn"):
        step_masks(torch.ones(1, 4, dtype=torch.bool), ["sliding_attention"], 4, 2, "cudnn", uniform_keys=True)


def test_trainer_uniform_keys_switch_reaches_the_masks_and_trains_the_same(tmp_path: Path, monkeypatch) -> None:
    """``trainer.ttt_uniform_keys``: the trainer's step builds its masks with ``uniform_keys`` (a spy on ``step_masks``)
    and two optimizer steps give the weights the steps' own key lengths give (fp32, sdpa on the CPU)."""
    seen = []
    real_step_masks = eagle3_train.step_masks
    monkeypatch.setattr(eagle3_train, "step_masks", lambda *a, **k: seen.append(k.get("uniform_keys", False)) or real_step_masks(*a, **k))
    common = FAST + ["trainer.max_steps=2", "trainer.batch_size=2", "trainer.eval_every=0", "data.num_eval=0", "trainer.export_formats=[]"]
    for uniform in (False, True):
        seen.clear()
        train(compose_train(common + [f"trainer.ttt_uniform_keys={str(uniform).lower()}", f"output_dir={tmp_path / str(uniform)}"]))
        assert seen and set(seen) == {uniform}, seen
    own = load_file(tmp_path / "False" / "export" / "model.safetensors")
    uniform = load_file(tmp_path / "True" / "export" / "model.safetensors")
    assert own.keys() == uniform.keys()
    for name in own:
        torch.testing.assert_close(uniform[name], own[name], rtol=1e-5, atol=1e-6, msg=name)
