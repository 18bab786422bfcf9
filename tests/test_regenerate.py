"""On-policy regeneration: every engine's replies equal a plain greedy loop, turn by turn (and ours with each conversation's
turns reusing their row); a killed run resumes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from train.config import RegenerateConfig
from train.data.chat import ChatRenderer
from train.data.readers import Conversation
from train.data.regenerate import HFReplies, OurReplies, read_partial, regenerate_conversations
from models.target import TargetModel


@torch.no_grad()
def greedy_reply(model, tokenizer, prompt_ids: list[int], max_new_tokens: int) -> tuple[list[int], bool]:
    """Reference: full forward each step, argmax, stop at EOS (no cache, no batching, no padding); (the reply's tokens,
    whether the target ended it within the budget)."""
    ids = list(prompt_ids)
    new = []
    for _ in range(max_new_tokens):
        next_id = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        if next_id == tokenizer.eos_token_id:
            return new, True
        ids.append(next_id)
        new.append(next_id)
    return new, False


def plain_greedy(model, tokenizer, prompt_ids: list[int], max_new_tokens: int) -> str:
    return tokenizer.decode(greedy_reply(model, tokenizer, prompt_ids, max_new_tokens)[0], skip_special_tokens=True)


def conversations_to_regenerate() -> list[Conversation]:
    return [
        Conversation("a", [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "old"},
                           {"role": "user", "content": "And of Italy?"}, {"role": "assistant", "content": "old"}]),
        Conversation("b", [{"role": "system", "content": "You are a helpful assistant."},
                           {"role": "user", "content": "Write a haiku about the sea, please, with a title."}, {"role": "assistant", "content": "old"}]),
        Conversation("c", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "old"}]),
    ]


def reply_runs(loss_mask: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of trained positions in a row (a reply, with its end of turn where trained)."""
    runs, start = [], None
    for t, m in enumerate(loss_mask + [0]):
        if m and start is None:
            start = t
        elif not m and start is not None:
            runs.append((start, t))
            start = None
    return runs


def check_greedy_replies(target, renderer, conversations, out, max_new_tokens: int) -> None:
    """Each conversation's training row is the target's own greedy trajectory: every reply, as trained, is what the
    plain greedy loop generates on the row before it (its token ids, its text, whether it ended), so every trained
    label is the target's argmax there; user turns untouched."""
    assert [c.id for c in out] == ["a", "b", "c"]
    eos = target.tokenizer.eos_token_id
    for new in out:
        replies = [m for m in new.messages if m["role"] == "assistant"]
        row = renderer.tokenize(new.messages, new.id)
        runs = reply_runs(row.loss_mask)
        assert len(runs) == len(replies), new.id
        for (start, end), m in zip(runs, replies):
            ids, ended = greedy_reply(target.model, target.tokenizer, row.input_ids[:start], max_new_tokens)
            assert m["token_ids"] == ids and row.input_ids[start:start + len(ids)] == ids, (new.id, start)
            assert m["content"] == target.tokenizer.decode(ids, skip_special_tokens=True) and m["content"] != "old"
            assert m.get("complete", True) is ended, (new.id, start)  # a reply cut at the budget is marked
            assert end - start == len(ids) + ended and (not ended or row.input_ids[end - 1] == eos)  # its end trained if ended
    # Roles and user turns are untouched.
    for old, new in zip(conversations, out):
        assert [m["role"] for m in old.messages] == [m["role"] for m in new.messages]
        assert [m["content"] for m in old.messages if m["role"] != "assistant"] == [m["content"] for m in new.messages if m["role"] != "assistant"]


@pytest.mark.parametrize("engine", [pytest.param("hf", marks=pytest.mark.slow), "ours"])
def test_greedy_regeneration_matches_plain_loop(reference_target_path, engine: str) -> None:
    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    renderer = ChatRenderer(target.tokenizer)
    conversations = conversations_to_regenerate()
    cfg = RegenerateConfig(enabled=True, max_new_tokens=12, batch_size=2, engine=engine)
    replies = target.model if engine == "hf" else OurReplies(target.model, target.tokenizer, cfg)
    out, stats = regenerate_conversations(conversations, replies, renderer, cfg, max_length=1024, progress=False)
    assert stats["turns_regenerated"] == 4
    assert [c.id for c in out] == ["a", "b", "c"]
    check_greedy_replies(target, renderer, conversations, out, 12)


@pytest.mark.parametrize("engine", ["hf", "ours"])
def test_every_reply_of_a_batch_gets_its_own_budget(reference_target_path, engine: str) -> None:
    """Budgets differ where a prompt nears ``max_length`` (its room is what is left): each reply is the plain greedy loop's
    up to its own budget. Hugging Face's engine gave every reply of a batch the batch's smallest budget (its batches are
    sorted by prompt length, so the longest prompt's room)."""
    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    cfg = RegenerateConfig(enabled=True, max_new_tokens=12, batch_size=2, engine=engine)
    replies = HFReplies(target.model, target.tokenizer, cfg) if engine == "hf" else OurReplies(target.model, target.tokenizer, cfg)
    prompts = [[200 + i for i in range(8)], [300 + i for i in range(20)]]
    budgets = [12, 3]
    got = dict((i, tokens) for i, tokens, _, _ in replies.replies(prompts, budgets))
    for i, prompt in enumerate(prompts):
        want = target.tokenizer(plain_greedy(target.model, target.tokenizer, prompt, budgets[i]), add_special_tokens=False)["input_ids"]
        assert target.tokenizer.decode(got[i], skip_special_tokens=True) == target.tokenizer.decode(want, skip_special_tokens=True)
    assert len(got[0]) > 3  # the short prompt's reply ran past the long one's budget


