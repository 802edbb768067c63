//! Opening the GPU: driver, device, NVRTC and header checks, and the kernel modules loaded for
//! the device's architecture (`sm_90a` on Hopper; compiled and kept by `nvrtc`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;

use crate::error::{CudaError, Result};

/// A launch of `grid.0 × grid.1` blocks of `block` threads with `shared` bytes of dynamic shared memory.
pub(crate) fn launch_cfg(
    grid: (u32, u32),
    block: u32,
    shared: u32,
) -> cudarc::driver::LaunchConfig {
    cudarc::driver::LaunchConfig {
        grid_dim: (grid.0, grid.1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: shared,
    }
}

/// A block of 256 threads per row, `rows` blocks: the row kernels' launch.
pub(crate) fn row_blocks(rows: usize) -> cudarc::driver::LaunchConfig {
    launch_cfg((rows as u32, 1), 256, 0)
}

/// The tensor-core GEMV's scratch (`Gpu::gemv_partial`, `Gpu::gemv_counters`): 32 MiB of
/// per-slice sums (XS 2.1's lm_head in two slices of 16 rows takes 12.8 MB) and a counter per
/// 16-output tile of up to a million outputs.
pub(crate) const MMA_PARTIAL_FLOATS: usize = 8 << 20;
pub(crate) const MMA_COUNTERS: usize = 1 << 16;

pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub name: String,
    /// Streaming multiprocessors: persistent kernels launch a whole number of blocks per SM.
    pub sm_count: u32,
    arch: &'static str,
    include: PathBuf,
    modules: Mutex<HashMap<&'static str, Loaded>>,
    pdl_on: std::sync::atomic::AtomicBool,
    /// Compute capability 9.0 or newer and not turned off by `FASTDECODE_PDL=0` (knobs.rs).
    pdl_capable: bool,
    /// The cuBLAS handle of the prefill GEMMs (`prefill.rs`), created on first use.
    pub(crate) blas: Mutex<Option<cudarc::cublas::CudaBlas>>,
    /// The expert GEMVs of `Gpu::moe_gate_up` and `Gpu::moe_down` (`FASTDECODE_MOE`).
    pub moe_kernel: crate::knobs::MoeKernel,
    /// The bf16 GEMVs on the tensor cores (`gemv_mma_R`) rather than the f32 cores
    /// (`FASTDECODE_DENSE`; tests switch it).
    pub dense_mma: std::sync::atomic::AtomicBool,
    /// The tensor-core GEMV's per-slice sums (`slices × rows × out` floats) and its counters per
    /// 16-output tile, which the last arriving slice resets to zero: allocated once, so that
    /// captured graphs keep their addresses. One stream runs every launch, and a launch touches
    /// them only after its wait for its predecessor, so launches never share them.
    pub(crate) gemv_partial: cudarc::driver::CudaSlice<f32>,
    pub(crate) gemv_counters: cudarc::driver::CudaSlice<u32>,
}

pub fn arch_for(major: i32, minor: i32) -> Result<&'static str> {
    // `a` targets unlock the architecture-specific instructions (wgmma, setmaxnreg on sm_90a).
    Ok(match (major, minor) {
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        (8, 7) => "sm_87",
        (8, 9) => "sm_89",
        (9, 0) => "sm_90a",
        (10, 0) => "sm_100a",
        (12, 0) => "sm_120a",
        _ => return Err(CudaError::Arch(major, minor)),
    })
}

