"""Shared pieces of the training scripts: the model config, corpus loading and tokenisation, a dense
experts forward for training (with optional NVFP4 quantisation-aware training), checkpoint export."""
from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import random
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nvfp4  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BOS, EOS, PAD, MASK = 0, 1, 2, 3

# The target: every Laguna feature at a size that trains in minutes and stays under 16 MB in bf16.
# Layer types follow XS 2.1 (full attention at i % 4 == 0), with different query-head counts for full and
# sliding layers, dense layer 0, and rope_parameters exactly as in the XS 2.1 config (YaRN partial rotary on
# full layers; max_position_embeddings / original_max_position_embeddings == factor == 32).
TARGET_CONFIG = {
    "architectures": ["LagunaForCausalLM"],
    "model_type": "laguna",
    "vocab_size": 8192,
    "hidden_size": 256,
    "intermediate_size": 384,
    "num_hidden_layers": 5,
    "num_attention_heads": 4,
    "num_attention_heads_per_layer": [4, 6, 6, 6, 4],
    "num_key_value_heads": 2,
    "head_dim": 64,
    "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "sliding_attention",
                    "full_attention"],
    "sliding_window": 64,
    "mlp_layer_types": ["dense", "sparse", "sparse", "sparse", "sparse"],
    "mlp_only_layers": [0],
    "decoder_sparse_step": 1,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 64,
    "moe_routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "moe_apply_router_weight_on_input": False,
    "moe_router_logit_softcapping": 0.0,
    "router_aux_loss_coef": 0.0,
    "gating": "per-head",
    "gating_types": ["per_head"] * 5,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.02,
    "max_position_embeddings": 262144,
    "rope_parameters": {
        "full_attention": {
            "rope_theta": 500000.0,
            "rope_type": "yarn",
            "factor": 32.0,
            "original_max_position_embeddings": 8192,
            "beta_slow": 1.0,
            "beta_fast": 64.0,
            "attention_factor": 1.0,
            "partial_rotary_factor": 0.5,
        },
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
    },
    "tie_word_embeddings": False,
    "bos_token_id": BOS,
    "eos_token_id": [EOS],
    "pad_token_id": PAD,
    "use_cache": True,
}


