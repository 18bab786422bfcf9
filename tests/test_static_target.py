"""The static-cache target (``models/static_target.py``) against Hugging Face's own forward with no cache,
its decode attention against a softmax written out element by element, its rows against each other, and
the loop built on it against the eager ``CachedTarget`` loop. GPU tests (skipped without CUDA): a captured
step equals the same step run eagerly, and the small-query attention path equals SDPA."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from infer.generate import generate
from infer.prompt_lookup import PromptLookupDrafter
from swa_kernels.attention import cached_attention, grouped_attention
from models.static_target import StaticTarget
from models.target import CachedTarget

pytestmark = pytest.mark.usefixtures("single_cpu_thread")


def load(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()


def reference_attention(q, k, v, visible, scale):
    """q [M, D] of one KV head's group, k/v [C, D], visible [M, C]: softmax over the visible keys, one query at a time."""
    out = torch.zeros_like(q)
    for m in range(q.shape[0]):
        keys = [c for c in range(k.shape[0]) if visible[m, c]]
        weights = torch.softmax(torch.stack([scale * (q[m] @ k[c]) for c in keys]), dim=0)
        out[m] = sum(w * v[c] for w, c in zip(weights, keys))
    return out


def test_grouped_attention_equals_a_softmax_written_out() -> None:
    torch.manual_seed(0)
    b, hkv, m, c, d = 2, 3, 5, 11, 4
    q, k, v = torch.randn(b, hkv, m, d), torch.randn(b, hkv, c, d), torch.randn(b, hkv, c, d)
    visible = torch.rand(b, 1, m, c) < 0.6
    visible[..., 0] = True  # every row sees a key
    got = grouped_attention(q, k, v, visible, scale=0.5)
    for i in range(b):
        for h in range(hkv):
            torch.testing.assert_close(got[i, h], reference_attention(q[i, h], k[i, h], v[i, h], visible[i, 0], 0.5))


