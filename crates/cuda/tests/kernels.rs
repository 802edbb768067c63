//! GPU kernels against their CPU twins on random inputs of awkward sizes, plus determinism and
//! batch invariance. These need an NVIDIA GPU: they are `#[ignore]`d here and run on the GPU
//! machine with `--ignored` (see `tools/gpu/check.sh`).

use fastdecode_cpu::ops;
use fastdecode_cuda::dense::{Accumulate, MatShape, Norm, NormRows};
use fastdecode_cuda::Gpu;
use half::bf16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;
use common::{gpu, max_rel, moe_weights, quant_moe, rand_vec, to_bf16};

#[test]
fn no_gpu_is_an_error_not_a_panic() {
    // On a machine without a GPU this is the clear error; on a GPU machine it opens.
    match Gpu::open(0) {
        Ok(g) => assert!(!g.name.is_empty()),
        Err(e) => {
            let m = e.to_string();
            assert!(
                m.contains("driver")
                    || m.contains("device")
                    || m.contains("NVRTC")
                    || m.contains("headers"),
                "{m}"
            );
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemv_bf16_matches_cpu_and_is_batch_invariant() {
    let g = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    // Widths for each way the single-row GEMV stages x: normed up to 2048 (norm words loaded
    // before the wait) and wider, plain up to 8192 (float4s at once, 8184 leaving some threads
    // idle) and wider. 12288 columns (one row) and 6 rows of 2048 (staged) need exactly 48 KiB
    // of dynamic shared memory, which with the kernels' static arrays passes the default cap.
    for (out, inp) in [
        (1000, 136),
        (7, 8),
        (513, 2048),
        (33, 8184),
        (64, 8200),
        (40, 12288),
    ] {
        let w = to_bf16(&rand_vec(&mut rng, out * inp, 0.1));
        let wf: Vec<f32> = w.iter().map(|x| x.to_f32()).collect();
        let dw = g.stream.clone_htod(&w).unwrap();
        let nw = to_bf16(&rand_vec(&mut rng, inp, 1.0));
        let nwf: Vec<f32> = nw.iter().map(|x| x.to_f32()).collect();
        let dnw = g.stream.clone_htod(&nw).unwrap();
        // Every multi-row GEMV dense.rs picks for these shapes (the column-owned kernel for
        // inputs up to 2048; for wider ones weight rows in fours, pairs or ones per warp, normed
        // rows staged or too wide to stage, plain pairs as fours over half of the rows) and the
        // tensor-core kernel (`mma`) must give the one-row bits of its kernel.
        for (normed, mma) in [false, true]
            .into_iter()
            .flat_map(|n| [(n, false), (n, true)])
        {
            g.dense_mma.store(mma, std::sync::atomic::Ordering::Relaxed);
            for rows in [1usize, 3, 6, 16, 37] {
                let x = rand_vec(&mut rng, rows * inp, 2.0);
                let dx = g.stream.clone_htod(&x).unwrap();
                let norm = normed.then(|| (dnw.as_view(), 1e-6f32));
                let run = |dx: &cudarc::driver::CudaSlice<f32>, rows: usize| {
                    let mut dy = g.stream.alloc_zeros::<f32>(rows * out).unwrap();
                    g.gemv_bf16(
                        &dw.as_view(),
                        &dx.as_view(),
                        norm.as_ref().map(|(v, e)| Norm { w: v, eps: *e }),
                        &mut dy.as_view_mut(),
                        MatShape { out, inp, rows },
                        Accumulate::Overwrite,
                    )
                    .unwrap();
                    (g.stream.clone_dtoh(&dy).unwrap(), dy)
                };
                let (y, mut dy) = run(&dx, rows);
                let mut want = vec![0f32; rows * out];
                for r in 0..rows {
                    let xr = &x[r * inp..(r + 1) * inp];
                    let mut xn = xr.to_vec();
                    if normed {
                        ops::rms_norm(xr, &nwf, 1e-6, &mut xn);
                    }
                    ops::matvec(&wf, &xn, &mut want[r * out..(r + 1) * out]);
                }
                let e = max_rel(&y, &want);
                assert!(
                    e < 1e-5,
                    "gemv {out}x{inp} rows {rows} norm {normed} mma {mma}: max rel err {e}"
                );
                // Each row alone gives the same bits as inside the batch.
                for r in [0, rows / 2, rows - 1] {
                    let dx1 = g.stream.clone_htod(&x[r * inp..(r + 1) * inp]).unwrap();
                    let (y1, _) = run(&dx1, 1);
                    assert!(
                        y1 == y[r * out..(r + 1) * out],
                        "row {r} of {rows} depends on the row count (norm {normed}, mma {mma})"
                    );
                }
                // Accumulate mode adds onto y; and a rerun is bit-identical.
                g.gemv_bf16(
                    &dw.as_view(),
                    &dx.as_view(),
                    norm.as_ref().map(|(v, e)| Norm { w: v, eps: *e }),
                    &mut dy.as_view_mut(),
                    MatShape { out, inp, rows },
                    Accumulate::Add,
                )
                .unwrap();
                let y2 = g.stream.clone_dtoh(&dy).unwrap();
                assert!(y2.iter().zip(&y).all(|(a, b)| *a == b + b), "accumulate");
            }
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn embed_and_argmax_match_cpu() {
    let g = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    // Embedding gather is exact.
    let (vocab, hidden) = (300, 72);
    let e = to_bf16(&rand_vec(&mut rng, vocab * hidden, 1.0));
    let toks: Vec<i32> = (0..11).map(|_| rng.random_range(0..vocab as i32)).collect();
    let de = g.stream.clone_htod(&e).unwrap();
    let dt = g.stream.clone_htod(&toks).unwrap();
    let mut dx = g.stream.alloc_zeros::<f32>(toks.len() * hidden).unwrap();
    g.embed_rows(&de, &dt.as_view(), &mut dx, hidden).unwrap();
    let x = g.stream.clone_dtoh(&dx).unwrap();
    for (r, &t) in toks.iter().enumerate() {
        for i in 0..hidden {
            assert_eq!(x[r * hidden + i], e[t as usize * hidden + i].to_f32());
        }
    }
    // Argmax equals the CPU's, including ties (lowest index wins).
    for vocab in [1usize, 255, 100352] {
        let rows = 4;
        let mut l = rand_vec(&mut rng, rows * vocab, 10.0);
        if vocab > 10 {
            l[7] = 100.0;
            l[9] = 100.0; // a tie in row 0
        }
        let dl = g.stream.clone_htod(&l).unwrap();
        let mut dout = g.stream.alloc_zeros::<i32>(rows).unwrap();
        g.argmax_rows(&dl.as_view(), vocab, rows, &mut dout.as_view_mut())
            .unwrap();
        let got = g.stream.clone_dtoh(&dout).unwrap();
        for r in 0..rows {
            assert_eq!(
                got[r] as usize,
                ops::argmax(&l[r * vocab..(r + 1) * vocab]),
                "vocab {vocab} row {r}"
            );
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn drafter_context_kernels_match_cpu() {
    let g = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    // RMSNorm of each row with the weight rows in turn (the drafter's aux norms: W taps), and
    // with one weight (its hidden_norm), at awkward widths and row counts.
    for (n, rows, w_rows) in [
        (136usize, 1usize, 1usize),
        (136, 5, 3),
        (2048, 17, 5),
        (4, 3, 2),
    ] {
        let x = rand_vec(&mut rng, rows * n, 3.0);
        let w = to_bf16(&rand_vec(&mut rng, w_rows * n, 1.0));
        let wf: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
        let (dx, dw) = (
            g.stream.clone_htod(&x).unwrap(),
            g.stream.clone_htod(&w).unwrap(),
        );
        let mut dy = g.stream.alloc_zeros::<f32>(rows * n).unwrap();
        g.rms_norm_rows(
            &dx.as_view(),
            Norm {
                w: &dw.as_view(),
                eps: 1e-6,
            },
            &mut dy.as_view_mut(),
            NormRows { rows, n, w_rows },
        )
        .unwrap();
        let y = g.stream.clone_dtoh(&dy).unwrap();
        let mut want = vec![0f32; rows * n];
        for q in 0..rows {
            let wq = &wf[(q % w_rows) * n..(q % w_rows + 1) * n];
            ops::rms_norm(
                &x[q * n..(q + 1) * n],
                wq,
                1e-6,
                &mut want[q * n..(q + 1) * n],
            );
        }
        let e = max_rel(&y, &want);
        assert!(
            e < 1e-5,
            "rms_norm_rows n {n} rows {rows} W {w_rows}: max rel err {e}"
        );
    }
    // Tap slots are exact copies, every other slot untouched.
    let (rows, h, t_count) = (7usize, 72usize, 3usize);
    let x = rand_vec(&mut rng, rows * h, 1.0);
    let dx = g.stream.clone_htod(&x).unwrap();
    let poison = vec![-7.5f32; rows * t_count * h];
    let mut dt = g.stream.clone_htod(&poison).unwrap();
    g.copy_taps(&dx.as_view(), &mut dt.as_view_mut(), rows, h, t_count, 1)
        .unwrap();
    let t = g.stream.clone_dtoh(&dt).unwrap();
    for r in 0..rows {
        for slot in 0..t_count {
            let got = &t[(r * t_count + slot) * h..(r * t_count + slot + 1) * h];
            if slot == 1 {
                assert_eq!(got, &x[r * h..(r + 1) * h], "row {r}");
            } else {
                assert!(
                    got.iter().all(|&v| v == -7.5),
                    "row {r} slot {slot} was written"
                );
            }
        }
    }
}

use fastdecode_cpu::layers::{Attention, Linear, Mlp, Moe, Projected};
use fastdecode_model::config::{RopeParams, RopeScaling, YarnParams};
use fastdecode_model::rope::Rope;

fn linear(rng: &mut ChaCha8Rng, out: usize, inp: usize) -> Linear {
    // bf16-representable weights so the GPU's bf16 copy is exact.
    let w: Vec<f32> = rand_vec(rng, out * inp, (3.0 / inp as f32).sqrt())
        .iter()
        .map(|&x| bf16::from_f32(x).to_f32())
        .collect();
    Linear { w, out, inp }
}

fn identity(n: usize) -> Linear {
    let mut w = vec![0f32; n * n];
    for i in 0..n {
        w[i * n + i] = 1.0;
    }
    Linear { w, out: n, inp: n }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn attention_matches_cpu_for_sliding_ring_and_full_yarn_and_is_batch_invariant() {
    use fastdecode_cuda::ops::{AttnRows, AttnShape, DevRope, ATT_SPLITS};
    let g = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let yarn = RopeParams {
        theta: 5e5,
        partial_rotary_factor: 0.5,
        scaling: RopeScaling::Yarn(YarnParams {
            factor: 32.0,
            original_max_position_embeddings: 1024,
            beta_fast: 64.0,
            beta_slow: 1.0,
            attention_factor: None,
            truncate: true,
        }),
    };
    let default = RopeParams {
        theta: 1e4,
        partial_rotary_factor: 1.0,
        scaling: RopeScaling::Default,
    };
    // (heads, kv heads, head_dim, rope, window, positions): GQA groups 3, 8 and 1; a window
    // smaller than a tile and one larger; full contexts of one tile per split and, past
    // ATT_SPLITS · ATT_TILE = 1024 keys, of two.
    let cases = [
        (6usize, 2usize, 64usize, &default, 13usize, 80usize),
        (6, 2, 64, &yarn, 0, 600),
        (8, 2, 64, &yarn, 0, 1100),
        (16, 2, 128, &yarn, 0, 300),
        (8, 8, 32, &default, 40, 120),
    ];
    for (heads, kv_heads, d, params, window, total) in cases {
        let rope = Rope::new(params, d);
        let attn = Attention {
            q: identity(heads * d),
            k: identity(kv_heads * d),
            v: identity(kv_heads * d),
            o: identity(heads * d),
            g: identity(heads),
            q_norm: (0..d)
                .map(|i| bf16::from_f32(1.0 + 0.01 * i as f32).to_f32())
                .collect(),
            k_norm: (0..d)
                .map(|i| bf16::from_f32(0.9 + 0.02 * i as f32).to_f32())
                .collect(),
            heads,
            kv_heads,
            head_dim: d,
            rope: rope.clone(),
            window: (window > 0).then_some(window),
        };
        let kvd = kv_heads * d;
        let shape = AttnShape {
            heads,
            kv_heads,
            head_dim: d,
            window,
            ring: if window > 0 { window + 16 } else { 0 },
        };
        let width = shape.width();
        let raw = rand_vec(&mut rng, total * width, 2.0);
        let drope = DevRope {
            inv_freq: g.stream.clone_htod(&rope.inv_freq).unwrap(),
            rot_dim: rope.rotary_dim,
            scaling: rope.attention_scaling,
        };
        let dqn = g.stream.clone_htod(&to_bf16(&attn.q_norm)).unwrap();
        let dkn = g.stream.clone_htod(&to_bf16(&attn.k_norm)).unwrap();
        let slots = if shape.ring > 0 { shape.ring } else { total };
        // Runs the positions in launches of the given sizes; returns the outputs and the cache.
        let run = |sizes: &[usize]| {
            let mut ck = g.stream.alloc_zeros::<f32>(slots * kvd).unwrap();
            let mut cv = g.stream.alloc_zeros::<f32>(slots * kvd).unwrap();
            let mut part = g
                .stream
                .alloc_zeros::<f32>(16 * heads * ATT_SPLITS * (d + 2))
                .unwrap();
            let mut counters = g.stream.alloc_zeros::<u32>(16 * kv_heads).unwrap();
            let mut out = vec![];
            let mut p0 = 0;
            for &n in sizes {
                let n = n.min(total - p0);
                if n == 0 {
                    break;
                }
                let dq = g
                    .stream
                    .clone_htod(&raw[p0 * width..(p0 + n) * width])
                    .unwrap();
                let pos: Vec<i32> = (p0..p0 + n).map(|p| p as i32).collect();
                let dpos = g.stream.clone_htod(&pos).unwrap();
                let mut dout = g.stream.alloc_zeros::<f32>(n * heads * d).unwrap();
                g.attend_decode(
                    AttnRows {
                        qkvg: &dq.as_view(),
                        pos: &dpos.as_view(),
                        q_norm: &dqn,
                        k_norm: &dkn,
                        eps: 1e-6,
                        rope: &drope,
                        shape,
                        rows: n,
                    },
                    &mut ck,
                    &mut cv,
                    &mut part,
                    &mut counters,
                    &mut dout.as_view_mut(),
                )
                .unwrap();
                out.extend(g.stream.clone_dtoh(&dout).unwrap());
                p0 += n;
            }
            (out, g.stream.clone_dtoh(&ck).unwrap())
        };
        let mixed: Vec<usize> = [16usize, 5, 1, 16, 9, 3, 16, 2]
            .iter()
            .cycle()
            .take(total)
            .copied()
            .collect();
        let (single, _) = run(&vec![1; total]);
        // Multi-row launches' splits merged by a kernel of their own (attend_merge).
        let (out, _) = run(&mixed);
        assert!(
            out == single,
            "heads {heads}/{kv_heads} window {window}: a row's output depends on the launch's \
             other rows"
        );
        let (again, _) = run(&mixed);
        assert!(out == again, "attend_decode is not deterministic");
        let out = single;
        // CPU reference: its own q/k norm + RoPE, raw v, the softplus gate.
        let (mut cpu_k, mut cpu_v) = (vec![], vec![]);
        for p in 0..total {
            let row = &raw[p * width..(p + 1) * width];
            let mut k = row[heads * d..heads * d + kvd].to_vec();
            attn.norm_rope_heads(&mut k, &attn.k_norm, 1e-6, p);
            cpu_k.push(k);
            cpu_v.push(row[heads * d + kvd..heads * d + 2 * kvd].to_vec());
        }
        for p in 0..total {
            let row = &raw[p * width..(p + 1) * width];
            let mut q = row[..heads * d].to_vec();
            attn.norm_rope_heads(&mut q, &attn.q_norm, 1e-6, p);
            let proj = Projected {
                q,
                k: vec![],
                v: vec![],
                gate: row[heads * d + 2 * kvd..]
                    .iter()
                    .map(|&x| fastdecode_cpu::ops::softplus(x))
                    .collect(),
            };
            let keys: Vec<(&[f32], &[f32])> = (attn.first_visible(p)..=p)
                .map(|j| (cpu_k[j].as_slice(), cpu_v[j].as_slice()))
                .collect();
            let want = attn.attend(&proj, &keys);
            let e = max_rel(&out[p * heads * d..(p + 1) * heads * d], &want);
            assert!(
                e < 2e-5,
                "attend heads {heads}/{kv_heads} d {d} window {window} position {p}: {e}"
            );
        }
        // The prefill path's cache writes are bit-identical to the decode path's, and its
        // queries match the CPU's.
        let n = 16.min(total);
        let (_, cache_decode) = run(&[n]);
        let dq = g.stream.clone_htod(&raw[..n * width]).unwrap();
        let pos: Vec<i32> = (0..n as i32).collect();
        let dpos = g.stream.clone_htod(&pos).unwrap();
        let mut q_out = g.stream.alloc_zeros::<f32>(n * heads * d).unwrap();
        let mut ck = g.stream.alloc_zeros::<f32>(slots * kvd).unwrap();
        let mut cv = g.stream.alloc_zeros::<f32>(slots * kvd).unwrap();
        g.qk_norm_rope_store(
            AttnRows {
                qkvg: &dq.as_view(),
                pos: &dpos.as_view(),
                q_norm: &dqn,
                k_norm: &dkn,
                eps: 1e-6,
                rope: &drope,
                shape,
                rows: n,
            },
            &mut q_out.as_view_mut(),
            &mut ck,
            &mut cv,
        )
        .unwrap();
        let cache_prefill = g.stream.clone_dtoh(&ck).unwrap();
        assert!(
            cache_prefill[..n * kvd] == cache_decode[..n * kvd],
            "qk_norm_rope_store and attend_decode write different keys"
        );
        let gq = g.stream.clone_dtoh(&q_out).unwrap();
        for p in 0..n {
            let mut q = raw[p * width..p * width + heads * d].to_vec();
            attn.norm_rope_heads(&mut q, &attn.q_norm, 1e-6, p);
            let e = max_rel(&gq[p * heads * d..(p + 1) * heads * d], &q);
            assert!(e < 2e-6, "qk_norm_rope_store q at {p}: {e}");
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn moe_kernels_match_cpu_and_are_batch_invariant() {
    use fastdecode_cuda::knobs::MoeKernel;
    use fastdecode_cuda::ops::{
        MoeLayer, MoeShape, RouterOut, RouterWeights, Routing, TopK, MAX_ROWS,
    };
    let g = gpu();
    // (experts, top-k, hidden, intermediate, shared intermediate): awkward small sizes with more
    // experts than a warp and biases that make every selection key negative; then the XS 2.1
    // widths (2048 / 512, top-8) with fewer experts; then more experts than the step router's
    // block has threads (its bounded candidate search and two rounds of listing).
    for (e, k, hid, inter, sh) in [
        (100usize, 3usize, 96usize, 64usize, 32usize),
        (24, 8, 2048, 512, 512),
        (300, 8, 64, 32, 32),
    ] {
        let mut rng = ChaCha8Rng::seed_from_u64(4 + hid as u64);
        let (dev, [gq, uq, dq, sgq, suq, sdq]) = quant_moe(&g, &mut rng, (e, hid, inter, sh));
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let router = linear(&mut rng, e, hid);
        let bias: Vec<f32> = rand_vec(&mut rng, e, 0.05)
            .iter()
            .map(|b| b - 1.5)
            .collect();
        let norm = to_bf16(&rand_vec(&mut rng, hid, 1.0));
        let normf: Vec<f32> = norm.iter().map(|x| x.to_f32()).collect();
        let lin = |w: &[f32], out: usize, inp: usize| Linear {
            w: w.to_vec(),
            out,
            inp,
        };
        let moe = Moe {
            router: Linear {
                w: router.w.clone(),
                out: e,
                inp: hid,
            },
            bias: bias.clone(),
            experts: (0..e)
                .map(|x| Mlp {
                    gate: lin(&gq[x * inter * hid..(x + 1) * inter * hid], inter, hid),
                    up: lin(&uq[x * inter * hid..(x + 1) * inter * hid], inter, hid),
                    down: lin(&dq[x * hid * inter..(x + 1) * hid * inter], hid, inter),
                })
                .collect(),
            shared: Mlp {
                gate: lin(&sgq, sh, hid),
                up: lin(&suq, sh, hid),
                down: lin(&sdq, hid, sh),
            },
            top_k: k,
            routed_scaling: 2.5,
            norm_topk: true,
            softcap: 0.0,
        };
        let shape = MoeShape {
            hidden: hid,
            experts: e,
            top_k: k,
            inter,
            shared_inter: sh,
        };
        let moe_layer = MoeLayer {
            w: moe_weights(&dev),
            shape,
            scaling: 2.5,
        };
        let drouter = g.stream.clone_htod(&to_bf16(&router.w)).unwrap();
        let dbias = g.stream.clone_htod(&bias).unwrap();
        let dnorm = g.stream.clone_htod(&norm).unwrap();
        // A zero per row (the router's blocks of a row count themselves there).
        let mut counter = g.stream.alloc_zeros::<u32>(MAX_ROWS).unwrap();
        // The MoE half of a layer on `rows` rows: router, gate/up, down + residual. Returns the
        // new x, the ids and weights, and the router logits.
        let mut layer = |x: &[f32], rows: usize, kernel: MoeKernel| {
            let mut dx = g.stream.clone_htod(x).unwrap();
            let mut xn = g.stream.alloc_zeros::<f32>(rows * hid).unwrap();
            let mut logits = g.stream.alloc_zeros::<f32>(rows * e).unwrap();
            let mut ids = g.stream.alloc_zeros::<i32>(rows * k).unwrap();
            let mut wts = g.stream.alloc_zeros::<f32>(rows * k).unwrap();
            let mut h = g
                .stream
                .alloc_zeros::<f32>(rows * (k + 1) * shape.slot_width())
                .unwrap();
            g.router(
                &dx.as_view(),
                RouterWeights {
                    norm: &dnorm,
                    eps: 1e-6,
                    w: &drouter,
                },
                TopK {
                    bias: &dbias,
                    norm_topk: true,
                    softcap: 0.0,
                },
                shape,
                rows,
                RouterOut {
                    xn: &mut xn.as_view_mut(),
                    logits: &mut logits.as_view_mut(),
                    ids: &mut ids.as_view_mut(),
                    wts: &mut wts.as_view_mut(),
                    counter: &mut counter,
                },
            )
            .unwrap();
            g.moe_gate_up_by(
                kernel,
                &moe_layer,
                &xn.as_view(),
                &ids.as_view(),
                rows,
                &mut h.as_view_mut(),
            )
            .unwrap();
            g.moe_down_by(
                kernel,
                &moe_layer,
                &h.as_view(),
                Routing {
                    ids: &ids.as_view(),
                    wts: &wts.as_view(),
                },
                rows,
                &mut dx.as_view_mut(),
            )
            .unwrap();
            (
                g.stream.clone_dtoh(&dx).unwrap(),
                g.stream.clone_dtoh(&ids).unwrap(),
                g.stream.clone_dtoh(&wts).unwrap(),
                logits,
            )
        };
        // Every row of a multi-row launch gives its one-row bits, with every gate/up kernel.
        for (rows, kernel) in [1usize, 7, 16]
            .into_iter()
            .flat_map(|rows| [MoeKernel::F32, MoeKernel::Mma2].map(|k| (rows, k)))
        {
            let x = rand_vec(&mut rng, rows * hid, 1.0);
            let (got, gids, gw, logits) = layer(&x, rows, kernel);
            for r in 0..rows {
                let xr = &x[r * hid..(r + 1) * hid];
                let mut xn = vec![0f32; hid];
                ops::rms_norm(xr, &normf, 1e-6, &mut xn);
                let route = moe.route(&xn);
                for (s, (eid, w)) in route.iter().enumerate() {
                    assert_eq!(gids[r * k + s] as usize, *eid, "row {r} slot {s}");
                    assert!((gw[r * k + s] - w).abs() < 1e-5, "row {r} slot {s} weight");
                }
                let y = moe.forward(&xn);
                let want: Vec<f32> = xr.iter().zip(&y).map(|(a, b)| a + b).collect();
                let err = max_rel(&got[r * hid..(r + 1) * hid], &want);
                assert!(
                    err < 1e-5,
                    "moe {e}x{hid} rows {rows} row {r} ({kernel:?}): {err}"
                );
                // Alone, every row gives the same bits.
                let (one, _, _, _) = layer(xr, 1, kernel);
                if let Some(i) = (0..hid).find(|&i| one[i].to_bits() != got[r * hid + i].to_bits())
                {
                    panic!(
                        "row {r} of {rows} depends on the row count ({kernel:?}): \
                         output {i} is {:e} alone, {:e} in the launch",
                        one[i],
                        got[r * hid + i]
                    );
                }
            }
            // The prefill router (top-k of given logits) picks the same experts and weights.
            let mut ids2 = g.stream.alloc_zeros::<i32>(rows * k).unwrap();
            let mut wts2 = g.stream.alloc_zeros::<f32>(rows * k).unwrap();
            g.router_topk(
                &logits.as_view(),
                TopK {
                    bias: &dbias,
                    norm_topk: true,
                    softcap: 0.0,
                },
                shape,
                rows,
                &mut ids2.as_view_mut(),
                &mut wts2.as_view_mut(),
            )
            .unwrap();
            assert_eq!(g.stream.clone_dtoh(&ids2).unwrap(), gids);
            assert_eq!(g.stream.clone_dtoh(&wts2).unwrap(), gw);
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn model_step_graph_equals_eager_and_is_deterministic() {
    use fastdecode_cuda::target::TapsTo;
    use fastdecode_cuda::{CudaModel, CudaTarget};
    use std::sync::Arc;
    let g = Arc::new(gpu());
    let p = fastdecode_model::synth::preset("tiny").unwrap();
    let vocab = p.target.vocab_size;
    let model = Arc::new(CudaModel::synthetic(g, p.target.clone(), 3).unwrap());
    let prompt: Vec<u32> = (0..40).map(|i| (i * 37 % vocab) as u32).collect();
    let run = |graphs: bool| {
        let mut t = CudaTarget::new(model.clone(), 4, 200).unwrap();
        t.use_graphs = graphs;
        let pos: Vec<usize> = (0..prompt.len()).collect();
        let (mut toks, _) = t
            .forward_greedy(&prompt, &pos, &[], true, TapsTo::Host)
            .unwrap();
        for _ in 0..30 {
            let p = t.len();
            let last = *toks.last().unwrap();
            let (next, _) = t
                .forward_greedy(&[last], &[p], &[], false, TapsTo::Host)
                .unwrap();
            toks.extend(next);
        }
        let p = t.len();
        let rows: Vec<usize> = (p..p + 4).collect();
        let out = t.forward(&toks[..4], &rows, &[]).unwrap();
        (toks, out.logits)
    };
    let a = run(true);
    assert_eq!(a.0.len(), 31);
    assert!(a == run(true), "two graph runs differ");
    assert!(a == run(false), "graph replay differs from eager launches");
    // The prefill path (tensor cores, 40 rows in one chunk) agrees with the step path (16-row
    // steps) to about f32 accuracy, and is itself deterministic.
    let pos: Vec<usize> = (0..prompt.len()).collect();
    let logits = |chunk: usize| {
        let mut t = CudaTarget::new(model.clone(), 4, 200).unwrap();
        let mut out = vec![];
        for (i, rows) in prompt.chunks(chunk).enumerate() {
            let p0 = i * chunk;
            out.extend(
                t.forward(rows, &pos[p0..p0 + rows.len()], &[])
                    .unwrap()
                    .logits,
            );
        }
        out
    };
    let (prefill, steps) = (logits(40), logits(16));
    assert!(
        prefill == logits(40),
        "the prefill path is not deterministic"
    );
    let e = max_rel(&prefill, &steps);
    assert!(e < 1e-4, "prefill path vs step path: max rel err {e}");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn synthetic_weights_on_device_equal_synth_bytes() {
    use fastdecode_cuda::weights::WeightSource;
    use fastdecode_model::inventory::{target_inventory, Layout};
    use fastdecode_model::synth::{preset, write_synthetic};
    let g = gpu();
    let p = preset("tiny").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny");
    write_synthetic(
        &dir,
        &p,
        7,
        Layout::Runtime,
        &indicatif::ProgressBar::hidden(),
    )
    .unwrap();
    let store = fastdecode_model::checkpoint::TensorStore::open_dir(&dir).unwrap();
    let specs = target_inventory(&p.target, Layout::Runtime);
    let src = WeightSource::synthetic(7, &specs);
    for s in &specs {
        let want = store.get(&s.name).unwrap().data.to_vec();
        let got: Vec<u8> = match s.dtype {
            safetensors::Dtype::BF16 => {
                le_bytes(&g, &src.bf16(&g, &s.name).unwrap(), bf16::to_le_bytes)
            }
            safetensors::Dtype::F32 => {
                le_bytes(&g, &src.f32(&g, &s.name).unwrap(), f32::to_le_bytes)
            }
            safetensors::Dtype::U32 => {
                le_bytes(&g, &src.u32(&g, &s.name).unwrap(), u32::to_le_bytes)
            }
            safetensors::Dtype::U8 => g.stream.clone_dtoh(&src.u8(&g, &s.name).unwrap()).unwrap(),
            other => panic!("unexpected dtype {other:?}"),
        };
        assert!(
            got == want,
            "{}: device-generated bytes differ from synth",
            s.name
        );
    }
}

/// A device buffer's elements as their little-endian bytes, as a checkpoint stores them.
fn le_bytes<T: cudarc::driver::DeviceRepr, const N: usize>(
    g: &Gpu,
    buf: &cudarc::driver::CudaSlice<T>,
    bytes: fn(T) -> [u8; N],
) -> Vec<u8> {
    g.stream
        .clone_dtoh(buf)
        .unwrap()
        .into_iter()
        .flat_map(bytes)
        .collect()
}