def test_our_engine_gives_its_target_back_when_closed(reference_target_path) -> None:
    """``OurReplies.close`` (regeneration's engine is closed before training starts): its static target (fused weights,
    KV buffers of ``batch_size`` rows) is freed at once, not held into training by a reference cycle."""
    import weakref

    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    engine = OurReplies(target.model, target.tokenizer, RegenerateConfig(enabled=True, max_new_tokens=4, batch_size=2))
    list(engine.replies([[200, 201, 202]], [4]))
    static = weakref.ref(engine.target)
    engine.close()
    assert static() is None


class KilledAfter:
    """An engine that dies (as a kill would) after ``n`` replies, counting the prompts it was asked."""

    def __init__(self, inner, n: int):
        self.inner, self.n, self.asked = inner, n, 0
        self.whole_batches = getattr(inner, "whole_batches", False)

    def replies(self, prompts, budgets, *args, **kwargs):
        self.asked += len(prompts) - len(kwargs.get("skip", ()))
        for reply in self.inner.replies(prompts, budgets, *args, **kwargs):
            if self.n == 0:
                raise KeyboardInterrupt
            self.n -= 1
            yield reply


@pytest.mark.slow  # ~5 s on one core; the quick tier keeps the greedy regeneration against the plain loop
def test_a_killed_regeneration_resumes_where_it_stopped(reference_target_path, tmp_path: Path) -> None:
    """The first run dies after 3 of 4 replies (turn 2 of conversation a still to do); the second asks only for the
    missing one and its result equals an uninterrupted run's."""
    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    renderer = ChatRenderer(target.tokenizer)
    cfg = RegenerateConfig(enabled=True, max_new_tokens=8, engine="ours")
    partial = tmp_path / "regen.partial.jsonl"
    with pytest.raises(KeyboardInterrupt):
        regenerate_conversations(conversations_to_regenerate(), KilledAfter(OurReplies(target.model, target.tokenizer, cfg), 3),
                                 renderer, cfg, max_length=1024, progress=False, partial=partial)
    assert len(read_partial(partial)) == 3
    with partial.open("a") as f:
        f.write('{"conversation": 0, "tu')  # the line a kill cut off is ignored
    second = KilledAfter(OurReplies(target.model, target.tokenizer, cfg), 100)
    out, stats = regenerate_conversations(conversations_to_regenerate(), second, renderer, cfg, max_length=1024, progress=False,
                                          partial=partial)
    assert second.asked == 1 and stats["turns_resumed"] == 3 and stats["turns_regenerated"] == 1
    whole, whole_stats = regenerate_conversations(conversations_to_regenerate(), OurReplies(target.model, target.tokenizer, cfg), renderer,
                                                  cfg, max_length=1024, progress=False)
    assert [c.messages for c in out] == [c.messages for c in whole]
    # the resumed replies' budget cuts counted as the uninterrupted run's (8 new tokens: some replies are cut)
    assert stats["replies_cut_at_budget"] == whole_stats["replies_cut_at_budget"] > 0
    check_greedy_replies(target, renderer, conversations_to_regenerate(), out, 8)


@pytest.mark.slow  # the quick tier stays under 3 minutes (README); the full suite runs it
def test_kept_replies_stay_and_later_turns_follow_them(reference_target_path) -> None:
    """A regenerated file extended with a later user turn (``keep_replies=1``): the first replies come back as they
    were, untouched, and only the new turn is asked, on a prompt holding the kept reply; its reply is the plain greedy
    loop's, and equals the whole conversation regenerated from scratch (the kept reply was the target's own)."""
    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    renderer = ChatRenderer(target.tokenizer)
    cfg = RegenerateConfig(enabled=True, max_new_tokens=8, engine="ours")
    whole, _ = regenerate_conversations(conversations_to_regenerate(), OurReplies(target.model, target.tokenizer, cfg), renderer, cfg,
                                        max_length=1024, progress=False)
    def first_reply_end(messages):
        return next(i for i, m in enumerate(messages) if m["role"] == "assistant") + 1
    extended = [Conversation(c.id, [dict(m) for m in c.messages[:first_reply_end(c.messages)]]
                             + [dict(m) for m in src.messages[first_reply_end(src.messages):]])
                for c, src in zip(whole, conversations_to_regenerate())]  # first replies regenerated, a's second still "old"
    engine = KilledAfter(OurReplies(target.model, target.tokenizer, cfg), 100)
    kept_cfg = RegenerateConfig(enabled=True, max_new_tokens=8, engine="ours", keep_replies=1)
    out, stats = regenerate_conversations(extended, engine, renderer, kept_cfg, max_length=1024, progress=False)
    assert engine.asked == 1 and stats["turns_kept"] == 3 and stats["turns_regenerated"] == 1
    assert [c.messages for c in out] == [c.messages for c in whole]
    marked = [Conversation(c.id, [dict(m, content="kept " + m["content"]) if m["role"] == "assistant" else dict(m) for m in c.messages])
              for c in extended]  # kept replies are not rewritten, whatever they hold
    out, _ = regenerate_conversations(marked, OurReplies(target.model, target.tokenizer, cfg), renderer, kept_cfg, max_length=1024,
                                      progress=False)
    assert [m["content"] for c in out for m in c.messages if m["role"] == "assistant"][:1] == ["kept " + whole[0].messages[1]["content"]]
    check = out[0].messages
    prompt = target.tokenizer(renderer.render(check[:3], add_generation_prompt=True), add_special_tokens=False)["input_ids"]
    assert check[3]["content"] == plain_greedy(target.model, target.tokenizer, prompt, 8)


