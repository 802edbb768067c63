//! The tensor-core prefill kernels against their CPU twins on random inputs of awkward sizes,
//! plus determinism (same input twice -> same bits) and a timing run at the XS 2.1 shapes. These
//! need an NVIDIA GPU: they are `#[ignore]`d here and run on the GPU machine with `--ignored`.

use std::time::Instant;

use fastdecode_cpu::layers::{Attention, Linear, Mlp, Moe, Projected};
use fastdecode_cpu::ops;
use fastdecode_cuda::dense::{Accumulate, MatShape, Norm, RowShape};
use fastdecode_cuda::ops::{AttnShape, DevNvfp4, MoeLayer, MoeShape, Routing};
use fastdecode_cuda::prefill::{GroupedSplit, PrefillAttn};
use fastdecode_cuda::Gpu;
use fastdecode_model::config::{RopeParams, RopeScaling};
use fastdecode_model::rope::Rope;
use half::bf16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;
use common::{gpu, max_rel, moe_weights, quant_moe, rand_vec, to_bf16};

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// `xs` is exactly the split the GEMMs take of `v`: `[hi; lo]` with `hi = bf16(v)`,
/// `lo = bf16(v - hi)` (as `pf_split_rows` makes it).
fn assert_split_of(xs: &[bf16], v: &[f32], what: &str) {
    assert_eq!(xs.len(), 2 * v.len(), "{what}: split length");
    for (i, &x) in v.iter().enumerate() {
        let hi = bf16::from_f32(x);
        let lo = bf16::from_f32(x - hi.to_f32());
        assert_eq!(xs[i].to_bits(), hi.to_bits(), "{what}: hi at {i}");
        assert_eq!(xs[v.len() + i].to_bits(), lo.to_bits(), "{what}: lo at {i}");
    }
}