@pytest.mark.parametrize("which", ["qwen2", "llama-biases"])
def test_biased_projections_on_the_static_target_match_hf(which) -> None:
    """The static target runs every architecture ``static_unsupported`` passes, biases included (Qwen2's q/k/v, Llama's
    ``attention_bias`` / ``mlp_bias``), against Hugging Face's forward: a prefill and a 10-token step."""
    import transformers as tf

    common = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                  num_hidden_layers=3, max_position_embeddings=512)
    torch.manual_seed(0)
    model = (tf.Qwen2ForCausalLM(tf.Qwen2Config(**common)) if which == "qwen2" else
             tf.LlamaForCausalLM(tf.LlamaConfig(attention_bias=True, mlp_bias=True, **common))).eval()
    for p in model.parameters():  # biases and norms away from their zeros and ones
        p.data.normal_(0, 0.3)
    ids = torch.randint(0, 96, (40,))
    with torch.no_grad():
        ref = model(ids[None]).logits[0]
    target = StaticTarget(model, feature_layer_ids=[])
    target.allocate(64)
    logits = [target.prefill(ids[:30], 0, 0)[0], target.step(ids[None, 30:40], torch.tensor([30]))[0][0]]
    torch.testing.assert_close(torch.cat(logits), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("which", ["reference", "tiny_llama3"])
def test_prefill_steps_and_overwritten_drafts_match_hf(which, reference_target_path, tiny_llama3_path) -> None:
    model = load(reference_target_path if which == "reference" else tiny_llama3_path)
    vocab = model.config.vocab_size
    torch.manual_seed(0)
    ids = torch.randint(3, vocab, (300,))
    with torch.no_grad():
        ref = model(ids[None], output_hidden_states=True)
    target = StaticTarget(model, feature_layer_ids=[4, 1, 5])
    target.allocate(320)
    logits = [target.prefill(ids[:200], 0, 0)[0]]
    pos = torch.tensor([200])
    target.step(torch.randint(3, vocab, (1, 16)), pos)  # rejected drafts at 200..215 ...
    for start in range(200, 300, 10):  # ... overwritten by the real tokens, ten at a time
        out, features = target.step(ids[None, start:start + 10], torch.tensor([start]))
        logits.append(out[0])
    torch.testing.assert_close(torch.cat(logits), ref.logits[0], rtol=1e-4, atol=1e-4)
    want_features = torch.cat([ref.hidden_states[i + 1][0, 290:] for i in [4, 1, 5]], dim=-1)
    torch.testing.assert_close(features[0], want_features, rtol=1e-4, atol=1e-4)
    with torch.no_grad():  # the HF model still runs on the fused weights' views
        torch.testing.assert_close(model(ids[None]).logits, ref.logits)


def test_rows_at_different_positions_each_match_their_own_sequence(reference_target_path) -> None:
    model = load(reference_target_path)
    torch.manual_seed(1)
    seqs = [torch.randint(3, 8192, (n,)) for n in (40, 57, 23)]
    target = StaticTarget(model, feature_layer_ids=[2])
    target.allocate(80, batch=3)
    for row, seq in enumerate(seqs):
        target.prefill(seq[:-4], row, 0)
    logits, features = target.step(torch.stack([s[-4:] for s in seqs]), torch.tensor([len(s) - 4 for s in seqs]))
    for row, seq in enumerate(seqs):
        with torch.no_grad():
            ref = model(seq[None], output_hidden_states=True)
        torch.testing.assert_close(logits[row], ref.logits[0, -4:], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(features[row], ref.hidden_states[3][0, -4:], rtol=1e-4, atol=1e-4)


def test_a_row_moved_down_and_a_step_of_the_first_rows_match_their_own_sequences(reference_target_path) -> None:
    """Batched decoding packs live rows to the front as a batch drains (``move_row``) and steps only those (uncaptured):
    row 2's cache moved into row 0, then a step of the first two rows, each against HF's forward of its own sequence."""
    model = load(reference_target_path)
    torch.manual_seed(2)
    seqs = [torch.randint(3, 8192, (n,)) for n in (30, 45, 52)]
    target = StaticTarget(model, feature_layer_ids=[])
    target.allocate(80, batch=3)
    for row, seq in enumerate(seqs):
        target.prefill(seq[:-4], row, 0)
    target.move_row(2, 0, len(seqs[2]) - 4)
    moved = [seqs[2], seqs[1]]
    logits, _ = target.step(torch.stack([s[-4:] for s in moved]), torch.tensor([len(s) - 4 for s in moved]))
    assert logits.shape[0] == 2
    for row, seq in enumerate(moved):
        with torch.no_grad():
            ref = model(seq[None]).logits[0, -4:]
        torch.testing.assert_close(logits[row], ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("row_attention", [True, False])
def test_a_step_of_padded_rows_runs_only_the_real_tokens_and_equals_the_unpacked_step(reference_target_path, row_attention,
                                                                                      monkeypatch) -> None:
    """Rows with 3, 1, 6 and 4 real tokens of a 6-token step (prompt lookup's shorter drafts): the linears see only the
    14 real tokens (``_packed_step``), the logits and features of the real tokens equal the same step unpacked (every
    token through the linears) and HF's forward of each row's own sequence, and the padding's keys, written past each
    row's real tokens, change nothing in the next step (fp32, CPU). ``row_attention`` (the CPU's default): each row's
    real queries attend over its own keys alone, one SDPA a row and layer; else one SDPA over the padded layout."""
    import models.static_target as static_target

    monkeypatch.setattr(static_target, "ROW_ATTENTION_ON_CPU", row_attention)
    model = load(reference_target_path)
    torch.manual_seed(3)
    lengths = [3, 1, 6, 4]
    seqs = [torch.randint(3, 8192, (n,)) for n in (30, 52, 41, 47)]  # prompt, this step's real tokens, the next step's 4
    packed, plain = StaticTarget(model, feature_layer_ids=[2, 5]), StaticTarget(model, feature_layer_ids=[2, 5])
    starts = [len(s) - n - 4 for s, n in zip(seqs, lengths)]
    for target in (packed, plain):
        target.allocate(80, batch=4)
        for row, (seq, start) in enumerate(zip(seqs, starts)):
            target.prefill(seq[:start], row, 0)
    ids = torch.randint(3, 8192, (4, 6))  # the padding: random ids
    for row, (seq, start, n) in enumerate(zip(seqs, starts, lengths)):
        ids[row, :n] = seq[start:start + n]
    pos = torch.tensor(starts)
    rows_through_linears, linear = [], packed.linear
    packed.linear = lambda x, w, b: rows_through_linears.append(x.shape[:-1].numel()) or linear(x, w, b)
    attended, sdpa = [], torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, k, v, **kw: attended.append((q.shape[0], q.shape[2], k.shape[2])) or sdpa(q, k, v, **kw))
    logits, features = packed.step(ids, pos, torch.tensor(lengths))
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    packed.linear = linear
    assert set(rows_through_linears) == {sum(lengths)}
    groups = model.config.num_attention_heads // model.config.num_key_value_heads
    if row_attention:  # (rows, query rows (g, t), keys) per call: each row's real tokens over its own keys, every layer
        assert attended == [(1, groups * n, start + n) for _ in range(model.config.num_hidden_layers)
                            for start, n in zip(starts, lengths)]
    else:  # every row padded to the step's 6 tokens, over the furthest row's keys
        assert set(attended) == {(4, groups * 6, max(starts) + 6)}
    want_logits, want_features = plain.step(ids, pos)
    for row, (seq, start, n) in enumerate(zip(seqs, starts, lengths)):
        torch.testing.assert_close(logits[row, :n], want_logits[row, :n], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(features[row, :n], want_features[row, :n], rtol=1e-5, atol=1e-5)
        with torch.no_grad():
            ref = model(seq[None, :start + n], output_hidden_states=True)
        torch.testing.assert_close(logits[row, :n], ref.logits[0, start:], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(features[row, :n, :512], ref.hidden_states[3][0, start:], rtol=1e-4, atol=1e-4)
    # the next step at each row's next position: over the padding's keys, which it writes over first
    logits, _ = packed.step(torch.stack([s[-4:] for s in seqs]), torch.tensor([len(s) - 4 for s in seqs]))
    for row, seq in enumerate(seqs):
        with torch.no_grad():
            ref = model(seq[None]).logits[0, -4:]
        torch.testing.assert_close(logits[row], ref, rtol=1e-4, atol=1e-4)


def test_buffers_are_kept_while_the_size_fits_and_bad_steps_are_refused(reference_target_path) -> None:
    target = StaticTarget(load(reference_target_path), feature_layer_ids=[])
    target.allocate(1000)
    assert target.capacity == 1024
    buffer = target.k_cache
    target.allocate(600)  # 1024 <= 600 + 2048: kept
    assert target.k_cache is buffer
    target.allocate(5000)
    assert target.capacity == 5120
    target.allocate(100)  # 5120 > max(200, 2148): a smaller buffer
    assert target.capacity == 256
    with pytest.raises(ValueError, match="step with 2 rows; the caches hold 1"):
        target.step(torch.zeros(2, 1, dtype=torch.long), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="step of 65 tokens per row; at most 64"):
        target.step(torch.zeros(1, 65, dtype=torch.long), torch.zeros(1, dtype=torch.long))
    with pytest.raises(ValueError, match="exceeds the KV cache capacity 256"):
        target.forward(torch.zeros(2, dtype=torch.long), 255)


def test_steps_past_the_capacity_are_refused_in_one_line(reference_target_path) -> None:
    """``step`` (whole and packed rows), ``greedy_step`` and ``tree_greedy`` on the CPU, a row's last token one slot past
    the capacity: a one-line error naming the position and the capacity (before: an IndexError from the RoPE table or
    the cache write); a step ending exactly at the capacity runs."""
    target = StaticTarget(load(reference_target_path), feature_layer_ids=[])
    target.allocate(100, batch=2)
    cap = target.capacity
    ids = torch.zeros(2, 3, dtype=torch.long)
    target.step(ids, torch.tensor([cap - 3, 0]))  # slots cap-3 .. cap-1: the last ones there are
    past = torch.tensor([cap - 2, 0])
    calls = {"step": lambda: target.step(ids, past), "packed": lambda: target.step(ids, past, torch.tensor([3, 1])),
             "greedy_step": lambda: target.greedy_step(ids, past),
             "tree_greedy": lambda: target.tree_greedy(ids, past, torch.tensor([[0, 1, 1]] * 2),
                                                       torch.tril(torch.ones(2, 3, 3, dtype=torch.bool)))}
    for name, call in calls.items():
        with pytest.raises(ValueError, match=rf"^step to position {cap + 1} exceeds the KV cache capacity {cap}; call allocate\(\) first$"):
            call()


@pytest.mark.parametrize("chunk", [0, -3, 2.5])
def test_a_bad_prefill_chunk_is_refused_in_one_line(reference_target_path, chunk) -> None:
    """``generate``'s ``prefill_chunk`` as ``generate_batch`` refuses it (before: range()'s error for 0, an
    UnboundLocalError for a negative chunk, which prefilled nothing, a TypeError for a float)."""
    target = StaticTarget(load(reference_target_path), feature_layer_ids=[])
    with pytest.raises(ValueError, match=rf"^prefill_chunk={chunk}; expected an integer >= 1$"):
        generate(target, None, [5, 6, 7], 4, prefill_chunk=chunk)


@pytest.mark.slow  # the quick tier stays under 3 minutes (README); the full suite runs it
def test_the_loop_on_the_static_target_equals_the_eager_loop(reference_target_path, reference_tokenizer) -> None:
    """Greedy, the target alone and with prompt lookup: the same tokens and the same accepted counts per step."""
    model = load(reference_target_path)
    eager = CachedTarget(model, [])
    static = StaticTarget(model, [])
    eos = [reference_tokenizer.convert_tokens_to_ids("<|im_end|>")]
    for question in ["Write a poem about the sea.", "Explain how a hash map works, step by step."]:
        ids = reference_tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        for drafter in (None, PromptLookupDrafter(num_draft_tokens=8, vocab_size=8192)):
            want = generate(eager, drafter, ids, 48, eos_token_ids=eos)
            got = generate(static, drafter, ids, 48, eos_token_ids=eos)
            assert got.tokens == want.tokens
            assert got.stats.accepted_per_step == want.stats.accepted_per_step


def test_greedy_step_equals_a_step_and_the_greedy_verify(reference_target_path) -> None:
    """``greedy_step`` (one graph on a GPU: forward, argmax, accepted prefix, next token) against ``step``'s logits
    through ``models.sampling.verify``: blocks of the target's own greedy tokens with a wrong draft at slot j accept
    exactly j; ``forced`` replaces the count and takes the token after it; a one-token block is a plain decode step."""
    from models.sampling import SamplingConfig, verify

    model = load(reference_target_path)
    target = StaticTarget(model, [1, 3])
    prompt = torch.randint(3, 8192, (30,), generator=torch.Generator().manual_seed(2))
    greedy = model.generate(prompt[None], max_new_tokens=9, do_sample=False, eos_token_id=None, pad_token_id=0)[0, 29:]
    target.allocate(64)
    target.prefill(prompt[:29], 0, 0)
    pos = torch.tensor([29])
    for wrong_at in (0, 3, 7, None):  # block: the last prompt token, then 8 drafts (the greedy continuation)
        block = greedy[:9].clone()
        if wrong_at is not None:
            block[1 + wrong_at] = (block[1 + wrong_at] + 1) % 8192
        logits, features = (t.clone() for t in target.step(block[None], pos))
        accepted, token = verify(block[1:], None, logits[0], SamplingConfig(), None)
        values, got_features = target.greedy_step(block[None], pos)
        assert values.tolist() == [[int(accepted)] + block[1:].tolist() + [int(token)]]
        assert int(accepted) == (8 if wrong_at is None else wrong_at)
        torch.testing.assert_close(got_features, features, rtol=0, atol=0)
        forced, _ = target.greedy_step(block[None], pos, torch.tensor([2]))
        assert forced[0, 0] == 2 and forced[0, -1] == logits[0, 2].argmax()
    one, _ = target.greedy_step(greedy[None, :1], pos)
    assert one.tolist() == [[0, int(greedy[1])]]


def test_accept_per_step_is_a_benchmark_mode_for_chains_only(reference_target_path) -> None:
    target = StaticTarget(load(reference_target_path), [])
    drafter = PromptLookupDrafter(num_draft_tokens=4, vocab_size=8192)
    run = generate(target, drafter, list(range(5, 40)), 30, accept_per_step=2)
    assert run.stats.accepted_per_step[:-1] == [2] * (len(run.stats.accepted_per_step) - 1)
    with pytest.raises(ValueError, match="accept_per_step=5: needs a chain drafter and 0 <= it < its block size"):
        generate(target, drafter, [5, 6], 4, accept_per_step=5)
    with pytest.raises(ValueError, match="accept_per_step=1: needs a chain drafter"):
        generate(target, None, [5, 6], 4, accept_per_step=1)


# ----------------------------------------------------------------------------------------------- GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@gpu
@pytest.mark.parametrize("q_len,k_len,causal,window", [(1, 5000, True, None), (16, 5000, True, None), (16, 2063, True, 2048),
                                                       (16, 300, False, None), (8, 40, True, 3)])
def test_small_query_attention_on_cuda_equals_sdpa(q_len, k_len, causal, window) -> None:
    from swa_kernels.attention import aligned_mask

    torch.manual_seed(0)
    q = torch.randn(q_len, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(k_len, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    got = cached_attention(q, k, v, causal=causal, window=window, scale=128 ** -0.5)
    mask = aligned_mask(q_len, k_len, causal, window, q.device)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float().transpose(0, 1)[None], k.float().transpose(0, 1)[None], v.float().transpose(0, 1)[None], attn_mask=mask,
        scale=128 ** -0.5, enable_gqa=True)[0].transpose(0, 1)
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


@gpu
@pytest.mark.parametrize("compile_layers", [False, True])
def test_a_captured_step_equals_the_eager_step(reference_target_path, compile_layers) -> None:
    model = AutoModelForCausalLM.from_pretrained(reference_target_path, dtype=torch.bfloat16).cuda().eval()
    torch.manual_seed(0)
    ids = torch.randint(3, 8192, (2, 300), device="cuda")
    captured = StaticTarget(model, [3], capture=True, compile_layers=compile_layers)
    captured.allocate(320, batch=2)
    for row in range(2):
        captured.prefill(ids[row, :280], row, 0)
    pos = torch.tensor([280, 270], device="cuda")
    block = torch.stack([ids[0, 280:296], ids[1, 270:286]])
    eager_logits, eager_features = (t.clone() for t in captured._step(block, pos))
    for _ in range(2):  # the capture, then a replay
        logits, features = captured.step(block, pos)
        atol = 0 if not compile_layers else 0.1
        torch.testing.assert_close(logits, eager_logits, atol=atol, rtol=0 if not compile_layers else 0.05)
        torch.testing.assert_close(features, eager_features, atol=atol, rtol=0 if not compile_layers else 0.05)
    assert math.isfinite(logits.sum().item())
    # the greedy step's graph (forward, row_argmax, acceptance) against the captured step's logits through torch; the
    # second block's first draft is the target's own token (at least one accepted)
    matching = block.clone()
    matching[:, 1] = logits[:, 0].argmax(-1)
    for blk in (block, matching):
        tokens = captured.step(blk, pos)[0].argmax(-1)  # [2, 16]
        accepted = (blk[:, 1:] == tokens[:, :-1]).long().cumprod(-1).sum(-1)
        want = torch.cat([accepted[:, None], blk[:, 1:], tokens.gather(1, accepted[:, None])], dim=1)
        for _ in range(2):
            values, _ = captured.greedy_step(blk, pos)
            assert torch.equal(values, want)
    assert (want[:, 0] >= 1).all()


def test_running_a_step_ahead_changes_no_token(reference_target_path) -> None:
    """The target alone with each step launched before the host reads the previous token (the GPU default) gives the
    tokens of the plain loop and of HF's greedy decoding, stops at an end-of-sequence token, and samples the same."""
    from models.sampling import SamplingConfig

    model = load(reference_target_path)
    target = StaticTarget(model, [])
    prompt = torch.randint(3, model.config.vocab_size, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    want = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)[0, 40:].tolist()
    for eos in ([], [want[9]]):
        expected = want[:want.index(eos[0]) + 1] if eos else want
        for ahead in (True, False):
            got = generate(target, None, prompt, 24, eos_token_ids=eos, run_ahead=ahead)
            assert got.tokens == expected and got.stats.steps == len(expected) - 1
    sampled = [generate(target, None, prompt, 24, sampling=SamplingConfig(temperature=1.0, seed=3), run_ahead=ahead).tokens
               for ahead in (True, False)]
    assert sampled[0] == sampled[1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_reading_a_step_back_waits_for_that_step_alone() -> None:
    """``read_back`` (the loop's host sync, the autoregressive baseline's included) hands the host a step's values while
    the next step, launched after them, still runs; read on the stream instead (``.tolist()``, ``int()``: the baseline's
    read before), the host waits for the launched step too and the GPU idles through the host's turn."""
    from infer.generate import PhaseTimer, read_back

    a = torch.randn(4096, 4096, device="cuda")
    values = torch.arange(5, device="cuda")

    def next_step() -> torch.cuda.Event:  # ~0.1-1 s of products queued behind the values, then an event after them
        for _ in range(100):
            a.copy_(torch.mm(a, a).clamp_(-1, 1))
        done = torch.cuda.Event()
        done.record()
        return done

    timer = PhaseTimer(values.device)
    got, done = read_back(values + 1, next_step, timer, "verify")
    assert got == [1, 2, 3, 4, 5] and not done.query()  # the host has the values; the launched step is still running
    torch.cuda.synchronize()
    ahead = values + 2
    done = next_step()
    assert ahead.tolist() == [2, 3, 4, 5, 6] and done.query()  # the stream-ordered read waited for the launched step
    assert read_back(values, None, timer, "verify") == ([0, 1, 2, 3, 4], None)


def test_without_onednn_prepacking_the_plain_matrices_run(reference_target_path, monkeypatch) -> None:
    """Where torch's private prepacking ops are unusable the CPU default runs the plain matrices; asking for them fails."""
    import torch.nn.functional as F

    import models.static_target as static_target

    monkeypatch.setattr(static_target, "prepack_supported", lambda: False)
    model = load(reference_target_path)
    assert StaticTarget(model, []).linear is F.linear
    with pytest.raises(ValueError, match="prepack=True"):
        StaticTarget(model, [], prepack=True)


def test_switching_the_products_takes_and_a_prepacked_target_refuses(reference_target_path) -> None:
    """``use_triton_products`` (decode_speed's A/B): the product function follows it on plain matrices and the logits
    stay the CPU's (the kernel is for CUDA rows only); a target on prepacked matrices refuses it in one line."""
    import torch.nn.functional as F

    from swa_kernels import skinny_gemm

    model = load(reference_target_path)
    plain = StaticTarget(model, [], prepack=False)
    ids = torch.tensor([5, 9, 11, 2])
    plain.allocate(16)
    want, _ = plain.forward(ids, 0)
    plain.use_triton_products(True)
    assert plain.triton_products and plain.linear is skinny_gemm.few_row_linear
    plain.allocate(16)
    got, _ = plain.forward(ids, 0)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    plain.use_triton_products(False)
    assert plain.linear is F.linear
    packed = StaticTarget(model, [])  # the CPU default in fp32, where the ops are usable
    if packed.prepacked:
        with pytest.raises(ValueError, match="prepacked CPU matrices"):
            packed.use_triton_products(True)


def test_captured_steps_capture_once_per_name_and_shape(monkeypatch) -> None:
    """The capture cache the target and the static drafters share (CUDA-only graphs replaced by a recorder here): one
    capture per (name, input shapes), replays after it, all in one pool until ``clear``."""
    import models.static_target as static_target

    captured, pools = [], iter(range(100))

    class Recorder:
        def __init__(self, fn, *inputs, pool, borrowed=()):
            captured.append((fn.__name__, tuple(t.shape for t in inputs), pool))
            self.fn = fn

        def __call__(self, *inputs):
            return self.fn(*inputs)

    monkeypatch.setattr(static_target, "CapturedStep", Recorder)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: next(pools))
    steps = static_target.CapturedSteps()

    def double(x):
        return 2 * x

    def triple(x):
        return 3 * x

    assert steps("a", double, torch.ones(2)).tolist() == [2, 2]
    assert steps("a", double, torch.full((2,), 5.0)).tolist() == [10, 10]  # replayed, not captured again
    steps("a", double, torch.ones(3))  # another shape
    steps("b", triple, torch.ones(2))  # another name
    assert captured == [("double", ((2,),), 0), ("double", ((3,),), 0), ("triple", ((2,),), 0)]
    steps.clear()
    steps("a", double, torch.ones(2))
    assert captured[-1] == ("double", ((2,),), 1)  # captured again, in a fresh pool
    # a borrowed input is read in place: its buffer is part of the key (the same buffer replays, another captures)
    mine, other = torch.ones(2), torch.ones(2)
    steps("a", double, mine, borrowed=(0,))
    steps("a", double, mine, borrowed=(0,))
    assert len(captured) == 5
    steps("a", double, other, borrowed=(0,))
    assert len(captured) == 6
    steps("a", double, mine[:1], borrowed=(0,))  # the same address, another shape
    assert len(captured) == 7
    # a fresh buffer every call (a caller's mistake) is stopped with a clear error, not captured without end
    steps.max_borrowed_variants = 4
    keep = [torch.ones(2) for _ in range(4)]
    for t in keep:
        steps("c", double, t, borrowed=(0,))
    with pytest.raises(ValueError, match="4 graphs captured in a row.*same buffer every call"):
        steps("c", double, torch.ones(2), borrowed=(0,))
    before = len(captured)
    steps("c", double, keep[0], borrowed=(0,))  # a buffer it has: replayed
    assert len(captured) == before
    # buffers that go stale between generations (a drafter step borrowing a target's verify outputs, captured anew each
    # time the target grows its caches): each captured then replayed, the least recently replayed graph is dropped for
    # the new one, without end and without error
    generations = [torch.full((2,), float(i)) for i in range(12)]
    for t in generations:
        for _ in range(3):
            assert steps("c", double, t, borrowed=(0,)).tolist() == (2 * t).tolist()
    assert len(captured) == before + 12
    assert sum(k[0] == "c" for k in steps.graphs) == 4  # the last four buffers' graphs
    steps("c", double, generations[-1], borrowed=(0,))
    assert len(captured) == before + 12  # kept: replayed
    steps("c", double, generations[0], borrowed=(0,))
    assert len(captured) == before + 13  # dropped long ago: captured again


@gpu
def test_a_borrowed_buffer_is_read_and_updated_in_place_once_a_replay() -> None:
    """``CapturedStep``'s borrowed inputs (the real CUDA graph): no copy in (the graph reads the caller's buffer as it
    is at replay), and a step that updates one in place does so once a replay (its warm-up ran on copies)."""
    from models.static_target import CapturedSteps

    steps = CapturedSteps()
    pos, scale = torch.zeros(1, device="cuda"), torch.ones(1, device="cuda")

    def advance(pos, scale):  # pos += 1, then the new position times scale
        pos.add_(1)
        return pos * scale

    out = steps("advance", advance, pos, scale, borrowed=(0, 1))
    torch.cuda.synchronize()
    assert pos.item() == 1 and out.item() == 1  # the first call: warm-ups on copies, then one replay
    scale.fill_(10)  # read in place: no call copies it in
    out = steps("advance", advance, pos, scale, borrowed=(0, 1))
    torch.cuda.synchronize()
    assert pos.item() == 2 and out.item() == 20 and len(steps.graphs) == 1
    copied = torch.ones(1, device="cuda")
    out = steps("advance", advance, pos, copied, borrowed=(0,))  # scale copied in: a second graph
    torch.cuda.synchronize()
    assert pos.item() == 3 and out.item() == 3 and len(steps.graphs) == 2


@gpu
def test_triton_products_give_cublas_logits_at_the_8b_widths() -> None:
    """At Qwen3-8B's widths (two layers, the 152K head), captured and compiled, the target's steps of 1 and 16 tokens
    through ``swa_kernels/skinny_gemm.py`` (q|k|v, gate|up, the head) give cuBLAS's logits within bf16 rounding."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from swa_kernels import skinny_gemm

    config = Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=2, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16).eval()
    targets = [StaticTarget(model, [], compile_layers=True, triton_products=t) for t in (False, True)]
    x16 = torch.empty(16, 4096, device="cuda", dtype=torch.bfloat16)
    assert all(skinny_gemm.tuned_config(x16, w) is not None for w in (targets[1].weights[0].wqkv, targets[1].weights[0].w13, targets[1].head_weight))
    ids = torch.randint(3, 151936, (1, 80), device="cuda")
    for t in targets:
        t.allocate(128)
        t.forward(ids[0, :60], 0)  # the prompt (60 rows: cuBLAS in both)
    for n, pos in ((1, 60), (16, 61)):
        (want, _), (got, _) = (t.step(ids[:, pos:pos + n], torch.tensor([pos], device="cuda")) for t in targets)
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN (CPU) only")
def test_mid_sized_matrices_run_prepacked_for_many_rows_on_avx512(monkeypatch) -> None:
    """Between ``PREPACK_BY_ROWS_MIN_ELEMENTS`` and ``PREPACK_MIN_ELEMENTS`` elements a matrix is kept both ways where
    torch runs AVX-512 kernels, and plain elsewhere; products of ``PREPACK_MIN_ROWS`` rows or more run the prepacked
    copy, fewer the plain one (which copy ran: the plain one is an ordinary tensor F.linear reads; counted here)."""
    import models.static_target as static_target

    if not static_target.prepack_supported():
        pytest.skip("oneDNN's prepacked linear is not usable with this torch")
    m = torch.randn(768, 512)
    monkeypatch.setattr(static_target, "prepack_by_rows", lambda: False)
    assert static_target.prepacked_copy(m) is m  # AVX2 and others: plain, as measured there
    monkeypatch.setattr(static_target, "prepack_by_rows", lambda: True)
    both = static_target.prepacked_copy(m)
    assert isinstance(both, static_target.RowsPrepacked) and both.packed.is_mkldnn and both.plain is m and both.shape == m.shape
    plain_calls, linear = [], torch.nn.functional.linear
    monkeypatch.setattr(static_target.F, "linear", lambda x, w, b=None: plain_calls.append(x.shape[0]) or linear(x, w, b))
    for rows in (1, static_target.PREPACK_MIN_ROWS - 1, static_target.PREPACK_MIN_ROWS, 40):
        x = torch.randn(rows, 512)
        torch.testing.assert_close(static_target.prepacked_linear(x, both, None), linear(x, m), rtol=1e-5, atol=1e-4)
    assert plain_calls == [1, static_target.PREPACK_MIN_ROWS - 1]


def test_small_matrices_stay_plain_and_every_product_equals_f_linear() -> None:
    """``prepacked_copy`` packs a matrix of at least ``PREPACK_MIN_ELEMENTS`` elements (oneDNN's layout) and leaves a
    smaller one as it is; ``prepacked_linear`` gives ``F.linear``'s result on both (1, 5 and 16 rows, with a bias)."""
    from models.static_target import PREPACK_MIN_ELEMENTS, prepack_supported, prepacked_copy, prepacked_linear

    if not prepack_supported():
        pytest.skip("oneDNN's prepacked linear is not usable with this torch")
    torch.manual_seed(0)
    small, large = torch.randn(64, 32), torch.randn(PREPACK_MIN_ELEMENTS // 512, 512)
    assert prepacked_copy(small) is small and prepacked_copy(large).is_mkldnn
    for m in (small, large, torch.randn(768, 512)):  # the last: mid-sized, both copies on an AVX-512 CPU (run by rows)
        packed, bias = prepacked_copy(m), torch.randn(m.shape[0])
        for rows in (1, 5, 16):
            x = torch.randn(rows, m.shape[1])
            torch.testing.assert_close(prepacked_linear(x, packed, bias), torch.nn.functional.linear(x, m, bias), rtol=1e-5, atol=1e-4)


def test_decode_attention_default_follows_the_head_dim() -> None:
    """The split-KV kernel takes power-of-two head dims >= 16 (``tl.dot`` over them); a target with head_dim 80 or 96 on
    a GPU failed at its first step where it should have run the products (as the DFlash drafter's block attention did)."""
    from models.static_target import choose_decode_attention
    from swa_kernels import decode_attention

    cuda = torch.device("cuda")
    assert choose_decode_attention(None, torch.device("cpu"), 128) == "products"
    assert choose_decode_attention("products", cuda, 96) == "products"
    with pytest.raises(ValueError, match=r"a power-of-two head_dim of at least 16 \(this target's: 96\)"):
        choose_decode_attention("split_kv", cuda, 96)
    if decode_attention.available():
        assert choose_decode_attention(None, cuda, 128) == "split_kv"
        for head_dim in (80, 96, 8):
            with pytest.warns(UserWarning, match=f"head_dim {head_dim} is not a power of two"):
                assert choose_decode_attention(None, cuda, head_dim) == "products"


@gpu
def test_captures_run_with_the_collector_off_among_dropped_graphs(reference_target_path) -> None:
    """On CUDA, with the cyclic collector on at a threshold of one allocation and dropped static targets (cycles inside,
    each holding captured graphs) waiting for it: every capture runs with the collector off (a collection there
    destroyed the old graphs mid-capture: "operation failed due to a previous error during capture", and the process's
    later captures and random draws broken, a one-in-two failure of the GPU tier's
    ``test_captured_rows_reuse_their_turns_on_a_gpu[eagle3]`` on fresh machines), equals the eager step, and leaves the
    generator working. (Whether the collector would have run inside a given capture is up to its thresholds: this
    checks that it cannot, as the CPU test with stand-ins does, on the real calls.)"""
    import gc

    model = AutoModelForCausalLM.from_pretrained(reference_target_path, dtype=torch.float32).cuda().eval()
    torch.manual_seed(0)
    ids = torch.randint(3, 8192, (2, 40), device="cuda")
    pos = torch.tensor([30, 25], device="cuda")
    block = torch.stack([ids[0, 30:34], ids[1, 25:29]])
    thresholds = gc.get_threshold()
    seen = []
    try:
        for attempt in range(3):
            target = StaticTarget(model, [], capture=True)
            target.allocate(64, batch=2)
            for row in range(2):
                target.prefill(ids[row, :30], row, 0)
            want = target._step(block, pos)[0].clone()
            step = target._step
            target._step = lambda *a: seen.append((torch.cuda.is_current_stream_capturing(), gc.isenabled())) or step(*a)
            gc.set_threshold(1, 1, 1)
            got = target.step(block, pos)[0]
            gc.set_threshold(*thresholds)
            torch.testing.assert_close(got, want, atol=0, rtol=0, msg=f"attempt {attempt}")
            target.cycle = target  # dropped with a cycle: only the collector frees it (and its graphs)
            del target, step
    finally:
        gc.set_threshold(*thresholds)
    assert seen == [(False, True), (False, True), (True, False)] * 3 and gc.isenabled()
    torch.cuda.synchronize()
    assert torch.randn(4, device="cuda").isfinite().all()


def test_the_collector_is_off_only_while_a_graph_is_captured(monkeypatch) -> None:
    """``CapturedStep`` on CPU stand-ins for CUDA's stream and graph calls: the warm-up runs see the cyclic collector on,
    the captured run sees it off, and it is on again after, a failed capture included (the GPU half:
    ``test_a_capture_survives_the_collection_of_older_graphs``)."""
    import contextlib
    import gc
    from types import SimpleNamespace

    from models.static_target import CapturedStep

    stream = SimpleNamespace(wait_stream=lambda other: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda: stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: SimpleNamespace(replay=lambda: None))
    capturing = []
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, pool=None: contextlib.nullcontext(capturing.append(True)))
    seen = []

    def fn(x, fail=False):
        seen.append((bool(capturing), gc.isenabled()))
        if capturing and fail:
            raise RuntimeError("capture failed")
        return x + 1

    assert gc.isenabled()
    CapturedStep(fn, torch.zeros(2), pool=None)
    assert seen == [(False, True), (False, True), (True, False)] and gc.isenabled()
    capturing.clear()
    seen.clear()
    with pytest.raises(RuntimeError, match="capture failed"):
        CapturedStep(lambda x: fn(x, fail=True), torch.zeros(2), pool=None)
    assert seen[-1] == (True, False) and gc.isenabled()
