import torch, sys, torch.nn.functional as F
sys.path.insert(0, '/tmp/repo2')
from torch.profiler import profile, ProfilerActivity
def bench(name, fn):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5): fn()
        torch.cuda.synchronize()
    rows = sorted(((k.self_device_time_total / k.count, k.key[:50]) for k in p.key_averages() if k.self_device_time_total > 0), reverse=True)[:3]
    print(name, [(round(a), b) for a, b in rows], flush=True)
B, T, H, Hk, D = 16, 2048, 8, 2, 64
q = torch.randn(B, T, H, D, device='cuda', dtype=torch.bfloat16).transpose(1, 2)
k = torch.randn(B, T, Hk, D, device='cuda', dtype=torch.bfloat16).transpose(1, 2)
v = torch.randn(B, T, Hk, D, device='cuda', dtype=torch.bfloat16).transpose(1, 2)
def rep(x): return x[:, :, None].expand(B, Hk, 4, T, D).reshape(B, H, T, D)
f = lambda q, k, v: F.scaled_dot_product_attention(q, rep(k), rep(v), is_causal=True)
bench("eager causal", lambda: f(q, k, v))
cf = torch.compile(f, dynamic=False)
bench("compiled causal", lambda: cf(q, k, v))
g = lambda q, k, v: F.scaled_dot_product_attention(q.contiguous(), rep(k).contiguous(), rep(v).contiguous(), is_causal=True)
bench("compiled causal contiguous", lambda: torch.compile(g, dynamic=False)(q, k, v))
from torch.nn.attention import sdpa_kernel, SDPBackend
def h(q, k, v):
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, rep(k), rep(v), is_causal=True)
ch = torch.compile(h, dynamic=False)
bench("compiled causal flash inside", lambda: ch(q, k, v))
# what the mask function decides while tracing the capture
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from models.target import register_causal_sdpa, CAUSAL_SDPA, TargetModel
register_causal_sdpa(); inner = ALL_MASK_ATTENTION_FUNCTIONS[CAUSAL_SDPA]
def spy(*a, **kw):
    r = inner(*a, **kw); print("mask fn:", {x: kw.get(x) for x in ("q_length", "kv_length", "q_offset", "kv_offset", "allow_is_causal_skip", "local_size")}, "mask None" if r is None else tuple(r.shape), "args", len(a)); return r
AttentionMaskInterface.register(CAUSAL_SDPA, spy)
t = TargetModel.from_pretrained('/tmp/tgt', 'cuda', dtype='bfloat16'); t.model.set_attn_implementation(CAUSAL_SDPA)
L = [1, 2, 3, 4, 5]; ids = torch.randint(0, 8000, (16, 2048), device='cuda')
fc = torch.compile(lambda ids: t.stack(input_ids=ids, use_cache=False).last_hidden_state, dynamic=False)
bench("compiled HF stack", lambda: fc(ids))
