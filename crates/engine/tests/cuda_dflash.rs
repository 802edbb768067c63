//! DFlash on the GPU is serial decoding, token for token: the bundled trained model's held-out
//! prompts, 512 new tokens each, every block size of {2, 3, 4, 8, 16} with drafts from the oracle
//! (never, half the time, always right) and from the GPU drafter; and a K-row verify's logits are
//! bit-identical to K one-row steps. Needs an NVIDIA GPU: `#[ignore]`d here, run on the GPU
//! machine with `--ignored` (`tools/gpu/check.sh`).

use std::path::{Path, PathBuf};

use fastdecode_engine::cuda_backend::CudaBackend;
use fastdecode_engine::session::{self, DraftPlan};
use fastdecode_engine::traces;
use fastdecode_engine::{DraftSource, DraftSpec, TargetBackend};

/// The bundled model: in this checkout, or (a test executable staged to a GPU machine by
/// `tools/gpu/stage.sh`) under the current directory, the repository root there.
fn bundled() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/laguna-tiny");
    if here.is_dir() {
        here
    } else {
        PathBuf::from("assets/laguna-tiny")
    }
}

/// The first `n` held-out prompts of the bundled traces.
fn prompts(n: usize) -> Vec<Vec<u32>> {
    let text =
        std::fs::read_to_string(bundled().join("../traces/laguna-tiny-hf-greedy.json")).unwrap();
    let mut prompts = traces::prompt_ids(&text).unwrap();
    prompts.truncate(n);
    prompts
}

const NEW: usize = 512;

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn dflash_on_the_gpu_equals_serial_for_every_block_size_and_source() {
    let mut gpu = CudaBackend::open_dir(&bundled(), 16, 1024, true).unwrap();
    assert!(gpu.has_drafter(), "the bundled model has a drafter");
    let vocab = gpu.config().vocab_size;
    for (pi, prompt) in prompts(3).iter().enumerate() {
        let serial = session::run(&mut gpu, None, prompt, NEW, 1, &[]).unwrap();
        assert_eq!(serial.tokens.len(), NEW);
        for k in [2usize, 3, 4, 8, 16] {
            for spec in ["oracle:0", "oracle:0.5", "oracle:1", "drafter"] {
                let source: DraftSpec = spec.parse().unwrap();
                let plan = DraftPlan {
                    block_size: k,
                    source,
                    seed: 11,
                };
                let mut oracle = match source {
                    DraftSpec::Oracle(_) => Some(
                        session::oracle_source(vocab, prompt, plan, Some(&serial.tokens)).unwrap(),
                    ),
                    DraftSpec::Drafter => None,
                };
                let s = oracle.as_mut().map(|s| s.as_mut() as &mut dyn DraftSource);
                let g = session::run(&mut gpu, s, prompt, NEW, k, &[]).unwrap();
                assert!(
                    g.tokens == serial.tokens,
                    "prompt {pi}, K = {k}, {spec}: DFlash differs from serial"
                );
                // The sources exercise what they should: none / all drafts accepted.
                match spec {
                    "oracle:0" => assert_eq!(g.accepted_drafts, 0),
                    "oracle:1" => assert_eq!(g.rounds, (NEW - 1).div_ceil(k)),
                    _ => {}
                }
                if spec == "drafter" && k == 8 {
                    eprintln!(
                        "prompt {pi}: GPU drafter at K = 8: {:.2} tokens per round",
                        g.tokens_per_round()
                    );
                }
            }
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_k_row_verify_is_bit_identical_to_k_serial_steps() {
    let mut gpu = CudaBackend::open_dir(&bundled(), 16, 1024, false).unwrap();
    let prompt = &prompts(1)[0];
    let serial = session::run(&mut gpu, None, prompt, 64, 1, &[]).unwrap();
    let rows = &serial.tokens;
    let p0 = prompt.len();
    for k in [2usize, 3, 4, 8, 16] {
        // K one-row steps after the prompt...
        gpu.reset();
        let pos: Vec<usize> = (0..p0).collect();
        gpu.forward_greedy(prompt, &pos, &[], true).unwrap();
        let mut steps = vec![];
        for (i, &t) in rows[..k].iter().enumerate() {
            steps.extend(gpu.forward(&[t], &[p0 + i], &[]).unwrap().logits);
        }
        // ...against one K-row verify of the same rows.
        gpu.truncate(p0);
        let pos: Vec<usize> = (p0..p0 + k).collect();
        let block = gpu.forward(&rows[..k], &pos, &[]).unwrap().logits;
        assert!(
            block == steps,
            "K = {k}: the verify's logits differ from serial steps"
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn serial_decoding_run_ahead_equals_one_row_steps_and_stops_where_it_should() {
    let mut gpu = CudaBackend::open_dir(&bundled(), 16, 1024, false).unwrap();
    let prompt = &prompts(1)[0];
    let p0 = prompt.len();
    // Serial decoding runs each step ahead of the host (`serial_greedy`)...
    let run = session::run(&mut gpu, None, prompt, NEW, 1, &[]).unwrap();
    assert_eq!(run.tokens.len(), NEW);
    assert_eq!(run.rounds, NEW - 1);
    assert_eq!(gpu.kv_len(), p0 + NEW - 1);
    // ...and makes the tokens of one-row steps, each read before the next is launched.
    gpu.reset();
    let pos: Vec<usize> = (0..p0).collect();
    let mut t = gpu.forward_greedy(prompt, &pos, &[], true).unwrap().tokens[0];
    let mut steps = vec![t];
    for i in 0..NEW - 1 {
        t = gpu
            .forward_greedy(&[t], &[p0 + i], &[], false)
            .unwrap()
            .tokens[0];
        steps.push(t);
    }
    assert!(
        run.tokens == steps,
        "run-ahead decoding differs from one-row steps"
    );
    // A stop token ends it there, though the GPU had already started the step after it: the
    // cache holds the stop's position no further, and what runs next sees that cache.
    // The stop: the run's last token that does not occur earlier (a small model's greedy run
    // soon loops), so the stop comes where it first occurs.
    let at = (1..NEW - 1)
        .rev()
        .find(|&i| !run.tokens[..i].contains(&run.tokens[i]))
        .expect("a token of the run that does not occur before it");
    let stop = run.tokens[at];
    let g = session::run(&mut gpu, None, prompt, NEW, 1, &[stop]).unwrap();
    assert!(g.stopped);
    assert_eq!(g.tokens, run.tokens[..=at]);
    assert_eq!(gpu.kv_len(), p0 + at);
    let next = gpu.forward_greedy(&[stop], &[p0 + at], &[], false).unwrap();
    assert_eq!(next.tokens, [run.tokens[at + 1]]);
}
