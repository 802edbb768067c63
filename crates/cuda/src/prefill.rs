//! Launch wrappers of `kernels/prefill.cu`: tensor-core kernels for the prefill of many rows at
//! once (dense GEMM through cuBLAS, the NVFP4 mixture of experts, flash-style attention). Shapes
//! are checked here, before any launch. Every result is bit-identical run to run.

use cudarc::cublas::{result as blas, sys as blas_sys, CudaBlas};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr};
use half::bf16;

use crate::dense::{Accumulate, MatShape, Norm, RowShape};
use crate::device::{launch_cfg, row_blocks, Gpu};
use crate::error::{check, CudaError, Result};
use crate::ops::{AttnShape, DevNvfp4, MoeLayer, MoeShape, MoeWeights, Routing};
use crate::params::{kernel_params, Order};

/// Tokens per MoE work tile (`PF_TOK` in the kernels).
pub(crate) const MOE_TILE: usize = 32;
/// Weight rows per MoE GEMM block (`PF_MROWS`).
pub(crate) const MOE_ROWS: usize = 256;
/// Dynamic shared memory of the MoE GEMM blocks (`PF_MOE_SMEM`: 3 stages of 256 weight rows
/// of 128 NVFP4 columns with their scales, and 32 tokens of 128 split columns, padded).
const MOE_SMEM: u32 = 3 * (256 * 64 + 256 * 8 + 32 * 576);
/// Experts the MoE tile kernel can scan (one thread each).
pub const MOE_MAX_EXPERTS: usize = 1024;
/// Pipeline stages of the attention kernels (`PF_ASTAGES`).
pub(crate) const ATTEND_STAGES: usize = 3;

fn nvfp4_is(w: &DevNvfp4, rows: usize, cols: usize) -> bool {
    w.codes.len() == rows * cols / 8 && w.scales.len() == rows * cols / 16
}

/// Scratch the kernels write in full before reading it.
fn scratch<T: DeviceRepr>(gpu: &Gpu, n: usize) -> Result<CudaSlice<T>> {
    // SAFETY: every element a kernel reads was written by an earlier kernel on this stream
    // (each use says which).
    Ok(unsafe { gpu.stream.alloc::<T>(n.max(1)) }?)
}

fn is_aligned<T>(v: &CudaView<T>, gpu: &Gpu, bytes: u64) -> bool {
    let (p, _sync) = v.device_ptr(&gpu.stream);
    p % bytes == 0
}

/// What `rms_norm_split` makes: the plain hi/lo split `[2, rows, n]` (bf16) and, when asked, the
/// grouped expert GEMMs' layout of it (`rows · n / 4` uint4 as u32).
pub struct NormSplit {
    pub xs: CudaSlice<bf16>,
    pub perm: Option<CudaSlice<u32>>,
}

