//! Launch wrappers of `kernels/attention.cu` and `kernels/moe.cu`.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, PushKernelArg};
use half::bf16;

use crate::device::{launch_cfg, Gpu};
use crate::error::{CudaError, Result};

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

impl Gpu {
    /// In place per-head RMSNorm + RoPE of `rows × heads × d`.
    #[allow(clippy::too_many_arguments)]
    pub fn qk_norm_rope(
        &self,
        x: &mut CudaViewMut<f32>,
        w: &CudaSlice<bf16>,
        pos: &CudaView<i32>,
        rope: &DevRope,
        heads: usize,
        d: usize,
        rows: usize,
        eps: f32,
    ) -> Result<()> {
        if d > 512 || x.len() < rows * heads * d || w.len() != d {
            return Err(CudaError::Shape(format!(
                "qk_norm_rope: bad shapes (d {d}, heads {heads}, rows {rows})"
            )));
        }
        let f = self.function("attention", "qk_norm_rope")?;
        let (h, dd, rd) = (heads as i32, d as i32, rope.rot_dim as i32);
        // SAFETY: argument types match the kernel; shapes checked above.
        unsafe {
            self.stream
                .launch_builder(&f)
                .arg(x)
                .arg(w)
                .arg(pos)
                .arg(&rope.inv_freq)
                .arg(&h)
                .arg(&dd)
                .arg(&rd)
                .arg(&rope.scaling)
                .arg(&eps)
                .launch(launch_cfg((heads as u32, rows as u32), 128, 0))
        }?;
        Ok(())
    }

    /// Writes `rows` rows of k and v into the cache at their positions' slots (`pos % ring`,
    /// or the position itself when `ring` is 0).
    #[allow(clippy::too_many_arguments)]
    pub fn kv_store(
        &self,
        k: &CudaView<f32>,
        v: &CudaView<f32>,
        ck: &mut CudaSlice<f32>,
        cv: &mut CudaSlice<f32>,
        pos: &CudaView<i32>,
        ring: usize,
        kvd: usize,
        rows: usize,
    ) -> Result<()> {
        let f = self.function("attention", "kv_store")?;
        let (n, rg) = (kvd as i32, ring as i32);
        // SAFETY: argument types match the kernel; the caller sized the cache for these positions.
        unsafe {
            self.stream
                .launch_builder(&f)
                .arg(k)
                .arg(v)
                .arg(ck)
                .arg(cv)
                .arg(pos)
                .arg(&rg)
                .arg(&n)
                .launch(launch_cfg((rows as u32, 1), 256, 0))
        }?;
        Ok(())
    }