@pytest.mark.slow
def test_a_prompt_near_max_length_gets_the_room_left_and_one_at_it_is_cut(reference_target_path) -> None:
    """A prompt 3 tokens short of ``max_length`` gets a reply of at most 3 tokens (the plain loop's, marked cut), one of
    exactly ``max_length`` tokens cuts its conversation: the edges no other test reached (a budget one short and a
    cut at > instead of >= passed)."""
    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    renderer = ChatRenderer(target.tokenizer)
    conversation = Conversation("n", [{"role": "user", "content": "Tell me a long story about the sea."}, {"role": "assistant", "content": "old"}])
    prompt = target.tokenizer(renderer.render(conversation.messages[:1], add_generation_prompt=True, conversation_id="n"),
                              add_special_tokens=False)["input_ids"]
    cfg = RegenerateConfig(max_new_tokens=8, engine="ours")
    engine = OurReplies(target.model, target.tokenizer, cfg)
    out, stats = regenerate_conversations([conversation], engine, renderer, cfg, max_length=len(prompt) + 3, progress=False)
    ids, ended = greedy_reply(target.model, target.tokenizer, prompt, 3)
    assert out[0].messages[1]["content"] == target.tokenizer.decode(ids) and not ended and out[0].messages[1].get("complete", True) is False
    assert stats["replies_cut_at_budget"] == 1 and stats["conversations_cut"] == 0
    out, stats = regenerate_conversations([conversation], engine, renderer, cfg, max_length=len(prompt), progress=False)
    assert stats["conversations_cut"] == 1 and stats["turns_regenerated"] == 0


def test_too_long_prompt_cuts_the_conversation(reference_target_path) -> None:
    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    renderer = ChatRenderer(target.tokenizer)
    long_user = "word " * 200
    conversations = [Conversation("x", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "old"},
                                        {"role": "user", "content": long_user}, {"role": "assistant", "content": "old"}])]
    out, stats = regenerate_conversations(conversations, target.model, renderer, RegenerateConfig(max_new_tokens=4), max_length=64, progress=False)
    assert stats["conversations_cut"] == 1
    assert len(out[0].messages) == 2 and out[0].messages[1]["content"] != "old"


def test_runs_started_together_regenerate_the_data_once(tiny_qwen3_path, tmp_path: Path, monkeypatch) -> None:
    """Two trainings on the same data at once (the small-target pipeline starts DFlash and EAGLE-3 side by side): one
    regenerates, the other waits for it and reads the cache; both get the same conversations. Without the lock both
    started an engine and appended to one partial file."""
    import threading

    import train.data as data
    from compose import compose_train

    source = tmp_path / "data.jsonl"
    source.write_text("".join(json.dumps({"id": c.id, "messages": c.messages}) + "\n" for c in conversations_to_regenerate()))
    cfg = compose_train(["experiment=dflash_swa_tiny", f"target.path={tiny_qwen3_path}", f"data.path={source}", "data.num_eval=0",
                         f"data.cache_dir={tmp_path / 'cache'}", "data.regenerate.max_new_tokens=4"])
    target = TargetModel.from_pretrained(str(tiny_qwen3_path), "cpu")
    started = []
    reply_engine = data.reply_engine

    def slow_engine(*args):  # the first run holds the data long enough for the second to arrive
        started.append(threading.current_thread().name)
        time.sleep(1.0)
        return reply_engine(*args)

    monkeypatch.setattr(data, "reply_engine", slow_engine)
    results = {}
    runs = [threading.Thread(target=lambda n=n: results.update({n: data.prepare_data(cfg.data, target, progress=False)}), name=f"run{n}")
            for n in range(2)]
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    assert len(started) == 1
    assert [r["input_ids"] for r in results[0][0]] == [r["input_ids"] for r in results[1][0]]
    assert results[0][2]["regenerated_from"] == results[1][2]["regenerated_from"]


def test_regenerated_again_its_new_replies_are_tokenized(tiny_qwen3_path, tmp_path: Path) -> None:
    """The tokenized cache of regenerated data follows the regenerated file itself: regenerated again (the file deleted
    to redo it, here rewritten with other replies), its tokens are the new replies', not those cached from the old
    file at the same path."""
    import train.data as data
    from compose import compose_train

    source = tmp_path / "data.jsonl"
    source.write_text("".join(json.dumps({"id": c.id, "messages": c.messages}) + "\n" for c in conversations_to_regenerate()))
    cfg = compose_train(["experiment=dflash_swa_tiny", f"target.path={tiny_qwen3_path}", f"data.path={source}", "data.num_eval=0",
                         f"data.cache_dir={tmp_path / 'cache'}", "data.regenerate.max_new_tokens=4"])
    target = TargetModel.from_pretrained(str(tiny_qwen3_path), "cpu")
    first, _, summary = data.prepare_data(cfg.data, target, progress=False)
    path = Path(summary["regenerated_from"])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        for m in row["messages"]:
            if m["role"] == "assistant":
                m["content"] = "a reply written by another regeneration"
    time.sleep(0.01)  # a new modification time even on coarse clocks
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    second, _, _ = data.prepare_data(cfg.data, target, progress=False)
    text = [target.tokenizer.decode(r["input_ids"]) for r in second]
    assert all("a reply written by another regeneration" in t for t in text), text[0]
    assert [r["input_ids"] for r in first] != [r["input_ids"] for r in second]


