//! Launch wrappers of `kernels/dense.cu`. Shapes are checked here, before any launch.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use half::bf16;

use crate::device::{launch_cfg, row_blocks, Gpu, MMA_COUNTERS, MMA_PARTIAL_FLOATS};
use crate::error::{check, Result};
use crate::ops::MAX_ROWS;
use crate::params::{kernel_params, Order};

/// The widest input of the column-owned GEMV (`gemv_cols_R`: 256 threads of 8 columns) and the
/// most rows of one of its launches (R = 1, 2, 4, 8 entries: the rows' x' stays in registers).
const COLS_MAX_IN: usize = 256 * 8;
const COLS_MAX_ROWS: usize = 8;

/// The most shared memory a staged multi-row GEMV takes (its rows of x').
const STAGE_MAX_BYTES: usize = 200 * 1024;
/// The chunks (8 columns each) of x' a grouped multi-row GEMV stages at once: common.cuh's
/// `GEMV_KB`.
pub(crate) const GEMV_KB: usize = 256;

/// Slices of the tensor-core GEMV's input and columns per slice: at most 1024 columns (16
/// rows' staged terms, 96 KiB of shared memory), at least 512 where the input is that wide, and
/// within that the count that streams fastest if two blocks fit per SM: the fewest waves of
/// blocks times the chunks each warp streams (XS 2.1's q|k|v|g: three slices in one wave rather
/// than four in 1.2 waves, whose second wave took a one-row launch from 16 to 25 µs on the
/// H200). A function of the shape and the GPU only, never of the row count: a row's sums follow
/// the slices.
fn mma_slice(out: usize, inp: usize, sm_count: usize) -> (usize, usize) {
    let chunks = inp.div_ceil(32);
    let blocks_x = out.div_ceil(16).div_ceil(8);
    let fewest = chunks.div_ceil(32);
    let most = (chunks / 16).max(fewest);
    let slots = 2 * sm_count;
    let slices = (fewest..=most)
        .min_by_key(|&s| (blocks_x * s).div_ceil(slots) * chunks.div_ceil(s))
        .unwrap_or(fewest);
    let per = chunks.div_ceil(slices);
    (chunks.div_ceil(per), per * 32)
}

kernel_params! {
    /// dense.cu's `embed_rows`.
    struct EmbedRows<'a>("dense", "embed_rows") {
        embed: &'a CudaSlice<bf16>,
        tokens: &'a CudaView<'a, i32>,
        x: &'a mut CudaSlice<f32>,
        hidden: i32,
    }

    /// dense.cu's f32 GEMV entries (`GEMV_ENTRY`'s `NAME`, and `gemv_bf16_1s`): `norm` None
    /// passes a null pointer, the plain GEMV.
    struct Gemv<'a>("dense", "NAME") {
        W: &'a CudaView<'a, bf16>,
        x: &'a CudaView<'a, f32>,
        norm: Option<&'a CudaView<'a, bf16>>,
        eps: f32,
        y: CudaViewMut<'a, f32>,
        out: i32,
        r#in: i32,
        rows: i32,
        accumulate: i32,
    }

    /// dense.cu's tensor-core GEMV entries (`gemv_mma_R`): the f32 entries' parameters, then
    /// the slice width and the scratch (`Gpu::gemv_partial`, `Gpu::gemv_counters`).
    struct GemvMma<'a>("dense", "gemv_mma_##R") {
        W: &'a CudaView<'a, bf16>,
        x: &'a CudaView<'a, f32>,
        norm: Option<&'a CudaView<'a, bf16>>,
        eps: f32,
        y: CudaViewMut<'a, f32>,
        out: i32,
        r#in: i32,
        rows: i32,
        accumulate: i32,
        ks: i32,
        partial: &'a CudaSlice<f32>,
        counters: &'a CudaSlice<u32>,
    }

    /// dense.cu's `silu_mul`.
    struct SiluMul<'a>("dense", "silu_mul") {
        gu: &'a CudaView<'a, f32>,
        a: CudaViewMut<'a, f32>,
        n: i32,
    }

    /// dense.cu's `argmax_rows`.
    struct ArgmaxRows<'a>("dense", "argmax_rows") {
        logits: &'a CudaView<'a, f32>,
        vocab: i32,
        out: CudaViewMut<'a, i32>,
    }

    /// dense.cu's `copy_taps`: tap slot `t` of `T`, rows of `H`.
    struct CopyTaps<'a>("dense", "copy_taps") {
        x: &'a CudaView<'a, f32>,
        taps: CudaViewMut<'a, f32>,
        H: i32,
        T: i32,
        t: i32,
    }

    /// dense.cu's `rms_norm_rows`: `W` weight rows.
    struct RmsNormRows<'a>("dense", "rms_norm_rows") {
        x: &'a CudaView<'a, f32>,
        w: &'a CudaView<'a, bf16>,
        y: CudaViewMut<'a, f32>,
        n: i32,
        W: i32,
        eps: f32,
    }
}

