"""Tiny targets built offline: the embedded default for the quickstart and the CPU tests.

``builtin:tiny-qwen3`` (Qwen3, ChatML) and ``builtin:tiny-llama3`` (Llama, Llama-3.1 template) are
8-layer models with a byte-level BPE tokenizer, both trained here for about a minute on the embedded
ShareGPT sample; no file comes from a model hub. They are built once into ``$SWA_DRAFTERS_CACHE/builtin`` (default
``~/.cache/swa-drafters/builtin``), written to a temporary folder and renamed, and then load like
any Hugging Face checkpoint.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from common.atomic import atomic_dir

BUILTIN_PREFIX = "builtin:"
# The bundled ShareGPT sample (package data of train/, read by path: no import of train/)
SAMPLE_DATA = Path(__file__).parents[1] / "train" / "data" / "samples" / "sharegpt_sample.jsonl"
BUILD_VERSION = 2

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Llama-3.1's template, cut to its chat part: a system header always comes first (with the
# knowledge-date preamble), and every message is trimmed.
LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] | trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\n\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n' }}"
    "{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
)

STYLES = {
    # name: (special tokens in id order, bos, eos, pad, template)
    "chatml": (
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"<|reserved_{i}|>" for i in range(5)],
        None, "<|im_end|>", "<|endoftext|>", CHATML_TEMPLATE,
    ),
    "llama3": (
        ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
        + [f"<|reserved_special_token_{i}|>" for i in range(5)],
        "<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>", LLAMA3_TEMPLATE,
    ),
}

TINY_MODELS = {
    "tiny-qwen3": ("chatml", "qwen3"),
    "tiny-llama3": ("llama3", "llama"),
}


def cache_root() -> Path:
    return Path(os.environ.get("SWA_DRAFTERS_CACHE", "~/.cache/swa-drafters")).expanduser()


def sample_texts() -> list[str]:
    texts = []
    with SAMPLE_DATA.open(encoding="utf-8") as f:
        for line in f:
            texts.extend(turn["value"] for turn in json.loads(line)["conversations"])
    return texts


def build_tokenizer(style: str, vocab_size: int = 1024):
    """A byte-level BPE tokenizer trained on the embedded sample, with ``style``'s chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials, bos, eos, pad, template = STYLES[style]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(sample_texts(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad, chat_template=template,
        additional_special_tokens=[t for t in specials if t not in (bos, eos, pad)], clean_up_tokenization_spaces=False,
    )


def build_model(arch: str, tokenizer, seed: int = 0):
    """An 8-layer model (hidden 128), random init: deep enough for every default layer selection."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=352, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=32768, rms_norm_eps=1e-6,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    if arch == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(rope_theta=1e6, **common))
    return LlamaForCausalLM(LlamaConfig(rope_theta=5e5, **common))


def pretrain(model, tokenizer, steps: int = 150, seq_len: int = 256, batch_size: int = 16, seed: int = 0) -> float:
    """A short next-token run on the embedded sample, so the tiny target has a real distribution
    (a random-init LM head is ~0.02-scale noise that no drafter can learn to match). Returns the
    last loss. About a minute on 2 CPU cores."""
    conversations = [json.loads(line)["conversations"] for line in SAMPLE_DATA.open(encoding="utf-8")]
    roles = {"human": "user", "gpt": "assistant"}
    stream = []
    for turns in conversations:
        messages = [{"role": roles.get(t["from"], t["from"]), "content": t["value"]} for t in turns]
        stream += tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    data = torch.tensor(stream[: len(stream) // seq_len * seq_len]).view(-1, seq_len)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    model.train()
    loss = torch.tensor(float("nan"))
    from tqdm.auto import tqdm

    for _ in tqdm(range(steps), desc="building the tiny target (first use only)", unit="step", leave=False):
        batch = data[torch.randint(len(data), (batch_size,), generator=generator)]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    return float(loss.detach())


def build_tiny_target(name: str, out_dir: Path) -> Path:
    """Build ``name`` (see TINY_MODELS) into ``out_dir`` atomically; returns ``out_dir``."""
    style, arch = TINY_MODELS[name]
    with atomic_dir(out_dir, replace=False) as tmp:  # a concurrent build that finished first wins
        tokenizer = build_tokenizer(style)
        model = build_model(arch, tokenizer)
        final_loss = pretrain(model, tokenizer)
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        tokenizer.save_pretrained(tmp)
        model.save_pretrained(tmp)
        (tmp / "README.md").write_text(
            f"# {name}\n8-layer {arch} model (hidden 128) with a BPE tokenizer, both trained briefly on the embedded "
            f"ShareGPT sample ({style} chat template; final train loss {final_loss:.2f} nats). Built by swa-drafters "
            f"(models/builtin_targets.py, build v{BUILD_VERSION}).\n"
        )
    return out_dir


def resolve_target_path(path: str) -> str:
    """``builtin:<name>`` -> the local folder of that tiny target (built on first use); else ``path``."""
    if not path.startswith(BUILTIN_PREFIX):
        return path
    name = path[len(BUILTIN_PREFIX):]
    if name not in TINY_MODELS:
        raise ValueError(f"target.path={path!r}: unknown builtin target; expected one of {[BUILTIN_PREFIX + n for n in TINY_MODELS]}")
    out_dir = cache_root() / "builtin" / f"{name}-v{BUILD_VERSION}"
    if not (out_dir / "config.json").exists():
        import logging

        from filelock import FileLock

        out_dir.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(out_dir) + ".lock"):  # processes starting together (test workers, several runs) build it once
            if not (out_dir / "config.json").exists():
                logging.getLogger(__name__).info("%s: first use, training it offline into %s (about a minute and a half on 2 cores)",
                                                 path, out_dir)
                build_tiny_target(name, out_dir)
    return str(out_dir)