@pytest.mark.parametrize("engine", ["hf", "ours"])
def test_a_reply_cut_at_its_budget_is_marked_and_its_end_of_turn_is_not_trained(reference_target_path, engine: str, tmp_path) -> None:
    """The reference target answers "ok" in 22 tokens, then its end of sequence (the plain loop says so). With a budget
    of 22 the end is never generated: the reply is cut, stored with ``"complete": false``, and the end-of-turn token the
    template puts after it is out of the loss mask (trained, it taught an end the target never produced there); with
    23 the reply ends on its own and that token is trained. The flag survives the regenerated file's round trip."""
    from train.data.readers import read_conversations
    from train.data.regenerate import write_jsonl_atomic

    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    renderer = ChatRenderer(target.tokenizer)
    source = [Conversation("ok", [{"role": "user", "content": "ok"}, {"role": "assistant", "content": "old"},
                                  {"role": "user", "content": "ok"}, {"role": "assistant", "content": "old"}])]
    prompt = target.tokenizer(renderer.render(source[0].messages[:1], add_generation_prompt=True), add_special_tokens=False)["input_ids"]
    assert greedy_reply(target.model, target.tokenizer, prompt, 22)[1] is False
    assert greedy_reply(target.model, target.tokenizer, prompt, 23)[1] is True
    eot = target.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for budget, ended in ((22, False), (23, True)):
        cfg = RegenerateConfig(enabled=True, max_new_tokens=budget, batch_size=2, engine=engine)
        replies = HFReplies(target.model, target.tokenizer, cfg) if engine == "hf" else OurReplies(target.model, target.tokenizer, cfg)
        out, stats = regenerate_conversations(source, replies, renderer, cfg, max_length=1024, progress=False)
        first = out[0].messages[1]
        assert first.get("complete", True) is ended and ("complete" in first) is not ended
        write_jsonl_atomic(out, tmp_path / f"{budget}.jsonl")
        back, _ = read_conversations(tmp_path / f"{budget}.jsonl")
        assert back[0].messages == out[0].messages
        tok = renderer.tokenize(back[0].messages, "ok")
        ends = [t for t, i in enumerate(tok.input_ids) if i == eot]  # user, assistant, user, assistant turns: 4 ends
        assert len(ends) == 4
        assert [tok.loss_mask[t] for t in ends] == [0, int(ended), 0, int(back[0].messages[3].get("complete", True))]
        # the reply's own tokens stay trained either way: every masked token but the ends is the replies' content
        content = target.tokenizer.decode([i for i, m in zip(tok.input_ids, tok.loss_mask) if m and i != eot])
        assert content == back[0].messages[1]["content"] + back[0].messages[3]["content"]
        assert stats["replies_cut_at_budget"] == sum(m.get("complete", True) is False for m in out[0].messages)


def test_a_cut_reply_resumes_with_its_flag(tmp_path) -> None:
    """The partial file keeps each reply's flag and token ids: a resumed run marks a cut reply as the run that made it
    did (a server's reply has no ids)."""
    partial = tmp_path / "regen.partial.jsonl"
    partial.write_text('{"conversation": 0, "turn": 0, "content": "cut", "complete": false, "token_ids": [5, 6]}\n'
                       '{"conversation": 0, "turn": 1, "content": "whole", "complete": true, "token_ids": null}\n')
    assert read_partial(partial) == {(0, 0): ("cut", False, [5, 6]), (0, 1): ("whole", True, None)}


def test_the_regenerated_cache_follows_the_targets_dtype(reference_target_path, tmp_path) -> None:
    """Replies made in this process are the target's at its dtype (bf16 and fp32 greedy replies differ): the cache key
    holds it, so a bf16 run does not read an fp32 run's replies (it did). vLLM loads the target itself: not keyed."""
    from train.config import DataConfig
    from train.data import regenerated_key
    from train.data.dataset import cache_key

    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    renderer = ChatRenderer(target.tokenizer)
    cfg = DataConfig(path=str(tmp_path), regenerate=RegenerateConfig(enabled=True, engine="ours"))
    fp32 = cache_key(regenerated_key(cfg, target, renderer, str(tmp_path)))
    assert cache_key(regenerated_key(cfg, target, renderer, str(tmp_path))) == fp32  # the same target: the same file
    target.model.to(torch.bfloat16)
    assert cache_key(regenerated_key(cfg, target, renderer, str(tmp_path))) != fp32
    cfg.regenerate.engine = "vllm"
    vllm = cache_key(regenerated_key(cfg, target, renderer, str(tmp_path)))
    target.model.to(torch.float32)
    assert cache_key(regenerated_key(cfg, target, renderer, str(tmp_path))) == vllm


def test_a_reply_line_cut_inside_a_character_is_dropped_and_the_next_starts_a_line(tmp_path: Path) -> None:
    """A kill (or a full disk) can cut the partial file's last line inside a multi-byte character: decoding the whole
    file first failed every resume on it. The cut line is dropped, and the next reply is not glued to the fragment."""
    from train.data.regenerate import open_partial

    path = tmp_path / "p.partial.jsonl"
    good = json.dumps({"conversation": 0, "turn": 0, "content": "héllo", "complete": True}, ensure_ascii=False) + "\n"
    cut = json.dumps({"conversation": 1, "turn": 0, "content": "日本語", "complete": True}, ensure_ascii=False).encode()[:-4]
    path.write_bytes(good.encode() + cut[:-1])  # ends inside 語's three bytes
    assert read_partial(path) == {(0, 0): ("héllo", True, None)}
    with open_partial(path) as sink:
        sink.write(json.dumps({"conversation": 2, "turn": 0, "content": "next", "complete": False}) + "\n")
    assert read_partial(path) == {(0, 0): ("héllo", True, None), (2, 0): ("next", False, None)}


def one_turn_conversations(prompts: list[str]) -> list[Conversation]:
    return [Conversation(str(i), [{"role": "user", "content": q}, {"role": "assistant", "content": "old"}]) for i, q in enumerate(prompts)]


def test_a_killed_sampled_hf_regeneration_resumes_into_the_uninterrupted_result(reference_target_path, tmp_path: Path) -> None:
    """Sampled, Hugging Face's engine: a run killed inside its second batch, resumed, equals the uninterrupted run. The
    resumed run batched the remaining prompts anew and drew from the global generator where it stood after its first
    seeding: other replies than the uninterrupted run's, under the same cache key. Now the batches are those of the
    uninterrupted run (the answered ones skipped), each seeded from its members."""
    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    renderer = ChatRenderer(target.tokenizer)
    prompts = ["hi", "What is 2+2?", "Tell me a joke", "Name a color", "Where is Paris?", "ok"]
    cfg = RegenerateConfig(enabled=True, max_new_tokens=10, batch_size=2, engine="hf", temperature=1.0, seed=3)
    whole, whole_stats = regenerate_conversations(one_turn_conversations(prompts), HFReplies(target.model, target.tokenizer, cfg),
                                                  renderer, cfg, max_length=1024, progress=False)
    partial = tmp_path / "regen.partial.jsonl"
    with pytest.raises(KeyboardInterrupt):  # batch 2's first reply written, its second lost
        regenerate_conversations(one_turn_conversations(prompts), KilledAfter(HFReplies(target.model, target.tokenizer, cfg), 3),
                                 renderer, cfg, max_length=1024, progress=False, partial=partial)
    assert len(read_partial(partial)) == 3
    second = KilledAfter(HFReplies(target.model, target.tokenizer, cfg), 100)
    out, stats = regenerate_conversations(one_turn_conversations(prompts), second, renderer, cfg, max_length=1024, progress=False,
                                          partial=partial)
    assert second.asked == 3 and stats["turns_resumed"] == 3 and stats["turns_regenerated"] == 3
    assert [c.messages for c in out] == [c.messages for c in whole]
    assert len({c.messages[1]["content"] for c in whole}) == len(prompts)  # sampled: no two alike