impl Gpu {
    /// Opens device `ordinal`, failing with a clear error when there is no driver, device, NVRTC
    /// or header directory.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        // A mistyped knob is the user's to fix first, GPU or not.
        let knobs = crate::knobs::Knobs::from_env()?;
        // cudarc's dynamic loader panics on a missing library; check first.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(CudaError::NoDriver);
        }
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(CudaError::NoNvrtc);
        }
        let include = crate::nvrtc::include_dir()?;
        let ctx = CudaContext::new(ordinal).map_err(|e| CudaError::NoDevice(e.to_string()))?;
        let (major, minor) = ctx.compute_capability()?;
        let arch = arch_for(major, minor)?;
        let name = ctx.name()?;
        let sm_count = ctx.attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )? as u32;
        // One non-default stream for all work: CUDA graphs cannot capture the legacy default
        // stream. With a single stream cudarc's cross-stream event tracking has nothing to order,
        // and its events would break a capture, so it is off.
        // SAFETY: every slice of this context is used on this one stream.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        if ctx.has_async_alloc() {
            // Scratch comes from the stream-ordered pool (cuMemAllocAsync). By default the pool
            // hands its memory back to the driver at every synchronisation, so each prefill would
            // map its scratch anew; keep it instead.
            // SAFETY: the device is this context's; the attribute takes a u64.
            unsafe {
                let pool = cudarc::driver::result::device::get_default_mem_pool(ctx.cu_device())?;
                let mut keep = u64::MAX;
                cudarc::driver::result::mem_pool::set_attribute(
                    pool,
                    cudarc::driver::sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&mut keep as *mut u64).cast(),
                )?;
            }
        }
        let gemv_partial = stream.alloc_zeros::<f32>(MMA_PARTIAL_FLOATS)?;
        let gemv_counters = stream.alloc_zeros::<u32>(MMA_COUNTERS)?;
        Ok(Gpu {
            ctx,
            stream,
            name,
            sm_count,
            arch,
            include,
            modules: Mutex::new(HashMap::new()),
            pdl_on: std::sync::atomic::AtomicBool::new(false),
            pdl_capable: major >= 9 && knobs.pdl,
            blas: Mutex::new(None),
            moe_kernel: knobs.moe,
            dense_mma: std::sync::atomic::AtomicBool::new(knobs.dense_mma),
            gemv_partial,
            gemv_counters,
        })
    }

    pub fn arch(&self) -> &'static str {
        self.arch
    }

    fn compile(&self, name: &str, src: &str) -> Result<Ptx> {
        let cubin = crate::nvrtc::module(name, src, self.arch, &self.include)?;
        Ok(Ptx::from_binary(cubin))
    }

    /// Blocks for a persistent kernel: as many as stay resident at once (all SMs full), or
    /// `needed` if fewer do the work.
    pub(crate) fn persistent_grid(
        &self,
        f: &CudaFunction,
        block: u32,
        shared: usize,
        needed: usize,
    ) -> Result<u32> {
        let per_sm = f
            .occupancy_max_active_blocks_per_multiprocessor(block, shared, None)?
            .max(1);
        Ok((needed.max(1) as u32).min(per_sm * self.sm_count))
    }

    /// The timeline records of every loaded module built with `-DFD_TRACE` (see common.cuh), in
    /// no particular order; the modules' buffers are emptied. Modules built without it have none.
    pub fn trace_take(&self) -> Result<Vec<crate::timeline::TraceRecord>> {
        let mods = self.modules.lock().expect("module cache lock");
        let mut out = vec![];
        for (name, loaded) in mods.iter() {
            let m = &loaded.module;
            let Ok(mut n) = m.get_global("fd_trace_n", &self.stream) else {
                continue;
            };
            let mut nb = [0u8; 4];
            self.stream.memcpy_dtoh(&n, &mut nb)?;
            self.stream.memset_zeros(&mut n)?;
            let mut buf = m.get_global("fd_trace", &self.stream)?;
            let cap = buf.len() / 24;
            let count = (u32::from_le_bytes(nb) as usize).min(cap);
            let mut bytes = vec![0u8; count * 24];
            let mut used = buf.slice_mut(0..count * 24);
            self.stream.memcpy_dtoh(&used, &mut bytes)?;
            // Blocks reserve records in runs; the ones they left unused keep a zero timestamp.
            self.stream.memset_zeros(&mut used)?;
            for r in bytes.chunks_exact(24) {
                let word =
                    |i: usize| u64::from_le_bytes(r[8 * i..8 * i + 8].try_into().expect("8 bytes"));
                let (t, info) = (word(0), word(1));
                if t == 0 {
                    continue;
                }
                out.push(crate::timeline::TraceRecord {
                    module: name.to_string(),
                    ns: t,
                    kind: (info >> 40) as u32,
                    event: ((info >> 32) & 0xff) as u32,
                    block: info as u32,
                    clock: word(2),
                });
            }
        }
        self.stream.synchronize()?;
        Ok(out)
    }

    /// A kernel function, compiling and loading its module on first use. After a function's
    /// first use this is a lookup and two reference-count increments: no allocation, so an
    /// eager launch pays nothing for the name its errors carry.
    pub fn function(&self, module: &'static str, func: &str) -> Result<Kernel> {
        let mut mods = self.modules.lock().expect("module cache lock");
        let loaded = match mods.entry(module) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let src = crate::nvrtc::MODULES
                    .iter()
                    .find(|(n, _)| *n == module)
                    .map(|(_, s)| *s)
                    .ok_or_else(|| CudaError::Shape(format!("no kernel module {module}")))?;
                e.insert(Loaded {
                    module: self.ctx.load_module(self.compile(module, src)?)?,
                    functions: HashMap::new(),
                })
            }
        };
        if let Some(k) = loaded.functions.get(func) {
            return Ok(k.clone());
        }
        let k = Kernel {
            f: loaded.module.load_function(func)?,
            module,
            func: func.into(),
        };
        loaded.functions.insert(func.to_string(), k.clone());
        Ok(k)
    }
}