kernel_params! {
    /// prefill.cu's `pf_split_rows`: `xs = [hi; lo]` of `n` floats.
    struct SplitRows<'a>("prefill", "pf_split_rows") {
        x: &'a CudaView<'a, f32>,
        xs: &'a mut CudaSlice<bf16>,
        n: i64,
    }

    /// prefill.cu's `pf_rms_norm_split`: `out` and `perm` None pass null.
    struct RmsNormSplit<'a>("prefill", "pf_rms_norm_split") {
        x: &'a CudaView<'a, f32>,
        w: &'a CudaView<'a, bf16>,
        out: Option<CudaViewMut<'a, f32>>,
        xs: &'a mut CudaSlice<bf16>,
        perm: Option<&'a mut CudaSlice<u32>>,
        n: i32,
        rows: i32,
        eps: f32,
    }

    /// prefill.cu's `pf_split_perm`: `n` rows of `K`.
    struct SplitPerm<'a>("prefill", "pf_split_perm") {
        x: &'a CudaView<'a, f32>,
        xs: &'a mut CudaSlice<u32>,
        n: i32,
        K: i32,
    }

    /// prefill.cu's `pf_moe_place`: the (row, slot) pairs grouped by expert.
    struct MoePlace<'a>("prefill", "pf_moe_place") {
        gids: &'a CudaView<'a, i32>,
        rows: i32,
        k: i32,
        E: i32,
        order: &'a mut CudaSlice<i32>,
        pos: &'a mut CudaSlice<i32>,
        cnt: &'a mut CudaSlice<i32>,
    }

    /// prefill.cu's `pf_moe_tiles`: the experts' tiles of rows.
    struct MoeTiles<'a>("prefill", "pf_moe_tiles") {
        cnt: &'a CudaSlice<i32>,
        rows: i32,
        E: i32,
        tiles: &'a mut CudaSlice<i32>,
        max_tiles: i32,
    }

    /// prefill.cu's `pf_moe_gate_up`: the grouped gate/up GEMMs.
    struct MoeGateUp<'a>("prefill", "pf_moe_gate_up") {
        gc: &'a CudaSlice<u32>,
        gs: &'a CudaSlice<u8>,
        uc: &'a CudaSlice<u32>,
        us: &'a CudaSlice<u8>,
        sgc: &'a CudaSlice<u32>,
        sgs: &'a CudaSlice<u8>,
        suc: &'a CudaSlice<u32>,
        sus: &'a CudaSlice<u8>,
        xs: &'a CudaView<'a, u32>,
        order: &'a CudaSlice<i32>,
        tiles: &'a CudaSlice<i32>,
        h: &'a mut CudaSlice<bf16>,
        hs: &'a mut CudaSlice<bf16>,
        E: i32,
        H: i32,
        I: i32,
        Is: i32,
        k: i32,
    }

    /// prefill.cu's `pf_moe_down`: the grouped down GEMMs.
    struct MoeDown<'a>("prefill", "pf_moe_down") {
        dc: &'a CudaSlice<u32>,
        ds: &'a CudaSlice<u8>,
        sdc: &'a CudaSlice<u32>,
        sds: &'a CudaSlice<u8>,
        h: &'a CudaSlice<bf16>,
        hs: &'a CudaSlice<bf16>,
        tiles: &'a CudaSlice<i32>,
        y: &'a mut CudaSlice<f32>,
        E: i32,
        H: i32,
        I: i32,
        Is: i32,
        pairs: i32,
    }

    /// prefill.cu's `pf_moe_combine`: the routed slots weighted, the shared expert, the residual.
    struct MoeCombine<'a>("prefill", "pf_moe_combine") {
        y: &'a CudaSlice<f32>,
        pos: &'a CudaSlice<i32>,
        wts: &'a CudaView<'a, f32>,
        x: CudaViewMut<'a, f32>,
        H: i32,
        k: i32,
        rows: i32,
        scaling: f32,
    }

    /// prefill.cu's `pf_attn_split`: a run of cache slots as bf16 hi/lo rows.
    struct AttnSplit<'a>("prefill", "pf_attn_split") {
        ck: &'a CudaView<'a, f32>,
        cv: &'a CudaView<'a, f32>,
        kx: &'a mut CudaSlice<bf16>,
        vx: &'a mut CudaSlice<bf16>,
        off: i64,
        n: i64,
        D: i32,
    }

    /// prefill.cu's `pf_attend_d32|64|128` (`PF_ATTEND`): `out` or `xs` a device pointer, the
    /// other null (`AttnDest::pointers`).
    struct Attend<'a>("prefill", "pf_attend_d##DIM") {
        q: &'a CudaView<'a, f32>,
        kx: &'a CudaSlice<bf16>,
        vx: &'a CudaSlice<bf16>,
        gl: &'a CudaView<'a, f32>,
        gstride: i32,
        pos: &'a CudaView<'a, i32>,
        out: u64,
        xs: u64,
        rows: i32,
        heads: i32,
        kv_heads: i32,
        window: i32,
        ring: i32,
        slots: i32,
        gb: i32,
        rb: i32,
    }
}

/// The grouped expert GEMMs' placement of (row, slot) pairs (`Gpu::moe_place`).
struct Placed {
    order: CudaSlice<i32>,
    pos: CudaSlice<i32>,
    /// int4 tiles: `4 · max_tiles` ints.
    tiles: CudaSlice<i32>,
    max_tiles: usize,
}

/// Whether `rms_norm_split` also writes its split in the grouped expert GEMMs' layout (`perm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupedSplit {
    Skip,
    Make,
}

/// The inputs of `attend_prefill`: `q [rows, heads, d]` (normed and roped), the caches
/// `ck`, `cv` (`[slots, kv_heads, d]`), the gate logits of row r at `g[r · g_stride ..][..heads]`,
/// `pos [rows]`, and `keys`, the key positions the rows see.
pub struct PrefillAttn<'a> {
    pub q: &'a CudaView<'a, f32>,
    pub ck: &'a CudaView<'a, f32>,
    pub cv: &'a CudaView<'a, f32>,
    pub g: &'a CudaView<'a, f32>,
    pub g_stride: usize,
    pub pos: &'a CudaView<'a, i32>,
    pub shape: AttnShape,
    pub rows: usize,
    pub keys: std::ops::Range<usize>,
}

/// Where `attend_prefill_to` writes its output.
enum AttnDest<'a, 'b> {
    /// f32 rows `[rows, heads, d]`.
    Rows(&'a mut CudaViewMut<'b, f32>),
    /// The hi/lo bf16 split `[2, rows, heads · d]`.
    Split(&'a mut CudaSlice<bf16>),
}

impl AttnDest<'_, '_> {
    /// Elements of one half: f32 rows, or half the split.
    fn len(&self) -> usize {
        match self {
            AttnDest::Rows(o) => o.len(),
            AttnDest::Split(x) => x.len() / 2,
        }
    }

