"""eval/loop_*: the decoding loop during training agrees with teacher forcing on the same continuations;
the replayed loop (walk) and the per-anchor mean on hand-made cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from compose import compose_train

from infer.prompts import mt_bench_questions
from infer.prompt_lookup import PromptLookupDrafter
from train.loop_eval import prompt_lookup_acceptance, tau_summaries, walk_segments, walk_tau
from train.trainer import train


def test_walk_over_a_hand_made_sequence() -> None:
    # 8 easy positions (every draft right, 7 accepted) then 8 hard ones (none): the loop crosses the easy run
    # in one step and pays a step for each hard position: the first token is the prefill's and the last ends the loop
    # (no step from it), so 15 tokens in 8 steps, where the per-anchor mean says 4.5.
    accepted = [7] * 8 + [0] * 8
    assert walk_tau(accepted) == (15, 8)
    summary = tau_summaries("x", torch.tensor(float(sum(accepted))), torch.tensor(16.0), torch.tensor(15.0), torch.tensor(8.0))
    assert summary == {"x/anchor_tau": pytest.approx(4.5), "x/block_tau": pytest.approx(15 / 8)}
    assert walk_tau([0, 0, 0]) == (2, 2) and walk_tau([]) == (0, 0) and walk_tau([5]) == (0, 0)
    # a step whose bonus token falls past the reply's last token counts up to it (``trim_output`` cuts the loop's)
    assert walk_tau([2, 5, 5, 0]) == (3, 1) and walk_tau([1, 0, 1, 0]) == (3, 2)
    # two assistant turns in one row, and a row with none: each turn's walk starts at its first token
    accepted = torch.tensor([[-1, 1, 0, 1, -1, -1, 0, 0], [-1] * 8])
    loss_mask = torch.tensor([[0, 1, 1, 1, 1, 0, 1, 1], [0] * 8], dtype=torch.bool)
    assert walk_segments(accepted, loss_mask) == (4, 3)  # turn 1: steps at 1 and 3 (2 tokens, then 1 up to 4); turn 2: at 6


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_prompt_lookup_acceptance_equals_the_loops_drafter_at_every_position(seed: int) -> None:
    """Rows of a 5-token vocabulary (n-grams recur everywhere, one 40-token copy) with two assistant turns: at each loss position the
    one-pass index accepts what ``PromptLookupDrafter.propose`` on the context so far drafts, counted against the rest
    of that turn; -1 off the turns."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 5, (300,), generator=g).tolist()
    ids[200:240] = ids[40:80]  # a copy: long drafts right
    mask = [0] * 20 + [1] * 110 + [0] * 30 + [1] * 140
    for max_drafts in (1, 7, 15):
        drafter = PromptLookupDrafter(max_drafts)
        got = prompt_lookup_acceptance(ids, mask, max_drafts)
        for t in range(len(ids)):
            if not mask[t]:
                assert got[t] == -1
                continue
            turn_end = next((i for i in range(t, len(mask)) if not mask[i]), len(mask))
            drafts, a = drafter.propose(ids[:t + 1]), 0
            while a < len(drafts) and t + 1 + a < turn_end and drafts[a] == ids[t + 1 + a]:
                a += 1
            assert got[t] == a, (max_drafts, t)
    assert max(got) >= 3  # long accepted runs were exercised


