//! The Laguna target's weights on the GPU: uploaded from a runtime checkpoint or generated in
//! place (`synthetic`), with the projections one kernel reads together stacked into one buffer
//! (q|k|v|g, and the dense MLP's gate|up). The session that runs them is `target::CudaTarget`.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use half::bf16;

use fastdecode_model::checkpoint::TensorStore;
use fastdecode_model::config::{LagunaConfig, LayerType};
use fastdecode_model::inventory::{target_inventory, Layout};
use fastdecode_model::rope::Rope;

use crate::device::Gpu;
use crate::error::{CudaError, Result};
use crate::ops::{DevNvfp4, DevRope, MoeLayer, MoeShape, MoeWeights, TopK};
use crate::weights::WeightSource;

pub struct DevMoe {
    pub router: CudaSlice<bf16>,
    pub bias: CudaSlice<f32>,
    pub gate: DevNvfp4,
    pub up: DevNvfp4,
    pub down: DevNvfp4,
    pub shared_gate: DevNvfp4,
    pub shared_up: DevNvfp4,
    pub shared_down: DevNvfp4,
}

impl DevMoe {
    /// The layer as the expert kernels take it.
    pub fn layer(&self, shape: MoeShape, scaling: f32) -> MoeLayer<'_> {
        let w = MoeWeights {
            gate: &self.gate,
            up: &self.up,
            down: &self.down,
            shared_gate: &self.shared_gate,
            shared_up: &self.shared_up,
            shared_down: &self.shared_down,
        };
        MoeLayer { w, shape, scaling }
    }

    /// The router's top-k as `c` configures it, with this layer's expert biases.
    pub fn top_k(&self, c: &LagunaConfig) -> TopK<'_> {
        TopK {
            bias: &self.bias,
            norm_topk: c.norm_topk_prob,
            softcap: c.moe_router_logit_softcapping as f32,
        }
    }
}

pub enum DevFfn {
    Dense {
        /// gate_proj rows, then up_proj rows: one GEMV computes both.
        gate_up: CudaSlice<bf16>,
        down: CudaSlice<bf16>,
    },
    Moe(Box<DevMoe>),
}

pub struct DevLayer {
    pub input_norm: CudaSlice<bf16>,
    pub post_norm: CudaSlice<bf16>,
    /// q_proj, k_proj, v_proj and g_proj rows stacked: one GEMV computes all four.
    pub qkvg: CudaSlice<bf16>,
    pub o: CudaSlice<bf16>,
    pub q_norm: CudaSlice<bf16>,
    pub k_norm: CudaSlice<bf16>,
    pub rope: DevRope,
    pub heads: usize,
    /// 0 = full attention.
    pub window: usize,
    pub ffn: DevFfn,
}

/// A stack of Laguna decoder layers with its embedding, final norm and lm_head: the target, or
/// the DFlash drafter (`drafter.rs`), whose layers are Laguna layers too and which shares the
/// target's embedding and lm_head (hence the `Arc`s).
pub struct CudaModel {
    pub gpu: Arc<Gpu>,
    pub cfg: LagunaConfig,
    pub embed: Arc<CudaSlice<bf16>>,
    pub lm_head: Arc<CudaSlice<bf16>>,
    pub norm: CudaSlice<bf16>,
    pub layers: Vec<DevLayer>,
}

fn bf16s(store: &WeightSource, name: &str, gpu: &Gpu) -> Result<CudaSlice<bf16>> {
    store.bf16(gpu, name)
}

/// Several weight matrices of equal input width stacked row-wise into one device buffer.
fn stacked(store: &WeightSource, names: &[String], gpu: &Gpu) -> Result<CudaSlice<bf16>> {
    let parts = names
        .iter()
        .map(|n| bf16s(store, n, gpu))
        .collect::<Result<Vec<_>>>()?;
    let total = parts.iter().map(|p| p.len()).sum();
    let mut out = gpu.stream.alloc_zeros::<bf16>(total)?;
    let mut at = 0;
    for p in &parts {
        gpu.stream
            .memcpy_dtod(p, &mut out.slice_mut(at..at + p.len()))?;
        at += p.len();
    }
    Ok(out)
}

fn nvfp4(store: &WeightSource, base: &str, gpu: &Gpu) -> Result<DevNvfp4> {
    Ok(DevNvfp4 {
        codes: store.u32(gpu, &format!("{base}.weight"))?,
        scales: store.u8(gpu, &format!("{base}.scales"))?,
    })
}

impl CudaModel {
    /// Uploads a runtime-layout checkpoint (checked against the inventory first).
    pub fn upload(gpu: Arc<Gpu>, cfg: LagunaConfig, store: &TensorStore) -> Result<CudaModel> {
        if Layout::of(&cfg) != Layout::Runtime {
            return Err(CudaError::Shape(format!(
                "{}: the CUDA backend runs the NVFP4 runtime layout; convert with `fastdecode transform`",
                store.dir().display()
            )));
        }
        store.check(&target_inventory(&cfg, Layout::Runtime), false)?;
        Self::build(gpu, cfg, &WeightSource::Store(store))
    }

    /// Generates `synth`'s weights for `cfg` (runtime layout) directly in GPU memory.
    pub fn synthetic(gpu: Arc<Gpu>, mut cfg: LagunaConfig, seed: u64) -> Result<CudaModel> {
        cfg.quantization
            .get_or_insert(fastdecode_model::config::Quantization {
                group_size: 16,
                bits: 4,
            });
        let specs = target_inventory(&cfg, Layout::Runtime);
        Self::build(gpu, cfg, &WeightSource::synthetic(seed, &specs))
    }

