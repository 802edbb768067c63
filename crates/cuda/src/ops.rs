//! Launch wrappers of `kernels/attention.cu` and `kernels/moe.cu`. Shapes are checked here,
//! before any launch.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use half::bf16;

use crate::device::{launch_cfg, row_blocks, Gpu};
use crate::error::{CudaError, Result};
use crate::knobs::MoeKernel;
use crate::params::{kernel_params, Order};

kernel_params! {
    /// attention.cu's `qk_norm_rope_store`: the prefill side of the cache.
    struct QkNormRopeStore<'a>("attention", "qk_norm_rope_store") {
        qkvg: &'a CudaView<'a, f32>,
        width: i32,
        q_norm: &'a CudaSlice<bf16>,
        k_norm: &'a CudaSlice<bf16>,
        pos: &'a CudaView<'a, i32>,
        inv_freq: &'a CudaSlice<f32>,
        rot_dim: i32,
        rope_scaling: f32,
        eps: f32,
        heads: i32,
        kv_heads: i32,
        d: i32,
        ring: i32,
        q_out: CudaViewMut<'a, f32>,
        ck: &'a mut CudaSlice<f32>,
        cv: &'a mut CudaSlice<f32>,
    }

    /// moe.cu's `router`: a row's norm, router logits and top-k on blocks of its own.
    struct Router<'a>("moe", "router") {
        x: &'a CudaView<'a, f32>,
        norm: &'a CudaSlice<bf16>,
        eps: f32,
        W: &'a CudaSlice<bf16>,
        bias: &'a CudaSlice<f32>,
        xn: CudaViewMut<'a, f32>,
        logits: CudaViewMut<'a, f32>,
        ids: CudaViewMut<'a, i32>,
        wts: CudaViewMut<'a, f32>,
        counter: &'a mut CudaSlice<u32>,
        E: i32,
        H: i32,
        k: i32,
        norm_topk: i32,
        softcap: f32,
    }

    /// moe.cu's `router_topk`: the prefill's top-k of router logits.
    struct RouterTopk<'a>("moe", "router_topk") {
        logits: &'a CudaView<'a, f32>,
        bias: &'a CudaSlice<f32>,
        ids: CudaViewMut<'a, i32>,
        wts: CudaViewMut<'a, f32>,
        E: i32,
        k: i32,
        norm_topk: i32,
        softcap: f32,
        rows: i32,
    }

    /// moe.cu's `moe_gate_up` and `moe_gate_up_mma2` (`MOE_GATE_UP_MMA_ARGS`): NVFP4 codes
    /// (`gc`, `uc`, shared `sgc`, `suc`) and their scales.
    struct MoeGateUp<'a>("moe", "moe_gate_up") {
        xn: &'a CudaView<'a, f32>,
        ids: &'a CudaView<'a, i32>,
        gc: &'a CudaSlice<u32>,
        gs: &'a CudaSlice<u8>,
        uc: &'a CudaSlice<u32>,
        us: &'a CudaSlice<u8>,
        sgc: &'a CudaSlice<u32>,
        sgs: &'a CudaSlice<u8>,
        suc: &'a CudaSlice<u32>,
        sus: &'a CudaSlice<u8>,
        h: CudaViewMut<'a, f32>,
        H: i32,
        I: i32,
        Is: i32,
        k: i32,
    }

    /// moe.cu's `moe_down` and `moe_down_mma4` (`MOE_DOWN_MMA_ARGS`).
    struct MoeDown<'a>("moe", "moe_down") {
        h: &'a CudaView<'a, f32>,
        ids: &'a CudaView<'a, i32>,
        wts: &'a CudaView<'a, f32>,
        dc: &'a CudaSlice<u32>,
        ds: &'a CudaSlice<u8>,
        sdc: &'a CudaSlice<u32>,
        sds: &'a CudaSlice<u8>,
        x: CudaViewMut<'a, f32>,
        H: i32,
        I: i32,
        Is: i32,
        k: i32,
        scaling: f32,
    }

    /// attention.cu's `attend_decode` and `attend_decode_parts` (`ATTEND_DECODE_ARGS`).
    struct AttendDecode<'a>("attention", "attend_decode") {
        qkvg: &'a CudaView<'a, f32>,
        width: i32,
        q_norm: &'a CudaSlice<bf16>,
        k_norm: &'a CudaSlice<bf16>,
        pos: &'a CudaView<'a, i32>,
        inv_freq: &'a CudaSlice<f32>,
        rot_dim: i32,
        rope_scaling: f32,
        eps: f32,
        ck: &'a mut CudaSlice<f32>,
        cv: &'a mut CudaSlice<f32>,
        ring: i32,
        window: i32,
        heads: i32,
        kv_heads: i32,
        d: i32,
        part: &'a mut CudaSlice<f32>,
        counters: &'a mut CudaSlice<u32>,
        out: CudaViewMut<'a, f32>,
    }

    /// attention.cu's `attend_merge`: the splits `attend_decode_parts` left, merged.
    struct AttendMerge<'a>("attention", "attend_merge") {
        qkvg: &'a CudaView<'a, f32>,
        width: i32,
        pos: &'a CudaView<'a, i32>,
        window: i32,
        heads: i32,
        kv_heads: i32,
        d: i32,
        part: &'a CudaSlice<f32>,
        out: CudaViewMut<'a, f32>,
    }
}