/// A loaded module and the functions loaded from it so far.
struct Loaded {
    module: Arc<CudaModule>,
    functions: HashMap<String, Kernel>,
}

/// A loaded kernel function and its name (`module::function`), which a failed launch names.
/// Cloning it counts references; the name is formatted only for an error.
#[derive(Clone)]
pub struct Kernel {
    f: CudaFunction,
    module: &'static str,
    func: Arc<str>,
}

/// The shared memory a block may hold, static and dynamic together, while its kernel's
/// max-dynamic-shared-memory attribute is the default.
const DEFAULT_SHARED_BYTES: usize = 48 * 1024;

impl Kernel {
    /// `module::function`.
    pub fn name(&self) -> String {
        format!("{}::{}", self.module, self.func)
    }

    /// Makes a launch with `dynamic` bytes of dynamic shared memory possible: when those and the
    /// kernel's static shared memory exceed the 48 KiB a block may hold by default, raises the
    /// kernel's max-dynamic-shared-memory attribute to `cap` (at least `dynamic`); otherwise
    /// leaves the attribute as it is. Give every launch of a kernel the same `cap`, never the
    /// launch's own size: the attribute is the function's, and a graph captured with a larger
    /// launch would fail to replay once a smaller launch had lowered it.
    pub(crate) fn fit_shared(&self, dynamic: usize, cap: usize) -> Result<()> {
        if dynamic == 0 {
            return Ok(());
        }
        let fixed = self.f.shared_size_bytes()? as usize;
        if dynamic + fixed <= DEFAULT_SHARED_BYTES {
            return Ok(());
        }
        crate::error::check(dynamic <= cap && cap <= i32::MAX as usize, || {
            format!(
                "kernel {}: {dynamic} bytes of dynamic shared memory over its cap of {cap}",
                self.name()
            )
        })?;
        self.f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            cap as i32,
        )?;
        Ok(())
    }
}

impl std::ops::Deref for Kernel {
    type Target = CudaFunction;
    fn deref(&self) -> &CudaFunction {
        &self.f
    }
}