@pytest.mark.slow  # a 120-step training run with regeneration and the loop: ~35 s of one worker
def test_loop_tau_matches_teacher_forcing_after_an_on_policy_run(tmp_path: Path) -> None:
    """A short on-policy DFlash run on the tiny builtin target whose held-out prompts have near-twins in training
    (each question four times, written four ways: the split keeps exact twins of a held-out prompt out of training,
    these it cannot tell apart, so the drafter can learn the target's replies and τ is well above 1). The tiny target,
    not the 27M reference: what is compared is the loop against teacher forcing (238 s -> 35 s in the full suite)."""
    questions = [q["turns"][0] for q in mt_bench_questions()[:10]]
    data = tmp_path / "data.jsonl"
    with open(data, "w") as f:
        for copy, written in enumerate(["{}", "{} ", "{}\n", " {}"]):
            for i, q in enumerate(questions):
                f.write(json.dumps({"id": f"q{i}-{copy}", "messages": [{"role": "user", "content": written.format(q)},
                                                                     {"role": "assistant", "content": "-"}]}) + "\n")
    metrics = train(compose_train([
        "experiment=dflash_swa_tiny", f"data.path={data}", "data.num_eval=8",
        "data.max_length=256", "data.regenerate.enabled=true", "data.regenerate.max_new_tokens=48", "data.regenerate.batch_size=40",
        "drafter.num_hidden_layers=1", "drafter.layer_types=[sliding_attention]", "drafter.sliding_window=32", "drafter.num_anchors=48",
        "trainer.max_steps=120", "trainer.lr=3e-3", "trainer.eval_every=0", "trainer.progress=false", "trainer.export=false",
        "trainer.loop_eval_prompts=8", "trainer.loop_eval_max_new_tokens=48", f"output_dir={tmp_path / 'run'}",
        # AdamW and the paper's decay, as this test was sized on: the tiny recipe's Muon + D-PACE memorised these
        # replies (on the 27M target, where it was sized) to a τ of 7.8-8.0 of 8, where one near-tie draft (cached
        # against full forward) is past the 2% below; on the tiny target this run gives loop τ 1.94, replay 1.92
        "trainer.optimizer=adamw", "drafter.loss_weighting=exp",
    ]))
    loop, teacher_forced = metrics["eval/loop_tau"], metrics["eval/loop_tf_block_tau"]
    assert loop > 1.15, metrics  # drafts are accepted: agreement is not the trivial 1.0 == 1.0
    assert metrics["eval/loop_same_as_greedy"] == 1.0  # the loop is lossless: it decoded the continuations teacher forcing saw
    # the training-side block_tau (the loop replayed on teacher-forced acceptances) on the same continuations: the
    # issue asks for 10%; the replay takes the loop's own steps, so only numerics (cached vs full forward) separate them
    assert abs(teacher_forced - loop) <= 0.02 * loop, (loop, teacher_forced)
    assert metrics["eval/block_tau"] > 1.0 and metrics["eval/loop_pld_tau"] >= 1.0 and metrics["eval/pld_block_tau"] >= 1.0


def test_dflash_evaluation_replays_blocks_drafted_one_anchor_at_a_time(tiny_qwen3_path) -> None:
    """``DFlashStep.evaluate_batch`` (blocks at every position, in chunks of num_anchors, then the walk) against
    an independent reference: each anchor's block drafted alone, its leading correct drafts counted by hand, each
    assistant turn walked by hand. The row has two turns; num_anchors=5 makes several chunks."""
    from train.dflash import build_blocks
    from models.target import TargetModel
    from train.trainer import build_step, to_train_config

    cfg = to_train_config(compose_train(["experiment=dflash_swa_tiny", "drafter.num_anchors=5", "drafter.sliding_window=8"]))
    target = TargetModel.from_pretrained(tiny_qwen3_path)
    step = build_step(cfg, target, [1, 5], torch.device("cpu"))
    drafter = step.drafter.eval()
    torch.manual_seed(0)
    ids = torch.randint(20, 200, (40,))
    loss = torch.zeros(40, dtype=torch.bool)
    loss[6:18] = loss[24:38] = True
    batch = step.ctx.collate([{"input_ids": ids.tolist(), "loss_mask": loss.tolist()}], target.pad_id)
    # the untrained drafter's favourite token fills the second turn: its blocks there are accepted, so the walk
    # and the per-anchor mean differ and the test can tell them apart
    blocks = build_blocks(batch["input_ids"], batch["loss_mask"], torch.tensor([[24]]), torch.tensor([[True]]), cfg.drafter.block_size,
                          drafter.mask_token_id)
    with torch.no_grad():
        favourite = step.block_logits(batch, blocks, "sdpa")[0, 1:].argmax(-1).mode().values
    ids[25:36] = favourite
    batch = step.ctx.collate([{"input_ids": ids.tolist(), "loss_mask": loss.tolist()}], target.pad_id)
    stats = step.evaluate_batch(batch)
    _, by_position = step.dense_acceptance(batch)

    b = cfg.drafter.block_size
    accepted = {}
    for a in range(39):
        if not (loss[a] and loss[a + 1]):
            continue
        blocks = build_blocks(batch["input_ids"], batch["loss_mask"], torch.tensor([[a]]), torch.tensor([[True]]), b, drafter.mask_token_id)
        with torch.no_grad():
            drafts = step.block_logits(batch, blocks, "sdpa")[0, 1:].argmax(-1).tolist()
        n = 0
        while n < b - 1 and a + 1 + n < 40 and loss[a + 1 + n] and drafts[n] == int(ids[a + 1 + n]):
            n += 1
        accepted[a] = n
    tokens = steps = 0
    for start, end in ((6, 18), (24, 38)):  # each turn walked from its first token (the prefill's) to its last (no step there)
        i = start
        while i < end - 1:
            made = min(accepted.get(i, 0) + 1, end - 1 - i)
            steps, tokens, i = steps + 1, tokens + made, i + made
    assert by_position[0].tolist() == [accepted.get(a, -1) for a in range(40)]
    summary = stats.summary("x")
    assert summary["x/block_tau"] == pytest.approx(tokens / steps)
    assert summary["x/anchor_tau"] == pytest.approx(1 + sum(accepted.values()) / len(accepted))
    assert stats.num_blocks == len(accepted) == 11 + 13
    assert max(accepted.values()) >= 3 and summary["x/anchor_tau"] > summary["x/block_tau"] + 0.2, (accepted, summary)


