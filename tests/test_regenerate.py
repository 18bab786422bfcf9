"""On-policy regeneration: batched, left-padded replies equal a plain greedy loop, turn by turn."""

from __future__ import annotations

import torch

from train.config import RegenerateConfig
from train.data.chat import ChatRenderer
from train.data.readers import Conversation
from train.data.regenerate import regenerate_conversations
from models.target import TargetModel


@torch.no_grad()
def plain_greedy(model, tokenizer, prompt_ids: list[int], max_new_tokens: int) -> str:
    """Reference: full forward each step, argmax, stop at EOS (no cache, no batching, no padding)."""
    ids = list(prompt_ids)
    new = []
    for _ in range(max_new_tokens):
        next_id = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        if next_id == tokenizer.eos_token_id:
            break
        ids.append(next_id)
        new.append(next_id)
    return tokenizer.decode(new, skip_special_tokens=True)


def test_greedy_regeneration_matches_plain_loop(reference_target_path) -> None:
    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    renderer = ChatRenderer(target.tokenizer)
    conversations = [
        Conversation("a", [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "old"},
                           {"role": "user", "content": "And of Italy?"}, {"role": "assistant", "content": "old"}]),
        Conversation("b", [{"role": "system", "content": "You are a helpful assistant."},
                           {"role": "user", "content": "Write a haiku about the sea, please, with a title."}, {"role": "assistant", "content": "old"}]),
        Conversation("c", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "old"}]),
    ]
    cfg = RegenerateConfig(enabled=True, max_new_tokens=12, batch_size=2)
    out, stats = regenerate_conversations(conversations, target.model, renderer, cfg, max_length=1024, progress=False)
    assert stats["turns_regenerated"] == 4
    assert [c.id for c in out] == ["a", "b", "c"]
    for new in out:
        messages = new.messages
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            # The prompt holds the target's own earlier replies, as regenerated.
            prompt = target.tokenizer(renderer.render(messages[:i], add_generation_prompt=True), add_special_tokens=False)["input_ids"]
            assert m["content"] == plain_greedy(target.model, target.tokenizer, prompt, 12), (new.id, i)
            assert m["content"] != "old"
    # Roles and user turns are untouched.
    for old, new in zip(conversations, out):
        assert [m["role"] for m in old.messages] == [m["role"] for m in new.messages]
        assert [m["content"] for m in old.messages if m["role"] != "assistant"] == [m["content"] for m in new.messages if m["role"] != "assistant"]


def test_too_long_prompt_cuts_the_conversation(reference_target_path) -> None:
    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    renderer = ChatRenderer(target.tokenizer)
    long_user = "word " * 200
    conversations = [Conversation("x", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "old"},
                                        {"role": "user", "content": long_user}, {"role": "assistant", "content": "old"}])]
    out, stats = regenerate_conversations(conversations, target.model, renderer, RegenerateConfig(max_new_tokens=4), max_length=64, progress=False)
    assert stats["conversations_cut"] == 1
    assert len(out[0].messages) == 2 and out[0].messages[1]["content"] != "old"