    fn aligned(&self, gpu: &Gpu) -> bool {
        match self {
            AttnDest::Rows(o) => is_aligned(&o.as_view(), gpu, 8),
            AttnDest::Split(x) => is_aligned(&x.as_view(), gpu, 4),
        }
    }

    /// (out, xs) kernel arguments: the unused one is null.
    fn pointers<'s>(&'s mut self, gpu: &'s Gpu) -> (u64, u64, cudarc::driver::SyncOnDrop<'s>) {
        match self {
            AttnDest::Rows(o) => {
                let (p, s) = o.device_ptr_mut(&gpu.stream);
                (p, 0, s)
            }
            AttnDest::Split(x) => {
                let (p, s) = x.device_ptr_mut(&gpu.stream);
                (0, p, s)
            }
        }
    }
}

impl Gpu {
    /// This GPU's cuBLAS handle (bound to its stream), created on first use.
    fn with_blas<R>(&self, f: impl FnOnce(&CudaBlas) -> Result<R>) -> Result<R> {
        let mut slot = self.blas.lock().expect("cuBLAS handle lock");
        if slot.is_none() {
            // cudarc's dynamic loader panics on a missing library; check first.
            if !unsafe { blas_sys::is_culib_present() } {
                return Err(CudaError::Blas(
                    "libcublas.so could not be loaded: install the CUDA toolkit's cuBLAS or put it on LD_LIBRARY_PATH".into(),
                ));
            }
            let handle = CudaBlas::new(self.stream.clone())
                .map_err(|e| CudaError::Blas(format!("creating a handle: {e:?}")))?;
            *slot = Some(handle);
        }
        f(slot.as_ref().expect("created above"))
    }

    /// `y[r] (+)= x[r] · Wᵀ` for `rows` rows on the tensor cores (the semantics of `gemv_bf16`):
    /// `w` bf16 `[out, inp]`, `x` f32 `[rows, inp]`, `y` f32 `[rows, out]`. Each activation is
    /// split into bf16 hi + lo (`hi = bf16(x)`, `lo = bf16(x - hi)`) and `y = hi·Wᵀ + lo·Wᵀ` runs as
    /// two cuBLAS bf16 GEMMs with f32 accumulation (the second adds onto the first), so the result
    /// is accurate to about f32 and, cuBLAS being deterministic on a given GPU and library, the
    /// same bits every run. Any sizes; scratch of `4 · rows · inp` bytes is taken from the stream.
    pub fn gemm_bf16_tc(
        &self,
        w: &CudaView<bf16>,
        x: &CudaView<f32>,
        y: &mut CudaViewMut<f32>,
        shape: MatShape,
        accumulate: Accumulate,
    ) -> Result<()> {
        let MatShape { inp, rows, .. } = shape;
        check(x.len() >= rows * inp, || {
            format!("gemm_bf16_tc: activations too small for {rows} rows of {inp}")
        })?;
        let n = rows * inp;
        // xs = [hi; lo], each [rows, inp]; pf_split_rows writes all 2n elements.
        let mut xs = scratch::<bf16>(self, 2 * n)?;
        if n > 0 {
            let params = SplitRows {
                x,
                xs: &mut xs,
                n: n as i64,
            };
            let cfg = launch_cfg((n.div_ceil(256) as u32, 1), 256, 0);
            // SAFETY: argument types match the kernel; x holds n elements, xs 2n.
            unsafe { self.run(Order::AfterPredecessor, params, cfg) }?;
        }
        self.gemm_bf16_tc_split(w, &xs.as_view(), y, shape, accumulate)
    }

    /// `xs = [hi; lo]` of `RMSNorm(x; norm)` for `rows` rows of width `n` (the input
    /// `gemm_bf16_tc_split` takes), the normalised rows themselves into `out` when given, and
    /// with `GroupedSplit::Make` the same split in the grouped expert GEMMs' layout (`perm`,
    /// `moe_prefill_split`'s input; `n % 128 == 0`): one pass instead of a norm and a split or
    /// two. Scratch of `4 · rows · n` bytes (and as much again for `perm`) from the stream.
    pub fn rms_norm_split(
        &self,
        x: &CudaView<f32>,
        norm: Norm,
        out: Option<&mut CudaViewMut<f32>>,
        grouped: GroupedSplit,
        shape: RowShape,
    ) -> Result<NormSplit> {
        let (Norm { w, eps }, RowShape { rows, n }) = (norm, shape);
        let perm = grouped == GroupedSplit::Make;
        check(
            x.len() >= rows * n
                && w.len() == n
                && n.is_multiple_of(4)
                && (!perm || n.is_multiple_of(128))
                && out.as_ref().is_none_or(|o| o.len() >= rows * n)
                && n <= i32::MAX as usize
                && rows <= i32::MAX as usize,
            || format!("rms_norm_split: bad shapes for {rows}×{n}"),
        )?;
        check(
            is_aligned(x, self, 16)
                && is_aligned(w, self, 8)
                && out
                    .as_ref()
                    .is_none_or(|o| is_aligned(&o.as_view(), self, 16)),
            || "rms_norm_split: x and out must be 16-byte, w 8-byte aligned".into(),
        )?;
        // Written in full by pf_rms_norm_split.
        let mut split = NormSplit {
            xs: scratch::<bf16>(self, 2 * rows * n)?,
            perm: if perm {
                Some(scratch::<u32>(self, rows * n)?)
            } else {
                None
            },
        };
        if rows == 0 {
            return Ok(split);
        }
        let params = RmsNormSplit {
            x,
            w,
            out: out.map(|o| o.slice_mut(..)),
            xs: &mut split.xs,
            perm: split.perm.as_mut(),
            n: n as i32,
            rows: rows as i32,
            eps,
        };
        // SAFETY: argument types match the kernel (out and perm are pointers or null); shapes
        // checked above.
        unsafe { self.run(Order::AfterPredecessor, params, row_blocks(rows)) }?;
        Ok(split)
    }

