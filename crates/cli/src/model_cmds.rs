//! Commands on checkpoints: synth, transform, inspect, verify.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};

use fastdecode_model::config::{DrafterConfig, LagunaConfig};
use fastdecode_model::inventory::{
    drafter_inventory, inventory_sha256, inventory_text, target_inventory, Layout, TensorSpec,
};
use fastdecode_model::synth::{preset, write_synthetic, PRESETS};
use fastdecode_model::{manifest, transform as tf};

pub fn bytes_bar(what: &str) -> ProgressBar {
    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

#[derive(Clone, Copy, ValueEnum)]
pub enum LayoutArg {
    /// NVFP4 experts (`switch_mlp`, `shared_expert`), what the engine runs.
    Runtime,
    /// docs/spec/laguna.md's HF layout: BF16 stacked experts (`mlp.experts.gate_up_proj`).
    Hf,
    /// What HF transformers 5.x `save_pretrained` writes: one BF16 tensor per expert.
    HfSaved,
}

#[derive(Args)]
pub struct SynthArgs {
    /// Shape preset: `tiny` (a few million parameters, every feature) or `xs2.1` (the real XS 2.1 shapes, 21.6 GB).
    #[arg(long)]
    preset: String,
    /// Seed of the counter-based weight generator; the same seed gives the same bytes.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    seed: u64,
    /// Output directory (must not exist; written under a temporary name, then renamed).
    #[arg(long)]
    out: PathBuf,
    /// Checkpoint layout to write.
    #[arg(long, value_enum, default_value = "runtime")]
    layout: LayoutArg,
}

pub fn synth(a: SynthArgs) -> Result<()> {
    let p = preset(&a.preset)?;
    let layout = match a.layout {
        LayoutArg::Runtime => Layout::Runtime,
        LayoutArg::Hf => Layout::Hf,
        LayoutArg::HfSaved => Layout::HfSaved,
    };
    let pb = bytes_bar("synth");
    let digest = write_synthetic(&a.out, &p, a.seed, layout, &pb)?;
    pb.finish_and_clear();
    outln!(
        "wrote {} ({} preset, seed {}), digest sha256:{digest}",
        a.out.display(),
        p.name,
        a.seed
    )?;
    Ok(())
}

#[derive(Args)]
pub struct TransformArgs {
    /// HF-layout checkpoint directory (config.json, *.safetensors, optional drafter/ and tokenizer.json).
    input: PathBuf,
    /// Output directory for the runtime layout (must not exist).
    output: PathBuf,
}

pub fn transform(a: TransformArgs) -> Result<()> {
    let pb = bytes_bar("transform");
    let digest = tf::transform(&a.input, &a.output, &pb)?;
    pb.finish_and_clear();
    outln!("wrote {}, digest sha256:{digest}", a.output.display())?;
    Ok(())
}

#[derive(Args)]
pub struct InspectArgs {
    /// Model directory to inspect.
    dir: Option<PathBuf>,
    /// Print the canonical inventory (`name<TAB>dtype<TAB>shape`, sorted) instead of a summary.
    #[arg(long)]
    inventory: bool,
    /// Inspect a preset's shapes instead of a directory (no weights are written).
    #[arg(long, conflicts_with = "dir")]
    preset: Option<String>,
    /// For --inventory: list the drafter's tensors instead of the target's.
    #[arg(long)]
    drafter: bool,
}

fn summary(
    cfg: &LagunaConfig,
    d: Option<&DrafterConfig>,
    t: &[TensorSpec],
    layout: Layout,
) -> Result<()> {
    // Parameters are counted in the HF layout, where every weight is one element.
    let params: usize = target_inventory(cfg, Layout::Hf)
        .iter()
        .map(TensorSpec::numel)
        .sum();
    let bytes: usize = t.iter().map(TensorSpec::nbytes).sum();
    let name = match layout {
        Layout::Runtime => "runtime (NVFP4 experts)",
        Layout::Hf => "HF (stacked experts, as docs/spec/laguna.md names them)",
        Layout::HfSaved => "HF as transformers saves it (one tensor per expert)",
    };
    outln!("layout        {name}")?;
    outln!("tensors       {} ({bytes} bytes of tensor data)", t.len())?;
    outln!("parameters    {params}")?;
    outln!("inventory     sha256:{}", inventory_sha256(t))?;
    outln!(
        "shape         hidden {}, layers {}, vocab {}, head_dim {}, kv heads {}",
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.vocab_size,
        cfg.head_dim,
        cfg.num_key_value_heads
    )?;
    let full = cfg
        .layer_types
        .iter()
        .filter(|l| **l == fastdecode_model::LayerType::Full)
        .count();
    outln!(
        "attention     {full} full + {} sliding (window {}); query heads per layer {:?}",
        cfg.num_hidden_layers - full,
        cfg.sliding_window,
        cfg.num_attention_heads_per_layer
    )?;
    outln!(
        "moe           {} experts, top-{}, width {}, shared width {}, routed scale {}",
        cfg.num_experts,
        cfg.num_experts_per_tok,
        cfg.moe_intermediate_size,
        cfg.shared_expert_intermediate_size,
        cfg.moe_routed_scaling_factor
    )?;
    if let Some(d) = d {
        let dp: usize = drafter_inventory(d).iter().map(TensorSpec::numel).sum();
        outln!(
            "drafter       {} layers, {} parameters, block {}, taps {:?}, mask token {}",
            d.num_hidden_layers,
            dp,
            d.block_size,
            d.target_layer_ids,
            d.mask_token_id
        )?;
    } else {
        outln!("drafter       none")?;
    }
    Ok(())
}

pub fn inspect(a: InspectArgs) -> Result<()> {
    let (cfg, drafter) = match (&a.preset, &a.dir) {
        (Some(p), _) => {
            let p = preset(p)?;
            (p.target, Some(p.drafter))
        }
        (None, Some(dir)) => {
            let cfg = LagunaConfig::from_file(&dir.join("config.json"))?;
            let dp = dir.join("drafter/config.json");
            let d = if dp.is_file() {
                Some(DrafterConfig::from_file(&dp)?)
            } else {
                None
            };
            (cfg, d)
        }
        (None, None) => bail!(
            "give a model directory or --preset ({})",
            PRESETS.join(", ")
        ),
    };
    let layout = match &a.dir {
        // An HF directory may hold docs/spec/laguna.md's stacked experts or transformers'
        // per-expert files.
        Some(dir) if Layout::of(&cfg).is_hf() => {
            let store = fastdecode_model::checkpoint::TensorStore::open_dir(dir)?;
            Layout::detect(&cfg, store.names())
        }
        _ => Layout::of(&cfg),
    };
    if a.inventory {
        let specs = if a.drafter {
            drafter_inventory(drafter.as_ref().context("this model has no drafter")?)
        } else {
            target_inventory(&cfg, layout)
        };
        out!("{}", inventory_text(&specs))?;
        return Ok(());
    }
    summary(
        &cfg,
        drafter.as_ref(),
        &target_inventory(&cfg, layout),
        layout,
    )?;
    if let Some(dir) = &a.dir {
        let m = dir.join(manifest::MANIFEST);
        if m.symlink_metadata().is_ok() {
            let text = fastdecode_model::files::read_text(&m)?;
            outln!(
                "MANIFEST      sha256:{} (run `fastdecode verify` to check the files)",
                manifest::digest_of(&text)
            )?;
        }
    }
    Ok(())
}

#[derive(Args)]
pub struct VerifyArgs {
    /// Directory with a MANIFEST file.
    dir: PathBuf,
    /// Write the MANIFEST instead (hash every file under DIR), then print the digest.
    #[arg(long)]
    write: bool,
}

pub fn verify(a: VerifyArgs) -> Result<()> {
    if a.write {
        let pb = bytes_bar("hash");
        let digest = manifest::write(&a.dir, &pb);
        pb.finish_and_clear();
        // Success is reported only once the MANIFEST is in place.
        let digest = digest?;
        outln!("wrote {}", a.dir.join(manifest::MANIFEST).display())?;
        outln!("digest sha256:{digest}")?;
        return Ok(());
    }
    let pb = bytes_bar("verify");
    let v = manifest::verify(&a.dir, &pb);
    pb.finish_and_clear();
    let v = v?;
    outln!(
        "ok: {} files, {} bytes match {}",
        v.files,
        v.bytes,
        a.dir.join(manifest::MANIFEST).display()
    )?;
    outln!("digest sha256:{}", v.digest)?;
    Ok(())
}
