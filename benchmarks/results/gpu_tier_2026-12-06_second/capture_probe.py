"""pytest plugin (debug only): report every Triton compile and module load that happens while a CUDA graph is being
captured, with the repo frames that led there."""
import os, traceback
import torch
import triton.runtime.jit as jit
import triton.compiler.compiler as cc

LOG = os.path.join(os.environ.get("OUT", "/tmp"), "capture_probe.txt")


def note(what, name):
    capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    with open(LOG, "a") as f:
        f.write(f"{what} {name} capturing={capturing}\n")
        if capturing:
            frames = [fr for fr in traceback.extract_stack() if "/models/" in fr.filename or "/swa_kernels/" in fr.filename or "/infer/" in fr.filename]
            for fr in frames[-8:]:
                f.write(f"    {fr.filename.split('/')[-2]}/{fr.filename.split('/')[-1]}:{fr.lineno} {fr.name}\n")


if hasattr(jit.JITFunction, "_do_compile"):
    orig_compile = jit.JITFunction._do_compile

    def _do_compile(self, *a, **k):
        note("compile", getattr(self, "__name__", self))
        return orig_compile(self, *a, **k)

    jit.JITFunction._do_compile = _do_compile
orig_init = cc.CompiledKernel._init_handles


def _init_handles(self):
    if getattr(self, "module", None) is None:
        note("load", getattr(self, "name", "?"))
    return orig_init(self)


cc.CompiledKernel._init_handles = _init_handles