    /// `y[r] (+)= x[r] · Wᵀ` from the split activations `xs = [hi; lo]` (`2 · rows · inp` bf16,
    /// as `gemm_bf16_tc` or `rms_norm_split` make them): two cuBLAS bf16 GEMMs with f32
    /// accumulation, the second adding onto the first.
    pub fn gemm_bf16_tc_split(
        &self,
        w: &CudaView<bf16>,
        xs: &CudaView<bf16>,
        y: &mut CudaViewMut<f32>,
        shape: MatShape,
        accumulate: Accumulate,
    ) -> Result<()> {
        let MatShape { out, inp, rows } = shape;
        check(w.len() == out * inp, || {
            format!(
                "gemm_bf16_tc: weight has {} elements, expected {out}×{inp}",
                w.len()
            )
        })?;
        check(xs.len() >= 2 * rows * inp && y.len() >= rows * out, || {
            format!("gemm_bf16_tc: activations too small for {rows} rows of {inp} -> {out}")
        })?;
        check(
            out <= i32::MAX as usize && inp <= i32::MAX as usize && rows <= i32::MAX as usize,
            || format!("gemm_bf16_tc: {rows}×{inp}×{out} exceeds cuBLAS's int sizes"),
        )?;
        if rows == 0 || out == 0 {
            return Ok(());
        }
        let n = rows * inp;
        self.with_blas(|b| {
            let (wp, _s0) = w.device_ptr(&self.stream);
            let (xp, _s1) = xs.device_ptr(&self.stream);
            let (yp, _s2) = y.device_ptr_mut(&self.stream);
            let one = 1f32;
            let beta0 = if accumulate == Accumulate::Add {
                1f32
            } else {
                0f32
            };
            for (half, beta) in [(0usize, beta0), (1, 1f32)] {
                // Column-major view: C[out, rows] = op(A)[out, inp] · B[inp, rows] with A = W
                // (row-major [out, inp] is column-major [inp, out], transposed) and B = xs half.
                // SAFETY: pointers are live device allocations of the sizes checked above;
                // alpha/beta are host scalars (the handle's default pointer mode).
                unsafe {
                    blas::gemm_ex(
                        *b.handle(),
                        blas_sys::cublasOperation_t::CUBLAS_OP_T,
                        blas_sys::cublasOperation_t::CUBLAS_OP_N,
                        out as i32,
                        rows as i32,
                        inp as i32,
                        (&one) as *const f32 as *const _,
                        wp as *const _,
                        blas_sys::cudaDataType::CUDA_R_16BF,
                        inp as i32,
                        (xp + (half * n * 2) as u64) as *const _,
                        blas_sys::cudaDataType::CUDA_R_16BF,
                        inp as i32,
                        (&beta) as *const f32 as *const _,
                        yp as *mut _,
                        blas_sys::cudaDataType::CUDA_R_32F,
                        out as i32,
                        blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                        blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )
                }
                .map_err(|e| CudaError::Blas(format!("gemm_ex: {e:?}")))?;
            }
            Ok(())
        })
    }

    /// The whole MoE layer for `rows` tokens on the tensor cores:
    /// `x[r] += scaling · Σ_s wts[r,s] · D_e(silu(G_e xn_r) · U_e xn_r) + D_sh(silu(G_sh xn_r) · U_sh xn_r)`
    /// with `e = ids[r, s]` (the output of `router_topk`: `[rows, k]`, ascending experts): the
    /// activations split into the grouped GEMMs' layout (`split_perm`), then
    /// `moe_prefill_split`. Needs 16-byte aligned `xn`.
    pub fn moe_prefill(
        &self,
        layer: &MoeLayer,
        xn: &CudaView<f32>,
        routing: Routing,
        rows: usize,
        x: &mut CudaViewMut<f32>,
    ) -> Result<()> {
        let xs = self.split_perm(xn, layer.shape.hidden, rows)?;
        self.moe_prefill_split(layer, &xs.as_view(), routing, rows, x)
    }