/// Key ranges per (row, kv head) of `attend_decode` (`ATT_SPLITS` in attention.cu).
pub const ATT_SPLITS: usize = 32;
pub(crate) const ATT_TILE: usize = 32;
pub(crate) const ATT_WARPS: usize = 8;
/// Output rows per block of the expert GEMVs (`MOE_OB`, `DOWN_OB` in moe.cu).
pub(crate) const MOE_OB: usize = 4;
pub(crate) const DOWN_OB: usize = 8;
/// Rows one decode-kernel launch carries (the GEMVs keep one accumulator per row in registers).
pub const MAX_ROWS: usize = 16;

/// Rotary parameters on the device.
pub struct DevRope {
    pub inv_freq: CudaSlice<f32>,
    pub rot_dim: usize,
    pub scaling: f32,
}

/// NVFP4 weights on the device: packed codes and scale bytes (optionally stacked per expert).
pub struct DevNvfp4 {
    pub codes: CudaSlice<u32>,
    pub scales: CudaSlice<u8>,
}

/// The NVFP4 weights of one MoE layer: routed stacks `[E, I, H]` (gate, up) and `[E, H, I]`
/// (down), and the shared expert as a one-expert stack (`[Is, H]`, `[H, Is]`).
#[derive(Clone, Copy)]
pub struct MoeWeights<'a> {
    pub gate: &'a DevNvfp4,
    pub up: &'a DevNvfp4,
    pub down: &'a DevNvfp4,
    pub shared_gate: &'a DevNvfp4,
    pub shared_up: &'a DevNvfp4,
    pub shared_down: &'a DevNvfp4,
}

/// One MoE layer as the expert kernels take it: its weights, shapes and routed scaling factor.
pub struct MoeLayer<'a> {
    pub w: MoeWeights<'a>,
    pub shape: MoeShape,
    pub scaling: f32,
}

/// The router's choice for each row: `ids [rows, k]` (experts) and `wts [rows, k]` (weights).
#[derive(Clone, Copy)]
pub struct Routing<'a> {
    pub ids: &'a CudaView<'a, i32>,
    pub wts: &'a CudaView<'a, f32>,
}

/// The attention kernels' inputs for `rows` rows (consecutive positions from `pos[0]`): the
/// fused projections `qkvg`, and the layer's q/k norms (with `eps`), rotary parameters and
/// shapes.
pub struct AttnRows<'a> {
    pub qkvg: &'a CudaView<'a, f32>,
    pub pos: &'a CudaView<'a, i32>,
    pub q_norm: &'a CudaSlice<bf16>,
    pub k_norm: &'a CudaSlice<bf16>,
    pub eps: f32,
    pub rope: &'a DevRope,
    pub shape: AttnShape,
    pub rows: usize,
}

/// The router's top-k: the experts' `bias` (added for the choice only), whether the k weights
/// are renormalised (`norm_topk`), and the logits' `softcap` (0: none).
#[derive(Clone, Copy)]
pub struct TopK<'a> {
    pub bias: &'a CudaSlice<f32>,
    pub norm_topk: bool,
    pub softcap: f32,
}

/// The router's weights: its input norm (with `eps`) and the `[E, H]` router matrix `w`.
#[derive(Clone, Copy)]
pub struct RouterWeights<'a> {
    pub norm: &'a CudaSlice<bf16>,
    pub eps: f32,
    pub w: &'a CudaSlice<bf16>,
}