/// Whether a GEMV or GEMM adds its product onto `y` or overwrites `y` with it (the kernels'
/// `accumulate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accumulate {
    Overwrite,
    Add,
}

/// The shape of `y[rows, out] (+)= x[rows, inp] · Wᵀ` (`W`: `[out, inp]`; the kernels' `out`,
/// `in`, `rows`).
#[derive(Clone, Copy, Debug)]
pub struct MatShape {
    pub out: usize,
    pub inp: usize,
    pub rows: usize,
}

/// An RMSNorm's weight and epsilon.
#[derive(Clone, Copy)]
pub struct Norm<'a> {
    pub w: &'a CudaView<'a, bf16>,
    pub eps: f32,
}

/// `rows` rows of `n` values.
#[derive(Clone, Copy, Debug)]
pub struct RowShape {
    pub rows: usize,
    pub n: usize,
}

/// `rms_norm_rows`'s shape: `rows` rows of `n`, normed by `w_rows` stacked weight rows (the
/// kernel's `n` and `W`).
#[derive(Clone, Copy, Debug)]
pub struct NormRows {
    pub rows: usize,
    pub n: usize,
    pub w_rows: usize,
}

fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per) as u32
}

impl Gpu {
    /// `x[r] = embed[tokens[r]]` in f32.
    pub fn embed_rows(
        &self,
        embed: &CudaSlice<bf16>,
        tokens: &CudaView<i32>,
        x: &mut CudaSlice<f32>,
        hidden: usize,
    ) -> Result<()> {
        let rows = tokens.len();
        check(x.len() >= rows * hidden, || {
            format!("embed_rows: x holds {} < {rows}×{hidden}", x.len())
        })?;
        let params = EmbedRows {
            embed,
            tokens,
            x,
            hidden: hidden as i32,
        };
        let cfg = row_blocks(rows);
        // SAFETY: argument types and sizes match the kernel signature; shapes checked above.
        unsafe { self.run(Order::Overlapping, params, cfg) }?;
        Ok(())
    }

