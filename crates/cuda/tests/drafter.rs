//! The GPU drafter against the CPU drafter: the same tapped hidden states (the CPU target's)
//! become context rows on both, and the block forward's logits through the target's lm_head
//! agree to f32 accuracy, on the bundled trained model and on a synthetic one. Needs an NVIDIA
//! GPU: `#[ignore]`d here, run on the GPU machine with `--ignored`.

use std::path::Path;
use std::sync::Arc;

use fastdecode_cpu::{DrafterModel, TargetModel};
use fastdecode_cuda::{CudaDrafter, CudaModel};
use fastdecode_model::checkpoint::TensorStore;
use fastdecode_model::config::DrafterConfig;
use fastdecode_model::LagunaConfig;

// The shared helpers; this file needs two of them.
#[allow(dead_code)]
mod common;
use common::{gpu, max_rel};

/// Compares the two drafters on `dir` (a runtime checkpoint with `drafter/`) over three rounds
/// of context growth, the first from a whole prompt.
fn compare(dir: &Path) {
    let g = Arc::new(gpu());
    let cpu = TargetModel::load(dir).unwrap();
    let dcpu = DrafterModel::load(&dir.join("drafter")).unwrap();
    let cfg = LagunaConfig::from_file(&dir.join("config.json")).unwrap();
    let store = TensorStore::open_dir(dir).unwrap();
    let model = CudaModel::upload(g.clone(), cfg.clone(), &store).unwrap();
    let dcfg = DrafterConfig::from_file(&dir.join("drafter/config.json")).unwrap();
    let dstore = TensorStore::open_dir(&dir.join("drafter")).unwrap();
    let mut dgpu = CudaDrafter::upload(&model, dcfg.clone(), &dstore, 512).unwrap();
    let vocab = cfg.vocab_size as u32;
    let tokens: Vec<u32> = (0..120u32).map(|i| (i * 131 + 7) % vocab).collect();
    // The CPU target's taps of every row (the exact input both drafters see).
    let mut cache = cpu.new_cache(16);
    let positions: Vec<usize> = (0..tokens.len()).collect();
    let out = cpu
        .forward(&mut cache, &tokens, &positions, &dcfg.target_layer_ids)
        .unwrap();
    let per = dcfg.target_layer_ids.len() * cfg.hidden_size;
    let mut ctx = dcpu.new_context();
    let mut done = 0;
    // A prompt's 97 rows (several 16-row chunks and a partial one), then rounds of 1 and 16.
    for rows in [97usize, 1, 16] {
        let taps = &out.taps[done * per..(done + rows) * per];
        dcpu.extend_context(&mut ctx, taps).unwrap();
        for (i, chunk) in taps.chunks(16 * per).enumerate() {
            let d = g.stream.clone_htod(chunk).unwrap();
            dgpu.extend(&d.as_view(), chunk.len() / per)
                .unwrap_or_else(|e| {
                    panic!("chunk {i} of {rows} rows: {e}");
                });
        }
        done += rows;
        assert_eq!(dgpu.len(), done);
        let bonus = tokens[done];
        for k in [2usize, 5, dcfg.block_size] {
            let want: Vec<f32> = dcpu
                .block_logits(&cpu, &ctx, bonus, k)
                .into_iter()
                .flatten()
                .collect();
            let got = dgpu.block_logits(bonus, k).unwrap();
            let e = max_rel(&got, &want);
            assert!(
                e < 2e-4,
                "{}: context {done}, block {k}: max rel err {e}",
                dir.display()
            );
            // The drafts agree wherever the CPU's top-2 are clearly apart.
            let drafts = dgpu.draft(bonus, k).unwrap();
            assert_eq!(dgpu.len(), done, "a draft leaves the context as it was");
            for (j, l) in want.chunks(cfg.vocab_size).enumerate() {
                let [(a, la), (_, lb)] = fastdecode_cpu::ops::top2(l);
                if la - lb > 1e-3 * la.abs().max(1.0) {
                    assert_eq!(drafts[j], a as u32, "context {done}, block {k}, row {j}");
                }
            }
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_drafter_matches_cpu_on_the_bundled_model() {
    // In this checkout, or (staged to a GPU machine) under the repository root there.
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/laguna-tiny");
    compare(if here.is_dir() {
        &here
    } else {
        Path::new("assets/laguna-tiny")
    });
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_drafter_matches_cpu_on_a_synthetic_model() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny");
    fastdecode_model::synth::write_synthetic(
        &dir,
        &fastdecode_model::synth::preset("tiny").unwrap(),
        5,
        fastdecode_model::inventory::Layout::Runtime,
        &indicatif::ProgressBar::hidden(),
    )
    .unwrap();
    compare(&dir);
}
