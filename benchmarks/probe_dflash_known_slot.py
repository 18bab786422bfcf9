"""Probe: does a DFlash drafter draft its later slots better when slot 1 holds a real token instead of the mask?

A DFlash block is [x_p, mask, ..., mask] at positions p .. p+B-1, and slot k's output drafts x_{p+k}; in-block
attention is causal for ``sliding_block_causal`` drafters, so slot k >= 2 sees slot 1. Training only ever put the mask
there. If slot 2.. draft better with the true x_{p+1} in slot 1, a tree could re-draft each of slot 1's top-k
candidates with that candidate in place (conditioning deeper slots on their parent, as EAGLE-3's tree does) instead of
reusing one block's marginals for every branch. This measures it on the target's own greedy text, CPU, fp32:

    python benchmarks/probe_dflash_known_slot.py --target builtin:smollm2-135m-instruct --drafter RUN/export \\
        --prompts sharegpt_heldout_prompts.jsonl --num-prompts 20 --max-new-tokens 128

Per slot k >= 2: top-1 accuracy of the plain block and of the block with the true x_{p+1} in slot 1, over all anchors
and split by whether the plain block's own slot 1 was right; then the greedy chain's τ both ways (the conditioned chain takes slot 1 from the plain
block and slots 2.. from the conditioned one, as a re-drafting loop would, only when slot 1 was right).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.script import run_main  # noqa: E402

from infer.loading import load_drafter_model, read_drafter_config  # noqa: E402
from infer.prompts import chat_ids  # noqa: E402
from models.builtin_targets import resolve_target_path  # noqa: E402
from models.dflash import DFlashDrafter, block_ids  # noqa: E402
from models.static_target import StaticTarget  # noqa: E402
from models.target import TargetModel  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--drafter", required=True)
    p.add_argument("--prompts", required=True, help="JSONL with a 'turns' list (the first turn is used)")
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=128)
    args = p.parse_args()
    torch.set_grad_enabled(False)

    target = TargetModel.from_pretrained(resolve_target_path(args.target), device="cpu", dtype="float32")
    config = read_drafter_config(args.drafter)
    model = load_drafter_model(args.drafter, config, torch.float32).eval()
    b, mask = model.block_size, model.mask_token_id
    static = StaticTarget(target.model, list(config["dflash_config"]["target_layer_ids"]))
    drafter = DFlashDrafter(model, target.embed_tokens, target.lm_head)
    records = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()][:args.num_prompts]

    plain_hits = torch.zeros(b - 1)
    known_hits = torch.zeros(b - 1)
    plain_given_first = torch.zeros(b - 1)
    known_given_first = torch.zeros(b - 1)
    anchors = first_right = 0
    tau_plain = tau_known = 0.0
    for r in records:
        prompt = chat_ids(target.tokenizer, [{"role": "user", "content": r["turns"][0]}])
        out = target.model.generate(torch.tensor([prompt]), max_new_tokens=args.max_new_tokens, do_sample=False,
                                    pad_token_id=target.tokenizer.pad_token_id or 0)[0].tolist()
        n = len(out)
        static.allocate(n + 1)
        _, features = static.forward(torch.tensor(out), 0)  # [n, k*H], the loop's own features
        drafter.reset(n + b)
        drafter.append_context(features[:len(prompt)], 0)
        seq = torch.tensor(out + [mask] * b)
        for a in range(len(prompt), n - b):
            truth = seq[a + 1:a + b]  # x_{a+1} .. x_{a+b-1}
            plain = drafter.logits_for_ids(block_ids(seq[a:a + 1], b, mask)[0], a).argmax(-1)
            # slot 1 revealed as a re-drafted tree node's path is (``block_tree``'s re-drafts build their blocks the same way)
            known = drafter.logits_for_ids(block_ids(seq[a:a + 1], b, mask, seq[a + 1:a + 2][None, None])[0, 0], a).argmax(-1)
            plain_ok, known_ok = (plain == truth).float(), (known == truth).float()
            plain_hits += plain_ok
            known_hits += known_ok
            anchors += 1
            if plain_ok[0]:
                first_right += 1
                plain_given_first += plain_ok
                known_given_first += known_ok
            tau_plain += 1 + plain_ok.cumprod(0).sum().item()
            chain = torch.cat([plain_ok[:1], known_ok[1:]])  # slot 1 from the plain block, the rest re-drafted
            tau_known += 1 + chain.cumprod(0).sum().item()
            drafter.append_context(features[a:a + 1], a)
    print(f"{args.drafter} on {args.target}: {len(records)} prompts, {anchors} anchors in the target's greedy replies; "
          f"slot 1 right at {first_right} ({100 * first_right / anchors:.1f}%)")
    wrong = anchors - first_right
    print("| slot k | plain block | slot 1 the true token | where the plain slot 1 was right: plain | true token | where it was wrong: plain | true token |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for k in range(1, b - 1):  # slot 1's own output reads its input when it holds the true token: not a draft
        print(f"| {k + 1} | {plain_hits[k] / anchors:.3f} | {known_hits[k] / anchors:.3f} | {plain_given_first[k] / max(first_right, 1):.3f} | "
              f"{known_given_first[k] / max(first_right, 1):.3f} | {(plain_hits[k] - plain_given_first[k]) / max(wrong, 1):.3f} | "
              f"{(known_hits[k] - known_given_first[k]) / max(wrong, 1):.3f} |")
    print(f"greedy chain τ (per anchor, no tree): plain block {tau_plain / anchors:.3f}; slot 1 accepted then slots 2.. re-drafted "
          f"with it in place {tau_known / anchors:.3f}")


if __name__ == "__main__":
    run_main(main)  # bad input (a flag, a missing or malformed file): one line, not a traceback
