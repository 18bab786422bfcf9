"""Loss masks: decode every masked span and compare it with the assistant text it should be.

Reference: for each assistant turn with content, in order, the span must decode to exactly the
content as the template renders it (ChatML: verbatim; Llama-3: trimmed) followed by the template's
end-of-turn token. Nothing else (headers, system prompt, user turns) may be masked.
"""

from __future__ import annotations

import pytest

from train.data.chat import ChatRenderer
from train.data.readers import DataError, read_conversations
from train.data.dataset import resolve_source


def masked_spans(tokenizer, input_ids: list[int], loss_mask: list[int]) -> list[str]:
    """Decode each maximal run of masked tokens."""
    spans, run = [], []
    for token, m in zip(input_ids + [None], loss_mask + [0]):
        if m:
            run.append(token)
        elif run:
            spans.append(tokenizer.decode(run))
            run = []
    return spans


def expected_spans(messages: list[dict], end_of_turn: str, trim: bool) -> list[str]:
    out = []
    for m in messages:
        if m["role"] == "assistant" and m["content"].strip():
            out.append((m["content"].strip() if trim else m["content"]) + end_of_turn)
    return out


def sample_conversations(n: int) -> list:
    conversations, _ = read_conversations(resolve_source("builtin:sharegpt-sample"))
    multi_turn = [c for c in conversations if sum(m["role"] == "assistant" for m in c.messages) >= 2]
    return multi_turn[:n]


TRICKY = [
    # A reply that is the role name, a reply equal to the user turn, repeated replies, a system prompt.
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "assistant"}, {"role": "assistant", "content": "assistant"}],
    [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Say hi"}, {"role": "user", "content": "again"}, {"role": "assistant", "content": "Say hi"}],
    [{"role": "user", "content": "x"}, {"role": "assistant", "content": "line one\n\nline two\n"}, {"role": "user", "content": "y"}, {"role": "assistant", "content": "ok"}],
    # A reply whose untrimmed text appears only inside a later reply (a trimming template renders "Same\n\n" as
    # "Same"): a target's own looping replies do this (found regenerating with the tiny Llama target).
    [{"role": "user", "content": "x"}, {"role": "assistant", "content": "Same\n\n"}, {"role": "user", "content": "y"},
     {"role": "assistant", "content": "Same\n\n\nSame again."}],
]


def check(renderer: ChatRenderer, messages: list[dict], end_of_turn: str, trim: bool) -> None:
    tok = renderer.tokenize(messages)
    assert len(tok.input_ids) == len(tok.loss_mask)
    # The ids are those of the template itself (no re-tokenization drift).
    assert tok.input_ids == renderer.tokenizer.apply_chat_template(messages, chat_template=renderer.template, tokenize=True, return_dict=True)["input_ids"]
    assert masked_spans(renderer.tokenizer, tok.input_ids, tok.loss_mask) == expected_spans(messages, end_of_turn, trim)


def test_chatml_reference_target(reference_tokenizer) -> None:
    renderer = ChatRenderer(reference_tokenizer)
    for conversation in sample_conversations(60):
        check(renderer, conversation.messages, "<|im_end|>", trim=False)
    for messages in TRICKY:
        check(renderer, messages, "<|im_end|>", trim=False)


def test_llama3_template(tiny_llama3_path: str) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama3_path)
    renderer = ChatRenderer(tokenizer)
    for conversation in sample_conversations(60):
        check(renderer, conversation.messages, "<|eot_id|>", trim=True)
    for messages in TRICKY:
        check(renderer, messages, "<|eot_id|>", trim=True)
    # The system header and knowledge-date preamble are rendered but never masked.
    tok = renderer.tokenize(TRICKY[0])
    text = tokenizer.decode(tok.input_ids)
    assert "Cutting Knowledge Date" in text
    assert "Cutting" not in "".join(masked_spans(tokenizer, tok.input_ids, tok.loss_mask))


