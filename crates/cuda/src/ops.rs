//! Launch wrappers of `kernels/attention.cu` and `kernels/moe.cu`. Shapes are checked here,
//! before any launch.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, PushKernelArg};
use half::bf16;

use crate::device::{launch_cfg, Gpu};
use crate::error::{CudaError, Result};
use crate::knobs::MoeKernel;

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
    #[allow(clippy::too_many_arguments)]
    pub fn qk_norm_rope_store(
        &self,
        qkvg: &CudaView<f32>,
        q_norm: &CudaSlice<bf16>,
        k_norm: &CudaSlice<bf16>,
        pos: &CudaView<i32>,
        rope: &DevRope,
        eps: f32,
        shape: AttnShape,
        rows: usize,
        q_out: &mut CudaViewMut<f32>,
        ck: &mut CudaSlice<f32>,
        cv: &mut CudaSlice<f32>,
    ) -> Result<()> {
        shape.check("qk_norm_rope_store")?;
        let (h, kvh, d) = (shape.heads, shape.kv_heads, shape.head_dim);
        if qkvg.len() < rows * shape.width() || q_out.len() < rows * h * d || pos.len() < rows {
            return Err(CudaError::Shape(format!(
                "qk_norm_rope_store: buffers too small for {rows} rows"
            )));
        }
        let f = self.function("attention", "qk_norm_rope_store")?;
        let ints = [shape.width(), h, kvh, d, shape.ring, rope.rot_dim].map(|v| v as i32);
        // SAFETY: argument types match the kernel; shapes checked above; the caller sized the
        // cache for these positions.
        unsafe {
            self.launch(&f)
                .arg(qkvg)
                .arg(&ints[0])
                .arg(q_norm)
                .arg(k_norm)
                .arg(pos)
                .arg(&rope.inv_freq)
                .arg(&ints[5])
                .arg(&rope.scaling)
                .arg(&eps)
                .arg(&ints[1])
                .arg(&ints[2])
                .arg(&ints[3])
                .arg(&ints[4])
                .arg(q_out)
                .arg(ck)
                .arg(cv)
                .launch(launch_cfg(
                    ((h + kvh).div_ceil(8) as u32, rows as u32),
                    256,
                    0,
                ))
        }?;
        Ok(())
    }

    /// Split-KV attention of `rows` rows (consecutive positions from `pos[0]`) from their fused
    /// projections, writing each row's k/v into the cache and the gated output to `out`.
    #[allow(clippy::too_many_arguments)]
    pub fn attend_decode(
        &self,
        qkvg: &CudaView<f32>,
        q_norm: &CudaSlice<bf16>,
        k_norm: &CudaSlice<bf16>,
        pos: &CudaView<i32>,
        rope: &DevRope,
        eps: f32,
        shape: AttnShape,
        rows: usize,
        ck: &mut CudaSlice<f32>,
        cv: &mut CudaSlice<f32>,
        part: &mut CudaSlice<f32>,
        counters: &mut CudaSlice<u32>,
        out: &mut CudaViewMut<f32>,
    ) -> Result<()> {
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
        let f = self.function(
            "attention",
            if apart {
                "attend_decode_parts"
            } else {
                "attend_decode"
            },
        )?;
        let ints = [
            shape.width(),
            rope.rot_dim,
            shape.ring,
            shape.window,
            h,
            kvh,
            d,
        ]
        .map(|v| v as i32);
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (kvh as u32, rows as u32, ATT_SPLITS as u32),
            block_dim: (256, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        // SAFETY: as above; `counters` is zero between launches (the kernel resets it).
        unsafe {
            self.launch(&f)
                .arg(qkvg)
                .arg(&ints[0])
                .arg(q_norm)
                .arg(k_norm)
                .arg(pos)
                .arg(&rope.inv_freq)
                .arg(&ints[1])
                .arg(&rope.scaling)
                .arg(&eps)
                .arg(ck)
                .arg(cv)
                .arg(&ints[2])
                .arg(&ints[3])
                .arg(&ints[4])
                .arg(&ints[5])
                .arg(&ints[6])
                .arg(&mut *part)
                .arg(counters)
                .arg(&mut *out)
                .launch(cfg)
        }?;
        if apart {
            let f = self.function("attention", "attend_merge")?;
            // SAFETY: as above; reads the partials the launch above wrote for these rows.
            unsafe {
                self.launch(&f)
                    .arg(qkvg)
                    .arg(&ints[0])
                    .arg(pos)
                    .arg(&ints[3])
                    .arg(&ints[4])
                    .arg(&ints[5])
                    .arg(&ints[6])
                    .arg(&*part)
                    .arg(out)
                    .launch(launch_cfg((kvh as u32, rows as u32), 256, 0))
            }?;
        }
        Ok(())
    }

    /// Top-k selection of `rows` rows of router logits (any number of rows).
    #[allow(clippy::too_many_arguments)]
    pub fn router_topk(
        &self,
        logits: &CudaView<f32>,
        bias: &CudaSlice<f32>,
        ids: &mut CudaViewMut<i32>,
        wts: &mut CudaViewMut<f32>,
        shape: MoeShape,
        norm_topk: bool,
        softcap: f32,
        rows: usize,
    ) -> Result<()> {
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
        let f = self.function("moe", "router_topk")?;
        let (ee, kk, n, ri) = (e as i32, k as i32, norm_topk as i32, rows as i32);
        // SAFETY: as above.
        unsafe {
            self.launch(&f)
                .arg(logits)
                .arg(bias)
                .arg(ids)
                .arg(wts)
                .arg(&ee)
                .arg(&kk)
                .arg(&n)
                .arg(&softcap)
                .arg(&ri)
                // A block per row.
                .launch(launch_cfg((rows as u32, 1), 256, 0))
        }?;
        Ok(())
    }

    /// The whole router of up to 16 rows in one launch: `xn = RMSNorm(x)`, logits, top-k ids and
    /// weights, each row on blocks of its own that run the one-row code (so each row gets its
    /// one-row bits). `counter` holds a zero per row between launches (the kernel resets them).
    #[allow(clippy::too_many_arguments)]
    pub fn router(
        &self,
        x: &CudaView<f32>,
        norm: &CudaSlice<bf16>,
        eps: f32,
        w: &CudaSlice<bf16>,
        bias: &CudaSlice<f32>,
        shape: MoeShape,
        norm_topk: bool,
        softcap: f32,
        rows: usize,
        xn: &mut CudaViewMut<f32>,
        logits: &mut CudaViewMut<f32>,
        ids: &mut CudaViewMut<i32>,
        wts: &mut CudaViewMut<f32>,
        counter: &mut CudaSlice<u32>,
    ) -> Result<()> {
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
        let ints = [e, hd, k, norm_topk as usize].map(|v| v as i32);
        // SAFETY: argument types match the kernel; shapes checked above.
        unsafe {
            self.launch(&f)
                .arg(x)
                .arg(norm)
                .arg(&eps)
                .arg(w)
                .arg(bias)
                .arg(&mut *xn)
                .arg(&mut *logits)
                .arg(&mut *ids)
                .arg(&mut *wts)
                .arg(counter)
                .arg(&ints[0])
                .arg(&ints[1])
                .arg(&ints[2])
                .arg(&ints[3])
                .arg(&softcap)
                .launch(launch_cfg((grid, rows as u32), 256, 0))
        }?;
        Ok(())
    }

    /// `h[r, s] = silu(G_e xn_r) · (U_e xn_r)` for the routed slots and the shared expert (slot k).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_gate_up(
        &self,
        xn: &CudaView<f32>,
        ids: &CudaView<i32>,
        gate: &DevNvfp4,
        up: &DevNvfp4,
        shared_gate: &DevNvfp4,
        shared_up: &DevNvfp4,
        shape: MoeShape,
        rows: usize,
        h: &mut CudaViewMut<f32>,
    ) -> Result<()> {
        self.moe_gate_up_by(
            self.moe_kernel,
            xn,
            ids,
            gate,
            up,
            shared_gate,
            shared_up,
            shape,
            rows,
            h,
        )
    }

    /// `moe_gate_up` with the kernel chosen by the caller (tests compare them).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_gate_up_by(
        &self,
        kernel: MoeKernel,
        xn: &CudaView<f32>,
        ids: &CudaView<i32>,
        gate: &DevNvfp4,
        up: &DevNvfp4,
        shared_gate: &DevNvfp4,
        shared_up: &DevNvfp4,
        shape: MoeShape,
        rows: usize,
        h: &mut CudaViewMut<f32>,
    ) -> Result<()> {
        shape.check()?;
        let (hd, k, i, is) = (shape.hidden, shape.top_k, shape.inter, shape.shared_inter);
        let sw = shape.slot_width();
        if xn.len() < rows * hd || ids.len() < rows * k || h.len() < rows * (k + 1) * sw {
            return Err(CudaError::Shape(format!(
                "moe_gate_up: buffers too small for {rows} rows"
            )));
        }
        let ints = [hd, i, is, k].map(|v| v as i32);
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
        let mut b = self.launch(&f);
        b.arg(xn)
            .arg(ids)
            .arg(&gate.codes)
            .arg(&gate.scales)
            .arg(&up.codes)
            .arg(&up.scales)
            .arg(&shared_gate.codes)
            .arg(&shared_gate.scales)
            .arg(&shared_up.codes)
            .arg(&shared_up.scales)
            .arg(h)
            .arg(&ints[0])
            .arg(&ints[1])
            .arg(&ints[2])
            .arg(&ints[3]);
        // SAFETY: as above.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `x[r] += scaling · Σ_s w[r,s] · D_e h[r,s] + D_shared h[r,k]`.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_down(
        &self,
        h: &CudaView<f32>,
        ids: &CudaView<i32>,
        wts: &CudaView<f32>,
        down: &DevNvfp4,
        shared_down: &DevNvfp4,
        shape: MoeShape,
        scaling: f32,
        rows: usize,
        x: &mut CudaViewMut<f32>,
    ) -> Result<()> {
        self.moe_down_by(
            self.moe_kernel,
            h,
            ids,
            wts,
            down,
            shared_down,
            shape,
            scaling,
            rows,
            x,
        )
    }

    /// `moe_down` with the kernel chosen by the caller (tests compare them).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_down_by(
        &self,
        kernel: MoeKernel,
        h: &CudaView<f32>,
        ids: &CudaView<i32>,
        wts: &CudaView<f32>,
        down: &DevNvfp4,
        shared_down: &DevNvfp4,
        shape: MoeShape,
        scaling: f32,
        rows: usize,
        x: &mut CudaViewMut<f32>,
    ) -> Result<()> {
        shape.check()?;
        let (hd, k, i, is) = (shape.hidden, shape.top_k, shape.inter, shape.shared_inter);
        let sw = shape.slot_width();
        if x.len() < rows * hd || ids.len() < rows * k || h.len() < rows * (k + 1) * sw {
            return Err(CudaError::Shape(format!(
                "moe_down: buffers too small for {rows} rows"
            )));
        }
        let t = k * i / 32 + is / 32;
        if t > 8 * 32 {
            return Err(CudaError::Shape(format!(
                "moe_down: {t} code chunks per output row (at most 256)"
            )));
        }
        let ints = [hd, i, is, k].map(|v| v as i32);
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
        // SAFETY: as above.
        unsafe {
            self.launch(&f)
                .arg(h)
                .arg(ids)
                .arg(wts)
                .arg(&down.codes)
                .arg(&down.scales)
                .arg(&shared_down.codes)
                .arg(&shared_down.scales)
                .arg(x)
                .arg(&ints[0])
                .arg(&ints[1])
                .arg(&ints[2])
                .arg(&ints[3])
                .arg(&scaling)
                .launch(cfg)
        }?;
        Ok(())
    }
}