def log(*a) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def lr_at(step: int, total_steps: int, lr: float, warmup: int, floor: float) -> float:
    """The learning rate of `step` (both trainings): a linear warmup over `warmup` steps, then a
    cosine decay to `floor` times `lr` at `total_steps`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * frac)))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def read_docs(path: Path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def load_tokenizer(path: Path):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(path))
    for i, s in enumerate(["<|bos|>", "<|eos|>", "<|pad|>", "<|mask|>"]):
        assert tok.token_to_id(s) == i
    return tok


def encode_docs(tok, docs: list[dict]) -> list[list[int]]:
    return [e.ids for e in tok.encode_batch([d["text"] for d in docs])]


def token_stream(encoded: list[list[int]]) -> torch.Tensor:
    """Documents in file order as one stream: <|bos|> doc <|eos|> <|bos|> doc <|eos|> ..."""
    total = sum(len(e) + 2 for e in encoded)
    out = np.empty(total, dtype=np.int32)
    i = 0
    for e in encoded:
        out[i] = BOS
        out[i + 1:i + 1 + len(e)] = e
        out[i + 1 + len(e)] = EOS
        i += len(e) + 2
    return torch.from_numpy(out)


def find_corpus(corpus_dir: Path, split: str) -> Path:
    for name in (f"corpus-{split}.jsonl.gz", f"{split}.jsonl"):
        if (corpus_dir / name).exists():
            return corpus_dir / name
    raise FileNotFoundError(f"no {split} corpus in {corpus_dir}")


# ----------------------------------------------------------------------------------------------------------
# Dense experts forward for training: every token through all E experts as two plain GEMMs, weighted by the
# (renormalised, top-k) routing weights, zero for experts not selected. The same function as HF's eager
# per-expert loop (up to summation order), but fast on a GPU, autocast-friendly and QAT-capable.
# ----------------------------------------------------------------------------------------------------------

def dense_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    n, d = hidden_states.shape
    e, two_i, _ = self.gate_up_proj.shape
    i = two_i // 2
    gu, dn = self.gate_up_proj, self.down_proj
    if getattr(self, "qat", False):
        gu, dn = nvfp4.ste(gu), nvfp4.ste(dn)
    comb = torch.zeros(n, e, dtype=top_k_weights.dtype, device=hidden_states.device)
    comb = comb.scatter(1, top_k_index, top_k_weights)
    h = F.linear(hidden_states, gu.reshape(e * two_i, d)).view(n, e, two_i)
    gate, up = h[..., :i], h[..., i:]
    a = F.silu(gate) * up * comb.to(h.dtype)[..., None]  # hidden_act is silu
    out = F.linear(a.reshape(n, e * i), dn.permute(1, 0, 2).reshape(d, e * i))
    return out.to(hidden_states.dtype)


def register_dense_experts() -> None:
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    ALL_EXPERTS_FUNCTIONS.register("dense_train", dense_experts_forward)


def _qat_mlp_forward(self, x):
    gw, uw, dw = self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight
    if getattr(self, "qat", False):
        gw, uw, dw = nvfp4.ste(gw), nvfp4.ste(uw), nvfp4.ste(dw)
    return F.linear(self.act_fn(F.linear(x, gw)) * F.linear(x, uw), dw)


def sparse_layers(model):
    return [l for l, t in zip(model.model.layers, model.config.mlp_layer_types) if t == "sparse"]


def set_qat(model, on: bool) -> None:
    """Fake-quantise the routed and shared experts of sparse layers in the forward (straight-through)."""
    for layer in sparse_layers(model):
        layer.mlp.experts.qat = on
        sh = layer.mlp.shared_experts
        sh.qat = on
        if not isinstance(sh.forward, types.MethodType) or sh.forward.__func__ is not _qat_mlp_forward:
            sh.forward = types.MethodType(_qat_mlp_forward, sh)


def quantized_param_names(config) -> list[str]:
    names = []
    for n, t in enumerate(config.mlp_layer_types):
        if t == "sparse":
            p = f"model.layers.{n}.mlp."
            names += [p + "experts.gate_up_proj", p + "experts.down_proj"]
            names += [p + f"shared_experts.{w}.weight" for w in ("gate_proj", "up_proj", "down_proj")]
    return names


@torch.no_grad()
def export_state_dict(model) -> dict[str, torch.Tensor]:
    """Every weight rounded to bf16; routed and shared experts of sparse layers replaced by their NVFP4
    fixed point (exact in bf16). Returns the bf16 tensors by HF name."""
    sd = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
    qnames = set(quantized_param_names(model.config))
    out = {}
    for k, v in sd.items():
        b = v.to(torch.bfloat16)
        if k in qnames:
            fp = nvfp4.fixed_point(b.to(torch.float64))
            b = fp.to(torch.bfloat16)
            assert torch.equal(b.to(torch.float64), fp), k
        out[k] = b
    missing = qnames - set(out)
    assert not missing, missing
    return out


def build_model(config_dict: dict, experts_impl: str = "eager", attn_impl: str = "sdpa"):
    from transformers import LagunaConfig, LagunaForCausalLM
    register_dense_experts()
    cfg = LagunaConfig(**config_dict)
    model = LagunaForCausalLM(cfg)
    model.set_experts_implementation(experts_impl)
    model.set_attn_implementation(attn_impl)
    return model


def load_hf(path: Path, dtype=torch.float32, experts_impl: str = "eager", attn_impl: str = "eager"):
    from transformers import LagunaForCausalLM
    register_dense_experts()
    model = LagunaForCausalLM.from_pretrained(str(path), dtype=dtype, experts_implementation=experts_impl,
                                              attn_implementation=attn_impl)
    model.eval()
    return model


def tap_hooks(model, layer_ids: list[int], store: dict):
    """Capture the output of decoder layer j (after its residual add, before the final norm).
    NB: HF's output_hidden_states would NOT do for the last layer: transformers' capture_outputs replaces
    hidden_states[-1] by the final-normed last_hidden_state."""
    handles = []
    for j in layer_ids:
        def hook(mod, args, out, j=j):
            store[j] = out[0] if isinstance(out, tuple) else out
        handles.append(model.model.layers[j].register_forward_hook(hook))
    return handles
