//! GPU kernels against their CPU twins on random inputs of awkward sizes, plus determinism and
//! batch invariance. These need an NVIDIA GPU: they are `#[ignore]`d here and run on the GPU
//! machine with `--ignored` (see `tools/gpu/check.sh`).

use fastdecode_cpu::ops;
use fastdecode_cuda::Gpu;
use half::bf16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn gpu() -> Gpu {
    Gpu::open(0).expect("these tests need a GPU")
}

fn rand_vec(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| rng.random_range(-1.0f32..1.0) * scale)
        .collect()
}

fn to_bf16(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-20);
    a.iter()
        .zip(b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs() / scale))
}

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
    for (out, inp) in [(1000, 136), (7, 8), (513, 2048), (64, 1032)] {
        let w = to_bf16(&rand_vec(&mut rng, out * inp, 0.1));
        let wf: Vec<f32> = w.iter().map(|x| x.to_f32()).collect();
        let dw = g.stream.clone_htod(&w).unwrap();
        for rows in [1usize, 3, 16, 37] {
            let x = rand_vec(&mut rng, rows * inp, 1.0);
            let dx = g.stream.clone_htod(&x).unwrap();
            let mut dy = g.stream.alloc_zeros::<f32>(rows * out).unwrap();
            g.gemv_bf16(
                &dw.as_view(),
                &dx.as_view(),
                &mut dy.as_view_mut(),
                out,
                inp,
                rows,
                false,
            )
            .unwrap();
            let y = g.stream.clone_dtoh(&dy).unwrap();
            let mut want = vec![0f32; rows * out];
            for r in 0..rows {
                ops::matvec(
                    &wf,
                    &x[r * inp..(r + 1) * inp],
                    &mut want[r * out..(r + 1) * out],
                );
            }
            let e = max_rel(&y, &want);
            assert!(e < 1e-5, "gemv {out}x{inp} rows {rows}: max rel err {e}");
            // Each row alone gives the same bits as inside the batch.
            for r in [0, rows - 1] {
                let dx1 = g.stream.clone_htod(&x[r * inp..(r + 1) * inp]).unwrap();
                let mut dy1 = g.stream.alloc_zeros::<f32>(out).unwrap();
                g.gemv_bf16(
                    &dw.as_view(),
                    &dx1.as_view(),
                    &mut dy1.as_view_mut(),
                    out,
                    inp,
                    1,
                    false,
                )
                .unwrap();
                let y1 = g.stream.clone_dtoh(&dy1).unwrap();
                assert!(
                    y1 == y[r * out..(r + 1) * out],
                    "row {r} depends on the row count"
                );
            }
            // Accumulate mode adds onto y; and a rerun is bit-identical.
            g.gemv_bf16(
                &dw.as_view(),
                &dx.as_view(),
                &mut dy.as_view_mut(),
                out,
                inp,
                rows,
                true,
            )
            .unwrap();
            let y2 = g.stream.clone_dtoh(&dy).unwrap();
            assert!(y2.iter().zip(&y).all(|(a, b)| *a == b + b), "accumulate");
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn rms_norm_embed_and_argmax_match_cpu() {
    let g = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    for (rows, n) in [(1usize, 2048usize), (5, 136), (17, 1000)] {
        let x = rand_vec(&mut rng, rows * n, 3.0);
        let w = to_bf16(&rand_vec(&mut rng, n, 1.0));
        let wf: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
        let (dx, dw) = (
            g.stream.clone_htod(&x).unwrap(),
            g.stream.clone_htod(&w).unwrap(),
        );
        let mut dout = g.stream.alloc_zeros::<f32>(rows * n).unwrap();
        g.rms_norm_rows(
            &dx.as_view(),
            &dw.as_view(),
            &mut dout.as_view_mut(),
            n,
            rows,
            1e-6,
        )
        .unwrap();
        let got = g.stream.clone_dtoh(&dout).unwrap();
        let mut want = vec![0f32; rows * n];
        for r in 0..rows {
            ops::rms_norm(
                &x[r * n..(r + 1) * n],
                &wf,
                1e-6,
                &mut want[r * n..(r + 1) * n],
            );
        }
        assert!(max_rel(&got, &want) < 1e-5, "rms_norm {rows}x{n}");
    }
    // Embedding gather is exact.
    let (vocab, hidden) = (300, 72);
    let e = to_bf16(&rand_vec(&mut rng, vocab * hidden, 1.0));
    let toks: Vec<i32> = (0..11).map(|_| rng.random_range(0..vocab as i32)).collect();
    let de = g.stream.clone_htod(&e).unwrap();
    let dt = g.stream.clone_htod(&toks).unwrap();
    let mut dx = g.stream.alloc_zeros::<f32>(toks.len() * hidden).unwrap();
    g.embed_rows(&de, &dt, &mut dx, hidden).unwrap();
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
fn attention_kernels_match_cpu_for_sliding_ring_and_full_yarn() {
    use fastdecode_cuda::ops::DevRope;
    let g = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let (heads, kv_heads, d) = (6usize, 2usize, 48usize);
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
    for (params, window, ring) in [(&default, 13usize, 13 + 16), (&yarn, 0, 0)] {
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
        // Positions 0..40 in blocks of at most 16 rows (a ring of window + 16 slots holds any
        // block of up to 16 rows without overwriting a key an earlier row of the block still sees).
        let total = 40usize;
        let kvd = kv_heads * d;
        let slots = if ring > 0 { ring } else { total };
        let mut ck = g.stream.alloc_zeros::<f32>(slots * kvd).unwrap();
        let mut cv = g.stream.alloc_zeros::<f32>(slots * kvd).unwrap();
        let drope = DevRope {
            inv_freq: g.stream.clone_htod(&rope.inv_freq).unwrap(),
            rot_dim: rope.rotary_dim,
            scaling: rope.attention_scaling,
        };
        let qn = g
            .stream
            .clone_htod(
                &attn
                    .q_norm
                    .iter()
                    .map(|&x| bf16::from_f32(x))
                    .collect::<Vec<_>>(),
            )
            .unwrap();
        let kn = g
            .stream
            .clone_htod(
                &attn
                    .k_norm
                    .iter()
                    .map(|&x| bf16::from_f32(x))
                    .collect::<Vec<_>>(),
            )
            .unwrap();
        let mut cpu_k: Vec<Vec<f32>> = vec![];
        let mut cpu_v: Vec<Vec<f32>> = vec![];
        for block in [(0usize, 16usize), (16, 30), (30, 35), (35, 40)] {
            let n = block.1 - block.0;
            let (mut q, mut k) = (
                rand_vec(&mut rng, n * heads * d, 2.0),
                rand_vec(&mut rng, n * kvd, 2.0),
            );
            let v = rand_vec(&mut rng, n * kvd, 1.0);
            let gl = rand_vec(&mut rng, n * heads, 3.0);
            let pos: Vec<i32> = (block.0..block.1).map(|p| p as i32).collect();
            let dpos = g.stream.clone_htod(&pos).unwrap();
            let mut dq = g.stream.clone_htod(&q).unwrap();
            let mut dk = g.stream.clone_htod(&k).unwrap();
            g.qk_norm_rope(
                &mut dq.as_view_mut(),
                &qn,
                &dpos.as_view(),
                &drope,
                heads,
                d,
                n,
                1e-6,
            )
            .unwrap();
            g.qk_norm_rope(
                &mut dk.as_view_mut(),
                &kn,
                &dpos.as_view(),
                &drope,
                kv_heads,
                d,
                n,
                1e-6,
            )
            .unwrap();
            for r in 0..n {
                attn.norm_rope_heads(
                    &mut q[r * heads * d..(r + 1) * heads * d],
                    &attn.q_norm,
                    1e-6,
                    block.0 + r,
                );
                attn.norm_rope_heads(
                    &mut k[r * kvd..(r + 1) * kvd],
                    &attn.k_norm,
                    1e-6,
                    block.0 + r,
                );
            }
            let gq = g.stream.clone_dtoh(&dq).unwrap();
            assert!(
                max_rel(&gq, &q) < 2e-6,
                "qk_norm_rope q: {}",
                max_rel(&gq, &q)
            );
            let gk = g.stream.clone_dtoh(&dk).unwrap();
            // Attention reads the GPU's own k (same values up to rounding) from the cache.
            let dv = g.stream.clone_htod(&v).unwrap();
            g.kv_store(
                &dk.as_view(),
                &dv.as_view(),
                &mut ck,
                &mut cv,
                &dpos.as_view(),
                ring,
                kvd,
                n,
            )
            .unwrap();
            let dg = g.stream.clone_htod(&gl).unwrap();
            let mut dout = g.stream.alloc_zeros::<f32>(n * heads * d).unwrap();
            let max_keys = if window > 0 { window } else { block.1 };
            g.attend(
                &dq.as_view(),
                &ck,
                &cv,
                &dg.as_view(),
                &dpos.as_view(),
                &mut dout.as_view_mut(),
                heads,
                kv_heads,
                d,
                window,
                ring,
                n,
                max_keys,
            )
            .unwrap();
            let got = g.stream.clone_dtoh(&dout).unwrap();
            for r in 0..n {
                cpu_k.push(gk[r * kvd..(r + 1) * kvd].to_vec());
                cpu_v.push(v[r * kvd..(r + 1) * kvd].to_vec());
            }
            for r in 0..n {
                let p = block.0 + r;
                let proj = Projected {
                    q: gq[r * heads * d..(r + 1) * heads * d].to_vec(),
                    k: vec![],
                    v: vec![],
                    gate: gl[r * heads..(r + 1) * heads]
                        .iter()
                        .map(|&x| fastdecode_cpu::ops::softplus(x))
                        .collect(),
                };
                let keys: Vec<(&[f32], &[f32])> = (attn.first_visible(p)..=p)
                    .map(|j| (cpu_k[j].as_slice(), cpu_v[j].as_slice()))
                    .collect();
                let want = attn.attend(&proj, &keys);
                let e = max_rel(&got[r * heads * d..(r + 1) * heads * d], &want);
                assert!(e < 1e-5, "attend window {window} position {p}: {e}");
            }
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn moe_kernels_match_cpu() {
    use fastdecode_cuda::ops::DevNvfp4;
    use fastdecode_model::nvfp4::{dequantize_row, quantize_row};
    let g = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    // More experts than a warp (a 32-thread router launch would never scan experts 32..), and
    // biases that make every selection key negative (so uninitialised shared memory, often zero,
    // would win a reduction that reads it).
    let (e, k, hid, inter, sh) = (100usize, 3usize, 96usize, 48usize, 32usize);
    // NVFP4 weights: quantise random rows, keep codes/scales for the GPU and dequantised f32 for the CPU.
    let mut quant = |rows: usize, cols: usize| {
        let w = rand_vec(&mut rng, rows * cols, (3.0 / cols as f32).sqrt());
        let (mut codes, mut scales, mut deq) = (
            vec![0u32; rows * cols / 8],
            vec![0u8; rows * cols / 16],
            vec![0f32; rows * cols],
        );
        for r in 0..rows {
            quantize_row(
                &w[r * cols..(r + 1) * cols],
                &mut codes[r * cols / 8..(r + 1) * cols / 8],
                &mut scales[r * cols / 16..(r + 1) * cols / 16],
            );
            dequantize_row(
                &codes[r * cols / 8..(r + 1) * cols / 8],
                &scales[r * cols / 16..(r + 1) * cols / 16],
                &mut deq[r * cols..(r + 1) * cols],
            );
        }
        (
            DevNvfp4 {
                codes: g.stream.clone_htod(&codes).unwrap(),
                scales: g.stream.clone_htod(&scales).unwrap(),
            },
            deq,
        )
    };
    let (gd, gq) = quant(e * inter, hid);
    let (ud, uq) = quant(e * inter, hid);
    let (dd, dq) = quant(e * hid, inter);
    let (sgd, sgq) = quant(sh, hid);
    let (sud, suq) = quant(sh, hid);
    let (sdd, sdq) = quant(hid, sh);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let router = linear(&mut rng, e, hid);
    let bias: Vec<f32> = rand_vec(&mut rng, e, 0.05)
        .iter()
        .map(|b| b - 1.5)
        .collect();
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
    let rows = 7;
    let xn = rand_vec(&mut rng, rows * hid, 1.0);
    let resid = rand_vec(&mut rng, rows * hid, 1.0);
    let dxn = g.stream.clone_htod(&xn).unwrap();
    let drouter = g
        .stream
        .clone_htod(
            &router
                .w
                .iter()
                .map(|&x| bf16::from_f32(x))
                .collect::<Vec<_>>(),
        )
        .unwrap();
    let dbias = g.stream.clone_htod(&bias).unwrap();
    let mut rl = g.stream.alloc_zeros::<f32>(rows * e).unwrap();
    g.gemv_bf16(
        &drouter.as_view(),
        &dxn.as_view(),
        &mut rl.as_view_mut(),
        e,
        hid,
        rows,
        false,
    )
    .unwrap();
    let mut ids = g.stream.alloc_zeros::<i32>(rows * k).unwrap();
    let mut wts = g.stream.alloc_zeros::<f32>(rows * k).unwrap();
    g.router_topk(
        &rl.as_view(),
        &dbias,
        &mut ids.as_view_mut(),
        &mut wts.as_view_mut(),
        e,
        k,
        true,
        0.0,
        rows,
    )
    .unwrap();
    let (gids, gw) = (
        g.stream.clone_dtoh(&ids).unwrap(),
        g.stream.clone_dtoh(&wts).unwrap(),
    );
    for r in 0..rows {
        let want = moe.route(&xn[r * hid..(r + 1) * hid]);
        for (s, (eid, w)) in want.iter().enumerate() {
            assert_eq!(gids[r * k + s] as usize, *eid, "row {r} slot {s}");
            assert!((gw[r * k + s] - w).abs() < 1e-5);
        }
    }
    let mut h = g.stream.alloc_zeros::<f32>(rows * k * inter).unwrap();
    let mut hs = g.stream.alloc_zeros::<f32>(rows * sh).unwrap();
    g.nvfp4_gate_up(
        &gd,
        &ud,
        &dxn.as_view(),
        Some(&ids.as_view()),
        &mut h.as_view_mut(),
        inter,
        hid,
        rows,
        k,
    )
    .unwrap();
    g.nvfp4_gate_up(
        &sgd,
        &sud,
        &dxn.as_view(),
        None,
        &mut hs.as_view_mut(),
        sh,
        hid,
        rows,
        1,
    )
    .unwrap();
    let mut dx = g.stream.clone_htod(&resid).unwrap();
    g.nvfp4_down_combine(
        &dd,
        &sdd,
        &h.as_view(),
        &hs.as_view(),
        &ids.as_view(),
        &wts.as_view(),
        &mut dx.as_view_mut(),
        hid,
        inter,
        sh,
        k,
        2.5,
        rows,
    )
    .unwrap();
    let got = g.stream.clone_dtoh(&dx).unwrap();
    for r in 0..rows {
        let y = moe.forward(&xn[r * hid..(r + 1) * hid]);
        let want: Vec<f32> = resid[r * hid..(r + 1) * hid]
            .iter()
            .zip(&y)
            .map(|(a, b)| a + b)
            .collect();
        let e = max_rel(&got[r * hid..(r + 1) * hid], &want);
        assert!(e < 1e-5, "moe row {r}: {e}");
    }
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
            safetensors::Dtype::BF16 => g
                .stream
                .clone_dtoh(&src.bf16(&g, &s.name).unwrap())
                .unwrap()
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            safetensors::Dtype::F32 => g
                .stream
                .clone_dtoh(&src.f32(&g, &s.name).unwrap())
                .unwrap()
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            safetensors::Dtype::U32 => g
                .stream
                .clone_dtoh(&src.u32(&g, &s.name).unwrap())
                .unwrap()
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
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
