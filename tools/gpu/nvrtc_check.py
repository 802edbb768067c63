#!/usr/bin/env python3
"""Compiles every kernel module of crates/cuda/kernels with NVRTC for sm_90a, as the CUDA backend
does at run time (common.cuh prepended, same options), then runs ptxas on the PTX for the
register, shared-memory and spill report. No GPU needed: catches compile errors and spills before
device time is spent.

Needs NVRTC, the CUDA headers and ptxas, e.g. from PyPI in a virtual environment:
    python3 -m venv /tmp/cu && /tmp/cu/bin/pip install nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cuda-nvcc
    /tmp/cu/bin/python tools/gpu/nvrtc_check.py [MODULE ...] [-D...]
"""
import ctypes
import glob
import os
import subprocess
import sys
import tempfile

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
kernels = os.path.join(root, "crates", "cuda", "kernels")
site = glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "nvidia", "cu1*"))
if not site:
    sys.exit("no nvidia/cu1x package under this interpreter's prefix (see the docstring)")
cu = site[0]
nvrtc = ctypes.CDLL(glob.glob(os.path.join(cu, "lib", "libnvrtc.so*"))[0])
include = os.path.join(cu, "include")
ptxas = os.path.join(cu, "bin", "ptxas")

defines = [a for a in sys.argv[1:] if a.startswith("-D")]
wanted = [a for a in sys.argv[1:] if not a.startswith("-D")]
common = open(os.path.join(kernels, "common.cuh")).read()
mods = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(kernels, "*.cu")))
failed = False
for m in mods:
    if wanted and m not in wanted:
        continue
    src = common + "\n" + open(os.path.join(kernels, m + ".cu")).read()
    prog = ctypes.c_void_p()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), (m + ".cu").encode(), 0, None, None) == 0
    opts = ["--std=c++17", "-default-device", "-arch=sm_90a", "-I" + include] + defines
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        print(f"== {m}: COMPILE FAILED\n{log.value.decode()}")
        failed = True
        continue
    nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value)
    nvrtc.nvrtcGetPTX(prog, ptx)
    with tempfile.NamedTemporaryFile("wb", suffix=".ptx", delete=False) as f:
        f.write(ptx.value)
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True, text=True)
    os.unlink(f.name)
    print(f"== {m}")
    fn = None
    for line in r.stderr.splitlines():
        if "Compiling entry function" in line:
            fn = line.split("'")[1]
        elif "Used" in line and fn:
            print(f"  {fn:<40} {line.split('info    : ')[-1]}")
        elif "spill" in line and ("bytes spill" in line and not line.strip().startswith("0 bytes")) and fn:
            if " 0 bytes spill stores, 0 bytes spill loads" not in line:
                print(f"  {fn:<40} SPILLS: {line.strip()}")
    if r.returncode != 0:
        print(r.stderr)
        failed = True
sys.exit(1 if failed else 0)