def test_leading_space_token_straddling_the_header_is_left_out(reference_tokenizer) -> None:
    renderer = ChatRenderer(reference_tokenizer)
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "  indented reply"}]
    tok = renderer.tokenize(messages)
    (span,) = masked_spans(reference_tokenizer, tok.input_ids, tok.loss_mask)
    # "\n " is one token (header newline + first space): it is not trained on.
    assert span.endswith("indented reply<|im_end|>")
    assert ("  indented reply<|im_end|>").endswith(span)
    assert "assistant" not in span and "\n" not in span


def test_no_template_fails_clearly_unless_configured(reference_target_path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(reference_target_path)
    template = tokenizer.chat_template
    tokenizer.chat_template = None
    with pytest.raises(DataError, match="tokenizer has no chat template; set data.chat_template"):
        ChatRenderer(tokenizer)
    renderer = ChatRenderer(tokenizer, chat_template=template)
    check(renderer, TRICKY[1], "<|im_end|>", trim=False)


def test_configured_end_of_turn_token(reference_tokenizer) -> None:
    with pytest.raises(DataError, match="data.end_of_turn_token='<nope>' is not a token"):
        ChatRenderer(reference_tokenizer, end_of_turn_token="<nope>")
    renderer = ChatRenderer(reference_tokenizer, end_of_turn_token="<|im_end|>")
    check(renderer, TRICKY[2], "<|im_end|>", trim=False)


def test_template_that_rewrites_replies_is_refused(reference_tokenizer) -> None:
    upper = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] | upper + '<|im_end|>\n' }}{% endfor %}"
    renderer = ChatRenderer(reference_tokenizer, chat_template=upper)
    with pytest.raises(DataError, match="conversation c1: assistant turn 1 does not appear"):
        renderer.tokenize([{"role": "user", "content": "q"}, {"role": "assistant", "content": "lower"}], "c1")


def test_template_errors_name_the_template_or_the_conversation(reference_tokenizer) -> None:
    """A template that does not parse is refused when the renderer is built, naming the setting; one that refuses a
    conversation (``raise_exception``, as Mistral's and Gemma's do when roles do not alternate) names the conversation.
    Both were jinja2 tracebacks naming neither (``python -m train`` catches ValueError, not jinja2's errors)."""
    with pytest.raises(DataError, match=r"data.chat_template: not a valid Jinja template \(.* at line 1\)"):
        ChatRenderer(reference_tokenizer, chat_template="{% for m in messages %}{{ m['content'] }")
    strict = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
              "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
              "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}")
    renderer = ChatRenderer(reference_tokenizer, chat_template=strict)
    with pytest.raises(DataError, match="conversation c7: data.chat_template refused it: Conversation roles must alternate"):
        renderer.tokenize([{"role": "user", "content": "q"}, {"role": "user", "content": "q2"},
                           {"role": "assistant", "content": "a"}], "c7")
    renderer.tokenize([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "c8")  # alternating: fine


def test_a_reply_with_token_ids_is_trained_as_those_ids(reference_tokenizer) -> None:
    """An assistant turn's ``token_ids`` (regeneration stores the target's own) are the row's tokens for that reply, as
    generated, even split otherwise than the text tokenizes (here one token a character), with the text before it
    tokenized alone (the engine's prompt); a turn whose ids do not spell its text is tokenized from its text."""
    tok = reference_tokenizer
    renderer = ChatRenderer(tok)
    by_char = tok.convert_tokens_to_ids(list("Hello") + ["Ġ"] + list("world"))
    assert None not in by_char and tok.decode(by_char) == "Hello world"
    assert tok("Hello world", add_special_tokens=False)["input_ids"] != by_char  # the text alone tokenizes otherwise
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Hello world", "token_ids": by_char},
                {"role": "user", "content": "again"}, {"role": "assistant", "content": "Bye now", "token_ids": by_char}]
    counts = {}
    (row,) = renderer.tokenize_batch([messages], ["c"], counts)
    assert counts == {"replies_from_ids": 1, "replies_from_text": 1}
    # the reference, built by hand: the prompt's text alone, the ids, then the rest of the conversation's text alone
    text = renderer.render(messages)
    prompt = renderer.render(messages[:1], add_generation_prompt=True)
    end_of_first = len(prompt) + len("Hello world")
    rest = tok(text[end_of_first:], add_special_tokens=False)["input_ids"]
    assert row.input_ids == tok(prompt, add_special_tokens=False)["input_ids"] + by_char + rest
    assert renderer.prompt_ids(messages[:3], "c") == tok(prompt, add_special_tokens=False)["input_ids"] + by_char + \
        tok(renderer.render(messages[:3], add_generation_prompt=True)[end_of_first:], add_special_tokens=False)["input_ids"]
    assert masked_spans(tok, row.input_ids, row.loss_mask) == ["Hello world<|im_end|>", "Bye now<|im_end|>"]
    first = row.input_ids.index(by_char[0])
    assert row.loss_mask[first:first + len(by_char) + 1] == [1] * (len(by_char) + 1) and row.loss_mask[first - 1] == 0
    # without ids, the same conversation is the text tokenized whole, as before
    plain = [{k: v for k, v in m.items() if k != "token_ids"} for m in messages]
    assert renderer.tokenize(plain).input_ids == tok(text, add_special_tokens=False)["input_ids"]


