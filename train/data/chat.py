"""Render conversations with the target's chat template and build the loss mask.

The loss mask covers exactly each assistant turn's content tokens plus the end-of-turn token that
closes it (``<|im_end|>`` in ChatML, ``<|eot_id|>`` in Llama-3, ...), never a role header, a system
prompt or a user turn. It is computed on the rendered text, independent of the template:

1. render the whole conversation once with ``tokenizer.apply_chat_template``;
2. find each message's content in the rendered text, in order (a template may trim it); an
   assistant turn's search starts no earlier than the end of the template's own generation prompt
   for the turns before it, so a reply such as ``"assistant"`` never matches its header;
3. tokenize the rendered text with character offsets; a token is in the mask when it starts inside
   an assistant content span (a token straddling header and content is left out), and the token
   right after the span is added when it is the end-of-turn marker, unless the message says
   ``"complete": false`` (a reply cut at a token budget: the template still closes it, but the
   target never ended it there, and a drafter trained on that token learns an end that is not the
   target's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .readers import DataError


@dataclass
class TokenizedConversation:
    input_ids: list[int]
    loss_mask: list[int]  # 1 where the drafter is trained to predict this token


def chat_template_of(tokenizer: Any, override: str | None, where: str) -> str:
    template = override or getattr(tokenizer, "chat_template", None)
    if not template:
        raise DataError(
            f"{where}: tokenizer has no chat template; set data.chat_template to a Jinja template "
            "(e.g. models/builtin_targets.py's CHATML_TEMPLATE)"
        )
    return template


def check_template_syntax(template: str, source: str) -> None:
    """A template that does not parse, named in one line at start-up (it failed at the first conversation, as a
    traceback naming none)."""
    import jinja2
    import jinja2.ext

    try:
        jinja2.Environment(extensions=[jinja2.ext.loopcontrols]).parse(template)
    except jinja2.TemplateSyntaxError as e:
        raise DataError(f"{source}: not a valid Jinja template ({e.message} at line {e.lineno})") from None


class ChatRenderer:
    """Turns ``messages`` into ``input_ids`` and an assistant-only ``loss_mask``.

    Args:
        tokenizer: a fast Hugging Face tokenizer (character offsets are needed).
        chat_template: Jinja template to use instead of the tokenizer's own.
        end_of_turn_token: the token closing an assistant turn; by default, whichever special
            token the template puts right after the content.
        where: names the tokenizer in error messages.
    """

    def __init__(self, tokenizer: Any, chat_template: str | None = None, end_of_turn_token: str | None = None, where: str = "tokenizer"):
        if not getattr(tokenizer, "is_fast", False):
            raise DataError(f"{where}: a fast tokenizer is needed for character offsets, got {type(tokenizer).__name__}")
        self.tokenizer = tokenizer
        self.template = chat_template_of(tokenizer, chat_template, where)
        self.template_source = "data.chat_template" if chat_template else f"{where}'s chat template"
        check_template_syntax(self.template, self.template_source)
        self.special_ids = set(tokenizer.all_special_ids) | {
            i for i, t in tokenizer.added_tokens_decoder.items() if getattr(t, "special", False)
        }
        self.end_of_turn_id = None
        if end_of_turn_token is not None:
            ids = tokenizer.convert_tokens_to_ids([end_of_turn_token])
            if ids[0] is None or ids[0] == tokenizer.unk_token_id:
                raise DataError(f"data.end_of_turn_token={end_of_turn_token!r} is not a token of {where}")
            self.end_of_turn_id = ids[0]

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False, conversation_id: str = "?") -> str:
        from jinja2 import TemplateError

        try:
            return self.tokenizer.apply_chat_template(
                messages, chat_template=self.template, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        except TemplateError as e:  # a template's raise_exception (Mistral's, Gemma's: roles must alternate, no system)
            raise DataError(f"conversation {conversation_id}: {self.template_source} refused it: {e}") from None

    def assistant_spans(self, messages: list[dict[str, Any]], text: str, conversation_id: str) -> list[tuple[int, int, bool]]:
        """Character spans ``[start, end)`` of each non-empty assistant content in ``text``, each with whether its
        end-of-turn token is trained (the reply ended there: not ``"complete": false``)."""
        spans = []
        cursor = 0
        for i, message in enumerate(messages):
            content = message["content"]
            if not content.strip():
                continue
            start_at = cursor
            if message["role"] == "assistant":
                prefix = self.render(messages[:i], add_generation_prompt=True, conversation_id=conversation_id) if i else ""
                if text.startswith(prefix):
                    start_at = max(start_at, len(prefix))
            # Templates often trim message text: take whichever of the text and its trimmed form comes first. The
            # untrimmed text alone can match later (a reply "A\n\n" trimmed here, repeated inside a later "A\n\nB").
            found = text.find(content, start_at)
            lead = len(content) - len(content.lstrip())
            trimmed_at = text.find(content.strip(), start_at)
            if trimmed_at >= 0 and (found < 0 or trimmed_at < found + lead):
                content, found = content.strip(), trimmed_at
            if found < 0:
                if message["role"] == "assistant":
                    raise DataError(
                        f"conversation {conversation_id}: assistant turn {i} does not appear in the rendered "
                        "chat template; the template rewrites message text beyond trimming"
                    )
                continue  # some templates drop or rewrite system/user text; nothing to mask there
            cursor = found + len(content)
            if message["role"] == "assistant":
                spans.append((found, cursor, message.get("complete", True) is not False))
        return spans

    def tokenize(self, messages: list[dict[str, str]], conversation_id: str = "?") -> TokenizedConversation:
        return self.tokenize_batch([messages], [conversation_id])[0]

    def mask_from_offsets(self, input_ids: list[int], offsets: list[tuple[int, int]],
                          spans: list[tuple[int, int, bool]]) -> TokenizedConversation:
        loss_mask = [0] * len(input_ids)
        t = 0
        for start, end, closes in spans:
            while t < len(input_ids) and offsets[t][0] < start:
                t += 1
            while t < len(input_ids) and offsets[t][0] < end:
                loss_mask[t] = 1
                t += 1
            # The end-of-turn marker: the next token, when it is special (or the configured one).
            if t < len(input_ids):
                is_end = input_ids[t] == self.end_of_turn_id if self.end_of_turn_id is not None else input_ids[t] in self.special_ids
                if is_end:
                    loss_mask[t] = int(closes)
                    t += 1
        return TokenizedConversation(input_ids=list(input_ids), loss_mask=loss_mask)

    def tokenize_batch(self, batch_messages: list[list[dict[str, str]]], ids: list[str]) -> list[TokenizedConversation]:
        texts = [self.render(m, conversation_id=cid) for m, cid in zip(batch_messages, ids)]
        spans = [self.assistant_spans(m, text, cid) for m, text, cid in zip(batch_messages, texts, ids)]
        encodings = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        return [
            self.mask_from_offsets(ids_, offsets, s)
            for ids_, offsets, s in zip(encodings["input_ids"], encodings["offset_mapping"], spans)
        ]