/// What `router` writes: the normed rows `xn`, the `logits`, the top-k `ids` and `wts`, and
/// the per-row `counter` its blocks count themselves in.
pub struct RouterOut<'a, 'v> {
    pub xn: &'a mut CudaViewMut<'v, f32>,
    pub logits: &'a mut CudaViewMut<'v, f32>,
    pub ids: &'a mut CudaViewMut<'v, i32>,
    pub wts: &'a mut CudaViewMut<'v, f32>,
    pub counter: &'a mut CudaSlice<u32>,
}

/// Shapes of one attention layer, as the fused `qkvg` projection lays them out.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// 0 = full attention.
    pub window: usize,
    /// KV-cache ring length (0 = slot is the position).
    pub ring: usize,
}

impl AttnShape {
    /// Width of one fused projection row: q | k | v | g.
    pub fn width(&self) -> usize {
        self.heads * self.head_dim + 2 * self.kv_heads * self.head_dim + self.heads
    }

    pub(crate) fn check(&self, what: &str) -> Result<()> {
        let d = self.head_dim;
        let g = self.heads / self.kv_heads.max(1);
        if self.kv_heads == 0
            || !self.heads.is_multiple_of(self.kv_heads)
            || g > ATT_WARPS
            || !d.is_multiple_of(32)
            || d > 128
        {
            return Err(CudaError::Shape(format!(
                "{what}: {} heads on {} kv heads of dim {d}: needs a group of at most {ATT_WARPS} heads and head_dim a multiple of 32 up to 128",
                self.heads, self.kv_heads
            )));
        }
        Ok(())
    }
}

/// Shapes of one MoE layer.
#[derive(Clone, Copy, Debug)]
pub struct MoeShape {
    pub hidden: usize,
    pub experts: usize,
    pub top_k: usize,
    pub inter: usize,
    pub shared_inter: usize,
}

impl MoeShape {
    /// Width of one slot of the `h` buffer (`[rows, top_k + 1, slot_width]`).
    pub fn slot_width(&self) -> usize {
        self.inter.max(self.shared_inter)
    }

    pub(crate) fn check(&self) -> Result<()> {
        let ok = self.hidden.is_multiple_of(32)
            && self.hidden <= 4096
            && self.inter.is_multiple_of(32)
            && self.shared_inter.is_multiple_of(32)
            && self.top_k < 32
            && self.top_k <= self.experts
            && self.experts <= 1024;
        if !ok {
            return Err(CudaError::Shape(format!(
                "moe: {self:?}: needs hidden a multiple of 32 up to 4096, intermediate sizes multiples of 32, top_k below 32 and at most 1024 experts"
            )));
        }
        Ok(())
    }

    /// `check`, and the expert kernels' buffers for `rows` rows: the lengths of the rows `x`
    /// (`[rows, hidden]`), `ids` (`[rows, top_k]`) and `h` (`[rows, top_k + 1, slot_width]`).
    fn check_rows(
        &self,
        what: &str,
        rows: usize,
        (x, ids, h): (usize, usize, usize),
    ) -> Result<()> {
        self.check()?;
        let k = self.top_k;
        if x < rows * self.hidden || ids < rows * k || h < rows * (k + 1) * self.slot_width() {
            return Err(CudaError::Shape(format!(
                "{what}: buffers too small for {rows} rows"
            )));
        }
        Ok(())
    }
}

fn rows_ok(what: &str, rows: usize) -> Result<()> {
    if rows == 0 || rows > MAX_ROWS {
        return Err(CudaError::Shape(format!(
            "{what}: {rows} rows per launch (1..={MAX_ROWS})"
        )));
    }
    Ok(())
}