    /// f32 rows `xn [rows, n]` (`n % 128 == 0`, 16-byte aligned) as hi/lo in the grouped expert
    /// GEMMs' layout (`rows · n` u32): `moe_prefill_split`'s input. Scratch from the stream.
    pub fn split_perm(&self, xn: &CudaView<f32>, n: usize, rows: usize) -> Result<CudaSlice<u32>> {
        check(
            xn.len() >= rows * n && n.is_multiple_of(128) && rows * n / 4 <= i32::MAX as usize,
            || format!("split_perm: xn too small for {rows} rows of {n} (a multiple of 128)"),
        )?;
        check(is_aligned(xn, self, 16), || {
            "split_perm: xn is not 16-byte aligned".into()
        })?;
        // Written in full by pf_split_perm.
        let mut xs = scratch::<u32>(self, rows * n)?;
        if rows > 0 {
            let params = SplitPerm {
                x: xn,
                xs: &mut xs,
                n: rows as i32,
                K: n as i32,
            };
            let cfg = launch_cfg(((rows * n / 4).div_ceil(256) as u32, 1), 256, 0);
            // SAFETY: argument types match the kernel; xn holds rows·n floats, xs as many u32.
            unsafe { self.run(Order::AfterPredecessor, params, cfg) }?;
        }
        Ok(xs)
    }

    /// `moe_prefill` from activations already in the grouped GEMMs' split layout (`rows · hidden`
    /// u32, as `pf_split_perm` or `rms_norm_split`'s `perm` output make them; 16-byte aligned).
    ///
    /// The (row, slot) pairs are grouped by expert on the GPU (a warp per expert, then a scan
    /// into work tiles), each expert's tokens run as tiles of up to 32 through grouped GEMMs
    /// that stream NVFP4 weights and the tile's activations through a 3-stage cp.async
    /// pipeline in shared memory and dequantise in registers (each expert's weights are read
    /// once per 32 tokens), and the combine adds the slots in
    /// ascending expert order: no float atomics, the same bits every run. Needs `hidden`,
    /// `inter` and `shared_inter` multiples of 128 and `experts <= 1024`.
    /// Scratch of about `rows · (4·hidden + (k + 1)·(4·hidden + 4·inter))` bytes comes from the stream.
    pub fn moe_prefill_split(
        &self,
        layer: &MoeLayer,
        xs: &CudaView<u32>,
        routing: Routing,
        rows: usize,
        x: &mut CudaViewMut<f32>,
    ) -> Result<()> {
        let (w, shape, scaling) = (&layer.w, layer.shape, layer.scaling);
        let Routing { ids, wts } = routing;
        let MoeShape {
            experts: e,
            top_k: k,
            hidden: hd,
            inter: it,
            shared_inter: is,
        } = shape;
        check(
            hd % 128 == 0 && it % 128 == 0 && is % 128 == 0 && hd > 0 && it > 0 && is > 0,
            || {
                format!(
                "moe_prefill: hidden {hd}, inter {it} and shared_inter {is} must be positive multiples of 128"
            )
            },
        )?;
        check(e > 0 && e <= MOE_MAX_EXPERTS && k > 0 && k <= e, || {
            format!("moe_prefill: top-{k} of {e} experts (1..={MOE_MAX_EXPERTS} experts)")
        })?;
        check(
            nvfp4_is(w.gate, e * it, hd)
                && nvfp4_is(w.up, e * it, hd)
                && nvfp4_is(w.down, e * hd, it)
                && nvfp4_is(w.shared_gate, is, hd)
                && nvfp4_is(w.shared_up, is, hd)
                && nvfp4_is(w.shared_down, hd, is),
            || format!("moe_prefill: NVFP4 weights do not match E {e}, H {hd}, I {it}, Is {is}"),
        )?;
        check(
            xs.len() >= rows * hd
                && x.len() >= rows * hd
                && ids.len() >= rows * k
                && wts.len() >= rows * k,
            || format!("moe_prefill: activations or routing too small for {rows} rows"),
        )?;
        check(is_aligned(xs, self, 16), || {
            "moe_prefill: split activations are not 16-byte aligned".into()
        })?;
        check(rows * k <= i32::MAX as usize / hd.max(it), || {
            format!("moe_prefill: {rows} rows overflow the kernels' int indices")
        })?;
        if rows == 0 {
            return Ok(());
        }
        let placed = self.moe_place(ids, shape, rows)?;
        let y = self.moe_expert_gemms(w, shape, xs, &placed, rows)?;
        let combine = MoeCombine {
            y: &y,
            pos: &placed.pos,
            wts,
            x: x.slice_mut(..),
            H: hd as i32,
            k: k as i32,
            rows: rows as i32,
            scaling,
        };
        let cfg = launch_cfg((hd.div_ceil(256) as u32, rows as u32), 256, 0);
        // SAFETY: y holds a row per placed pair and shared row, pos a slot per pair (moe_place),
        // wts and x were checked above.
        unsafe { self.run(Order::AfterPredecessor, combine, cfg) }?;
        Ok(())
    }