    fn build(gpu: Arc<Gpu>, cfg: LagunaConfig, store: &WeightSource) -> Result<CudaModel> {
        check_shapes(&cfg)?;
        let g = gpu.as_ref();
        let layers = build_layers(&cfg, "model.layers", store, g)?;
        let lm = if cfg.tie_word_embeddings {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        Ok(CudaModel {
            embed: Arc::new(bf16s(store, "model.embed_tokens.weight", g)?),
            lm_head: Arc::new(bf16s(store, lm, g)?),
            norm: bf16s(store, "model.norm.weight", g)?,
            layers,
            cfg,
            gpu,
        })
    }

    /// A stack of `cfg`'s layers named `{prefix}.{i}.…` (the drafter's: `layers.{i}.…`) over
    /// this model's embedding and lm_head, with `norm` as its final norm.
    pub(crate) fn sibling(
        &self,
        cfg: LagunaConfig,
        prefix: &str,
        norm: &str,
        store: &WeightSource,
    ) -> Result<CudaModel> {
        check_shapes(&cfg)?;
        let g = self.gpu.as_ref();
        Ok(CudaModel {
            embed: self.embed.clone(),
            lm_head: self.lm_head.clone(),
            norm: bf16s(store, norm, g)?,
            layers: build_layers(&cfg, prefix, store, g)?,
            cfg,
            gpu: self.gpu.clone(),
        })
    }
}

/// The decoder layers of `cfg`, their tensors named `{prefix}.{i}.…` in `store`.
fn build_layers(
    cfg: &LagunaConfig,
    prefix: &str,
    store: &WeightSource,
    g: &Gpu,
) -> Result<Vec<DevLayer>> {
    let mut layers = vec![];
    for i in 0..cfg.num_hidden_layers {
        let p = format!("{prefix}.{i}");
        let a = format!("{p}.self_attn");
        let m = format!("{p}.mlp");
        let rope = Rope::new(cfg.rope(i), cfg.head_dim);
        let ffn = if cfg.is_sparse(i) {
            DevFfn::Moe(Box::new(DevMoe {
                router: bf16s(store, &format!("{m}.gate.weight"), g)?,
                bias: store.f32(g, &format!("{m}.gate.e_score_correction_bias"))?,
                gate: nvfp4(store, &format!("{m}.switch_mlp.gate_proj"), g)?,
                up: nvfp4(store, &format!("{m}.switch_mlp.up_proj"), g)?,
                down: nvfp4(store, &format!("{m}.switch_mlp.down_proj"), g)?,
                shared_gate: nvfp4(store, &format!("{m}.shared_expert.gate_proj"), g)?,
                shared_up: nvfp4(store, &format!("{m}.shared_expert.up_proj"), g)?,
                shared_down: nvfp4(store, &format!("{m}.shared_expert.down_proj"), g)?,
            }))
        } else {
            DevFfn::Dense {
                gate_up: stacked(
                    store,
                    &[
                        format!("{m}.gate_proj.weight"),
                        format!("{m}.up_proj.weight"),
                    ],
                    g,
                )?,
                down: bf16s(store, &format!("{m}.down_proj.weight"), g)?,
            }
        };
        layers.push(DevLayer {
            input_norm: bf16s(store, &format!("{p}.input_layernorm.weight"), g)?,
            post_norm: bf16s(store, &format!("{p}.post_attention_layernorm.weight"), g)?,
            qkvg: stacked(
                store,
                &["q_proj", "k_proj", "v_proj", "g_proj"].map(|n| format!("{a}.{n}.weight")),
                g,
            )?,
            o: bf16s(store, &format!("{a}.o_proj.weight"), g)?,
            q_norm: bf16s(store, &format!("{a}.q_norm.weight"), g)?,
            k_norm: bf16s(store, &format!("{a}.k_norm.weight"), g)?,
            rope: DevRope {
                inv_freq: g.stream.clone_htod(&rope.inv_freq)?,
                rot_dim: rope.rotary_dim,
                scaling: rope.attention_scaling,
            },
            heads: cfg.heads(i),
            window: if cfg.layer_types[i] == LayerType::Sliding {
                cfg.sliding_window
            } else {
                0
            },
            ffn,
        });
    }
    Ok(layers)
}

/// The kernels' shape requirements, checked once at load.
fn check_shapes(c: &LagunaConfig) -> Result<()> {
    let mut widths = vec![
        ("hidden_size", c.hidden_size),
        ("intermediate_size", c.intermediate_size),
    ];
    for i in 0..c.num_hidden_layers {
        widths.push((
            "num_attention_heads_per_layer × head_dim",
            c.heads(i) * c.head_dim,
        ));
    }
    for (name, w) in widths {
        if w % 8 != 0 {
            return Err(CudaError::Shape(format!(
                "{name} = {w} must be a multiple of 8 for the CUDA GEMV"
            )));
        }
    }
    for i in 0..c.num_hidden_layers {
        crate::ops::AttnShape {
            heads: c.heads(i),
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            window: 0,
            ring: 0,
        }
        .check(&format!("layer {i} attention"))?;
    }
    if c.num_experts > 0 {
        moe_shape(c).check()?;
    }
    Ok(())
}

/// The MoE shape of `c` as the kernels take it.
pub fn moe_shape(c: &LagunaConfig) -> crate::ops::MoeShape {
    crate::ops::MoeShape {
        hidden: c.hidden_size,
        experts: c.num_experts,
        top_k: c.num_experts_per_tok,
        inter: c.moe_intermediate_size,
        shared_inter: c.shared_expert_intermediate_size,
    }
}