def test_sampled_replies_to_a_repeated_prompt_differ(reference_target_path) -> None:
    """Our engine sampled every reply from one seed: a prompt asked four times (several samples of one prompt) got four
    identical replies, and different prompts shared their random draws. Each reply now has its own seed
    (``reply_seed``: the conversation and the turn), and the run stays reproducible."""
    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    renderer = ChatRenderer(target.tokenizer)
    cfg = RegenerateConfig(enabled=True, max_new_tokens=8, batch_size=4, engine="ours", temperature=1.0, seed=0)
    out, _ = regenerate_conversations(one_turn_conversations(["Tell me a joke"] * 4), OurReplies(target.model, target.tokenizer, cfg),
                                      renderer, cfg, max_length=1024, progress=False)
    replies = [c.messages[1]["content"] for c in out]
    assert len(set(replies)) == 4, replies
    again, _ = regenerate_conversations(one_turn_conversations(["Tell me a joke"] * 4), OurReplies(target.model, target.tokenizer, cfg),
                                        renderer, cfg, max_length=1024, progress=False)
    assert [c.messages[1]["content"] for c in again] == replies


def test_hf_replies_ignore_the_targets_generation_config(reference_target_path, tmp_path: Path) -> None:
    """A target whose generation_config.json sets decoding options (Qwen2.5-Instruct ships repetition_penalty 1.05 and
    top_k 20): Hugging Face's ``generate`` applied them to every regenerated reply, which was then not the target's
    greedy reply (nor the one ``ours`` gives). The replies equal the plain greedy loop's, and the model's own
    generation config is left as it was."""
    folder = tmp_path / "target"
    folder.mkdir()
    for f in reference_target_path.iterdir():
        if f.name != "generation_config.json":
            (folder / f.name).symlink_to(f)
    generation = json.loads((reference_target_path / "generation_config.json").read_text())
    generation.update(repetition_penalty=1.5, no_repeat_ngram_size=2, top_k=20, temperature=0.7, do_sample=True)
    (folder / "generation_config.json").write_text(json.dumps(generation))
    target = TargetModel.from_pretrained(str(folder), "cpu")
    assert target.model.generation_config.repetition_penalty == 1.5
    renderer = ChatRenderer(target.tokenizer)
    cfg = RegenerateConfig(enabled=True, max_new_tokens=12, batch_size=2, engine="hf")
    out, _ = regenerate_conversations(conversations_to_regenerate(), HFReplies(target.model, target.tokenizer, cfg), renderer, cfg,
                                      max_length=1024, progress=False)
    check_greedy_replies(target, renderer, conversations_to_regenerate(), out, 12)
    assert target.model.generation_config.repetition_penalty == 1.5 and target.model.generation_config.top_k == 20


@torch.no_grad()
def test_a_regenerated_row_trains_only_the_targets_own_tokens(tiny_qwen3_path) -> None:
    """The quickstart's target (builtin tiny-qwen3) regenerates replies that, decoded and tokenized again, split otherwise
    than it generated them: 10% of the quickstart's trained labels were not its own greedy tokens
    (``benchmarks/on_policy_check.py``). The replies' stored ids make each row the target's own trajectory: at every
    trained position the label is the target's argmax over the row before it (one forward over the row, the reference)."""
    from train.data.readers import read_conversations
    from train.data.dataset import resolve_source

    target = TargetModel.from_pretrained(tiny_qwen3_path, "cpu")
    renderer = ChatRenderer(target.tokenizer)
    conversations, _ = read_conversations(resolve_source("builtin:sharegpt-sample"), max_records=12)
    cfg = RegenerateConfig(enabled=True, max_new_tokens=24, batch_size=4, engine="ours")
    out, stats = regenerate_conversations(conversations, OurReplies(target.model, target.tokenizer, cfg), renderer, cfg,
                                          max_length=1024, progress=False)
    trained = wrong = 0
    for conversation in out:
        row = renderer.tokenize(conversation.messages, conversation.id)
        predicted = target.model(torch.tensor([row.input_ids])).logits[0].argmax(-1).tolist()
        labels = [t for t in range(1, len(row.input_ids)) if row.loss_mask[t]]
        trained += len(labels)
        wrong += sum(predicted[t - 1] != row.input_ids[t] for t in labels)
    assert trained > 12 * 20 and wrong == 0, f"{wrong} of {trained} trained labels are not the target's own tokens"


# ----------------------------------------------------------------------------- data.regenerate.reuse_turns


def three_turn_conversations() -> list[Conversation]:
    return conversations_to_regenerate() + [
        Conversation("d", [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "old"},
                           {"role": "user", "content": "Another one?"}, {"role": "assistant", "content": "old"},
                           {"role": "user", "content": "And a third, please."}, {"role": "assistant", "content": "old"}])]


