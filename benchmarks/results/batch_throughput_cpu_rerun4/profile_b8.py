import cProfile, pstats, sys, time, torch
sys.path.insert(0, '/work/main')
from infer.prompts import mt_bench
from eval.runner import run_conversations
from infer.loading import eos_ids, load_models, set_threads
from infer.prompt_lookup import PromptLookupDrafter
from models.sampling import SamplingConfig
bs, nq = int(sys.argv[1]), int(sys.argv[2])
target, _, tok = load_models('../shared/targets/qwen3-27m-sharegpt', None, 'cpu', batch_size=bs)
d = PromptLookupDrafter(num_draft_tokens=7, vocab_size=target.lm_head.weight.shape[0])
eos = eos_ids(tok, target.model)
set_threads('cpu', None, bs)
convs = mt_bench(nq)
def go():
    return run_conversations(target, d, tok, convs, prefill_tokens=0, sampling=SamplingConfig(), max_new_tokens=128, eos_token_ids=eos,
                             baseline=False, batch_size=bs, desc='x')
t0 = time.perf_counter(); go(); print('warm pass', time.perf_counter() - t0)
pr = cProfile.Profile(); t0 = time.perf_counter(); pr.enable(); go(); pr.disable(); print('profiled pass', time.perf_counter() - t0)
pstats.Stats(pr).sort_stats('tottime').print_stats(25)
