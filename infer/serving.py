"""Serving engines as clients: vLLM in its own process, or any running OpenAI-compatible server.

Both ``python -m eval ... --engine vllm|server`` and regeneration (``data.regenerate.engine``) talk to an
engine through these two classes; neither imports vLLM into this process.

* ``VllmEngine``: starts ``infer/vllm_worker.py`` under the vLLM environment's Python (``SWA_VLLM_PYTHON``):
  vLLM pins its own torch and transformers, so it never shares a process with this project. Prompts go
  down a pipe as token ids; tokens and vLLM's own acceptance counters come back.
* ``ServerEngine``: a server already running elsewhere (``vllm serve``, SGLang): ``/v1/completions`` with the
  prompt as token ids for generation, its Prometheus ``/metrics`` for acceptance.

Acceptance from counters. vLLM counts, per draft position k, the verify steps that accepted more than k
drafts (``vllm:spec_decode_num_accepted_tokens_per_pos``) and the verify steps (``..._num_drafts``). Those fix
the histogram of accepted drafts per step (``steps_from_counters``), so τ and the acceptance by position
computed from it (``infer.generate.pooled_acceptance``) are the engine's exactly; only the steps' order is
lost. Counters are read before and after each request, so a request's numbers are its own when it is the
only one in flight (eval sends one at a time; a shared server's other traffic would leak in).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Iterator

from models.sampling import SamplingConfig

WORKER = Path(__file__).with_name("vllm_worker.py")
GREEDY = SamplingConfig()


def steps_from_counters(drafts: int, accepted_per_pos: list[int]) -> list[int]:
    """Accepted drafts per verify step, as a histogram (order lost, pooled statistics exact): ``accepted_per_pos[k]``
    steps accepted more than k drafts, so ``accepted_per_pos[k-1] - accepted_per_pos[k]`` accepted exactly k."""
    counts = [int(drafts), *(int(a) for a in accepted_per_pos), 0]
    if any(a < b for a, b in zip(counts, counts[1:])):
        raise ValueError(f"the engine's counters are not a tail distribution: drafts {drafts}, accepted per position {accepted_per_pos}")
    return [k for k in range(len(counts) - 1) for _ in range(counts[k] - counts[k + 1])]


def engine_stats(tokens: list[int], seconds: float, block_size: int, drafts: int, accepted_per_pos: list[int], engine: str) -> dict:
    """Stats in ``GenerationStats.to_dict()``'s keys, the steps rebuilt from the engine's counters."""
    return {"block_size": block_size, "accepted_per_step": steps_from_counters(drafts, accepted_per_pos), "new_tokens": len(tokens),
            "decode_s": seconds, "prefill_s": 0.0, "draft_s": 0.0, "verify_s": 0.0, "other_s": 0.0, "engine": engine}


def through_eos(tokens: list[int], eos: list[int]) -> list[int]:
    """Tokens up to and including the first end-of-sequence token, as our loop keeps a reply (``infer.generate``: the
    end-of-sequence token is output), so an engine's reply compares with the target alone token for token."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[:i + 1]
    return tokens


def cut_at_eos(tokens: list[int], eos: list[int]) -> list[int]:
    """Tokens before the first end-of-sequence token (a regenerated reply; engines differ in whether they return it)."""
    kept = through_eos(tokens, eos)
    return kept[:-1] if kept and kept[-1] in eos else kept


def reply_ended(tokens: list[int], eos: list[int], budget: int, finish_reason: str | None = None) -> bool:
    """Whether a reply ended on its own rather than at its token budget: the engine's finish reason where it gives one
    (OpenAI's ``stop`` / ``length``), else an end-of-sequence token among its first ``budget`` tokens or fewer than
    ``budget`` back (engines that stop at the end-of-sequence token differ in whether they return it)."""
    if finish_reason in ("stop", "length"):
        return finish_reason == "stop"
    head = tokens[:budget]
    return any(t in eos for t in head) or len(head) < budget


