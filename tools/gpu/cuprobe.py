"""The harness of the GPU probes (signal_bench.py, chain_under_load.py): the CUDA driver and
NVRTC of the GPU machine through ctypes, so a probe runs there with no build. A probe's CUDA
source is compiled for the device's own architecture; `ptx_only(src)` compiles it without a
GPU (NVRTC from the PyPI wheels that tools/gpu/sass.py downloads), so a probe's source is
checked here before a call runs it.
"""
import argparse
import ctypes
import glob
import os
import sys

# Device code every probe's source may use, compiled in front of it: %globaltimer in ns.
PRELUDE = r"""
__device__ unsigned long long now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
"""


def lib(names):
    """The first of `names` (globs, or bare names the dynamic loader searches for) that loads."""
    for n in names:
        for path in glob.glob(n) or [n]:
            try:
                return ctypes.CDLL(path)
            except OSError:
                continue
    sys.exit(f"none of {names} could be loaded")


def check(rc, what):
    if rc != 0:
        sys.exit(f"{what} failed with CUDA error {rc}")


def compile_ptx(nvrtc, src, name, arch):
    """PRELUDE + src compiled by NVRTC for `arch` (e.g. compute_90): its PTX, or exit with the log."""
    prog = ctypes.c_void_p()
    check(nvrtc.nvrtcCreateProgram(ctypes.byref(prog), (PRELUDE + src).encode(), name.encode(), 0, None, None),
          "nvrtcCreateProgram")
    opts = [f"-arch={arch}".encode(), b"--std=c++17"]
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    check(rc, f"NVRTC compile of {name}:\n" + log.value.decode())
    nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value)
    nvrtc.nvrtcGetPTX(prog, ptx)
    return ptx.value


def ptx_only(src, name):
    """src's PTX for sm_90 on a machine without a GPU (the wheels of tools/gpu/sass.py)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import sass  # noqa: E402 (the wheels' download lives there)

    x = sass.tools()
    nvrtc = ctypes.CDLL(glob.glob(os.path.join(x, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.*"))[0])
    return compile_ptx(nvrtc, src, name, "compute_90")


def parser(doc, launches_help):
    """A probe's command line: its --launches, --json and --compile-only (add its own)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--launches", type=int, default=5, help=launches_help)
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--compile-only", action="store_true", help="compile the kernels (no GPU needed) and stop")
    return ap


def compiled_only(args, src, name):
    """With --compile-only: compiles src here (no GPU), says so, and returns True."""
    if args.compile_only:
        ptx_only(src, name)
        print(f"{name} compiles")
    return args.compile_only


class Gpu:
    """Device 0's primary context, with what the probes need of the driver API."""

    def __init__(self):
        cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        self.cu = lib(["/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1", "libcuda.so.1"])
        self.nvrtc = lib([os.path.join(cuda_home, "lib64", "libnvrtc.so*")])
        check(self.cu.cuInit(0), "cuInit")
        self.dev = ctypes.c_int()
        check(self.cu.cuDeviceGet(ctypes.byref(self.dev), 0), "cuDeviceGet")
        self.major, self.minor = self.attribute(75), self.attribute(76)  # compute capability
        ctx = ctypes.c_void_p()
        check(self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), self.dev), "cuDevicePrimaryCtxRetain")
        check(self.cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def attribute(self, attr):
        """A CUdevice_attribute's value (16: multiprocessors, 75/76: compute capability)."""
        v = ctypes.c_int()
        check(self.cu.cuDeviceGetAttribute(ctypes.byref(v), attr, self.dev), f"device attribute {attr}")
        return v.value

    def module(self, src, name):
        """src compiled for this device and loaded."""
        ptx = compile_ptx(self.nvrtc, src, name, f"compute_{self.major}{self.minor}")
        mod = ctypes.c_void_p()
        check(self.cu.cuModuleLoadData(ctypes.byref(mod), ptx), "cuModuleLoadData")
        return mod

    def function(self, mod, name, dynamic_shared=0):
        """Kernel `name` of mod, allowed `dynamic_shared` bytes of dynamic shared memory."""
        f = ctypes.c_void_p()
        check(self.cu.cuModuleGetFunction(ctypes.byref(f), mod, name.encode()), f"cuModuleGetFunction {name}")
        if dynamic_shared > 48 * 1024:  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(self.cu.cuFuncSetAttribute(f, 8, dynamic_shared), f"{name}: dynamic shared memory")
        return f

    def alloc(self, nbytes):
        """nbytes (a multiple of 4) of device memory, zeroed: its address."""
        p = ctypes.c_uint64()
        check(self.cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(nbytes)), f"cuMemAlloc of {nbytes} bytes")
        self.memset32(p, 0, nbytes // 4)
        return p

    def memset32(self, p, value, n):
        """n 32-bit words from device address p set to value."""
        check(self.cu.cuMemsetD32_v2(ctypes.c_uint64(p.value), ctypes.c_uint(value), ctypes.c_size_t(n)),
              "cuMemsetD32")
        return p

    def launch(self, f, grid, block, args, shared=0):
        """f over `grid` blocks of `block` threads with `args` (ctypes values), then waited for."""
        ptrs = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in args])
        check(self.cu.cuLaunchKernel(f, grid, 1, 1, block, 1, 1, shared, None, ptrs, None), "cuLaunchKernel")
        check(self.cu.cuCtxSynchronize(), "kernel run")

    def read(self, p, ctype, n):
        """n values of `ctype` from device address p."""
        host = (ctype * n)()
        check(self.cu.cuMemcpyDtoH_v2(host, p, ctypes.c_size_t(ctypes.sizeof(host))), "cuMemcpyDtoH")
        return list(host)
