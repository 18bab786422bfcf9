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

An assistant turn may carry ``token_ids``: the reply as the target generated it (regeneration stores them). Text
tokenized again can split otherwise than the target generated it (on the quickstart's data 10% of the trained labels
were not the target's own greedy tokens: ``benchmarks/on_policy_check.py``), so such a turn's tokens are its ids, the
text around it tokenized piece by piece: the text before a reply, up to its generation prompt, is tokenized alone, as
the engine's prompt was. A turn's ids are used only where they decode to its text in the rendered conversation (a
template that trims or rewrites the reply falls back to the text, counted in ``replies_from_text``); special tokens the
target generated inside a reply are not in its text and stay in the row, as generated.
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


class RecentResults(dict):
    """A dict keeping its last ``size`` entries, oldest out first: results a regeneration asks for again turn by turn."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def keep(self, key: Any, value: Any) -> Any:
        if len(self) >= self.size:
            del self[next(iter(self))]
        self[key] = value
        return value


def without_token_ids(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` as a chat template sees it: without the ``token_ids`` regeneration stores on a reply."""
    return message if "token_ids" not in message else {k: v for k, v in message.items() if k != "token_ids"}


class ChatRenderer:
    """Turns ``messages`` into ``input_ids`` and an assistant-only ``loss_mask``.

    Args:
        tokenizer: a fast Hugging Face tokenizer (character offsets are needed).
        chat_template: Jinja template to use instead of the tokenizer's own.
        end_of_turn_token: the token closing an assistant turn; by default, whichever special
            token the template puts right after the content.
        where: names the tokenizer in error messages.
    """

    RECENT = 2048  # results ``prompt_ids`` keeps of each kind: 256 conversations in flight (regeneration's rows) × turns

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
        # ``prompt_ids`` is asked for a conversation's turns one after another (regeneration): each later turn renders,
        # decodes and tokenizes again what the earlier ones did (their generation prompts, their replies' ids, the text
        # between). The last RECENT results of each are kept: SmolLM2's 6-turn ShareGPT prompts took 0.55-0.60 ms a
        # turn instead of 0.85 with transformers 5.17, and of 1.32 with 5.25, whose template call also walked the ids
        # (benchmarks/chat_render_speed.py). Not the prompts' texts for a template that reads the clock (Llama 3.1's
        # strftime_now): it renders the same messages differently over time.
        self.recent_prompts = None if "strftime_now" in self.template else RecentResults(self.RECENT)
        self.recent_spellings = RecentResults(self.RECENT)
        self.recent_pieces = RecentResults(self.RECENT)
        self.end_of_turn_id = None
        if end_of_turn_token is not None:
            ids = tokenizer.convert_tokens_to_ids([end_of_turn_token])
            if ids[0] is None or ids[0] == tokenizer.unk_token_id:
                raise DataError(f"data.end_of_turn_token={end_of_turn_token!r} is not a token of {where}")
            self.end_of_turn_id = ids[0]

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False, conversation_id: str = "?") -> str:
        from jinja2 import TemplateError

        # Without the stored reply ids: transformers' apply_chat_template (5.25; not 5.17) walks every value of every
        # message (its message normalisation recurses into lists), a Python call per id, over half of a regenerated
        # 6-turn conversation's rendering time; no template reads them (they are ours, not a chat-message field).
        messages = [without_token_ids(m) for m in messages]
        try:
            return self.tokenizer.apply_chat_template(
                messages, chat_template=self.template, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        except TemplateError as e:  # a template's raise_exception (Mistral's, Gemma's: roles must alternate, no system)
            raise DataError(f"conversation {conversation_id}: {self.template_source} refused it: {e}") from None

    def generation_prompt_text(self, messages: list[dict[str, Any]], conversation_id: str = "?") -> str:
        """``render(messages, add_generation_prompt=True)``, reused where the same messages were rendered so lately."""
        key = None
        if self.recent_prompts is not None:
            try:  # every field the template sees; unhashable ones (content blocks as lists) are not kept
                key = tuple(tuple(without_token_ids(m).items()) for m in messages)
                hash(key)
            except TypeError:
                key = None
        if key is not None and key in self.recent_prompts:
            return self.recent_prompts[key]
        text = self.render(messages, add_generation_prompt=True, conversation_id=conversation_id)
        return self.recent_prompts.keep(key, text) if key is not None else text

    def assistant_spans(self, messages: list[dict[str, Any]], text: str, conversation_id: str,
                        reuse: bool = False) -> list[tuple[int, int, bool, int]]:
        """Character spans ``[start, end)`` of each non-empty assistant content in ``text``, each with whether its
        end-of-turn token is trained (the reply ended there: not ``"complete": false``) and its message's index.
        ``reuse``: the generation prompts kept from earlier calls (``prompt_ids``; a training row's are all new)."""
        spans = []
        cursor = 0
        for i, message in enumerate(messages):
            content = message["content"]
            if not content.strip():
                continue
            start_at = cursor
            if message["role"] == "assistant":
                prefix = ("" if not i else self.generation_prompt_text(messages[:i], conversation_id) if reuse
                          else self.render(messages[:i], add_generation_prompt=True, conversation_id=conversation_id))
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
                spans.append((found, cursor, message.get("complete", True) is not False, i))
        return spans

    def tokenize(self, messages: list[dict[str, str]], conversation_id: str = "?") -> TokenizedConversation:
        return self.tokenize_batch([messages], [conversation_id])[0]

    def is_end_of_turn(self, token_id: int) -> bool:
        return token_id == self.end_of_turn_id if self.end_of_turn_id is not None else token_id in self.special_ids

    def mask_from_offsets(self, input_ids: list[int], offsets: list[tuple[int, int]],
                          spans: list[tuple[int, int, bool, int]]) -> TokenizedConversation:
        loss_mask = [0] * len(input_ids)
        t = 0
        for start, end, closes, _ in spans:
            while t < len(input_ids) and offsets[t][0] < start:
                t += 1
            while t < len(input_ids) and offsets[t][0] < end:
                loss_mask[t] = 1
                t += 1
            # The end-of-turn marker: the next token, when it is special (or the configured one).
            if t < len(input_ids) and self.is_end_of_turn(input_ids[t]):
                loss_mask[t] = int(closes)
                t += 1
        return TokenizedConversation(input_ids=list(input_ids), loss_mask=loss_mask)

    def reply_ids(self, message: dict[str, Any], text: str, start: int, end: int, conversation_id: str,
                  reuse: bool = False) -> list[int] | None:
        """The turn's stored ``token_ids`` where they spell its text in the rendered conversation, else None. ``reuse``:
        the spelling kept from an earlier call with the same ids (``prompt_ids``)."""
        ids = message.get("token_ids")
        if ids is None:
            return None
        vocab = len(self.tokenizer)
        if ids and not 0 <= min(ids) <= max(ids) < vocab:
            bad = next(i for i in ids if not 0 <= i < vocab)
            raise DataError(f"conversation {conversation_id}: an assistant turn's token_ids hold {bad}, not an id of the "
                            f"tokenizer ({vocab} tokens): the replies were made by another target")
        # the text as regeneration stored it: special tokens the target generated inside a reply (a toy target's
        # <|im_start|>) are not in the text, and stay in the row as the ids hold them
        key = tuple(ids) if reuse else None
        spelled = self.recent_spellings.get(key) if reuse else None
        if spelled is None:
            spelled = self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            if reuse:
                self.recent_spellings.keep(key, spelled)
        return ids if spelled == text[start:end] else None

    def tokenize_pieces(self, messages: list[dict[str, Any]], text: str, spans: list[tuple[int, int, bool, int]],
                        conversation_id: str, reuse: bool = False) -> tuple[TokenizedConversation, int, int]:
        """``text`` with each reply that has usable ``token_ids`` as those ids and the text between tokenized piece by
        piece (replies without them inside the pieces, masked by offsets); and how many replies were their ids and how
        many, holding ids, fell back to their text. ``reuse``: spellings and pieces kept from earlier calls
        (``prompt_ids``)."""
        input_ids, loss_mask, from_ids, from_text = [], [], 0, 0
        piece_start, piece_spans, closes_before = 0, [], None

        def add_text(end: int) -> None:
            piece = text[piece_start:end]
            encoding = self.recent_pieces.get(piece) if reuse else None
            if encoding is None:
                encoding = self.tokenizer(piece, add_special_tokens=False, return_offsets_mapping=True)
                encoding = (encoding["input_ids"], encoding["offset_mapping"])
                if reuse:
                    self.recent_pieces.keep(piece, encoding)
            shifted = [(s - piece_start, e - piece_start, c, i) for s, e, c, i in piece_spans]
            tok = self.mask_from_offsets(*encoding, shifted)
            if closes_before is not None and tok.input_ids and self.is_end_of_turn(tok.input_ids[0]):
                tok.loss_mask[0] = int(closes_before)  # the end of turn closing the stored reply just before the piece
            input_ids.extend(tok.input_ids)
            loss_mask.extend(tok.loss_mask)

        for start, end, closes, index in spans:
            ids = self.reply_ids(messages[index], text, start, end, conversation_id, reuse)
            if ids is None:
                from_text += "token_ids" in messages[index]
                piece_spans.append((start, end, closes, index))
                continue
            add_text(start)
            from_ids += 1
            input_ids.extend(ids)
            loss_mask.extend([1] * len(ids))
            piece_start, piece_spans, closes_before = end, [], closes
        add_text(len(text))
        return TokenizedConversation(input_ids=input_ids, loss_mask=loss_mask), from_ids, from_text

    def prompt_ids(self, messages: list[dict[str, Any]], conversation_id: str = "?") -> list[int]:
        """The ids of ``messages`` rendered with the generation prompt: the prompt a reply to them is generated from, the
        earlier replies as their stored ``token_ids`` (so a regenerated conversation's training row holds exactly the
        tokens each reply was generated after)."""
        text = self.generation_prompt_text(messages, conversation_id)
        if not any("token_ids" in m for m in messages):
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]
        spans = self.assistant_spans(messages, text, conversation_id, reuse=True)
        return self.tokenize_pieces(messages, text, spans, conversation_id, reuse=True)[0].input_ids

    def tokenize_batch(self, batch_messages: list[list[dict[str, str]]], ids: list[str],
                       counts: dict[str, int] | None = None) -> list[TokenizedConversation]:
        """Rows of ``batch_messages``; ``counts`` (optional) gains ``replies_from_ids`` and ``replies_from_text``: stored
        reply ids used, and stored ids that did not spell their turn's text (tokenized from the text instead)."""
        texts = [self.render(m, conversation_id=cid) for m, cid in zip(batch_messages, ids)]
        spans = [self.assistant_spans(m, text, cid) for m, text, cid in zip(batch_messages, texts, ids)]
        plain = [i for i, m in enumerate(batch_messages) if not any("token_ids" in message for message in m)]
        out: list[TokenizedConversation | None] = [None] * len(texts)
        if plain:  # one batched call (the tokenizer refuses an empty batch)
            encodings = self.tokenizer([texts[i] for i in plain], add_special_tokens=False, return_offsets_mapping=True)
            for i, ids_, offsets in zip(plain, encodings["input_ids"], encodings["offset_mapping"]):
                out[i] = self.mask_from_offsets(ids_, offsets, spans[i])
        for i, messages in enumerate(batch_messages):
            if out[i] is None:
                out[i], from_ids, from_text = self.tokenize_pieces(messages, texts[i], spans[i], ids[i])
                if counts is not None:
                    counts["replies_from_ids"] = counts.get("replies_from_ids", 0) + from_ids
                    counts["replies_from_text"] = counts.get("replies_from_text", 0) + from_text
        return out