    /// Gated attention of `rows` query rows over the cache; `max_keys` bounds the keys any row sees.
    #[allow(clippy::too_many_arguments)]
    pub fn attend(
        &self,
        q: &CudaView<f32>,
        ck: &CudaSlice<f32>,
        cv: &CudaSlice<f32>,
        g: &CudaView<f32>,
        pos: &CudaView<i32>,
        out: &mut CudaViewMut<f32>,
        heads: usize,
        kv_heads: usize,
        d: usize,
        window: usize,
        ring: usize,
        rows: usize,
        max_keys: usize,
    ) -> Result<()> {
        // 48 KiB of shared memory per block: 8 KiB of partial sums + one f32 score per key.
        if max_keys > 10240 || d > 512 {
            return Err(CudaError::Shape(format!(
                "attend: {max_keys} keys exceed the shared-memory score buffer (10240), or head_dim {d} is above 512"
            )));
        }
        let f = self.function("attention", "attend")?;
        let (h, kvh, dd, w, rg) = (
            heads as i32,
            kv_heads as i32,
            d as i32,
            window as i32,
            ring as i32,
        );
        // SAFETY: as above.
        unsafe {
            self.stream
                .launch_builder(&f)
                .arg(q)
                .arg(ck)
                .arg(cv)
                .arg(g)
                .arg(pos)
                .arg(out)
                .arg(&h)
                .arg(&kvh)
                .arg(&dd)
                .arg(&w)
                .arg(&rg)
                .launch(launch_cfg(
                    (heads as u32, rows as u32),
                    128,
                    (max_keys * 4) as u32,
                ))
        }?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub fn router_topk(
        &self,
        logits: &CudaView<f32>,
        bias: &CudaSlice<f32>,
        ids: &mut CudaViewMut<i32>,
        wts: &mut CudaViewMut<f32>,
        experts: usize,
        k: usize,
        norm_topk: bool,
        softcap: f32,
        rows: usize,
    ) -> Result<()> {
        if k > 64 || k > experts {
            return Err(CudaError::Shape(format!(
                "router_topk: top-{k} of {experts} (at most 64)"
            )));
        }
        let f = self.function("moe", "router_topk")?;
        let (e, kk, n) = (experts as i32, k as i32, norm_topk as i32);
        // SAFETY: as above.
        unsafe {
            self.stream
                .launch_builder(&f)
                .arg(logits)
                .arg(bias)
                .arg(ids)
                .arg(wts)
                .arg(&e)
                .arg(&kk)
                .arg(&n)
                .arg(&softcap)
                .launch(launch_cfg((rows as u32, 1), 256, 0))
        }?;
        Ok(())
    }

    /// `h[r, s] = silu(G_e x_r) · (U_e x_r)`, e = ids[r, s], or the single (shared) expert when `ids` is None.
    #[allow(clippy::too_many_arguments)]
    pub fn nvfp4_gate_up(
        &self,
        gate: &DevNvfp4,
        up: &DevNvfp4,
        x: &CudaView<f32>,
        ids: Option<&CudaView<i32>>,
        h: &mut CudaViewMut<f32>,
        inter: usize,
        hidden: usize,
        rows: usize,
        slots: usize,
    ) -> Result<()> {
        let f = self.function("moe", "nvfp4_gate_up")?;
        let (i, hh, s) = (inter as i32, hidden as i32, slots as i32);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&gate.codes)
            .arg(&gate.scales)
            .arg(&up.codes)
            .arg(&up.scales)
            .arg(x);
        let null: u64 = 0;
        match ids {
            Some(v) => b.arg(v),
            None => b.arg(&null),
        };
        b.arg(h).arg(&i).arg(&hh).arg(&s);
        // SAFETY: as above; a null ids pointer selects expert 0 in the kernel.
        unsafe {
            b.launch(launch_cfg(
                (inter.div_ceil(8) as u32, (rows * slots) as u32),
                256,
                0,
            ))
        }?;
        Ok(())
    }

    /// `x[r] += scaling · Σ_s w[r,s] · D_e h[r,s] + D_shared hs[r]`.
    #[allow(clippy::too_many_arguments)]
    pub fn nvfp4_down_combine(
        &self,
        down: &DevNvfp4,
        shared_down: &DevNvfp4,
        h: &CudaView<f32>,
        hs: &CudaView<f32>,
        ids: &CudaView<i32>,
        wts: &CudaView<f32>,
        x: &mut CudaViewMut<f32>,
        hidden: usize,
        inter: usize,
        shared_inter: usize,
        slots: usize,
        scaling: f32,
        rows: usize,
    ) -> Result<()> {
        let f = self.function("moe", "nvfp4_down_combine")?;
        let (hh, i, is, s) = (
            hidden as i32,
            inter as i32,
            shared_inter as i32,
            slots as i32,
        );
        // SAFETY: as above.
        unsafe {
            self.stream
                .launch_builder(&f)
                .arg(&down.codes)
                .arg(&down.scales)
                .arg(&shared_down.codes)
                .arg(&shared_down.scales)
                .arg(h)
                .arg(hs)
                .arg(ids)
                .arg(wts)
                .arg(x)
                .arg(&hh)
                .arg(&i)
                .arg(&is)
                .arg(&s)
                .arg(&scaling)
                .launch(launch_cfg((hidden.div_ceil(8) as u32, rows as u32), 256, 0))
        }?;
        Ok(())
    }

    pub fn silu_mul(
        &self,
        g: &CudaView<f32>,
        u: &CudaView<f32>,
        a: &mut CudaViewMut<f32>,
        n: usize,
    ) -> Result<()> {
        let f = self.function("moe", "silu_mul")?;
        let nn = n as i32;
        // SAFETY: as above.
        unsafe {
            self.stream
                .launch_builder(&f)
                .arg(g)
                .arg(u)
                .arg(a)
                .arg(&nn)
                .launch(launch_cfg((n.div_ceil(256) as u32, 1), 256, 0))
        }?;
        Ok(())
    }
}