    /// The (row, slot) pairs of `ids` grouped by expert (`pf_moe_place`) and the experts' tiles
    /// of rows (`pf_moe_tiles`). Scratch, each fully written before it is read: order (only
    /// where tiles point), pos and the counts by pf_moe_place, tiles by pf_moe_tiles.
    fn moe_place(&self, ids: &CudaView<i32>, shape: MoeShape, rows: usize) -> Result<Placed> {
        let (e, k) = (shape.experts, shape.top_k);
        let pairs = rows * k;
        let max_tiles = rows.div_ceil(MOE_TILE) + pairs.div_ceil(MOE_TILE) + e.min(pairs);
        let mut order = scratch::<i32>(self, pairs)?;
        let mut pos = scratch::<i32>(self, pairs)?;
        let mut tiles = scratch::<i32>(self, 4 * max_tiles)?;
        let mut cnt = scratch::<i32>(self, e)?;
        let place = MoePlace {
            gids: ids,
            rows: rows as i32,
            k: k as i32,
            E: e as i32,
            order: &mut order,
            pos: &mut pos,
            cnt: &mut cnt,
        };
        // SAFETY: ids holds rows · k experts (checked by the caller); order and pos a slot per
        // pair, cnt one per expert.
        unsafe { self.run(Order::AfterPredecessor, place, launch_cfg((1, 1), 256, 0)) }?;
        let tiles_of = MoeTiles {
            cnt: &cnt,
            rows: rows as i32,
            E: e as i32,
            tiles: &mut tiles,
            max_tiles: max_tiles as i32,
        };
        // SAFETY: tiles holds max_tiles int4s, the most the counts can need.
        unsafe {
            self.run(
                Order::AfterPredecessor,
                tiles_of,
                launch_cfg((1, 1), 1024, 0),
            )
        }?;
        Ok(Placed {
            order,
            pos,
            tiles,
            max_tiles,
        })
    }

    /// The grouped gate/up and down GEMMs over `placed`'s tiles: y, a row per placed pair and
    /// per shared row (h and hs by pf_moe_gate_up for every tile row, y by pf_moe_down for every
    /// placed pair and every shared row).
    fn moe_expert_gemms(
        &self,
        w: &MoeWeights,
        shape: MoeShape,
        xs: &CudaView<u32>,
        placed: &Placed,
        rows: usize,
    ) -> Result<CudaSlice<f32>> {
        let (e, k, hd) = (shape.experts, shape.top_k, shape.hidden);
        let (it, is) = (shape.inter, shape.shared_inter);
        let pairs = rows * k;
        let mut h = scratch::<bf16>(self, 2 * pairs * it)?;
        let mut hs = scratch::<bf16>(self, 2 * rows * is)?;
        let mut y = scratch::<f32>(self, (pairs + rows) * hd)?;
        let gate_up = MoeGateUp {
            gc: &w.gate.codes,
            gs: &w.gate.scales,
            uc: &w.up.codes,
            us: &w.up.scales,
            sgc: &w.shared_gate.codes,
            sgs: &w.shared_gate.scales,
            suc: &w.shared_up.codes,
            sus: &w.shared_up.scales,
            xs,
            order: &placed.order,
            tiles: &placed.tiles,
            h: &mut h,
            hs: &mut hs,
            E: e as i32,
            H: hd as i32,
            I: it as i32,
            Is: is as i32,
            k: k as i32,
        };
        let f = self.function("prefill", "pf_moe_gate_up")?;
        f.fit_shared(MOE_SMEM as usize, MOE_SMEM as usize)?;
        let cfg = launch_cfg(
            ((it.max(is) / 128) as u32, placed.max_tiles as u32),
            256,
            MOE_SMEM,
        );
        // SAFETY: the weights match the shape and xs holds the rows (checked by the caller);
        // h, hs, order and tiles are sized above and in moe_place.
        unsafe { self.run_kernel(&f, Order::AfterPredecessor, gate_up, cfg) }?;
        let down = MoeDown {
            dc: &w.down.codes,
            ds: &w.down.scales,
            sdc: &w.shared_down.codes,
            sds: &w.shared_down.scales,
            h: &h,
            hs: &hs,
            tiles: &placed.tiles,
            y: &mut y,
            E: e as i32,
            H: hd as i32,
            I: it as i32,
            Is: is as i32,
            pairs: pairs as i32,
        };
        let f = self.function("prefill", "pf_moe_down")?;
        f.fit_shared(MOE_SMEM as usize, MOE_SMEM as usize)?;
        let cfg = launch_cfg(
            (hd.div_ceil(MOE_ROWS) as u32, placed.max_tiles as u32),
            256,
            MOE_SMEM,
        );
        // SAFETY: as above; y holds (pairs + rows) rows of hd.
        unsafe { self.run_kernel(&f, Order::AfterPredecessor, down, cfg) }?;
        Ok(y)
    }