def test_token_ids_outside_the_vocabulary_are_one_line(reference_tokenizer) -> None:
    renderer = ChatRenderer(reference_tokenizer)
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x", "token_ids": [len(reference_tokenizer) + 5]}]
    with pytest.raises(DataError, match=r"conversation c7: an assistant turn's token_ids hold \d+, not an id of the tokenizer") as e:
        renderer.tokenize(messages, "c7")
    assert "\n" not in str(e.value)


def test_prompts_asked_turn_after_turn_are_what_a_fresh_renderer_gives(reference_tokenizer) -> None:
    """Regeneration asks ``prompt_ids`` for many conversations' turns, interleaved, each turn after the one before (the
    renderer keeps its last prompts, reply spellings and text pieces to reuse). Every prompt must be what a renderer that
    never saw the conversation gives, also when the kept results are evicted (here after 3 of each), when two
    conversations share their first turns, and when a reply's ids do not spell its text; a template that reads the
    clock keeps no prompts; and no template sees the stored ids."""
    tok = reference_tokenizer

    def reply(text: str, spelled: bool = True) -> dict:  # one token a character: not how the text tokenizes
        ids = tok.convert_tokens_to_ids(["Ġ" if ch == " " else ch for ch in (text if spelled else text[::-1])])
        assert None not in ids and ids != tok(text, add_special_tokens=False)["input_ids"]
        return {"role": "assistant", "content": text, "token_ids": ids}

    shared = [{"role": "user", "content": "Name a colour."}, reply("Blue.")]
    conversations = {
        "a": shared + [{"role": "user", "content": "Another?"}, reply("Red, and assistant again.")]
             + [{"role": "user", "content": "Last one"}, reply("Green")],
        "b": shared + [{"role": "user", "content": "Why?"}, reply("Because blue is calm.", spelled=False)]
             + [{"role": "user", "content": "And?"}, reply("That is all.")],
        "c": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, reply("Green")]  # a's length
             + [{"role": "user", "content": "Bye"}, reply("Bye.")],
    }
    asked = [(cid, i) for k in range(3) for cid, ms in conversations.items()
             for i in [j for j, m in enumerate(ms) if m["role"] == "assistant"][k:k + 1]]
    renderer = ChatRenderer(tok)
    renderer.recent_prompts.size = renderer.recent_spellings.size = renderer.recent_pieces.size = 3
    for _ in range(2):  # the second time round every result is one kept (or evicted) by the first
        for cid, i in asked:
            assert renderer.prompt_ids(conversations[cid][:i], cid) == ChatRenderer(tok).prompt_ids(conversations[cid][:i], cid), (cid, i)
    assert max(map(len, (renderer.recent_prompts, renderer.recent_spellings, renderer.recent_pieces))) == 3

    clock = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
             "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}{# strftime_now #}")
    assert ChatRenderer(tok, chat_template=clock).recent_prompts is None
    sees = "{% for m in messages %}{{ m.token_ids is defined }}{% endfor %}"
    assert ChatRenderer(tok, chat_template=sees).render(conversations["a"]) == "False" * len(conversations["a"])
