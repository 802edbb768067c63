#!/usr/bin/env python3
"""A kernel's Hopper machine code on a machine without a GPU: the kernel module compiled as
`device.rs` compiles it (common.cuh + MODULE.cu, NVRTC, `compute_90a`), assembled by ptxas
for sm_90a, disassembled by cuobjdump; prints the registers, spills and instruction mix of
KERNEL, and the loads it issues before its main path's first griddepcontrol.wait (ACQBULK): under a
programmatic launch only constant data (weights) may be read there, so a load of a buffer an
earlier kernel writes in that list is a race. NVRTC, ptxas, cuobjdump and the CUDA headers come from PyPI wheels
(nvidia-cuda-nvrtc-cu12, triton), downloaded once into .cache/sass/. Kernel variants compare
by instruction counts here at no device time before one GPU call times them.

    tools/gpu/sass.py MODULE KERNEL [-DNAME=VALUE ...]     e.g. tools/gpu/sass.py moe moe_gate_up
"""
import collections
import ctypes
import glob
import os
import re
import subprocess
import sys
import zipfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CACHE = os.path.join(ROOT, ".cache", "sass")
WHEELS = ["nvidia-cuda-nvrtc-cu12", "triton"]


def tools():
    """The unpacked wheels' directory, downloading them on first use."""
    x = os.path.join(CACHE, "x")
    if not os.path.isdir(x):
        os.makedirs(CACHE, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", CACHE] + WHEELS, check=True)
        for w in glob.glob(os.path.join(CACHE, "*.whl")):
            with zipfile.ZipFile(w) as z:
                z.extractall(x)
        for b in glob.glob(os.path.join(x, "triton", "backends", "nvidia", "bin", "*")):
            os.chmod(b, 0o755)
    return x


def ptx(x, module, defines):
    kernels = os.path.join(ROOT, "crates", "cuda", "kernels")
    src = open(os.path.join(kernels, "common.cuh")).read() + "\n" + open(os.path.join(kernels, module + ".cu")).read()
    nvrtc = ctypes.CDLL(glob.glob(os.path.join(x, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.*"))[0])
    prog = ctypes.c_void_p()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), (module + ".cu").encode(), 0, None, None):
        sys.exit("nvrtcCreateProgram failed")
    include = os.path.join(x, "triton", "backends", "nvidia", "include")
    opts = ["--std=c++17", "-default-device", "-arch=compute_90a", "-I" + include] + defines
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts]))
    n = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if rc:
        sys.exit(f"{module}.cu does not compile:\n{log.value.decode()}")
    nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    nvrtc.nvrtcGetPTX(prog, buf)
    return buf.value.decode()


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    module, kernel, defines = sys.argv[1], sys.argv[2], sys.argv[3:]
    x = tools()
    bins = os.path.join(x, "triton", "backends", "nvidia", "bin")
    stem = os.path.join(CACHE, module)
    with open(stem + ".ptx", "w") as f:
        f.write(ptx(x, module, defines))
    asm = subprocess.run([os.path.join(bins, "ptxas"), "-arch=sm_90a", "-v", "-o", stem + ".cubin", stem + ".ptx"],
                         capture_output=True, text=True, check=True).stderr
    # ptxas reports each function's properties on the lines after its name.
    report = asm.split("Compiling entry function '" + kernel + "'")
    if len(report) < 2:
        sys.exit(f"no kernel {kernel} in {module}.cu")
    for line in report[1].splitlines()[1:4]:
        if "Compiling entry" in line:
            break
        print(line.replace("ptxas info    : ", "").strip())
    dump = subprocess.run([os.path.join(bins, "cuobjdump"), "-sass", stem + ".cubin"],
                          capture_output=True, text=True, check=True).stdout
    body = next(p for p in re.split(r"\n\s+Function : ", dump) if p.split("\n")[0].strip() == kernel)
    with open(os.path.join(CACHE, kernel + ".sass"), "w") as f:
        f.write(body)
    ops = [re.sub(r"^\s+/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?", "", l).split()[0].split(".")[0]
           for l in body.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+\S", l)]
    mix = ", ".join(f"{op} {n}" for op, n in collections.Counter(ops).most_common(16))
    print(f"{kernel}: {len(ops)} instructions ({mix}); SASS in {os.path.relpath(CACHE, ROOT)}/{kernel}.sass")
    code = [l.split(";")[0].split("*/", 1)[1].strip() for l in body.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+\S", l)]
    # The wait of the main path: an early return's wait (`pdl_wait(); return;`) ends in EXIT.
    wait = next((i for i, l in enumerate(code) if "ACQBULK" in l and not any("EXIT" == c.split()[-1] for c in code[i + 1:i + 3])), None)
    if wait is not None:
        early = [l for l in code[:wait] if re.search(r"\bLD(G|S)?\b|\bLDG\.", l)]
        print(f"loads before the main path's first wait (instruction {wait}): {len(early)}")
        for l in early:
            print("   " + " ".join(l.split()))


if __name__ == "__main__":
    main()