fn lin(w: Vec<f32>, out: usize, inp: usize) -> Linear {
    Linear { w, out, inp }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemm_bf16_tc_matches_cpu_and_is_deterministic() {
    let g = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut worst = 0f32;
    for (out, inp) in [(1000, 136), (7, 8), (513, 2048), (64, 1003)] {
        let w = to_bf16(&rand_vec(&mut rng, out * inp, 0.1));
        let wf: Vec<f32> = w.iter().map(|x| x.to_f32()).collect();
        let dw = g.stream.clone_htod(&w).unwrap();
        for rows in [1usize, 5, 37, 300] {
            let x = rand_vec(&mut rng, rows * inp, 1.0);
            let y0 = rand_vec(&mut rng, rows * out, 1.0);
            let dx = g.stream.clone_htod(&x).unwrap();
            let mut want = vec![0f32; rows * out];
            for r in 0..rows {
                ops::matvec(
                    &wf,
                    &x[r * inp..(r + 1) * inp],
                    &mut want[r * out..(r + 1) * out],
                );
            }
            let run = |acc: Accumulate| {
                let mut dy = g.stream.clone_htod(&y0).unwrap();
                g.gemm_bf16_tc(
                    &dw.as_view(),
                    &dx.as_view(),
                    &mut dy.as_view_mut(),
                    MatShape { out, inp, rows },
                    acc,
                )
                .unwrap();
                g.stream.clone_dtoh(&dy).unwrap()
            };
            let y = run(Accumulate::Overwrite);
            let e = max_rel(&y, &want);
            worst = worst.max(e);
            assert!(e < 1e-4, "gemm {out}x{inp} rows {rows}: max rel err {e}");
            assert!(
                same_bits(&y, &run(Accumulate::Overwrite)),
                "gemm {out}x{inp} rows {rows}: rerun differs"
            );
            let ya = run(Accumulate::Add);
            let want_a: Vec<f32> = want.iter().zip(&y0).map(|(a, b)| a + b).collect();
            let e = max_rel(&ya, &want_a);
            assert!(e < 1e-4, "gemm accumulate {out}x{inp} rows {rows}: {e}");
        }
    }
    println!("gemm_bf16_tc: worst max rel err {worst:.3e}");
    // Bad shapes are errors, not panics.
    let dw = g.stream.alloc_zeros::<bf16>(10).unwrap();
    let dx = g.stream.alloc_zeros::<f32>(10).unwrap();
    let mut dy = g.stream.alloc_zeros::<f32>(10).unwrap();
    assert!(g
        .gemm_bf16_tc(
            &dw.as_view(),
            &dx.as_view(),
            &mut dy.as_view_mut(),
            MatShape {
                out: 3,
                inp: 4,
                rows: 1
            },
            Accumulate::Overwrite,
        )
        .is_err());
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn rms_norm_split_matches_cpu_and_feeds_the_gemm_like_a_split_of_the_norm() {
    let g = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    for (rows, n) in [
        (1usize, 4usize),
        (3, 12),
        (17, 2052),
        (40, 136),
        (1, 2048),
        (5, 136),
        (17, 1000),
        (5, 256),
        (3, 2048),
    ] {
        let grouped = if n % 128 == 0 {
            GroupedSplit::Make
        } else {
            GroupedSplit::Skip
        };
        let x = rand_vec(&mut rng, rows * n, 3.0);
        let w = to_bf16(&rand_vec(&mut rng, n, 1.0));
        let wf: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
        let (dx, dw) = (
            g.stream.clone_htod(&x).unwrap(),
            g.stream.clone_htod(&w).unwrap(),
        );
        let mut dout = g.stream.alloc_zeros::<f32>(rows * n).unwrap();
        let split = g
            .rms_norm_split(
                &dx.as_view(),
                Norm {
                    w: &dw.as_view(),
                    eps: 1e-6,
                },
                Some(&mut dout.as_view_mut()),
                grouped,
                RowShape { rows, n },
            )
            .unwrap();
        let out = g.stream.clone_dtoh(&dout).unwrap();
        let xs = g.stream.clone_dtoh(&split.xs).unwrap();
        // The normed rows against the CPU's RMSNorm.
        let mut want = vec![0f32; rows * n];
        for r in 0..rows {
            ops::rms_norm(
                &x[r * n..(r + 1) * n],
                &wf,
                1e-6,
                &mut want[r * n..(r + 1) * n],
            );
        }
        let err = max_rel(&out, &want);
        assert!(err < 1e-5, "rms_norm_split {rows}x{n}: {err}");
        assert_split_of(&xs, &out, "rms_norm_split");
        // The grouped GEMMs' layout: columns c..c+4 of a 128-column block kb, as thread
        // t = (c % 128) / 32's k step s, at uint4 kb·32 + s·4 + t of the row: hi pairs, lo pairs.
        if let Some(p) = &split.perm {
            let p = g.stream.clone_dtoh(p).unwrap();
            let pair = |a: f32, b: f32| {
                u32::from(bf16::from_f32(a).to_bits())
                    | u32::from(bf16::from_f32(b).to_bits()) << 16
            };
            let low = |a: f32| a - bf16::from_f32(a).to_f32();
            for r in 0..rows {
                for c in (0..n).step_by(4) {
                    let v = &out[r * n + c..r * n + c + 4];
                    let (cc, rem) = (c % 128, c % 32);
                    let s = 2 * (rem / 8) + (rem % 8) / 4;
                    let u = r * n / 4 + (c / 128) * 32 + s * 4 + cc / 32;
                    let want = [
                        pair(v[0], v[1]),
                        pair(v[2], v[3]),
                        pair(low(v[0]), low(v[1])),
                        pair(low(v[2]), low(v[3])),
                    ];
                    assert_eq!(p[4 * u..4 * u + 4], want, "perm row {r} col {c}");
                }
            }
            // ... the very layout the MoE's own split makes of the normed rows.
            let own = g.split_perm(&dout.as_view(), n, rows).unwrap();
            assert_eq!(
                g.stream.clone_dtoh(&own).unwrap(),
                p,
                "{rows}x{n}: split_perm differs"
            );
        }
        // Without the normed rows, the same split.
        let xs2 = g
            .rms_norm_split(
                &dx.as_view(),
                Norm {
                    w: &dw.as_view(),
                    eps: 1e-6,
                },
                None,
                GroupedSplit::Skip,
                RowShape { rows, n },
            )
            .unwrap();
        assert_eq!(
            g.stream.clone_dtoh(&xs2.xs).unwrap(),
            xs,
            "{rows}x{n}: rerun differs"
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn moe_prefill_matches_cpu_and_is_deterministic() {
    let g = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    // Is != I; more tokens than one 64-token tile for some experts (expert 3's bias makes every
    // row pick it), none at all for others (very negative biases).
    let (e, k, hid, inter, sh) = (40usize, 4usize, 256usize, 128usize, 384usize);
    let (dev, [gq, uq, dq, sgq, suq, sdq]) = quant_moe(&g, &mut rng, (e, hid, inter, sh));
    let router: Vec<f32> = to_bf16(&rand_vec(&mut rng, e * hid, (3.0 / hid as f32).sqrt()))
        .iter()
        .map(|x| x.to_f32())
        .collect();
    let bias: Vec<f32> = (0..e)
        .map(|i| match i {
            3 => 5.0,
            i if i % 7 == 0 => -5.0,
            _ => rng.random_range(-0.05f32..0.05),
        })
        .collect();
    let moe = Moe {
        router: lin(router, e, hid),
        bias,
        experts: (0..e)
            .map(|x| Mlp {
                gate: lin(
                    gq[x * inter * hid..(x + 1) * inter * hid].to_vec(),
                    inter,
                    hid,
                ),
                up: lin(
                    uq[x * inter * hid..(x + 1) * inter * hid].to_vec(),
                    inter,
                    hid,
                ),
                down: lin(
                    dq[x * hid * inter..(x + 1) * hid * inter].to_vec(),
                    hid,
                    inter,
                ),
            })
            .collect(),
        shared: Mlp {
            gate: lin(sgq, sh, hid),
            up: lin(suq, sh, hid),
            down: lin(sdq, hid, sh),
        },
        top_k: k,
        routed_scaling: 2.5,
        norm_topk: true,
        softcap: 0.0,
    };
    let weights = moe_weights(&dev);
    let shape = MoeShape {
        experts: e,
        top_k: k,
        hidden: hid,
        inter,
        shared_inter: sh,
    };
    let mut worst = 0f32;
    for rows in [1usize, 5, 37, 300] {
        let xn = rand_vec(&mut rng, rows * hid, 1.0);
        let resid = rand_vec(&mut rng, rows * hid, 1.0);
        let dxn = g.stream.clone_htod(&xn).unwrap();
        // Routing on the host with the CPU twin (the GPU router has its own test).
        let (mut hids, mut hwts) = (vec![], vec![]);
        for r in 0..rows {
            for (eid, w) in moe.route(&xn[r * hid..(r + 1) * hid]) {
                hids.push(eid as i32);
                hwts.push(w);
            }
        }
        let (ids, wts) = (
            g.stream.clone_htod(&hids).unwrap(),
            g.stream.clone_htod(&hwts).unwrap(),
        );
        let run = || {
            let mut dx = g.stream.clone_htod(&resid).unwrap();
            g.moe_prefill(
                &MoeLayer {
                    w: weights,
                    shape,
                    scaling: 2.5,
                },
                &dxn.as_view(),
                Routing {
                    ids: &ids.as_view(),
                    wts: &wts.as_view(),
                },
                rows,
                &mut dx.as_view_mut(),
            )
            .unwrap();
            g.stream.clone_dtoh(&dx).unwrap()
        };
        let got = run();
        let mut want = vec![0f32; rows * hid];
        for r in 0..rows {
            let y = moe.forward(&xn[r * hid..(r + 1) * hid]);
            for (i, v) in y.iter().enumerate() {
                want[r * hid + i] = resid[r * hid + i] + v;
            }
        }
        let err = max_rel(&got, &want);
        worst = worst.max(err);
        assert!(err < 1e-4, "moe_prefill rows {rows}: max rel err {err}");
        assert!(
            same_bits(&got, &run()),
            "moe_prefill rows {rows}: rerun differs"
        );
    }
    println!("moe_prefill: worst max rel err {worst:.3e}");
    // Bad shapes are errors, not panics.
    let bad = MoeShape {
        hidden: 96,
        ..shape
    };
    let dxn = g.stream.alloc_zeros::<f32>(96).unwrap();
    let ids = g.stream.alloc_zeros::<i32>(k).unwrap();
    let wts = g.stream.alloc_zeros::<f32>(k).unwrap();
    let mut dx = g.stream.alloc_zeros::<f32>(96).unwrap();
    assert!(g
        .moe_prefill(
            &MoeLayer {
                w: weights,
                shape: bad,
                scaling: 1.0
            },
            &dxn.as_view(),
            Routing {
                ids: &ids.as_view(),
                wts: &wts.as_view()
            },
            1,
            &mut dx.as_view_mut(),
        )
        .is_err());
}

fn identity(n: usize) -> Linear {
    let mut w = vec![0f32; n * n];
    for i in 0..n {
        w[i * n + i] = 1.0;
    }
    lin(w, n, n)
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn attend_prefill_matches_cpu_and_is_deterministic() {
    let g = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let rope = Rope::new(
        &RopeParams {
            theta: 1e4,
            partial_rotary_factor: 1.0,
            scaling: RopeScaling::Default,
        },
        32,
    );
    let mut worst = 0f32;
    // (heads, kv_heads, d, window, first position, rows)
    for (heads, kv_heads, d, window, p0, rows) in [
        (6usize, 2usize, 128usize, 13usize, 50usize, 37usize),
        (6, 2, 128, 0, 0, 300),
        (8, 1, 64, 100, 7, 300),
        (4, 2, 32, 0, 2000, 37),
        (6, 1, 64, 0, 3, 1),
        (3, 3, 32, 5, 0, 5),
    ] {
        let attn = Attention {
            q: identity(1),
            k: identity(1),
            v: identity(1),
            o: identity(heads * d),
            g: identity(1),
            q_norm: vec![],
            k_norm: vec![],
            heads,
            kv_heads,
            head_dim: d,
            rope: rope.clone(),
            window: (window > 0).then_some(window),
        };
        let kvd = kv_heads * d;
        let total = p0 + rows;
        // A ring (sliding layers) holds the window plus the chunk; full layers keep every position.
        let ring = if window > 0 { window + rows } else { 0 };
        let slots = if ring > 0 { ring } else { total };
        let keys: Vec<Vec<f32>> = (0..total).map(|_| rand_vec(&mut rng, kvd, 2.0)).collect();
        let vals: Vec<Vec<f32>> = (0..total).map(|_| rand_vec(&mut rng, kvd, 1.0)).collect();
        let (mut ck, mut cv) = (vec![0f32; slots * kvd], vec![0f32; slots * kvd]);
        for p in 0..total {
            let s = if ring > 0 { p % ring } else { p };
            ck[s * kvd..(s + 1) * kvd].copy_from_slice(&keys[p]);
            cv[s * kvd..(s + 1) * kvd].copy_from_slice(&vals[p]);
        }
        let q = rand_vec(&mut rng, rows * heads * d, 1.5);
        let gl = rand_vec(&mut rng, rows * heads, 3.0);
        // The gate logits sit strided, as at the tail of the fused projection rows; the gaps
        // hold values that would show if they were read.
        let gstride = heads + 5;
        let mut gpad = vec![1e30f32; rows * gstride];
        for r in 0..rows {
            gpad[r * gstride..r * gstride + heads].copy_from_slice(&gl[r * heads..(r + 1) * heads]);
        }
        let pos: Vec<i32> = (p0..total).map(|p| p as i32).collect();
        let (dq, dck, dcv, dg, dpos) = (
            g.stream.clone_htod(&q).unwrap(),
            g.stream.clone_htod(&ck).unwrap(),
            g.stream.clone_htod(&cv).unwrap(),
            g.stream.clone_htod(&gpad).unwrap(),
            g.stream.clone_htod(&pos).unwrap(),
        );
        // The key positions the rows see: the first row's window through the last row.
        let seen = attn.first_visible(p0)..total;
        let views = (
            dq.as_view(),
            dck.as_view(),
            dcv.as_view(),
            dg.as_view(),
            dpos.as_view(),
        );
        // The kernels' inputs, for attend_prefill and attend_prefill_split alike.
        let inputs = || PrefillAttn {
            q: &views.0,
            ck: &views.1,
            cv: &views.2,
            g: &views.3,
            g_stride: gstride,
            pos: &views.4,
            shape: AttnShape {
                heads,
                kv_heads,
                head_dim: d,
                window,
                ring,
            },
            rows,
            keys: seen.clone(),
        };
        let run = || {
            let mut dout = g.stream.alloc_zeros::<f32>(rows * heads * d).unwrap();
            g.attend_prefill(inputs(), &mut dout.as_view_mut()).unwrap();
            g.stream.clone_dtoh(&dout).unwrap()
        };
        let got = run();
        let mut want = vec![0f32; rows * heads * d];
        for r in 0..rows {
            let p = p0 + r;
            let proj = Projected {
                q: q[r * heads * d..(r + 1) * heads * d].to_vec(),
                k: vec![],
                v: vec![],
                gate: gl[r * heads..(r + 1) * heads]
                    .iter()
                    .map(|&x| ops::softplus(x))
                    .collect(),
            };
            let kv: Vec<(&[f32], &[f32])> = (attn.first_visible(p)..=p)
                .map(|j| (keys[j].as_slice(), vals[j].as_slice()))
                .collect();
            want[r * heads * d..(r + 1) * heads * d].copy_from_slice(&attn.attend(&proj, &kv));
        }
        let err = max_rel(&got, &want);
        worst = worst.max(err);
        assert!(
            err < 1e-4,
            "attend_prefill heads {heads}/{kv_heads} d {d} window {window} rows {rows}: {err}"
        );
        assert!(same_bits(&got, &run()), "attend_prefill: rerun differs");
        // The split output (the o_proj GEMM's input) is exactly hi/lo of those rows.
        let xs = g.attend_prefill_split(inputs()).unwrap();
        assert_split_of(
            &g.stream.clone_dtoh(&xs).unwrap(),
            &got,
            "attend_prefill_split",
        );
    }
    println!("attend_prefill: worst max rel err {worst:.3e}");
    let z = g.stream.alloc_zeros::<f32>(64).unwrap();
    let zp = g.stream.alloc_zeros::<i32>(1).unwrap();
    let mut out = g.stream.alloc_zeros::<f32>(64).unwrap();
    assert!(g
        .attend_prefill(
            PrefillAttn {
                q: &z.as_view(),
                ck: &z.as_view(),
                cv: &z.as_view(),
                g: &z.as_view(),
                g_stride: 1,
                pos: &zp.as_view(),
                shape: AttnShape {
                    heads: 1,
                    kv_heads: 1,
                    head_dim: 48,
                    window: 0,
                    ring: 0
                },
                rows: 1,
                keys: 0..1
            },
            &mut out.as_view_mut(),
        )
        .is_err());
}

/// Mean wall time of `f` over `n` runs after one warm-up, in ms (the stream synchronised).
fn time_ms(g: &Gpu, n: usize, mut f: impl FnMut()) -> f64 {
    f();
    g.stream.synchronize().unwrap();
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    g.stream.synchronize().unwrap();
    t.elapsed().as_secs_f64() * 1e3 / n as f64
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn prefill_kernels_timing_xs_shapes() {
    let g = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(14);
    let rows = 512usize;
    let mut total = 0f64;
    for (out, inp) in [
        (10304usize, 2048usize),
        (2048, 8192),
        (256, 2048),
        (8192, 2048),
    ] {
        let w: Vec<bf16> = (0..out * inp)
            .map(|_| bf16::from_f32(rng.random_range(-0.05f32..0.05)))
            .collect();
        let dw = g.stream.clone_htod(&w).unwrap();
        let dx = g
            .stream
            .clone_htod(&rand_vec(&mut rng, rows * inp, 1.0))
            .unwrap();
        let mut dy = g.stream.alloc_zeros::<f32>(rows * out).unwrap();
        let ms = time_ms(&g, 20, || {
            g.gemm_bf16_tc(
                &dw.as_view(),
                &dx.as_view(),
                &mut dy.as_view_mut(),
                MatShape { out, inp, rows },
                Accumulate::Overwrite,
            )
            .unwrap()
        });
        let tflops = 2.0 * 2.0 * (rows * out * inp) as f64 / (ms * 1e-3) / 1e12;
        println!(
            "gemm_bf16_tc rows {rows} out {out} in {inp}: {ms:.4} ms, {tflops:.1} TFLOP/s (hi+lo, counted twice)"
        );
    }
    // MoE at XS 2.1: E 256, k 8, H 2048, I = Is = 512; random codes and sane scales.
    let (e, k, hid, inter) = (256usize, 8usize, 2048usize, 512usize);
    let mut nv = |n_rows: usize, cols: usize| DevNvfp4 {
        codes: g
            .stream
            .clone_htod(
                &(0..n_rows * cols / 8)
                    .map(|_| rng.random::<u32>())
                    .collect::<Vec<_>>(),
            )
            .unwrap(),
        scales: g
            .stream
            .clone_htod(
                &(0..n_rows * cols / 16)
                    .map(|_| rng.random_range(0x20u8..0x38))
                    .collect::<Vec<_>>(),
            )
            .unwrap(),
    };
    // Routed gate, up, down, then the shared expert's, drawn in that order.
    let dev = [
        nv(e * inter, hid),
        nv(e * inter, hid),
        nv(e * hid, inter),
        nv(inter, hid),
        nv(inter, hid),
        nv(hid, inter),
    ];
    let weights = moe_weights(&dev);
    let shape = MoeShape {
        experts: e,
        top_k: k,
        hidden: hid,
        inter,
        shared_inter: inter,
    };
    // A short chunk (weight streaming dominates) and the full one.
    for n in [64usize, rows] {
        let mut ids = vec![];
        for _ in 0..n {
            let mut chosen: Vec<i32> = vec![];
            while chosen.len() < k {
                let c = rng.random_range(0..e as i32);
                if !chosen.contains(&c) {
                    chosen.push(c);
                }
            }
            chosen.sort_unstable();
            ids.extend(chosen);
        }
        let wts: Vec<f32> = (0..n * k).map(|_| rng.random_range(0.0f32..0.25)).collect();
        let (dids, dwts) = (
            g.stream.clone_htod(&ids).unwrap(),
            g.stream.clone_htod(&wts).unwrap(),
        );
        let dxn = g
            .stream
            .clone_htod(&rand_vec(&mut rng, n * hid, 1.0))
            .unwrap();
        let mut dx = g.stream.alloc_zeros::<f32>(n * hid).unwrap();
        let ms = time_ms(&g, 20, || {
            g.moe_prefill(
                &MoeLayer {
                    w: weights,
                    shape,
                    scaling: 2.5,
                },
                &dxn.as_view(),
                Routing {
                    ids: &dids.as_view(),
                    wts: &dwts.as_view(),
                },
                n,
                &mut dx.as_view_mut(),
            )
            .unwrap()
        });
        let bytes = ((e + 1) * 3 * inter * hid) as f64 * (0.5 + 1.0 / 16.0);
        let flops = 2.0 * 2.0 * ((n * k + n) * 3 * inter * hid) as f64;
        if n == rows {
            total = ms;
        }
        println!(
            "moe_prefill rows {n} E {e} k {k} H {hid} I {inter}: {ms:.4} ms, {:.0} GB/s of expert weights, {:.1} TFLOP/s (hi+lo)",
            bytes / (ms * 1e-3) / 1e9,
            flops / (ms * 1e-3) / 1e12
        );
    }
    // Attention at XS 2.1: 64 heads (and 48), 8 kv heads, d 128, positions 0..512, window 512 or all.
    for (heads, window) in [(64usize, 512usize), (64, 0), (48, 512)] {
        let (kvh, d) = (8usize, 128usize);
        let dq = g
            .stream
            .clone_htod(&rand_vec(&mut rng, rows * heads * d, 1.0))
            .unwrap();
        let dck = g
            .stream
            .clone_htod(&rand_vec(&mut rng, rows * kvh * d, 2.0))
            .unwrap();
        let dcv = g
            .stream
            .clone_htod(&rand_vec(&mut rng, rows * kvh * d, 1.0))
            .unwrap();
        let dg = g
            .stream
            .clone_htod(&rand_vec(&mut rng, rows * heads, 1.0))
            .unwrap();
        let dpos = g
            .stream
            .clone_htod(&(0..rows as i32).collect::<Vec<_>>())
            .unwrap();
        let mut dout = g.stream.alloc_zeros::<f32>(rows * heads * d).unwrap();
        let ms = time_ms(&g, 20, || {
            g.attend_prefill(
                PrefillAttn {
                    q: &dq.as_view(),
                    ck: &dck.as_view(),
                    cv: &dcv.as_view(),
                    g: &dg.as_view(),
                    g_stride: heads,
                    pos: &dpos.as_view(),
                    shape: AttnShape {
                        heads,
                        kv_heads: kvh,
                        head_dim: d,
                        window,
                        ring: 0,
                    },
                    rows,
                    keys: 0..rows,
                },
                &mut dout.as_view_mut(),
            )
            .unwrap()
        });
        // Causal pairs (the window covers the whole chunk), q·k and P·v, three products each.
        let pairs = (rows * (rows + 1) / 2) as f64;
        let flops = pairs * heads as f64 * d as f64 * 2.0 * 2.0 * 3.0;
        println!(
            "attend_prefill rows {rows} heads {heads}/{kvh} d {d} window {window}: {ms:.4} ms, {:.1} TFLOP/s (3 products)",
            flops / (ms * 1e-3) / 1e12
        );
    }
    println!("(moe per layer: {total:.4} ms)");
}