def test_repetition_counts_loops_and_copies_of_the_prompt() -> None:
    """The closing summary's note: n-grams of a greedy continuation seen before in it or in its prompt."""
    from train.loop_eval import LoopEval

    loop = object.__new__(LoopEval)
    loop.prompts = [[1, 2, 3, 4, 5], [9, 9]]
    loop.greedy = [[1, 2, 3, 4, 7, 8, 6, 7, 8, 6, 7, 8], [10, 11, 12, 13]]
    # continuation 1: 9 4-grams, (1,2,3,4) from the prompt and (7,8,6,7) (8,6,7,8) repeated; continuation 2: 1, fresh
    assert loop.repetition() == 3 / 10
    loop.prompts = [[], []]
    assert loop.repetition() == 2 / 10


def test_dflash_evaluation_in_row_chunks_equals_all_rows_at_once(tiny_qwen3_path, monkeypatch) -> None:
    """Evaluation computes the drafter's logits a few rows at a time (``EVAL_LOGITS_BYTES``: a 49K-128K vocabulary
    over 16 rows of 4,096 slots is tens of GB at once): one row at a time gives the statistics and per-position
    acceptances of every row at once, on three rows of different lengths and turns."""
    import train.dflash as dflash
    from models.target import TargetModel
    from train.trainer import build_step, to_train_config

    cfg = to_train_config(compose_train(["experiment=dflash_swa_tiny", "drafter.num_anchors=5", "drafter.sliding_window=8"]))
    target = TargetModel.from_pretrained(tiny_qwen3_path)
    step = build_step(cfg, target, [1, 5], torch.device("cpu"))
    step.drafter.eval()
    torch.manual_seed(1)
    records = []
    for n, turns in ((40, ((6, 18), (24, 38))), (31, ((3, 30),)), (25, ((10, 20),))):
        loss = torch.zeros(n, dtype=torch.bool)
        for a, b in turns:
            loss[a:b] = True
        records.append({"input_ids": torch.randint(20, 200, (n,)).tolist(), "loss_mask": loss.tolist()})
    batch = step.ctx.collate(records, target.pad_id)
    monkeypatch.setattr(dflash, "EVAL_LOGITS_BYTES", 1 << 40)
    whole, whole_positions = step.dense_acceptance(batch)
    monkeypatch.setattr(dflash, "EVAL_LOGITS_BYTES", 1)
    chunked, chunked_positions = step.dense_acceptance(batch)
    assert torch.equal(chunked_positions, whole_positions) and (whole_positions >= 0).sum() > 30
    for got, want in zip(vars(chunked).values(), vars(whole).values()):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_replayed_loop_is_the_loops_tau_step_for_step(kind: str, isolated_cache) -> None:
    """``block_tau``'s replay (``evaluate_batch``: ``eval/loop_tf_block_tau``, ``eval/block_tau``) against the real loop
    (``infer.generate``, as ``python -m infer`` runs it) on the same prompts: a drafter with a sliding and a full layer,
    a window shorter than every prompt, overfit for a few steps on the target's greedy replies so that drafts are
    accepted; each reply's replayed (tokens, steps) is the loop's, so the τ is too. The replay stepped from the reply's
    last token as well and counted a bonus token past it: (L, S + 1) or (L, S) where the loop had (L - 1, S)
    (EAGLE-3's tiny run: 4.38 for the loop's 4.86)."""
    from infer.generate import generate
    from infer.loading import decoding_target, eos_ids
    from infer.prompts import long_prompt_ids
    from models.builtin_targets import resolve_target_path
    from models.target import TargetModel
    from train.loop_eval import LoopEval
    from train.trainer import build_step, target_layer_ids, to_train_config, train_step

    window = 8
    drafter = (["experiment=dflash_swa_tiny", "drafter.num_anchors=64", "drafter.reveal_prob=0", "drafter.loss_weighting=exp"]
               if kind == "dflash" else ["experiment=eagle3_swa_tiny", "drafter.num_hidden_layers=2", "drafter.ttt_length=4"])
    cfg = to_train_config(compose_train([*drafter, "drafter.layer_types=[sliding_attention,full_attention]",
                                         f"drafter.sliding_window={window}", "trainer.optimizer=adamw", "trainer.lr=3e-3"]))
    torch.manual_seed(0)
    target = TargetModel.from_pretrained(resolve_target_path(cfg.target.path))
    layer_ids = target_layer_ids(cfg, target)
    prompts = [long_prompt_ids(target.tokenizer, q["turns"][0], 0) for q in mt_bench_questions()[:3]]
    assert min(map(len, prompts)) > window
    alone, eos = decoding_target(target.model, layer_ids), eos_ids(target.tokenizer, target.model)
    rows = [{"input_ids": p + g, "loss_mask": [0] * len(p) + [1] * len(g)}
            for p in prompts for g in [generate(alone, None, p, 40, eos_token_ids=eos).tokens]]
    step = build_step(cfg, target, layer_ids, torch.device("cpu"), train_ds=rows)  # EAGLE-3's draft vocabulary from the replies
    loop = LoopEval(step, prompts, max_new_tokens=40)
    assert [r["input_ids"][len(p):] for r, p in zip(rows, prompts)] == loop.greedy
    batch = step.ctx.collate(rows, target.pad_id)
    trainable = [p for p in step.drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=3e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    for n in range(1, 41):
        train_step(step, [batch], n, optimizer, scheduler)

    metrics = loop()
    step.drafter.eval()
    drafted = loop.inference_drafter()
    with torch.no_grad():
        for prompt, row, greedy in zip(prompts, rows, loop.greedy):
            run = generate(loop.cached, drafted, prompt, 40, eos_token_ids=loop.eos)
            assert run.tokens == greedy
            stats = step.evaluate_batch(step.ctx.collate([row], target.pad_id))
            steps = run.stats.accepted_per_step
            assert (int(stats.walk_tokens), int(stats.walk_steps)) == (sum(a + 1 for a in steps), len(steps)) == (len(greedy) - 1, len(steps))
    assert metrics["eval/loop_tau"] > 1.5, metrics  # drafts are accepted: the replay is not 1.0 == 1.0
    assert metrics["eval/loop_tf_block_tau"] == pytest.approx(metrics["eval/loop_tau"], rel=1e-6)


def test_loop_eval_with_no_verify_step_reports_no_tau(tiny_qwen3_path) -> None:
    """``trainer.loop_eval_max_new_tokens=1``: every reply is the prefill's one token, no verify step runs. The loop's
    τ was logged as 0.0 (``pooled_acceptance``'s value for no step, a τ below 1) beside a replayed 1.0; now neither
    the loop's nor the replay's τ is reported (``eval/loop_steps`` 0 says why), and nothing raises."""
    from infer.prompts import long_prompt_ids
    from models.target import TargetModel
    from train.loop_eval import LoopEval
    from train.trainer import build_step, to_train_config

    cfg = to_train_config(compose_train(["experiment=dflash_swa_tiny", "drafter.sliding_window=8"]))
    target = TargetModel.from_pretrained(tiny_qwen3_path)
    step = build_step(cfg, target, [1, 5], torch.device("cpu"))
    prompts = [long_prompt_ids(target.tokenizer, q["turns"][0], 0) for q in mt_bench_questions()[:2]]
    metrics = LoopEval(step, prompts, max_new_tokens=1)()
    assert metrics["eval/loop_steps"] == 0 and metrics["eval/loop_pld_steps"] == 0, metrics
    assert not {"eval/loop_tau", "eval/loop_pld_tau", "eval/loop_tf_block_tau", "eval/loop_acc_pos_1"} & set(metrics), metrics
    assert all(v == v for v in metrics.values()), metrics  # no NaN
