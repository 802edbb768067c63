#!/usr/bin/env python3
"""Compiles kernel sources to a cubin with NVRTC alone, common.cuh prepended as nvrtc.rs does:
NVRTC runs ptxas itself for a real architecture (sm_90, not compute_90), so the inline PTX of
common.cuh's helpers is assembled, not just pasted into the PTX. No GPU and no ptxas package
needed: the check for a source no backend module includes yet (tools/emu/persistent_toy.cu, the
persistent kernels' counters) and for the modules themselves.

    /tmp/nvrtc-venv/bin/python tools/gpu/nvrtc_cubin.py [--arch sm_90] [-D...] (MODULE | PATH.cu) ...

A MODULE is crates/cuda/kernels/MODULE.cu; PATH.cu is relative to the repository root. Prints
each source's cubin size or its log; exits 1 when one failed. The NVRTC and headers come from
PyPI (ptx_diff.py's docstring says how).
"""
import ctypes
import glob
import os
import sys

root = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
kdir = os.path.join(root, "crates", "cuda", "kernels")
nv = os.path.join(sys.prefix, "lib", "python3*", "site-packages", "nvidia")
libs = glob.glob(os.path.join(nv, "*", "lib", "libnvrtc.so*"))
heads = [os.path.dirname(p) for p in glob.glob(os.path.join(nv, "*", "include", "cuda_bf16.h"))]
if not libs or not heads:
    sys.exit("no NVRTC or CUDA headers under this interpreter's prefix (see the docstring)")
nvrtc = ctypes.CDLL(sorted(libs)[0])

args = sys.argv[1:]
arch = "sm_90"
if "--arch" in args:
    i = args.index("--arch")
    arch = args[i + 1]
    del args[i : i + 2]
defines = [a for a in args if a.startswith("-D")]
sources = [a for a in args if not a.startswith("-D")]
if not sources:
    sys.exit(__doc__)
common = open(os.path.join(kdir, "common.cuh")).read()
failed = False
for s in sources:
    path = os.path.join(root, s) if s.endswith(".cu") else os.path.join(kdir, s + ".cu")
    src = common + "\n" + open(path).read()
    prog = ctypes.c_void_p()
    name = os.path.basename(path)
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None) == 0
    opts = ["--std=c++17", "-default-device", f"--gpu-architecture={arch}"]
    opts += defines + [f"--include-path={h}" for h in heads]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if rc != 0 or nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(n)) != 0:
        print(f"== {s}: FAILED for {arch}\n{log.value.decode()}")
        failed = True
        continue
    print(f"== {s}: cubin of {n.value} bytes for {arch}" + (f"\n{log.value.decode()}" if log.value.strip() else ""))
sys.exit(1 if failed else 0)