    /// `y[r] (+)= x'[r] · Wᵀ` for any number of rows (launched 16 rows at a time, 8 for inputs of
    /// at most COLS_MAX_IN columns, which take the column-owned kernel), where `x'` is `x`, or `RMSNorm(x; norm)` computed inside the kernel.
    pub fn gemv_bf16(
        &self,
        w: &CudaView<bf16>,
        x: &CudaView<f32>,
        norm: Option<Norm>,
        y: &mut CudaViewMut<f32>,
        shape: MatShape,
        accumulate: Accumulate,
    ) -> Result<()> {
        let MatShape { out, inp, rows } = shape;
        check(inp.is_multiple_of(8), || {
            format!("gemv_bf16: input width {inp} is not a multiple of 8")
        })?;
        check(w.len() == out * inp, || {
            format!(
                "gemv_bf16: weight has {} elements, expected {out}×{inp}",
                w.len()
            )
        })?;
        check(x.len() >= rows * inp && y.len() >= rows * out, || {
            format!("gemv_bf16: activations too small for {rows} rows")
        })?;
        if let Some(Norm { w: nw, .. }) = norm {
            check(nw.len() == inp, || {
                format!(
                    "gemv_bf16: norm weight has {} elements, expected {inp}",
                    nw.len()
                )
            })?;
        }
        let eps = norm.map_or(0.0, |n| n.eps);
        let mma = self.dense_mma.load(std::sync::atomic::Ordering::Relaxed);
        // Inputs up to COLS_MAX_IN take the column-owned kernel at every row count (a matrix's
        // bits follow its kernel); wider ones the row-owned kernels.
        let cols = !mma && inp <= COLS_MAX_IN;
        let per_launch = if cols { COLS_MAX_ROWS } else { MAX_ROWS };
        for start in (0..rows).step_by(per_launch) {
            let n = (rows - start).min(per_launch);
            let xs = x.slice(start * inp..(start + n) * inp);
            let ys = y.slice_mut(start * out..(start + n) * out);
            // The tensor-core kernel takes the f32 kernels' arguments, then its slice width and
            // scratch.
            let (f, cfg, ks) = if mma {
                let (f, cfg, ks) = self.gemv_mma_launch(out, inp, n)?;
                (f, cfg, Some(ks))
            } else if cols {
                let f = self.function("dense", &format!("gemv_cols_{}", n.next_power_of_two()))?;
                // Tiles of 8 weight rows: as many blocks as fill every resident slot.
                let grid = self.persistent_grid(&f, 256, 0, out.div_ceil(8))?;
                (f, launch_cfg((grid, 1), 256, 0), None)
            } else {
                let (name, shared) = self.gemv_variant(out, inp, n, norm.is_some());
                let f = self.function("dense", &name)?;
                // 48 KiB of staged rows beside the kernel's own 576 bytes of static shared
                // memory were refused without the raised cap (the XS 2.1 worker's start with
                // staging on, H200). The cap is the same for every launch, whatever its size.
                f.fit_shared(shared, STAGE_MAX_BYTES)?;
                let grid = self.persistent_grid(&f, 256, shared, out.div_ceil(8))?;
                (f, launch_cfg((grid, 1), 256, shared as u32), None)
            };
            let params = Gemv {
                W: w,
                x: &xs,
                norm: norm.map(|n| n.w),
                eps,
                y: ys,
                out: out as i32,
                r#in: inp as i32,
                rows: n as i32,
                accumulate: (accumulate == Accumulate::Add) as i32,
            };
            // SAFETY: as above; a null norm pointer selects the plain GEMV in the kernel; the
            // tensor-core kernel writes its scratch, which only launches on this stream use
            // (device.rs).
            match ks {
                None => unsafe { self.run_kernel(&f, Order::Overlapping, params, cfg) }?,
                Some(ks) => {
                    let params = GemvMma {
                        W: params.W,
                        x: params.x,
                        norm: params.norm,
                        eps,
                        y: params.y,
                        out: params.out,
                        r#in: params.r#in,
                        rows: params.rows,
                        accumulate: params.accumulate,
                        ks,
                        partial: &self.gemv_partial,
                        counters: &self.gemv_counters,
                    };
                    unsafe { self.run_kernel(&f, Order::Overlapping, params, cfg) }?
                }
            }
        }
        Ok(())
    }

    /// The tensor-core GEMV for `rows` <= 16 rows (`gemv_mma_R`, R the next power of two), its
    /// launch over the slices of `mma_slice`, and the slice width.
    fn gemv_mma_launch(
        &self,
        out: usize,
        inp: usize,
        rows: usize,
    ) -> Result<(crate::device::Kernel, cudarc::driver::LaunchConfig, i32)> {
        let r = rows.next_power_of_two();
        let (slices, ks) = mma_slice(out, inp, self.sm_count as usize);
        let tiles = out.div_ceil(16);
        check(
            slices == 1 || (slices * rows * out <= MMA_PARTIAL_FLOATS && tiles <= MMA_COUNTERS),
            || {
                format!(
                    "gemv_bf16: {slices} slices of {rows} rows × {out} outputs exceed the \
                     tensor-core GEMV's scratch"
                )
            },
        )?;
        let nq = (3 * r).div_ceil(8);
        let shared = ks / 32 * nq * 512 + 8 * 16 * (8 * nq + 1) * 4;
        let f = self.function("dense", &format!("gemv_mma_{r}"))?;
        f.fit_shared(shared, STAGE_MAX_BYTES)?;
        let cfg = launch_cfg(
            (tiles.div_ceil(8) as u32, slices as u32),
            256,
            shared as u32,
        );
        Ok((f, cfg, ks as i32))
    }