    /// Gated attention of `rows` query rows over the cache on the tensor cores (the semantics of
    /// `attend`; `a` as `PrefillAttn` describes it), the caches holding every key the rows see
    /// (position p at slot `p % ring`, or `p` when `ring` is 0), into `out [rows, heads, d]`.
    /// Row r sees key positions `max(0, pos - window + 1) ..= pos` (`window` 0: all); `keys`
    /// must hold every position any row sees (only their slots are converted and read).
    /// Flash-style: those cache rows are first split into bf16 hi/lo rows (scratch of
    /// `8 · slots · kv_heads · d` bytes from the stream),
    /// then a block takes up to 8 query heads of one kv group (sharing its keys) × blocks of 16
    /// rows, a warp each, and streams tiles of 32 keys through a 3-stage cp.async pipeline with
    /// an online softmax; q/k/P/v split hi/lo (about f32 accuracy). `d` is 32, 64 or 128; any
    /// row count and key count. A key whose slot lies past the cache reads as zeros instead of
    /// out of bounds.
    pub fn attend_prefill(&self, a: PrefillAttn, out: &mut CudaViewMut<f32>) -> Result<()> {
        self.attend_prefill_to(a, AttnDest::Rows(out))
    }

    /// Gated attention straight into the hi/lo split `[2, rows, heads · d]` that
    /// `gemm_bf16_tc_split` takes (the o_proj input), skipping an f32 round trip and a split
    /// pass; the bits equal a split of `attend_prefill`'s rows. Scratch from the stream.
    pub fn attend_prefill_split(&self, a: PrefillAttn) -> Result<CudaSlice<bf16>> {
        // Every element is written: each row's heads × d outputs, hi and lo.
        let mut xs = scratch::<bf16>(self, 2 * a.rows * a.shape.heads * a.shape.head_dim)?;
        self.attend_prefill_to(a, AttnDest::Split(&mut xs))?;
        Ok(xs)
    }

    /// The launch behind `attend_prefill` and `attend_prefill_split`.
    fn attend_prefill_to(&self, a: PrefillAttn, mut out: AttnDest<'_, '_>) -> Result<()> {
        let PrefillAttn {
            q,
            ck,
            cv,
            g,
            g_stride,
            pos,
            shape,
            rows,
            keys,
        } = a;
        let AttnShape {
            heads,
            kv_heads,
            head_dim: d,
            window,
            ring,
        } = shape;
        let name = match d {
            32 => "pf_attend_d32",
            64 => "pf_attend_d64",
            128 => "pf_attend_d128",
            _ => {
                return Err(CudaError::Shape(format!(
                    "attend_prefill: head_dim {d} (supported: 32, 64, 128)"
                )))
            }
        };
        check(
            kv_heads > 0 && heads > 0 && heads.is_multiple_of(kv_heads),
            || format!("attend_prefill: {heads} heads are not a multiple of {kv_heads} kv heads"),
        )?;
        check(
            q.len() >= rows * heads * d
                && out.len() >= rows * heads * d
                && g_stride >= heads
                && g.len() >= rows.saturating_sub(1) * g_stride + heads
                && pos.len() >= rows,
            || format!("attend_prefill: q/g/pos/out too small for {rows} rows of {heads}×{d}"),
        )?;
        let kvd = kv_heads * d;
        check(ck.len() == cv.len() && ck.len().is_multiple_of(kvd), || {
            format!(
                "attend_prefill: caches of {} and {} floats are not slots × {kv_heads} × {d}",
                ck.len(),
                cv.len()
            )
        })?;
        check(
            is_aligned(q, self, 8)
                && is_aligned(ck, self, 16)
                && is_aligned(cv, self, 16)
                && out.aligned(self),
            || "attend_prefill: q/out must be 8-byte and the caches 16-byte aligned".into(),
        )?;
        let slots = ck.len() / kvd;
        check(
            slots <= i32::MAX as usize && window <= i32::MAX as usize && ring <= i32::MAX as usize,
            || "attend_prefill: cache, window or ring beyond int range".into(),
        )?;
        if rows == 0 {
            return Ok(());
        }
        // kx, vx: the caches as bf16 hi/lo rows; pf_attn_split writes the slots of the keys the
        // rows see (the kernel reads no other), one or two runs of slots (a ring may wrap).
        let n = slots * kvd;
        let mut kx = scratch::<bf16>(self, 2 * n)?;
        let mut vx = scratch::<bf16>(self, 2 * n)?;
        for run in key_slots(&keys, ring, slots) {
            let params = AttnSplit {
                ck,
                cv,
                kx: &mut kx,
                vx: &mut vx,
                off: (run.start * kvd) as i64,
                n: (run.len() * kvd) as i64,
                D: d as i32,
            };
            let cfg = launch_cfg(((run.len() * kvd / 4).div_ceil(256) as u32, 1), 256, 0);
            // SAFETY: argument types match pf_attn_split; the run lies inside the caches (n
            // floats each) and kx, vx (2n bf16 each).
            unsafe { self.run(Order::AfterPredecessor, params, cfg) }?;
        }
        // A block: gb heads of one kv group (the largest divisor of the group <= 8) times rb
        // blocks of 16 rows, a warp each.
        let group = heads / kv_heads;
        let gb = (1..=group.min(8))
            .rev()
            .find(|b| group.is_multiple_of(*b))
            .unwrap_or(1);
        let rb = 8 / gb;
        let smem = (ATTEND_STAGES * 256 * (d + 8)) as u32;
        // One size per kernel (it depends only on d, and each d has its own kernel).
        let f = self.function("prefill", name)?;
        f.fit_shared(smem as usize, smem as usize)?;
        let (out_ptr, xs_ptr, _sync) = out.pointers(self);
        check(g_stride <= i32::MAX as usize, || {
            format!("attend_prefill: gate row stride {g_stride} beyond int range")
        })?;
        let params = Attend {
            q,
            kx: &kx,
            vx: &vx,
            gl: g,
            gstride: g_stride as i32,
            pos,
            out: out_ptr,
            xs: xs_ptr,
            rows: rows as i32,
            heads: heads as i32,
            kv_heads: kv_heads as i32,
            window: window as i32,
            ring: ring as i32,
            slots: slots as i32,
            gb: gb as i32,
            rb: rb as i32,
        };
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (
                kv_heads as u32,
                rows.div_ceil(16 * rb) as u32,
                (group / gb) as u32,
            ),
            block_dim: (32 * (gb * rb) as u32, 1, 1),
            shared_mem_bytes: smem,
        };
        // SAFETY: argument types match pf_attend_d*; sizes checked above.
        unsafe { self.run_kernel(&f, Order::AfterPredecessor, params, cfg) }?;
        Ok(())
    }
}