class PrefillCounter:
    """Counts the tokens the static target prefills (``prefill_rows`` and the long prompts' ``prefill``)."""

    def __init__(self, target):
        self.tokens = 0
        rows, one = target.prefill_rows, target.prefill

        def prefill_rows(ids, *args, **kwargs):
            self.tokens += sum(len(x) for x in ids)
            return rows(ids, *args, **kwargs)

        def prefill(ids, *args, **kwargs):
            self.tokens += len(ids)
            return one(ids, *args, **kwargs)

        target.prefill_rows, target.prefill = prefill_rows, prefill


def test_turns_reused_in_their_row_equal_turn_by_turn_and_prefill_only_the_new_tokens(reference_target_path) -> None:
    """``reuse_turns`` (the default): each conversation's turns in one row, a later prompt prefilled past what the row
    holds. The replies are the plain greedy loop's (full forwards, no cache) and the turn-by-turn path's, and the
    prefilled tokens are at most each conversation's first prompt plus what each later prompt adds to the one before
    (the earlier turns and the reply are not prefilled again), fewer than turn by turn."""
    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    renderer = ChatRenderer(target.tokenizer)
    out, counted = {}, {}
    for reuse in (True, False):
        cfg = RegenerateConfig(enabled=True, max_new_tokens=10, batch_size=2, engine="ours", reuse_turns=reuse)
        engine = OurReplies(target.model, target.tokenizer, cfg)
        assert engine.streams is reuse
        counter = PrefillCounter(engine.target)
        out[reuse], stats = regenerate_conversations(three_turn_conversations(), engine, renderer, cfg, max_length=1024, progress=False)
        counted[reuse] = counter.tokens
        assert stats["turns_regenerated"] == 7
    assert [c.messages for c in out[True]] == [c.messages for c in out[False]]
    check_greedy_replies(target, renderer, conversations_to_regenerate(), out[True][:3], 10)
    for reuse in (True, False):  # runs queued ahead of the host (data.regenerate.run_ahead): the same replies both ways
        cfg = RegenerateConfig(enabled=True, max_new_tokens=10, batch_size=2, engine="ours", reuse_turns=reuse, run_ahead=True)
        ahead, _ = regenerate_conversations(three_turn_conversations(), OurReplies(target.model, target.tokenizer, cfg), renderer, cfg,
                                            max_length=1024, progress=False)
        assert [c.messages for c in ahead] == [c.messages for c in out[True]], reuse
    sampled = OurReplies(target.model, target.tokenizer, RegenerateConfig(engine="ours", temperature=1.0))
    assert not sampled.streams  # sampled replies go turn by turn (their seeds are per reply)
    with pytest.raises(ValueError, match=r"replies_in_streams: greedy .* \(temperature=1.0, reuse_turns=True"):
        sampled.replies_in_streams(1, lambda stream, reply: None, 64)
    bound = 0
    for conversation in out[True]:
        starts = [i for i, m in enumerate(conversation.messages) if m["role"] == "assistant"]
        prompts = [renderer.prompt_ids(conversation.messages[:i], conversation.id) for i in starts]
        bound += len(prompts[0]) + sum(len(b) - len(a) for a, b in zip(prompts, prompts[1:]))
    everything = sum(len(renderer.prompt_ids(c.messages[:i], c.id)) for c in out[True]
                     for i, m in enumerate(c.messages) if m["role"] == "assistant")
    # turn by turn, every prompt whole but what a row's last prompt shares with it (the template's first tokens)
    assert everything - 8 <= counted[False] <= everything, (counted, everything)
    assert counted[True] <= bound < counted[False] - 8, (counted, bound, everything)


class StreamsKilledAfter:
    """The streaming engine dying (as a kill would) after ``n`` replies, counting the prompts it was asked."""

    streams = True

    def __init__(self, inner, n: int):
        self.inner, self.n, self.asked = inner, n, 0
        self.replies = inner.replies  # an engine answers turn by turn too

    def replies_in_streams(self, num_streams, next_prompt, max_length):
        def counted(stream, reply):
            if reply is not None:
                if self.n == 0:
                    raise KeyboardInterrupt
                self.n -= 1
            request = next_prompt(stream, reply)
            self.asked += request is not None
            return request

        self.inner.replies_in_streams(num_streams, counted, max_length)


@pytest.mark.slow  # ~10 s on one core
def test_a_killed_regeneration_in_streams_resumes_where_it_stopped(reference_target_path, tmp_path: Path) -> None:
    """Killed after 3 of 7 replies, the streams resume from each conversation's first missing turn (asking only the 4
    missing ones, the answered ones read back in their rows' place) into the uninterrupted result; a file the turn-by-turn
    path started resumes in streams too."""
    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    renderer = ChatRenderer(target.tokenizer)
    cfg = RegenerateConfig(enabled=True, max_new_tokens=8, batch_size=2, engine="ours")
    whole, whole_stats = regenerate_conversations(three_turn_conversations(), OurReplies(target.model, target.tokenizer, cfg),
                                                  renderer, cfg, max_length=1024, progress=False)
    partial = tmp_path / "regen.partial.jsonl"
    with pytest.raises(KeyboardInterrupt):
        regenerate_conversations(three_turn_conversations(), StreamsKilledAfter(OurReplies(target.model, target.tokenizer, cfg), 3),
                                 renderer, cfg, max_length=1024, progress=False, partial=partial)
    assert len(read_partial(partial)) == 3
    second = StreamsKilledAfter(OurReplies(target.model, target.tokenizer, cfg), 100)
    out, stats = regenerate_conversations(three_turn_conversations(), second, renderer, cfg, max_length=1024, progress=False,
                                          partial=partial)
    assert second.asked == 4 and stats["turns_resumed"] == 3 and stats["turns_regenerated"] == 4
    assert [c.messages for c in out] == [c.messages for c in whole]
    assert stats["replies_cut_at_budget"] == whole_stats["replies_cut_at_budget"]
    # started turn by turn (killed after 2 replies), finished in streams
    turn_by_turn = RegenerateConfig(enabled=True, max_new_tokens=8, batch_size=2, engine="ours", reuse_turns=False)
    other = tmp_path / "other.partial.jsonl"
    with pytest.raises(KeyboardInterrupt):
        regenerate_conversations(three_turn_conversations(), KilledAfter(OurReplies(target.model, target.tokenizer, turn_by_turn), 2),
                                 renderer, turn_by_turn, max_length=1024, progress=False, partial=other)
    out, stats = regenerate_conversations(three_turn_conversations(), OurReplies(target.model, target.tokenizer, cfg), renderer, cfg,
                                          max_length=1024, progress=False, partial=other)
    assert stats["turns_resumed"] == 2 and [c.messages for c in out] == [c.messages for c in whole]