/// A kernel launch on the GPU's stream, the one way every kernel is launched: a refused launch
/// is an error that names the kernel and its configuration.
///
/// Made by [`Gpu::launch`], it may overlap its predecessor's tail: a programmatic dependent
/// launch (Hopper and later), captured into CUDA graphs as a programmatic edge. The kernel is
/// started while the previous one still runs, so its launch latency and the loads that do not
/// depend on the previous kernel (weights, older KV-cache rows) overlap it. Every kernel launched
/// this way calls `pdl_wait()` (common.cuh) before it reads anything an earlier kernel of the
/// stream wrote or writes anything one reads; before that it only loads constant data. Made by
/// [`Gpu::launch_ordered`], it never is: the kernel starts after its predecessor has finished.
pub(crate) struct Launch<'a> {
    gpu: &'a Gpu,
    f: &'a Kernel,
    /// Whether the launch is programmatic when the GPU's launches are (`Gpu::pdl`).
    programmatic: bool,
    args: Vec<*mut std::ffi::c_void>,
    /// Device pointers of slice arguments, boxed so their addresses stay put until the launch
    /// (a plain Vec would move them when it grows).
    #[allow(clippy::vec_box)]
    ptrs: Vec<Box<u64>>,
}

impl Gpu {
    /// A launch builder for `f` on this GPU's stream, programmatic while the GPU's launches are
    /// (see [`Launch`]).
    pub(crate) fn launch<'a>(&'a self, f: &'a Kernel) -> Launch<'a> {
        Launch {
            gpu: self,
            f,
            programmatic: true,
            args: Vec::with_capacity(24),
            ptrs: Vec::with_capacity(16),
        }
    }

    /// A launch builder for `f` on this GPU's stream that is never programmatic: for kernels
    /// that do not call `pdl_wait()` (the prefill path, the weight generator).
    pub(crate) fn launch_ordered<'a>(&'a self, f: &'a Kernel) -> Launch<'a> {
        Launch {
            programmatic: false,
            ..self.launch(f)
        }
    }

    /// Whether launches are programmatic: only inside a decode step (`CudaTarget` turns it on),
    /// whose kernels are all ours and all wait properly; the prefill path interleaves cuBLAS and
    /// other kernels, and ran wrong with it. Needs compute capability 9.0; `FASTDECODE_PDL=0`
    /// turns it off (to measure what it buys).
    fn pdl(&self) -> bool {
        self.pdl_capable && self.pdl_on.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Turns programmatic dependent launches on or off for the launches that follow.
    pub(crate) fn set_pdl(&self, on: bool) {
        self.pdl_on.store(on, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Launch<'_> {
    fn push_ptr(&mut self, p: u64) -> &mut Self {
        let b = Box::new(p);
        self.args.push(&*b as *const u64 as *mut std::ffi::c_void);
        self.ptrs.push(b);
        self
    }

    /// Launches the kernel with the arguments pushed so far; a refused launch is an error that
    /// names the kernel and its configuration.
    ///
    /// # Safety
    /// The arguments must match the kernel's parameters in number, order and type, and the
    /// kernel must stay within the buffers it is given.
    pub(crate) unsafe fn launch(&mut self, cfg: cudarc::driver::LaunchConfig) -> Result<()> {
        use cudarc::driver::sys;
        let named = |source| CudaError::Launch {
            kernel: self.f.name(),
            grid: cfg.grid_dim,
            block: cfg.block_dim,
            shared: cfg.shared_mem_bytes,
            source,
        };
        self.gpu.ctx.bind_to_thread().map_err(named)?;
        // SAFETY: an all-zero attribute value is valid; the field set below is the one the id names.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.gpu.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: (self.programmatic && self.gpu.pdl()) as u32,
        };
        // SAFETY: the caller vouches for the arguments; the pointers in `args` live in `self`
        // (boxed device pointers) or in the caller's borrowed scalars, both outliving the call.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                self.f.cu_function(),
                self.args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
            .result()
            .map_err(named)
        }
    }
}

macro_rules! scalar_args {
    ($($t:ty),*) => {$(
        // SAFETY: a plain value passed by address, read by the driver at launch.
        unsafe impl<'a, 'b: 'a> cudarc::driver::PushKernelArg<&'b $t> for Launch<'a> {
            fn arg(&mut self, arg: &'b $t) -> &mut Self {
                self.args.push(arg as *const $t as *mut std::ffi::c_void);
                self
            }
        }
    )*};
}
scalar_args!(i32, u32, f32, u64, i64);