/// The cache slots holding the key positions `keys` (position p at slot `p % ring`, or `p` when
/// `ring` is 0), as at most two runs, clamped to `slots`.
fn key_slots(
    keys: &std::ops::Range<usize>,
    ring: usize,
    slots: usize,
) -> Vec<std::ops::Range<usize>> {
    let (a, b) = if keys.is_empty() {
        (0, 0)
    } else if ring == 0 {
        (keys.start, keys.end)
    } else if keys.len() >= ring {
        (0, ring)
    } else {
        (keys.start % ring, keys.end % ring)
    };
    // A ring run that wraps is [a, ring) then [0, b).
    let runs = if ring > 0 && a >= b && !keys.is_empty() && keys.len() < ring {
        [a..ring, 0..b]
    } else {
        [a..b, 0..0]
    };
    runs.into_iter()
        .map(|r| r.start.min(slots)..r.end.min(slots))
        .filter(|r| !r.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::params::tests::check;

    #[test]
    fn every_launch_struct_follows_its_kernels_parameters() {
        use super::{
            Attend, AttnSplit, MoeCombine, MoeDown, MoeGateUp, MoePlace, MoeTiles, RmsNormSplit,
            SplitPerm, SplitRows,
        };
        check::<SplitRows>();
        check::<RmsNormSplit>();
        check::<SplitPerm>();
        check::<MoePlace>();
        check::<MoeTiles>();
        check::<MoeGateUp>();
        check::<MoeDown>();
        check::<MoeCombine>();
        check::<AttnSplit>();
        check::<Attend>();
    }

    use super::key_slots;

    #[test]
    fn key_slots_cover_exactly_the_seen_positions() {
        // Full attention: slot = position, clamped to the cache.
        assert_eq!(key_slots(&(3..9), 0, 100), vec![3..9]);
        assert_eq!(key_slots(&(90..120), 0, 100), vec![90..100]);
        assert!(key_slots(&(5..5), 0, 100).is_empty());
        // A ring of 16: no wrap, a wrap into two runs, and a range as long as the ring.
        assert_eq!(key_slots(&(18..30), 16, 16), vec![2..14]);
        assert_eq!(key_slots(&(12..20), 16, 16), vec![12..16, 0..4]);
        assert_eq!(key_slots(&(12..16), 16, 16), vec![12..16]);
        assert_eq!(key_slots(&(7..40), 16, 16), vec![0..16]);
        // Every seen position's slot is in a run, and every run's slot is seen.
        for start in 0..40 {
            for len in 1..20 {
                let keys = start..start + len;
                let runs = key_slots(&keys, 16, 16);
                let mut covered: Vec<usize> = runs.iter().flat_map(|r| r.clone()).collect();
                covered.sort();
                let mut want: Vec<usize> = keys.map(|p| p % 16).collect();
                want.sort();
                want.dedup();
                assert_eq!(covered, want, "{start}+{len}");
            }
        }
    }
}
