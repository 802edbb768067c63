"""NVRTC and the CUDA headers from PyPI's wheels in this interpreter's virtual environment, and a
compile of a source as the CUDA backend compiles its modules at run time (nvrtc.rs:
`--std=c++17 -default-device --gpu-architecture=ARCH` and the defines given). Shared by
ptx_diff.py (PTX) and nvrtc_cubin.py (a cubin, ptxas run by NVRTC itself). Set up with:
    python3 -m venv /tmp/nvrtc-venv
    /tmp/nvrtc-venv/bin/pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12
"""
import ctypes
import glob
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
_nv = os.path.join(sys.prefix, "lib", "python3*", "site-packages", "nvidia")
_libs = glob.glob(os.path.join(_nv, "*", "lib", "libnvrtc.so*"))
_heads = [os.path.dirname(p) for p in glob.glob(os.path.join(_nv, "*", "include", "cuda_bf16.h"))]
if not _libs or not _heads:
    sys.exit("no NVRTC or CUDA headers under this interpreter's prefix (see tools/gpu/nvrtc_pypi.py)")
_nvrtc = ctypes.CDLL(sorted(_libs)[0])


def take_arch(args, default):
    """The value of `--arch A` in args (removed from them), else default."""
    if "--arch" not in args:
        return default
    i = args.index("--arch")
    arch = args[i + 1]
    del args[i : i + 2]
    return arch


def compile_source(src, name, arch, defines, cubin=False):
    """src compiled for arch: (its PTX text, or its cubin's size in bytes with `cubin`; None when
    the compile failed) and NVRTC's log."""
    prog = ctypes.c_void_p()
    assert _nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None) == 0
    opts = ["--std=c++17", "-default-device", f"--gpu-architecture={arch}"]
    opts += defines + [f"--include-path={h}" for h in _heads]
    rc = _nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts]))
    n = ctypes.c_size_t()
    _nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    _nvrtc.nvrtcGetProgramLog(prog, log)
    log = log.value.decode()
    if rc != 0:
        return None, log
    if cubin:
        return (n.value if _nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(n)) == 0 else None), log
    _nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    _nvrtc.nvrtcGetPTX(prog, buf)
    return buf.value.decode(), log