// SAFETY (all four): the device pointer is copied into `ptrs` and passed by address.
unsafe impl<'a, 'b: 'a, T> cudarc::driver::PushKernelArg<&'b cudarc::driver::CudaSlice<T>>
    for Launch<'a>
{
    fn arg(&mut self, arg: &'b cudarc::driver::CudaSlice<T>) -> &mut Self {
        use cudarc::driver::DevicePtr;
        let (p, _sync) = arg.device_ptr(&self.gpu.stream);
        self.push_ptr(p)
    }
}

unsafe impl<'a, 'b: 'a, T> cudarc::driver::PushKernelArg<&'b mut cudarc::driver::CudaSlice<T>>
    for Launch<'a>
{
    fn arg(&mut self, arg: &'b mut cudarc::driver::CudaSlice<T>) -> &mut Self {
        use cudarc::driver::DevicePtrMut;
        let (p, _sync) = arg.device_ptr_mut(&self.gpu.stream);
        self.push_ptr(p)
    }
}

unsafe impl<'a, 'b: 'a, 'c: 'b, T>
    cudarc::driver::PushKernelArg<&'b cudarc::driver::CudaView<'c, T>> for Launch<'a>
{
    fn arg(&mut self, arg: &'b cudarc::driver::CudaView<'c, T>) -> &mut Self {
        use cudarc::driver::DevicePtr;
        let (p, _sync) = arg.device_ptr(&self.gpu.stream);
        self.push_ptr(p)
    }
}

unsafe impl<'a, 'b: 'a, 'c: 'b, T>
    cudarc::driver::PushKernelArg<&'b mut cudarc::driver::CudaViewMut<'c, T>> for Launch<'a>
{
    fn arg(&mut self, arg: &'b mut cudarc::driver::CudaViewMut<'c, T>) -> &mut Self {
        use cudarc::driver::DevicePtrMut;
        let (p, _sync) = arg.device_ptr_mut(&self.gpu.stream);
        self.push_ptr(p)
    }
}

#[cfg(test)]
mod tests {
    use crate::nvrtc::MODULES;

    const COMMON: &str = include_str!("../kernels/common.cuh");

    /// The integer a kernel source `#define`s `name` as (`#define NAME 32  // ...`).
    fn define(src: &str, name: &str) -> usize {
        src.lines()
            .filter_map(|l| l.trim().strip_prefix("#define "))
            .find_map(|l| {
                let mut t = l.split_whitespace();
                (t.next() == Some(name)).then(|| t.next().and_then(|v| v.parse().ok()))
            })
            .flatten()
            .unwrap_or_else(|| panic!("no integer #define {name}"))
    }

    fn module(name: &str) -> &'static str {
        MODULES.iter().find(|(n, _)| *n == name).unwrap().1
    }

    /// The launchers size grids and shared memory with constants the kernels also define: the
    /// two copies must agree, or a launch is wrongly sized with no error (no GPU needed to see it).
    #[test]
    fn host_constants_match_the_kernels_defines() {
        use crate::{dense, ops, prefill};
        let att = module("attention");
        assert_eq!(define(att, "ATT_SPLITS"), ops::ATT_SPLITS);
        assert_eq!(define(att, "ATT_TILE"), ops::ATT_TILE);
        assert_eq!(define(att, "ATT_WARPS"), ops::ATT_WARPS);
        let moe = module("moe");
        assert_eq!(define(moe, "MOE_OB"), ops::MOE_OB);
        assert_eq!(define(moe, "DOWN_OB"), ops::DOWN_OB);
        assert_eq!(define(COMMON, "GEMV_KB"), dense::GEMV_KB);
        let pf = module("prefill");
        // PF_TOK is (PF_NT * 8) and PF_MROWS (PF_MW * 32) there.
        assert_eq!(define(pf, "PF_NT") * 8, prefill::MOE_TILE);
        assert_eq!(define(pf, "PF_MW") * 32, prefill::MOE_ROWS);
        assert_eq!(define(pf, "PF_ASTAGES"), prefill::ATTEND_STAGES);
    }
}