    /// The GEMV kernel for `rows` rows (and its dynamic shared memory): one row with a small
    /// enough input stages it in shared memory (`gemv_bf16_1s`); several rows take the entry of
    /// R = the next power of two, normed rows staged in shared memory when they fit (`Rs`), with
    /// weight rows in groups of G = 4, 2 or 1 per warp: the largest that still gives three
    /// quarters of the resident warps a group (an o_proj's 2048 outputs in fours would leave
    /// half of them idle). All give the same bits. Staging took the XS 2.1 verify(8) from 3.36 to
    /// 3.27 serial steps (q|k|v|g 1.89 → 1.78 ms, lm_head 0.285 → 0.238 per 8-row forward) and
    /// left the serial step where it was (H200, BENCHMARKS, fourteenth measurement).
    fn gemv_variant(&self, out: usize, inp: usize, rows: usize, normed: bool) -> (String, usize) {
        if rows == 1 {
            return if inp * 4 <= 48 * 1024 {
                ("gemv_bf16_1s".into(), inp * 4)
            } else {
                ("gemv_bf16_1".into(), 0)
            };
        }
        let r = rows.next_power_of_two();
        let warps = self.sm_count as usize * 8;
        let g = [4, 2]
            .into_iter()
            .find(|g| out / g * 4 >= warps * 3)
            .unwrap_or(1);
        // Grouped weight rows stage normed rows a k-block of GEMV_KB chunks at a time, one
        // weight row per warp whole rows. Plain rows (o_proj's) are not staged: in k-blocks they
        // gained little at 8 rows, lost at 4, and the serial step lost 2 % in the same process
        // (H200, BENCHMARKS, sixteenth measurement; not understood: its kernels are the same).
        let shared = if g > 1 {
            rows * GEMV_KB * 32
        } else {
            rows * inp * 4
        };
        let staged = normed && shared <= STAGE_MAX_BYTES;
        // Plain rows whose weight rows would go in pairs (o_proj's) go in fours over half of the
        // rows of x each (`_g4h`): the same number of warp tasks, half the reads of x through L1
        // per weight. The 8-row o_proj waited a quarter of its time for x there (H200,
        // BENCHMARKS twentieth measurement). Two rows have no halves to split: they go in pairs.
        let halves = g == 2 && !staged && r >= 4;
        let group = if halves {
            "_g4h".to_string()
        } else if g == 1 && !staged {
            String::new()
        } else {
            format!("_g{g}")
        };
        let s = if staged { "s" } else { "" };
        (
            format!("gemv_bf16_{r}{s}{group}"),
            if staged { shared } else { 0 },
        )
    }

    /// `a[r, i] = silu(gu[r, i]) · gu[r, n + i]` for a fused gate|up projection of width 2n.
    pub fn silu_mul(
        &self,
        gu: &CudaView<f32>,
        a: &mut CudaViewMut<f32>,
        n: usize,
        rows: usize,
    ) -> Result<()> {
        check(gu.len() >= rows * 2 * n && a.len() >= rows * n, || {
            format!("silu_mul: buffers too small for {rows}×{n}")
        })?;
        let params = SiluMul {
            gu,
            a: a.slice_mut(..),
            n: n as i32,
        };
        let cfg = launch_cfg((blocks(n, 256), rows as u32), 256, 0);
        // SAFETY: as above.
        unsafe { self.run(Order::Overlapping, params, cfg) }?;
        Ok(())
    }

