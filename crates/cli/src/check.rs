//! `fastdecode check --backend cuda`: the GPU against the CPU reference on a small model.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use rand::{Rng, SeedableRng};

use fastdecode_cpu::ops::{argmax, top2};
use fastdecode_cuda::{CudaModel, Gpu};
use fastdecode_engine::cuda_backend::CudaBackend;
use fastdecode_engine::model_dir::default_model_dir;
use fastdecode_engine::session::serial;
use fastdecode_engine::{CpuTarget, LoadedModel, TargetBackend};
use fastdecode_model::checkpoint::TensorStore;

use crate::common::{at_least, non_negative_f32};

#[derive(Args)]
pub struct CheckArgs {
    /// Backend to check against the CPU reference (only `cuda`).
    #[arg(long, default_value = "cuda")]
    backend: String,
    /// A small runtime-layout model (the CPU reference must fit in memory); default: the bundled one.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Teacher-forced positions to compare (spread over several sequences).
    #[arg(long, allow_negative_numbers = true, default_value_t = 2048, value_parser = at_least(1))]
    positions: usize,
    /// A disagreement is tolerated only where the CPU's top-2 logit gap is below this.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.05, value_parser = non_negative_f32)]
    near_tie: f32,
    /// Seed for the random prompts.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    seed: u64,
    /// Rows per GPU forward in the first half of each sequence (the rest is one row at a time).
    #[arg(long, allow_negative_numbers = true, default_value_t = 128, value_parser = at_least(1))]
    prefill_rows: usize,
    /// Print every 16th position's max |Δ logit|, and every position where it exceeds 1e-3, with
    /// each layer's relative hidden-state difference.
    #[arg(long)]
    trace: bool,
}

pub fn run(a: CheckArgs) -> Result<()> {
    if a.backend != "cuda" {
        bail!(
            "--backend {}: only `cuda` can be checked against the CPU reference",
            a.backend
        );
    }
    let dir = match a.model {
        Some(d) => d,
        None => default_model_dir()?,
    };
    let cpu = LoadedModel::load(&dir)?;
    let gpu = Arc::new(Gpu::open(0)?);
    let store = TensorStore::open_dir(&dir)?;
    let model = Arc::new(
        CudaModel::upload(gpu.clone(), cpu.target.cfg.clone(), &store)
            .with_context(|| format!("uploading {}", dir.display()))?,
    );
    let c = &cpu.target.cfg;
    let v = c.vocab_size;
    let seq_len = (4 * c.sliding_window).clamp(256, 2048);
    let n_seq = a.positions.div_ceil(seq_len);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(a.seed);
    let (mut agree, mut near, mut hard, mut total) = (0usize, 0usize, 0usize, 0usize);
    let mut max_abs = 0f32;
    let mut non_finite = 0usize;
    let mut max_gap_at_disagreement = 0f32;
    for s in 0..n_seq {
        let prompt: Vec<u32> = (0..16).map(|_| rng.random_range(0..v as u32)).collect();
        let cont = serial(&cpu, &prompt, seq_len - prompt.len() + 1, &[])?.tokens;
        let seq: Vec<u32> = prompt
            .iter()
            .chain(&cont[..seq_len - prompt.len()])
            .copied()
            .collect();
        let positions: Vec<usize> = (0..seq.len()).collect();
        // With --trace, every layer's output is tapped on both backends to show where they part.
        let taps: Vec<usize> = if a.trace {
            (0..c.num_hidden_layers).collect()
        } else {
            vec![]
        };
        let mut ct = CpuTarget::new(cpu.target.clone(), 16);
        let cpu_out = ct.forward(&seq, &positions, &taps)?;
        let (want, want_taps) = (cpu_out.logits, cpu_out.taps);
        let mut got_taps = vec![];
        // GPU: the first half as chunked prefill, the rest one row at a time (the decode path).
        let mut gt = CudaBackend::new(model.clone(), 16, seq.len())?;
        let half = seq.len() / 2;
        let mut got = vec![];
        for start in (0..half).step_by(a.prefill_rows) {
            let end = (start + a.prefill_rows).min(half);
            let o = gt.forward(&seq[start..end], &positions[start..end], &taps)?;
            got.extend(o.logits);
            got_taps.extend(o.taps);
        }
        for i in half..seq.len() {
            let o = gt.forward(&seq[i..=i], &[i], &taps)?;
            got.extend(o.logits);
            got_taps.extend(o.taps);
        }
        let h = c.hidden_size;
        let layer_report = |p: usize| -> String {
            (0..taps.len())
                .map(|l| {
                    let at = (p * taps.len() + l) * h;
                    let (x, y) = (&want_taps[at..at + h], &got_taps[at..at + h]);
                    let d = x.iter().zip(y).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                    let scale = x.iter().fold(0f32, |m, a| m.max(a.abs()));
                    format!("L{l} {:.1e}", d / scale.max(1e-30))
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        for p in 0..seq.len() {
            let (w, g) = (&want[p * v..(p + 1) * v], &got[p * v..(p + 1) * v]);
            let mut row_max = 0f32;
            for (x, y) in w.iter().zip(g) {
                // f32::max ignores NaN, so count non-finite GPU values separately.
                if !y.is_finite() {
                    non_finite += 1;
                }
                row_max = row_max.max((x - y).abs());
            }
            if a.trace && (p % 16 == 0 || row_max > 1e-3) {
                eprintln!(
                    "trace: sequence {s} position {p} max|dlogit| {row_max:.3e}; per-layer max|dh|/max|h|: {}",
                    layer_report(p)
                );
            }
            max_abs = max_abs.max(row_max);
            total += 1;
            if argmax(w) == argmax(g) {
                agree += 1;
            } else {
                let t = top2(w);
                let gap = t[0].1 - t[1].1;
                max_gap_at_disagreement = max_gap_at_disagreement.max(gap);
                if gap < a.near_tie {
                    near += 1;
                } else {
                    if hard < 12 {
                        // Where the failures are is what a kernel author needs first.
                        eprintln!("failure: sequence {s} position {p} (of {}): cpu argmax {} gpu {} gap {gap:.3}", seq.len(), argmax(w), argmax(g));
                    }
                    hard += 1;
                }
            }
        }
        eprintln!("sequence {}/{n_seq}: {} positions", s + 1, seq.len());
    }
    outln!(
        "check: cuda ({}, {}) against the CPU reference on {}",
        gpu.name,
        gpu.arch(),
        dir.display()
    )?;
    outln!("{:<44} {:>12}", "teacher-forced positions", total)?;
    outln!("{:<44} {:>12}", "argmax agreements", agree)?;
    outln!(
        "{:<44} {:>12}",
        format!("disagreements at CPU near-ties (gap < {})", a.near_tie),
        near
    )?;
    outln!("{:<44} {:>12}", "disagreements elsewhere (failures)", hard)?;
    outln!("{:<44} {:>12}", "non-finite GPU logits", non_finite)?;
    outln!("{:<44} {:>12.3e}", "max |Δ logit|", max_abs)?;
    outln!(
        "{:<44} {:>12.3e}",
        "largest CPU top-2 gap at a disagreement",
        max_gap_at_disagreement
    )?;
    if hard > 0 || non_finite > 0 || total < a.positions {
        bail!("cuda disagrees with the CPU reference at {hard} positions that are not near-ties");
    }
    outln!("ok")?;
    Ok(())
}