def vllm_python(python: str | None, setting: str = "--vllm-python") -> str:
    """vLLM environment's interpreter: ``python`` or ``$SWA_VLLM_PYTHON``. ``setting``: where ``python`` came from, named
    in the error (a CLI flag, or a config key such as ``data.regenerate.vllm_python``)."""
    python = python or os.environ.get("SWA_VLLM_PYTHON")
    if not python or not Path(python).exists():
        found = f"neither {setting} nor SWA_VLLM_PYTHON is set" if not python else f"{setting}={python!r} does not exist"
        raise ValueError(f"vLLM's Python not found: {found} (make vLLM's environment with .ci/vllm-env DIR, then set "
                         f"{setting} to DIR/bin/python or SWA_VLLM_PYTHON; see README)")
    return python


class VllmEngine:
    """vLLM in its own process.

    Args:
        python: the vLLM environment's interpreter (None: ``$SWA_VLLM_PYTHON``).
        target: the target model folder; drafter: the engine export (None: vLLM without speculation).
        method: ``eagle3`` or ``dflash``; num_speculative_tokens: drafts per step.
        eos: token ids that end a reply; max_model_len: vLLM's context limit.
        max_num_seqs: requests vLLM batches together (1 for per-request counters).
    """

    def __init__(self, python: str | None, target: str, drafter: str | None, method: str | None, num_speculative_tokens: int,
                 eos: list[int], max_model_len: int, dtype: str = "float32", max_num_seqs: int = 1,
                 python_setting: str = "--vllm-python"):
        config = {"target": target, "drafter": drafter, "method": method, "num_speculative_tokens": num_speculative_tokens,
                  "eos": list(eos), "max_model_len": max_model_len, "dtype": dtype, "max_num_seqs": max_num_seqs}
        # The engine core in the worker's own process, not a second one (VLLM_ENABLE_V1_MULTIPROCESSING=0: the worker
        # drives vLLM's offline LLM alone): the second process imported vLLM and torch again, so a start of the
        # 27M reference target took 58 s on the 2-core AVX2 machine and takes 26 s, the same tokens
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
               "VLLM_ENABLE_V1_MULTIPROCESSING": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0")}
        # vLLM's log goes to a temporary file (the terminal with SWA_VLLM_VERBOSE=1): a refusal raised in its engine
        # core can reach the worker as "initialization failed" (in a process of its own), the cause only in the log
        self.log = None if os.environ.get("SWA_VLLM_VERBOSE") else tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen([vllm_python(python, python_setting), str(WORKER), json.dumps(config)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        self.block_size = num_speculative_tokens + 1
        self.drafter = drafter
        self.eos = list(eos)
        ready = self._read()
        if "error" in ready:
            self.close()
            what = f"target {target}" + (f" with {method} drafter {drafter}" if drafter else "")
            raise ValueError(f"vLLM refused {what}: {root_cause(self.log) or ready['error']}")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise ValueError(f"vLLM's process ended (exit {code}) before answering; rerun with SWA_VLLM_VERBOSE=1 for its log")
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            raise ValueError(f"vLLM's worker wrote {line[:200]!r} where a JSON answer belongs (infer/vllm_worker.py)") from None

    def _request(self, prompts: list[list[int]], max_new_tokens: int, sampling: SamplingConfig,
                 seeds: list[int] | None = None) -> dict:
        request = {"prompts": [list(p) for p in prompts], "max_new_tokens": max_new_tokens, "temperature": sampling.temperature,
                   "top_p": sampling.top_p, "top_k": sampling.top_k, "seed": sampling.seed}
        if seeds is not None:  # one per prompt (the worker's SamplingParams per prompt); else ``seed`` for all
            request["seeds"] = [int(x) for x in seeds]
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def generate(self, prompt: list[int], max_new_tokens: int) -> tuple[list[int], dict]:
        """Greedy, one prompt: (output tokens, stats in ``GenerationStats.to_dict()``'s keys)."""
        answer = self._request([prompt], max_new_tokens, GREEDY)
        tokens = through_eos(answer["outputs"][0], self.eos)  # eval's check against the target alone: as our loop's
        return tokens, engine_stats(tokens, answer["seconds"], self.block_size, answer.get("drafts", 0),
                                    answer.get("accepted_per_pos", []), "vllm")

    def generate_many(self, prompts: list[list[int]], max_new_tokens: list[int], sampling: SamplingConfig,
                      seeds: list[int] | None = None) -> list[tuple[list[int], bool]]:
        """Replies to prompts, batched by vLLM (one request per distinct budget): (tokens, end-of-sequence cut; whether
        the reply ended before its budget, ``reply_ended``). ``seeds``: one sampling seed per prompt (default
        ``sampling.seed`` for all: sampled replies to a repeated prompt then come out alike)."""
        out: list[tuple[list[int], bool]] = [([], True) for _ in prompts]
        for budget in sorted(set(max_new_tokens)):
            idx = [i for i, b in enumerate(max_new_tokens) if b == budget]
            answer = self._request([prompts[i] for i in idx], budget, sampling, None if seeds is None else [seeds[i] for i in idx])
            for i, tokens in zip(idx, answer["outputs"]):
                out[i] = cut_at_eos(tokens, self.eos), reply_ended(tokens, self.eos, budget)
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def root_cause(log) -> str | None:
    """The last ``SomeError: message`` line of vLLM's log that is not its generic "initialization failed" wrapper."""
    if log is None:
        return None
    log.seek(0)
    causes = []
    for line in log.read().splitlines():
        line = re.sub(r"^\([^)]*\)\s*", "", line.strip())  # vLLM prefixes its processes' lines: "(EngineCore pid=1) "
        if re.match(r"^[\w.]*(Error|Exception): ", line) and "initialization failed" not in line:
            causes.append(line)
    return causes[-1][:500] if causes else None


METRIC = re.compile(r'^(vllm:spec_decode_num_drafts|vllm:spec_decode_num_accepted_tokens_per_pos)(?:_total)?(?:\{([^}]*)\})?\s+(\S+)')


def parse_spec_metrics(text: str) -> dict | None:
    """vLLM's speculative-decoding counters from a Prometheus ``/metrics`` page, summed over engines and models;
    None when the page has none (no speculation, or a server that does not export vLLM's names)."""
    drafts, per_pos, found = 0.0, {}, False
    for line in text.splitlines():
        m = METRIC.match(line)
        if not m:
            continue
        found = True
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name.endswith("num_drafts"):
            drafts += value
        else:
            position = re.search(r'position="(\d+)"', labels)
            if position is None:
                raise ValueError(f"/metrics: {line!r} has no position label")
            per_pos[int(position.group(1))] = per_pos.get(int(position.group(1)), 0.0) + value
    if not found:
        return None
    return {"drafts": int(round(drafts)), "accepted_per_pos": [int(round(per_pos.get(k, 0.0))) for k in range(len(per_pos))]}


class ServerEngine:
    """A running OpenAI-compatible server (``vllm serve``, SGLang): generation by ``/v1/completions`` with token-id
    prompts; acceptance by its ``/metrics`` counters (vLLM's names).

    Args:
        url: the server's base URL (``http://host:8000``).
        eos: token ids that end a reply; concurrency: requests in flight at once (``complete_many``).
        timeout: seconds one request may take.
    """

    def __init__(self, url: str, eos: list[int] = (), concurrency: int = 1, timeout: float = 600.0):
        self.url = url.rstrip("/")
        self.eos = list(eos)
        self.concurrency = concurrency
        self.timeout = timeout
        models = self._call("/v1/models", None).get("data") or []
        if not models:
            raise ValueError(f"server {self.url}: /v1/models lists no model")
        self.model = models[0]["id"]
        self.drafter = f"{self.url} ({self.model})"
        self.block_size = None

    def _call(self, path: str, body: dict | None, raw: bool = False):
        request = urllib.request.Request(self.url + path, data=None if body is None else json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                payload = response.read().decode()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace").strip().splitlines()
            raise ValueError(f"server {self.url}{path}: HTTP {e.code} {detail[0][:300] if detail else e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ValueError(f"server {self.url}: unreachable ({reason}); expected a running OpenAI-compatible server "
                             "(vllm serve, SGLang)") from None
        return payload if raw else json.loads(payload)

    def metrics(self) -> dict | None:
        return parse_spec_metrics(self._call("/metrics", None, raw=True))

    def complete(self, prompt: list[int], max_new_tokens: int,
                 sampling: SamplingConfig = GREEDY) -> tuple[list[int] | None, str, bool]:
        """(reply tokens before any end-of-sequence token, or None when the server returns none; reply text; whether it
        ended before its budget): a regenerated reply."""
        tokens, text, ended = self._complete(prompt, max_new_tokens, sampling)
        return (None if tokens is None else cut_at_eos(tokens, self.eos)), text, ended

    def _complete(self, prompt: list[int], max_new_tokens: int, sampling: SamplingConfig) -> tuple[list[int] | None, str, bool]:
        """``complete`` with the tokens as the server returned them."""
        body = {"model": self.model, "prompt": list(prompt), "max_tokens": max_new_tokens, "temperature": sampling.temperature,
                "top_p": sampling.top_p, "seed": sampling.seed, "return_token_ids": True, "skip_special_tokens": True}
        if sampling.top_k:
            body["top_k"] = sampling.top_k
        if self.eos:
            body["stop_token_ids"] = self.eos
        choice = self._call("/v1/completions", body)["choices"][0]
        tokens = choice.get("token_ids")
        if tokens is None and choice.get("finish_reason") not in ("stop", "length"):
            raise ValueError(f"server {self.url}: /v1/completions returned neither token_ids nor a finish_reason of "
                             f"'stop' or 'length' (got {choice.get('finish_reason')!r}): whether a reply ended cannot be read")
        ended = reply_ended(list(tokens or []), self.eos, max_new_tokens, choice.get("finish_reason"))
        return (None if tokens is None else list(tokens)), choice.get("text", ""), ended

    def generate(self, prompt: list[int], max_new_tokens: int) -> tuple[list[int], dict]:
        """Greedy, one prompt, acceptance from the server's counters before and after."""
        before = self.metrics()
        if before is None:
            raise ValueError(f"server {self.url}: /metrics has no vllm:spec_decode_* counters (no speculative decoding, or "
                             "not vLLM's metric names): τ cannot be read")
        start = time.perf_counter()
        tokens, _, _ = self._complete(prompt, max_new_tokens, GREEDY)
        seconds = time.perf_counter() - start
        if tokens is None:
            raise ValueError(f"server {self.url}: /v1/completions returned no token_ids (return_token_ids unsupported): "
                             "tokens cannot be checked against the target")
        tokens = through_eos(tokens, self.eos)  # eval's check against the target alone: as our loop's
        after = self.metrics()
        self.block_size = len(after["accepted_per_pos"]) + 1
        prior = before["accepted_per_pos"] + [0] * (len(after["accepted_per_pos"]) - len(before["accepted_per_pos"]))
        return tokens, engine_stats(tokens, seconds, self.block_size, after["drafts"] - before["drafts"],
                                    [a - b for a, b in zip(after["accepted_per_pos"], prior)], "server")

    def complete_many(self, prompts: list[list[int]], max_new_tokens: list[int], sampling: SamplingConfig,
                      seeds: list[int] | None = None) -> Iterator[tuple[int, list[int] | None, str, bool]]:
        """(index, tokens or None, text, ended before its budget) for each prompt as its reply arrives, ``concurrency``
        requests in flight. ``seeds``: one sampling seed per prompt, each request's ``seed`` (default ``sampling.seed``)."""
        def sampling_of(i: int) -> SamplingConfig:
            return sampling if seeds is None else dataclasses.replace(sampling, seed=int(seeds[i]))

        with ThreadPoolExecutor(self.concurrency) as pool:
            futures = {pool.submit(self.complete, p, n, sampling_of(i)): i for i, (p, n) in enumerate(zip(prompts, max_new_tokens))}
            try:
                for future in as_completed(futures):
                    tokens, text, ended = future.result()
                    yield futures[future], tokens, text, ended
            finally:
                for future in futures:
                    future.cancel()

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


if __name__ == "__main__":  # a quick check by hand: python -m infer.serving VLLM_PYTHON TARGET [DRAFTER METHOD K]
    python, target, *rest = sys.argv[1:]
    with VllmEngine(python, target, rest[0] if rest else None, rest[1] if rest else None, int(rest[2]) if rest else 0, [], 2048) as e:
        print(e.generate([1, 2, 3], 16))