impl Gpu {
    /// Prefill side of the cache: `q_out[r, h] = norm_rope(q)`, and k, v of every row into the cache.
    pub fn qk_norm_rope_store(
        &self,
        a: AttnRows,
        q_out: &mut CudaViewMut<f32>,
        ck: &mut CudaSlice<f32>,
        cv: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let AttnRows {
            qkvg,
            pos,
            q_norm,
            k_norm,
            eps,
            rope,
            shape,
            rows,
        } = a;
        shape.check("qk_norm_rope_store")?;
        let (h, kvh, d) = (shape.heads, shape.kv_heads, shape.head_dim);
        if qkvg.len() < rows * shape.width() || q_out.len() < rows * h * d || pos.len() < rows {
            return Err(CudaError::Shape(format!(
                "qk_norm_rope_store: buffers too small for {rows} rows"
            )));
        }
        let params = QkNormRopeStore {
            qkvg,
            width: shape.width() as i32,
            q_norm,
            k_norm,
            pos,
            inv_freq: &rope.inv_freq,
            rot_dim: rope.rot_dim as i32,
            rope_scaling: rope.scaling,
            eps,
            heads: h as i32,
            kv_heads: kvh as i32,
            d: d as i32,
            ring: shape.ring as i32,
            q_out: q_out.slice_mut(..),
            ck,
            cv,
        };
        let cfg = launch_cfg(((h + kvh).div_ceil(8) as u32, rows as u32), 256, 0);
        // SAFETY: shapes checked above; the caller sized the cache for these positions.
        unsafe { self.run(Order::Overlapping, params, cfg) }?;
        Ok(())
    }