    /// Argmax of each row of `logits` (`rows × vocab`), ties to the lowest index.
    pub fn argmax_rows(
        &self,
        logits: &CudaView<f32>,
        vocab: usize,
        rows: usize,
        out: &mut CudaViewMut<i32>,
    ) -> Result<()> {
        check(logits.len() >= rows * vocab && out.len() >= rows, || {
            "argmax_rows: bad shapes".into()
        })?;
        let params = ArgmaxRows {
            logits,
            vocab: vocab as i32,
            out: out.slice_mut(..),
        };
        let cfg = launch_cfg((rows as u32, 1), 1024, 0);
        // SAFETY: as above.
        unsafe { self.run(Order::Overlapping, params, cfg) }?;
        Ok(())
    }

    /// Tap slot `t` of `taps` (`rows × t_count × hidden`) = `x` (`rows × hidden`).
    pub fn copy_taps(
        &self,
        x: &CudaView<f32>,
        taps: &mut CudaViewMut<f32>,
        rows: usize,
        hidden: usize,
        t_count: usize,
        t: usize,
    ) -> Result<()> {
        check(
            hidden.is_multiple_of(4)
                && t < t_count
                && x.len() >= rows * hidden
                && taps.len() >= rows * t_count * hidden,
            || format!("copy_taps: {rows} rows of {hidden} into slot {t} of {t_count}: bad shapes"),
        )?;
        if rows == 0 {
            return Ok(());
        }
        let params = CopyTaps {
            x,
            taps: taps.slice_mut(..),
            H: hidden as i32,
            T: t_count as i32,
            t: t as i32,
        };
        // SAFETY: argument types match the kernel; shapes checked above.
        unsafe { self.run(Order::Overlapping, params, row_blocks(rows)) }?;
        Ok(())
    }

    /// `y[q] = RMSNorm(x[q]; w[q mod w_rows])` for `rows` rows of `n` (`norm.w`: `w_rows × n`).
    pub fn rms_norm_rows(
        &self,
        x: &CudaView<f32>,
        norm: Norm,
        y: &mut CudaViewMut<f32>,
        shape: NormRows,
    ) -> Result<()> {
        let (Norm { w, eps }, NormRows { rows, n, w_rows }) = (norm, shape);
        check(
            n.is_multiple_of(4)
                && w_rows >= 1
                && w.len() == w_rows * n
                && x.len() >= rows * n
                && y.len() >= rows * n,
            || format!("rms_norm_rows: {rows} rows of {n} with {w_rows} weight rows: bad shapes"),
        )?;
        if rows == 0 {
            return Ok(());
        }
        let params = RmsNormRows {
            x,
            w,
            y: y.slice_mut(..),
            n: n as i32,
            W: w_rows as i32,
            eps,
        };
        // SAFETY: as above.
        unsafe { self.run(Order::Overlapping, params, row_blocks(rows)) }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::tests::{check, check_entry};

    #[test]
    fn every_launch_struct_follows_its_kernels_parameters() {
        check::<EmbedRows>();
        check::<Gemv>();
        check_entry::<Gemv>("gemv_bf16_1s");
        check::<GemvMma>();
        check::<SiluMul>();
        check::<ArgmaxRows>();
        check::<CopyTaps>();
        check::<RmsNormRows>();
    }

    #[test]
    fn tensor_core_gemv_slices_fill_one_wave_within_their_bounds() {
        // XS 2.1 on the H200's 132 SMs: q|k|v|g (10304 × 2048) in three slices of 704 columns
        // (243 blocks, one wave of 264), o_proj (2048 × 8192) in sixteen of 512, lm_head
        // (100352 × 2048) in two of 1024 (the staging bound).
        assert_eq!(mma_slice(10304, 2048, 132), (3, 704));
        assert_eq!(mma_slice(2048, 8192, 132), (16, 512));
        assert_eq!(mma_slice(100352, 2048, 132), (2, 1024));
        // Narrow inputs take one slice; every slice holds columns.
        assert_eq!(mma_slice(7, 8, 132), (1, 32));
        for (out, inp) in [(1000, 136), (33, 8184), (40, 12288), (513, 2048)] {
            let (s, ks) = mma_slice(out, inp, 132);
            assert!(ks <= 1024 && ks % 32 == 0 && (s - 1) * ks < inp && s * ks >= inp);
        }
    }
}
