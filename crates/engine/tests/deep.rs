//! The synthetic weight scaling keeps a 40-layer forward (the depth of XS 2.1) finite and its
//! greedy output varied: the tiny widths with XS 2.1's depth and layer pattern.

use fastdecode_engine::session::serial;
use fastdecode_engine::LoadedModel;
use fastdecode_model::config::{LayerType, MlpType};
use fastdecode_model::inventory::Layout;
use fastdecode_model::synth::{preset, write_synthetic, Preset};

#[test]
fn forty_layer_synthetic_forward_stays_finite_and_varies() {
    let p = preset("tiny").unwrap();
    let mut t = p.target.clone();
    let n = 40;
    t.num_hidden_layers = n;
    t.layer_types = (0..n)
        .map(|i| {
            if i % 4 == 0 {
                LayerType::Full
            } else {
                LayerType::Sliding
            }
        })
        .collect();
    t.num_attention_heads_per_layer = (0..n).map(|i| if i % 4 == 0 { 4 } else { 8 }).collect();
    t.mlp_layer_types = (0..n)
        .map(|i| {
            if i == 0 {
                MlpType::Dense
            } else {
                MlpType::Sparse
            }
        })
        .collect();
    let mut d = p.drafter.clone();
    d.num_target_layers = n;
    d.target_layer_ids = vec![1, 13, 25, 33, 39];
    let deep = Preset {
        name: "tiny-40",
        target: t,
        drafter: d,
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("deep");
    write_synthetic(
        &dir,
        &deep,
        7,
        Layout::Runtime,
        &indicatif::ProgressBar::hidden(),
    )
    .unwrap();
    let m = LoadedModel::load(&dir).unwrap();

    let prompt: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 512).collect();
    let mut target = fastdecode_engine::CpuTarget::new(m.target.clone(), 1);
    use fastdecode_engine::TargetBackend;
    let out = target
        .forward(&prompt, &(0..prompt.len()).collect::<Vec<_>>(), &[39])
        .unwrap();
    assert!(
        out.logits.iter().all(|x| x.is_finite()),
        "logits must stay finite"
    );
    assert!(out.taps.iter().all(|x| x.is_finite()));
    let rms = (out.taps.iter().map(|x| x * x).sum::<f32>() / out.taps.len() as f32).sqrt();
    assert!(rms > 0.1 && rms < 1e3, "last-layer hidden RMS {rms}");
    let spread = out.logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x))
        - out.logits.iter().fold(f32::INFINITY, |m, &x| m.min(x));
    assert!(spread > 1.0, "logits must not be flat: spread {spread}");

    let toks = serial(&m, &prompt, 100, &[]).unwrap().tokens;
    let distinct: std::collections::BTreeSet<_> = toks.iter().collect();
    assert!(distinct.len() >= 10, "greedy output must vary: {toks:?}");
}