    /// Split-KV attention of `rows` rows (consecutive positions from `pos[0]`) from their fused
    /// projections, writing each row's k/v into the cache and the gated output to `out`.
    pub fn attend_decode(
        &self,
        a: AttnRows,
        ck: &mut CudaSlice<f32>,
        cv: &mut CudaSlice<f32>,
        part: &mut CudaSlice<f32>,
        counters: &mut CudaSlice<u32>,
        out: &mut CudaViewMut<f32>,
    ) -> Result<()> {
        let AttnRows {
            qkvg,
            pos,
            q_norm,
            k_norm,
            eps,
            rope,
            shape,
            rows,
        } = a;
        shape.check("attend_decode")?;
        rows_ok("attend_decode", rows)?;
        let (h, kvh, d) = (shape.heads, shape.kv_heads, shape.head_dim);
        if qkvg.len() < rows * shape.width()
            || out.len() < rows * h * d
            || part.len() < rows * h * ATT_SPLITS * (d + 2)
            || counters.len() < rows * kvh
            || pos.len() < rows
        {
            return Err(CudaError::Shape(format!(
                "attend_decode: buffers too small for {rows} rows of {h} heads"
            )));
        }
        let g = h / kvh;
        let shared =
            (g * d + ATT_TILE * (d + 4) + ATT_TILE * d + 2 * ATT_WARPS * d + d + 8 * ATT_TILE + 8)
                * 4;
        // Several rows: the blocks leave with their partials written and attend_merge merges
        // them, instead of each (row, kv head)'s last block to arrive (attention.cu).
        let apart = rows > 1;
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (kvh as u32, rows as u32, ATT_SPLITS as u32),
            block_dim: (256, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        let params = AttendDecode {
            qkvg,
            width: shape.width() as i32,
            q_norm,
            k_norm,
            pos,
            inv_freq: &rope.inv_freq,
            rot_dim: rope.rot_dim as i32,
            rope_scaling: rope.scaling,
            eps,
            ck,
            cv,
            ring: shape.ring as i32,
            window: shape.window as i32,
            heads: h as i32,
            kv_heads: kvh as i32,
            d: d as i32,
            part: &mut *part,
            counters,
            out: out.slice_mut(..),
        };
        let name = if apart {
            "attend_decode_parts"
        } else {
            "attend_decode"
        };
        let f = self.function("attention", name)?;
        // SAFETY: as above; `counters` is zero between launches (the kernel resets it).
        unsafe { self.run_kernel(&f, Order::Overlapping, params, cfg) }?;
        if apart {
            let params = AttendMerge {
                qkvg,
                width: shape.width() as i32,
                pos,
                window: shape.window as i32,
                heads: h as i32,
                kv_heads: kvh as i32,
                d: d as i32,
                part: &*part,
                out: out.slice_mut(..),
            };
            let cfg = launch_cfg((kvh as u32, rows as u32), 256, 0);
            // SAFETY: as above; reads the partials the launch above wrote for these rows.
            unsafe { self.run(Order::Overlapping, params, cfg) }?;
        }
        Ok(())
    }

    /// Top-k selection of `rows` rows of router logits (any number of rows).
    pub fn router_topk(
        &self,
        logits: &CudaView<f32>,
        topk: TopK,
        shape: MoeShape,
        rows: usize,
        ids: &mut CudaViewMut<i32>,
        wts: &mut CudaViewMut<f32>,
    ) -> Result<()> {
        let TopK {
            bias,
            norm_topk,
            softcap,
        } = topk;
        shape.check()?;
        let (e, k) = (shape.experts, shape.top_k);
        if logits.len() < rows * e || ids.len() < rows * k || wts.len() < rows * k {
            return Err(CudaError::Shape(format!(
                "router_topk: buffers too small for {rows} rows"
            )));
        }
        if rows == 0 {
            return Ok(());
        }
        let params = RouterTopk {
            logits,
            bias,
            ids: ids.slice_mut(..),
            wts: wts.slice_mut(..),
            E: e as i32,
            k: k as i32,
            norm_topk: norm_topk as i32,
            softcap,
            rows: rows as i32,
        };
        // A block per row. SAFETY: as above.
        unsafe { self.run(Order::Overlapping, params, row_blocks(rows)) }?;
        Ok(())
    }

    /// The whole router of up to 16 rows in one launch: `xn = RMSNorm(x)`, logits, top-k ids and
    /// weights, each row on blocks of its own that run the one-row code (so each row gets its
    /// one-row bits). `counter` holds a zero per row between launches (the kernel resets them).
    pub fn router(
        &self,
        x: &CudaView<f32>,
        weights: RouterWeights,
        topk: TopK,
        shape: MoeShape,
        rows: usize,
        out: RouterOut,
    ) -> Result<()> {
        let RouterWeights { norm, eps, w } = weights;
        let TopK {
            bias,
            norm_topk,
            softcap,
        } = topk;
        let RouterOut {
            xn,
            logits,
            ids,
            wts,
            counter,
        } = out;
        shape.check()?;
        rows_ok("router", rows)?;
        let (hd, e, k) = (shape.hidden, shape.experts, shape.top_k);
        if x.len() < rows * hd
            || xn.len() < rows * hd
            || w.len() != e * hd
            || logits.len() < rows * e
            || ids.len() < rows * k
            || wts.len() < rows * k
            || counter.len() < rows
        {
            return Err(CudaError::Shape(format!(
                "router: buffers too small for {rows} rows of {e} experts"
            )));
        }
        let f = self.function("moe", "router")?;
        // One warp per expert row: a row's blocks, as many as its experts need and fit at once.
        let grid = self.persistent_grid(&f, 256, 0, e.div_ceil(8))?;
        let params = Router {
            x,
            norm,
            eps,
            W: w,
            bias,
            xn: xn.slice_mut(..),
            logits: logits.slice_mut(..),
            ids: ids.slice_mut(..),
            wts: wts.slice_mut(..),
            counter,
            E: e as i32,
            H: hd as i32,
            k: k as i32,
            norm_topk: norm_topk as i32,
            softcap,
        };
        // SAFETY: argument types match the kernel; shapes checked above.
        unsafe {
            self.run_kernel(
                &f,
                Order::Overlapping,
                params,
                launch_cfg((grid, rows as u32), 256, 0),
            )
        }?;
        Ok(())
    }

    /// `h[r, s] = silu(G_e xn_r) · (U_e xn_r)` for the routed slots and the shared expert (slot k).
    pub fn moe_gate_up(
        &self,
        layer: &MoeLayer,
        xn: &CudaView<f32>,
        ids: &CudaView<i32>,
        rows: usize,
        h: &mut CudaViewMut<f32>,
    ) -> Result<()> {
        self.moe_gate_up_by(self.moe_kernel, layer, xn, ids, rows, h)
    }

    /// `moe_gate_up` with the kernel chosen by the caller (tests compare them).
    pub fn moe_gate_up_by(
        &self,
        kernel: MoeKernel,
        layer: &MoeLayer,
        xn: &CudaView<f32>,
        ids: &CudaView<i32>,
        rows: usize,
        h: &mut CudaViewMut<f32>,
    ) -> Result<()> {
        let (w, shape) = (&layer.w, layer.shape);
        shape.check_rows("moe_gate_up", rows, (xn.len(), ids.len(), h.len()))?;
        let (hd, k, i, is) = (shape.hidden, shape.top_k, shape.inter, shape.shared_inter);
        let sw = shape.slot_width();
        // A tensor-core block has at most 8 warps, one per slice of 256 input columns.
        let (f, cfg) = if kernel == MoeKernel::Mma2 && hd.div_ceil(256) <= 8 {
            (
                self.function("moe", "moe_gate_up_mma2")?,
                cudarc::driver::LaunchConfig {
                    grid_dim: (sw.div_ceil(16) as u32, (k + 1) as u32, rows as u32),
                    block_dim: ((32 * hd.div_ceil(256)) as u32, 1, 1),
                    shared_mem_bytes: 0,
                },
            )
        } else {
            (
                self.function("moe", "moe_gate_up")?,
                cudarc::driver::LaunchConfig {
                    grid_dim: (sw.div_ceil(MOE_OB) as u32, (k + 1) as u32, rows as u32),
                    block_dim: ((32 * (hd / 32).div_ceil(32)) as u32, 1, 1),
                    shared_mem_bytes: 0,
                },
            )
        };
        let params = MoeGateUp {
            xn,
            ids,
            gc: &w.gate.codes,
            gs: &w.gate.scales,
            uc: &w.up.codes,
            us: &w.up.scales,
            sgc: &w.shared_gate.codes,
            sgs: &w.shared_gate.scales,
            suc: &w.shared_up.codes,
            sus: &w.shared_up.scales,
            h: h.slice_mut(..),
            H: hd as i32,
            I: i as i32,
            Is: is as i32,
            k: k as i32,
        };
        // SAFETY: as above.
        unsafe { self.run_kernel(&f, Order::Overlapping, params, cfg) }?;
        Ok(())
    }

    /// `x[r] += scaling · Σ_s w[r,s] · D_e h[r,s] + D_shared h[r,k]`.
    pub fn moe_down(
        &self,
        layer: &MoeLayer,
        h: &CudaView<f32>,
        routing: Routing,
        rows: usize,
        x: &mut CudaViewMut<f32>,
    ) -> Result<()> {
        self.moe_down_by(self.moe_kernel, layer, h, routing, rows, x)
    }

    /// `moe_down` with the kernel chosen by the caller (tests compare them).
    pub fn moe_down_by(
        &self,
        kernel: MoeKernel,
        layer: &MoeLayer,
        h: &CudaView<f32>,
        routing: Routing,
        rows: usize,
        x: &mut CudaViewMut<f32>,
    ) -> Result<()> {
        let (w, shape, scaling) = (&layer.w, layer.shape, layer.scaling);
        let Routing { ids, wts } = routing;
        shape.check_rows("moe_down", rows, (x.len(), ids.len(), h.len()))?;
        let (hd, k, i, is) = (shape.hidden, shape.top_k, shape.inter, shape.shared_inter);
        let sw = shape.slot_width();
        let t = k * i / 32 + is / 32;
        if t > 8 * 32 {
            return Err(CudaError::Shape(format!(
                "moe_down: {t} code chunks per output row (at most 256)"
            )));
        }
        // The tensor-core kernel: a warp per (slot, 512-column slice), at most 10 per block.
        let warps = (k + 1) * sw.div_ceil(512);
        let (f, cfg) = if kernel != MoeKernel::F32 && warps <= 10 {
            (
                self.function("moe", "moe_down_mma4")?,
                launch_cfg((hd.div_ceil(16) as u32, rows as u32), 32 * warps as u32, 0),
            )
        } else {
            (
                self.function("moe", "moe_down")?,
                launch_cfg(
                    (hd.div_ceil(DOWN_OB) as u32, rows as u32),
                    (32 * t.div_ceil(32)) as u32,
                    0,
                ),
            )
        };
        let params = MoeDown {
            h,
            ids,
            wts,
            dc: &w.down.codes,
            ds: &w.down.scales,
            sdc: &w.shared_down.codes,
            sds: &w.shared_down.scales,
            x: x.slice_mut(..),
            H: hd as i32,
            I: i as i32,
            Is: is as i32,
            k: k as i32,
            scaling,
        };
        // SAFETY: as above.
        unsafe { self.run_kernel(&f, Order::Overlapping, params, cfg) }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::tests::{check, check_entry};

    #[test]
    fn every_launch_struct_follows_its_kernels_parameters() {
        check::<QkNormRopeStore>();
        check::<AttendDecode>();
        check_entry::<AttendDecode>("attend_decode_parts");
        check::<AttendMerge>();
        check::<Router>();
        check::<RouterTopk>();
        check::<MoeGateUp>();
        check_entry::<MoeGateUp>("moe_gate_up_mma2");
        check::<MoeDown>();
        check_entry::<MoeDown>("moe_down_mma4");
    }
}