def test_streams_cut_a_conversation_at_max_length_and_keep_the_replies_asked_to(reference_target_path) -> None:
    """In streams as turn by turn: a turn whose prompt reaches ``max_length`` ends its conversation (the turns before
    kept), and ``keep_replies`` leaves the first replies as they are, the later ones following them."""
    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    renderer = ChatRenderer(target.tokenizer)
    results = {}
    for reuse in (True, False):
        cfg = RegenerateConfig(enabled=True, max_new_tokens=8, batch_size=2, engine="ours", reuse_turns=reuse, keep_replies=1)
        results[reuse] = regenerate_conversations(three_turn_conversations(), OurReplies(target.model, target.tokenizer, cfg), renderer,
                                                  cfg, max_length=40, progress=False)
    (streams, stats), (turns, turn_stats) = results[True], results[False]
    assert stats == turn_stats and stats["conversations_cut"] > 0 and stats["turns_kept"] > 0, stats
    assert [c.messages for c in streams] == [c.messages for c in turns]
    kept = [m["content"] for c in streams for m in c.messages[:2] if m["role"] == "assistant"]
    assert "old" in kept  # the first replies kept as they were


def test_reuse_turns_is_in_the_key_only_where_it_changes_how_replies_are_made_and_run_ahead_never() -> None:
    """Our loop, greedy, reusing turns: its replies can differ from turn-by-turn ones by rounding (bf16), so the key says
    so; off, sampled (which runs turn by turn) or another engine, the key is what it was before the setting existed."""
    from train.data import regenerate_key

    assert regenerate_key(RegenerateConfig(engine="ours"))["reuse_turns"] is True
    assert "reuse_turns" not in regenerate_key(RegenerateConfig(engine="ours", reuse_turns=False))
    assert "reuse_turns" not in regenerate_key(RegenerateConfig(engine="ours", temperature=1.0))
    assert "reuse_turns" not in regenerate_key(RegenerateConfig(engine="hf"))
    assert regenerate_key(RegenerateConfig(engine="ours")) != regenerate_key(RegenerateConfig(engine="ours", reuse_turns=False))
    # runs queued ahead change no reply: not in the key; refused where there are no runs to queue
    assert regenerate_key(RegenerateConfig(engine="ours", run_ahead=True)) == regenerate_key(RegenerateConfig(engine="ours"))
    for bad in ({"engine": "hf"}, {"engine": "ours", "temperature": 0.7}, {"engine": "ours", "run_steps": 1}):
        with pytest.raises(ValueError, match=r"data.regenerate.run_ahead=true: engine=ours, greedy, run_steps >= 2 only"):
            RegenerateConfig(run_ahead=True, **bad)


# ----------------------------------------------------------------------------- data.regenerate.processes


def test_processes_setting_is_checked_and_left_out_of_the_key_where_it_changes_no_reply() -> None:
    """``processes`` >= 1, only with the in-process engines; in the replies' cache key only for Hugging Face's engine
    split over several (its replies depend on their batch), so a file written by one process keeps its key."""
    from train.data import regenerate_key

    with pytest.raises(ValueError, match=r"data.regenerate.processes=0; expected >= 1"):
        RegenerateConfig(processes=0)
    with pytest.raises(ValueError, match=r"processes=2 with engine=vllm"):
        RegenerateConfig(processes=2, engine="vllm")
    assert "processes" not in regenerate_key(RegenerateConfig(engine="ours", processes=4))
    assert "processes" not in regenerate_key(RegenerateConfig(engine="hf", processes=1))
    assert regenerate_key(RegenerateConfig(engine="hf", processes=2))["processes"] == 2
    assert regenerate_key(RegenerateConfig(engine="ours", processes=4)) == regenerate_key(RegenerateConfig(engine="ours"))


def test_processes_spread_over_the_visible_gpus_of_a_one_process_run() -> None:
    """``share_devices``: round robin over the GPUs from the run's own; one GPU, a CPU, or a run of several ranks (each
    owning its GPU): every process on the run's device."""
    from train.data.regenerate import share_devices

    assert share_devices("cuda:1", 4, device_count=3) == ["cuda:1", "cuda:2", "cuda:0", "cuda:1"]
    assert share_devices("cuda", 3, device_count=2) == ["cuda:0", "cuda:1", "cuda:0"]
    assert share_devices("cuda:0", 3, device_count=1) == ["cuda:0"] * 3
    assert share_devices("cuda:0", 2, device_count=4, world_size=4) == ["cuda:0"] * 2
    assert share_devices("cpu", 2, device_count=0) == ["cpu", "cpu"]


def more_conversations() -> list[Conversation]:
    """Seven conversations: three processes get unequal shares (3, 2, 2), every share several turns."""
    extra = [Conversation(f"x{i}", [{"role": "user", "content": f"Tell me about the number {i}."}, {"role": "assistant", "content": "old"},
                                    {"role": "user", "content": "Why?"}, {"role": "assistant", "content": "old"}]) for i in range(4)]
    return conversations_to_regenerate() + extra


