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
