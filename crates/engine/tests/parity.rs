//! Parity with the upstream implementation: greedy traces recorded from HF transformers'
//! `LagunaForCausalLM` in f32 (20 held-out prompts × 128 steps, `assets/traces/`) replayed
//! teacher-forced through our CPU engine on the bundled runtime checkpoint. Every step's argmax
//! must match, except where HF's own top-2 gap is below 1e-3.

use std::path::{Path, PathBuf};

use fastdecode_cpu::ops::argmax;
use fastdecode_engine::{CpuTarget, LoadedModel, TargetBackend};
use sha2::{Digest, Sha256};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[derive(serde::Deserialize)]
struct Step {
    token: u32,
    top2_ids: [u32; 2],
    top2_logits: [f32; 2],
}

#[derive(serde::Deserialize)]
struct Prompt {
    doc_id: String,
    prompt_ids: Vec<u32>,
    steps: Vec<Step>,
}

#[derive(serde::Deserialize)]
struct Traces {
    model_sha256: String,
    prompts: Vec<Prompt>,
}

#[test]
fn cpu_engine_matches_hf_transformers_greedy_traces() {
    let traces: Traces = serde_json::from_str(
        &std::fs::read_to_string(repo().join("assets/traces/laguna-tiny-hf-greedy.json")).unwrap(),
    )
    .unwrap();
    // The traces were made from exactly the committed HF checkpoint.
    let hf_bytes = std::fs::read(repo().join("assets/laguna-tiny-hf/model.safetensors")).unwrap();
    assert_eq!(hex::encode(Sha256::digest(&hf_bytes)), traces.model_sha256);

    let m = LoadedModel::load(&repo().join("assets/laguna-tiny")).unwrap();
    let v = m.target.cfg.vocab_size;
    assert!(traces.prompts.len() >= 20);
    let (mut steps, mut matched, mut near_ties) = (0usize, 0usize, 0usize);
    let mut max_dtop1 = 0f32;
    for p in &traces.prompts {
        assert!(p.steps.len() >= 128, "{}", p.doc_id);
        let seq: Vec<u32> = p
            .prompt_ids
            .iter()
            .copied()
            .chain(p.steps.iter().map(|s| s.token))
            .collect();
        // Teacher-forced: the HF chain as input, one forward over all rows.
        let rows = &seq[..seq.len() - 1];
        let mut t = CpuTarget::new(m.target.clone(), 16);
        let logits = t
            .forward(rows, &(0..rows.len()).collect::<Vec<_>>(), &[])
            .unwrap()
            .logits;
        for (i, s) in p.steps.iter().enumerate() {
            let row = &logits[(p.prompt_ids.len() - 1 + i) * v..][..v];
            let ours = argmax(row) as u32;
            assert_eq!(s.token, s.top2_ids[0]);
            max_dtop1 = max_dtop1.max((row[s.top2_ids[0] as usize] - s.top2_logits[0]).abs());
            steps += 1;
            if ours == s.token {
                matched += 1;
            } else {
                let gap = s.top2_logits[0] - s.top2_logits[1];
                assert!(
                    gap < 1e-3,
                    "{} step {i}: ours {ours}, HF {} (top-2 gap {gap})",
                    p.doc_id,
                    s.token
                );
                near_ties += 1;
            }
        }
    }
    eprintln!(
        "parity: {matched}/{steps} steps match HF transformers ({near_ties} near-tie exceptions), max |Δ top-1 logit| = {max_dtop1:.3e}"
    );
    assert!(steps >= 20 * 128);
    // f32 against f32 with different summation orders: far below any decision margin.
    assert!(max_dtop1 < 1e-3, "max |Δ top-1 logit| {max_dtop1}");
}

#[test]
fn bundled_runtime_checkpoint_is_the_transform_of_the_bundled_hf_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("rt");
    fastdecode_model::transform::transform(
        &repo().join("assets/laguna-tiny-hf"),
        &out,
        &indicatif::ProgressBar::hidden(),
    )
    .unwrap();
    for f in [
        "model.safetensors",
        "drafter/model.safetensors",
        "config.json",
        "tokenizer.json",
        "MANIFEST",
    ] {
        let same = std::fs::read(out.join(f)).unwrap()
            == std::fs::read(repo().join("assets/laguna-tiny").join(f)).unwrap();
        assert!(
            same,
            "assets/laguna-tiny/{f} is not what transform makes of assets/laguna-tiny-hf"
        );
    }
    // Both layouts compute the same numbers: the experts are NVFP4 fixed points.
    let hf = LoadedModel::load(&repo().join("assets/laguna-tiny-hf")).unwrap();
    let rt = LoadedModel::load(&repo().join("assets/laguna-tiny")).unwrap();
    let prompt: Vec<u32> = (0..40).map(|i| (i * 131 + 7) % 8192).collect();
    let pos: Vec<usize> = (0..prompt.len()).collect();
    let a = CpuTarget::new(hf.target.clone(), 1)
        .forward(&prompt, &pos, &[])
        .unwrap()
        .logits;
    let b = CpuTarget::new(rt.target.clone(), 1)
        .forward(&prompt, &pos, &[])
        .unwrap()
        .logits;
    assert!(a == b, "HF-layout and runtime-layout logits differ");
}