@pytest.mark.slow  # three spawned processes load the target (~10 s each on a 2-core CPU)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_regeneration_split_over_processes_equals_one_process(reference_target_path, tmp_path: Path, temperature: float) -> None:
    """``data.regenerate.processes=3``: every conversation's replies equal one process's, greedy and sampled (each
    reply's seed is keyed by its conversation's index in the whole data, not in a process's share), in the source's
    order, with the counts summed; each other process appended its own partial file, keyed by those indices."""
    from train.data.regenerate import partial_files, regenerate_in_processes

    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    renderer = ChatRenderer(target.tokenizer)
    cfg = RegenerateConfig(enabled=True, max_new_tokens=8, batch_size=2, engine="ours", temperature=temperature, seed=5, processes=3)
    conversations = more_conversations()
    whole, whole_stats = regenerate_conversations(conversations, OurReplies(target.model, target.tokenizer, cfg), renderer, cfg,
                                                  max_length=1024, progress=False)
    partial, resume = partial_files(tmp_path / "key.jsonl")
    assert partial == tmp_path / "key.partial.jsonl" and resume == []
    split, stats = regenerate_in_processes(conversations, target, renderer, cfg, 1024, False, partial, resume)
    assert [c.id for c in split] == [c.id for c in conversations]
    assert [c.messages for c in split] == [c.messages for c in whole]
    assert stats == whole_stats and stats["turns_regenerated"] == 12
    # process i's file holds conversations i, i + 3, ...: keyed by their index in the whole data
    for i in range(3):
        lines = read_partial(tmp_path / ("key.partial.jsonl" if i == 0 else f"key.partial.{i}.jsonl"))
        assert {c for c, _ in lines} == set(range(i, 7, 3))
    assert len(partial_files(tmp_path / "key.jsonl")[1]) == 3
    if temperature == 0.0:
        check_greedy_replies(target, renderer, conversations_to_regenerate(), split[:3], 8)


@pytest.mark.slow  # two spawned processes load the target
def test_a_split_regeneration_resumes_one_processs_partial_file_and_names_a_failed_share(reference_target_path, tmp_path: Path) -> None:
    """A run of one process killed after 3 replies, resumed with two processes: each reads the replies the first file
    holds for its share and asks only for the rest (the result equals an uninterrupted run's). Then a share whose
    process cannot load the target: one line naming the share and why, after the other share's replies were kept."""
    from train.data.regenerate import partial_files, regenerate_in_processes

    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    renderer = ChatRenderer(target.tokenizer)
    cfg = RegenerateConfig(enabled=True, max_new_tokens=8, batch_size=2, engine="ours", processes=2)
    partial = tmp_path / "key.partial.jsonl"
    with pytest.raises(KeyboardInterrupt):
        regenerate_conversations(more_conversations(), KilledAfter(OurReplies(target.model, target.tokenizer, cfg), 3),
                                 renderer, cfg, max_length=1024, progress=False, partial=partial)
    partial, resume = partial_files(tmp_path / "key.jsonl")
    assert resume == [partial]
    out, stats = regenerate_in_processes(more_conversations(), target, renderer, cfg, 1024, False, partial, resume)
    whole, _ = regenerate_conversations(more_conversations(), OurReplies(target.model, target.tokenizer, cfg), renderer, cfg,
                                        max_length=1024, progress=False)
    assert [c.messages for c in out] == [c.messages for c in whole]
    assert stats["turns_resumed"] == 3 and stats["turns_resumed"] + stats["turns_regenerated"] == 12

    target.load_settings = {**target.load_settings, "path": str(tmp_path / "no-such-target")}
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    with pytest.raises(RuntimeError, match=r"data.regenerate.processes=2: share 1 \(ValueError: target.path=.*no-such-target.*"
                                            r"the same command resumes"):
        regenerate_in_processes(more_conversations(), target, renderer, cfg, 1024, False, fresh / "key.partial.jsonl", [])
    assert {c for c, _ in read_partial(fresh / "key.partial.jsonl")} == {0, 2, 4, 6}  # share 0's replies, kept


def test_a_target_not_loaded_from_a_folder_cannot_be_split(reference_target_path, tmp_path: Path) -> None:
    from train.data.regenerate import regenerate_in_processes

    loaded = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    assert loaded.load_settings == {"path": str(reference_target_path), "device": "cpu", "dtype": "float32", "attn_implementation": "auto"}
    built = TargetModel(loaded.model, loaded.tokenizer, loaded.path)
    cfg = RegenerateConfig(enabled=True, engine="ours", processes=2)
    with pytest.raises(ValueError, match=r"data.regenerate.processes=2: the other processes load the target as this one did"):
        regenerate_in_processes(more_conversations(), built, ChatRenderer(loaded.tokenizer), cfg, 1024, False, tmp_path / "k.partial.jsonl", [])


@pytest.mark.slow  # a spawned process loads the target
def test_prepare_data_with_two_processes_writes_one_processs_file_and_no_partial_left(tiny_qwen3_path, tmp_path: Path) -> None:
    """Through the config (``data.regenerate.processes=2``, the tiny recipe's engine): the regenerated file equals one
    process's line for line, under the same cache key, and the partial files are gone once it is written."""
    import train.data as data
    from compose import compose_train

    source = tmp_path / "data.jsonl"
    source.write_text("".join(json.dumps({"id": c.id, "messages": c.messages}) + "\n" for c in more_conversations()))
    files = {}
    for processes in (1, 2):
        cfg = compose_train(["experiment=dflash_swa_tiny", f"target.path={tiny_qwen3_path}", f"data.path={source}", "data.num_eval=0",
                             f"data.cache_dir={tmp_path / f'cache{processes}'}", "data.regenerate.max_new_tokens=6",
                             f"data.regenerate.processes={processes}"])
        target = TargetModel.from_pretrained(str(tiny_qwen3_path), "cpu")
        _, _, summary = data.prepare_data(cfg.data, target, progress=False)
        files[processes] = Path(summary["regenerated_from"])
        assert not list(files[processes].parent.glob("*.partial*")), processes
    assert cfg.data.regenerate.engine == "ours" and files[1].name == files[2].name
    assert files[1].read_text() == files[2].read_text() and len(files[2].read_text().splitlines()) == 7
