#!/usr/bin/env python3
"""Compiles kernel sources to a cubin with NVRTC alone, common.cuh prepended as nvrtc.rs does:
NVRTC runs ptxas itself for a real architecture (sm_90, not compute_90), so the inline PTX of
common.cuh's helpers is assembled, not just pasted into the PTX. No GPU and no ptxas package
needed: the check for a source no backend module includes yet (tools/emu/persistent_toy.cu, the
persistent kernels' counters) and for the modules themselves.

    /tmp/nvrtc-venv/bin/python tools/gpu/nvrtc_cubin.py [--arch sm_90] [-D...] (MODULE | PATH.cu) ...

A MODULE is crates/cuda/kernels/MODULE.cu; PATH.cu is relative to the repository root. Prints
each source's cubin size or its log; exits 1 when one failed. The NVRTC and headers come from
PyPI (nvrtc_pypi.py says how).
"""
import os
import sys

from nvrtc_pypi import ROOT as root, compile_source, take_arch

kdir = os.path.join(root, "crates", "cuda", "kernels")
args = sys.argv[1:]
arch = take_arch(args, "sm_90")
defines = [a for a in args if a.startswith("-D")]
sources = [a for a in args if not a.startswith("-D")]
if not sources:
    sys.exit(__doc__)
common = open(os.path.join(kdir, "common.cuh")).read()
failed = False
for s in sources:
    path = os.path.join(root, s) if s.endswith(".cu") else os.path.join(kdir, s + ".cu")
    size, log = compile_source(common + "\n" + open(path).read(), os.path.basename(path), arch, defines, cubin=True)
    if size is None:
        print(f"== {s}: FAILED for {arch}\n{log}")
        failed = True
        continue
    print(f"== {s}: cubin of {size} bytes for {arch}" + (f"\n{log}" if log.strip() else ""))
sys.exit(1 if failed else 0)
