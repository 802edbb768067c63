//! A table of bad inputs, each run through the real `fastdecode` binary as a user would type
//! it. For every one: a non-zero exit code (not a signal), no panic text, a message naming the
//! file, tensor, field or option at fault, and nothing new or changed in the case's directory
//! (the working directory, which holds every output path a case names). The shared fixtures
//! (a tiny model, its HF twin, a golden) must be unchanged after the whole table too.
//!
//! Placeholders in a command line: `{M}` the model, `{H}` the HF model, `{G}` a directory with
//! one golden of `{M}`, `{B}` this binary, `{D}` the case's own directory.

mod support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use support::*;

type Setup = Box<dyn Fn(&Path) + Send + Sync>;

struct Case {
    name: &'static str,
    setup: Option<Setup>,
    args: &'static str,
    /// Every one of these must appear in stderr.
    must: &'static [&'static str],
}

fn case(name: &'static str, args: &'static str, must: &'static [&'static str]) -> Case {
    Case {
        name,
        setup: None,
        args,
        must,
    }
}

fn with(
    name: &'static str,
    setup: impl Fn(&Path) + Send + Sync + 'static,
    args: &'static str,
    must: &'static [&'static str],
) -> Case {
    Case {
        name,
        setup: Some(Box::new(setup)),
        args,
        must,
    }
}

/// `{D}/m`: a copy of the model, edited by `edit`.
fn model(d: &Path, edit: impl FnOnce(&Path)) {
    let m = d.join("m");
    link_copy(&fixture().model, &m);
    edit(&m);
}

/// `{D}/h`: a copy of the HF model, edited by `edit`.
fn hf(d: &Path, edit: impl FnOnce(&Path)) {
    let h = d.join("h");
    link_copy(&fixture().hf, &h);
    edit(&h);
}

/// `{D}/m` with its config edited.
fn config(d: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    model(d, |m| edit_json(&m.join("config.json"), edit));
}

/// `{D}/m` with its drafter's config edited.
fn drafter_config(d: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    model(d, |m| edit_json(&m.join("drafter/config.json"), edit));
}

fn file(d: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(d.join(name), bytes).unwrap();
}

/// `{D}/g.json`: the fixture's golden, edited.
fn golden(d: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let src = goldens().join("golden-000.json");
    std::fs::copy(&src, d.join("g.json")).unwrap();
    edit_json(&d.join("g.json"), edit);
}

/// Edits the header of the safetensors file `file` (replacing it); the data stays as it was.
fn edit_header(file: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    rewrite_header(file, |text| {
        let mut h: serde_json::Value = serde_json::from_str(text).unwrap();
        edit(&mut h);
        serde_json::to_string(&h).unwrap()
    });
}

/// `{D}/t/x.toml`: the serial-tiny track with the first `old` replaced by `new`.
fn track(d: &Path, old: &str, new: &str) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tracks/serial-tiny.toml");
    let text = std::fs::read_to_string(src).unwrap();
    assert!(text.contains(old), "{old}");
    std::fs::create_dir(d.join("t")).unwrap();
    file(
        &d.join("t"),
        "x.toml",
        text.replacen(old, new, 1).as_bytes(),
    );
}

const TRACE: &str = "module,ns,kind,event,block,clock\nm,0,2,0,0,0\nm,5,2,2,0,9\n";

fn cases() -> Vec<Case> {
    use serde_json::json;
    vec![
        // The command line itself.
        case("unknown command", "frobnicate", &["frobnicate"]),
        case(
            "unknown option",
            "generate --model {M} --prompt-ids 1 --turbo",
            &["--turbo"],
        ),
        // synth
        case(
            "unknown preset",
            "synth --preset huge --out {D}/o",
            &["huge"],
        ),
        case("synth without preset", "synth --out {D}/o", &["--preset"]),
        case(
            "synth over a model",
            "synth --preset tiny --out {M}",
            &["already exists"],
        ),
        case(
            "synth --out x/..",
            "synth --preset tiny --out {D}/x/..",
            &["does not name a new directory"],
        ),
        case(
            "synth --out .",
            "synth --preset tiny --out .",
            &["does not name a new directory"],
        ),
        with(
            "synth under a file",
            |d| file(d, "f", b"x"),
            "synth --preset tiny --out {D}/f/o",
            &["f", "not a directory"],
        ),
        with(
            "synth over a file",
            |d| file(d, "f", b"x"),
            "synth --preset tiny --out {D}/f",
            &["f", "already exists"],
        ),
        case(
            "synth --seed -1",
            "synth --preset tiny --seed -1 --out {D}/o",
            &["--seed"],
        ),
        case(
            "synth --layout",
            "synth --preset tiny --layout weird --out {D}/o",
            &["--layout"],
        ),
        // transform
        case(
            "transform a missing input",
            "transform {D}/none {D}/o",
            &["none/config.json"],
        ),
        case(
            "transform a runtime model",
            "transform {M} {D}/o",
            &["already the runtime layout"],
        ),
        case(
            "transform into its input",
            "transform {H} {H}/out",
            &["inside the input directory"],
        ),
        case(
            "transform over a model",
            "transform {H} {M}",
            &["already exists"],
        ),
        case(
            "transform --out x/..",
            "transform {H} {D}/x/..",
            &["does not name a new directory"],
        ),
        with(
            "transform truncated",
            |d| {
                hf(d, |h| {
                    let p = h.join("model.safetensors");
                    let b = std::fs::read(&p).unwrap();
                    replace(&p, &b[..b.len() / 2]);
                })
            },
            "transform {D}/h {D}/o",
            &["model.safetensors", "truncated"],
        ),
        with(
            "transform NaN expert",
            |d| {
                hf(d, |h| {
                    patch_bf16(
                        &h.join("model.safetensors"),
                        "model.layers.1.mlp.experts.gate_up_proj",
                        7,
                        0x7fc0,
                    )
                })
            },
            "transform {D}/h {D}/o",
            &["model.layers.1.mlp.experts.gate_up_proj", "NaN"],
        ),
        with(
            "transform NaN norm",
            |d| {
                hf(d, |h| {
                    patch_bf16(&h.join("model.safetensors"), "model.norm.weight", 0, 0x7fc0)
                })
            },
            "transform {D}/h {D}/o",
            &["model.norm.weight", "NaN"],
        ),
        with(
            "transform Inf lm_head",
            |d| {
                hf(d, |h| {
                    patch_bf16(&h.join("model.safetensors"), "lm_head.weight", 5, 0xff80)
                })
            },
            "transform {D}/h {D}/o",
            &["lm_head.weight", "inf"],
        ),
        with(
            "transform FIFO config",
            |d| {
                hf(d, |h| {
                    std::fs::remove_file(h.join("config.json")).unwrap();
                    mkfifo(&h.join("config.json"));
                })
            },
            "transform {D}/h {D}/o",
            &["config.json", "FIFO"],
        ),
        with(
            "transform FIFO tokenizer",
            |d| {
                hf(d, |h| {
                    std::fs::remove_file(h.join("tokenizer.json")).unwrap();
                    mkfifo(&h.join("tokenizer.json"));
                })
            },
            "transform {D}/h {D}/o",
            &["tokenizer.json", "FIFO"],
        ),
        with(
            "transform bad JSON",
            |d| hf(d, |h| replace(&h.join("config.json"), b"{ nope")),
            "transform {D}/h {D}/o",
            &["config.json", "invalid JSON"],
        ),
        with(
            "transform two shards, same tensors",
            |d| {
                hf(d, |h| {
                    // A second shard holding a tensor that the first holds too.
                    std::fs::copy(h.join("model.safetensors"), h.join("model-2.safetensors"))
                        .unwrap();
                })
            },
            "transform {D}/h {D}/o",
            &["appears in both", "model-2.safetensors"],
        ),
        // inspect: configs
        case(
            "inspect a missing dir",
            "inspect {D}/none",
            &["none/config.json"],
        ),
        case("inspect nothing", "inspect", &["--preset"]),
        case("inspect unknown preset", "inspect --preset huge", &["huge"]),
        with(
            "hidden_size 2^40",
            |d| config(d, |v| v["hidden_size"] = json!(1u64 << 40)),
            "inspect {D}/m",
            &["hidden_size", "limit"],
        ),
        with(
            "vocab_size 2^40",
            |d| config(d, |v| v["vocab_size"] = json!(1u64 << 40)),
            "inspect {D}/m",
            &["vocab_size", "limit"],
        ),
        with(
            "layers 100000",
            |d| config(d, |v| v["num_hidden_layers"] = json!(100000)),
            "inspect {D}/m",
            &["num_hidden_layers"],
        ),
        with(
            "experts 2^20",
            |d| config(d, |v| v["num_experts"] = json!(1 << 20)),
            "inspect {D}/m",
            &["num_experts"],
        ),
        with(
            "head_dim 2^20",
            |d| config(d, |v| v["head_dim"] = json!(1 << 20)),
            "inspect {D}/m",
            &["head_dim"],
        ),
        with(
            "max positions 0",
            |d| config(d, |v| v["max_position_embeddings"] = json!(0)),
            "inspect {D}/m",
            &["max_position_embeddings"],
        ),
        with(
            "max positions 10^12",
            |d| {
                config(d, |v| {
                    v["max_position_embeddings"] = json!(1_000_000_000_000u64)
                })
            },
            "inspect {D}/m",
            &["max_position_embeddings"],
        ),
        with(
            "sliding_window 0",
            |d| config(d, |v| v["sliding_window"] = json!(0)),
            "inspect {D}/m",
            &["sliding_window"],
        ),
        with(
            "sliding_window -1",
            |d| config(d, |v| v["sliding_window"] = json!(-1)),
            "inspect {D}/m",
            &["config.json", "line"],
        ),
        with(
            "rope_theta 0.5",
            |d| {
                config(d, |v| {
                    v["rope_parameters"]["sliding_attention"]["rope_theta"] = json!(0.5)
                })
            },
            "inspect {D}/m",
            &["sliding_attention.rope_theta"],
        ),
        with(
            "softcap negative",
            |d| config(d, |v| v["moe_router_logit_softcapping"] = json!(-1.0)),
            "inspect {D}/m",
            &["moe_router_logit_softcapping"],
        ),
        with(
            "rms_norm_eps 0",
            |d| config(d, |v| v["rms_norm_eps"] = json!(0.0)),
            "inspect {D}/m",
            &["rms_norm_eps"],
        ),
        with(
            "yarn factor 0.5",
            |d| {
                config(d, |v| {
                    v["rope_parameters"]["full_attention"]["factor"] = json!(0.5)
                })
            },
            "inspect {D}/m",
            &["full_attention.factor"],
        ),
        with(
            "yarn original positions 1e30",
            |d| {
                config(d, |v| {
                    v["rope_parameters"]["full_attention"]["original_max_position_embeddings"] =
                        json!(1e30)
                })
            },
            "inspect {D}/m",
            &["original_max_position_embeddings"],
        ),
        with(
            "top-k above experts",
            |d| config(d, |v| v["num_experts_per_tok"] = json!(33)),
            "inspect {D}/m",
            &["num_experts_per_tok"],
        ),
        with(
            "eos outside vocab",
            |d| config(d, |v| v["eos_token_id"] = json!([2, 512])),
            "inspect {D}/m",
            &["eos_token_id"],
        ),
        with(
            "drafter block 32",
            |d| drafter_config(d, |v| v["block_size"] = json!(32)),
            "inspect {D}/m",
            &["drafter/config.json", "block_size"],
        ),
        with(
            "drafter layers 2^20",
            |d| drafter_config(d, |v| v["num_hidden_layers"] = json!(1 << 20)),
            "inspect {D}/m",
            &["drafter/config.json", "num_hidden_layers"],
        ),
        with(
            "config is a directory",
            |d| {
                model(d, |m| {
                    std::fs::remove_file(m.join("config.json")).unwrap();
                    std::fs::create_dir(m.join("config.json")).unwrap();
                })
            },
            "inspect {D}/m",
            &["config.json", "directory"],
        ),
        with(
            "config not UTF-8",
            |d| model(d, |m| replace(&m.join("config.json"), b"{\xff\xfe}")),
            "inspect {D}/m",
            &["config.json", "UTF-8"],
        ),
        with(
            "config FIFO",
            |d| {
                model(d, |m| {
                    std::fs::remove_file(m.join("config.json")).unwrap();
                    mkfifo(&m.join("config.json"));
                })
            },
            "inspect {D}/m",
            &["config.json", "FIFO"],
        ),
        with(
            "inspect drafter of none",
            |d| model(d, |m| std::fs::remove_dir_all(m.join("drafter")).unwrap()),
            "inspect --inventory --drafter {D}/m",
            &["no drafter"],
        ),
        // verify
        case("verify a missing dir", "verify {D}/none", &["none"]),
        with(
            "verify a file",
            |d| file(d, "f", b"x"),
            "verify {D}/f",
            &["f", "not a directory"],
        ),
        with(
            "verify a flipped byte",
            |d| {
                model(d, |m| {
                    let p = m.join("drafter/model.safetensors");
                    let mut b = std::fs::read(&p).unwrap();
                    let n = b.len() - 1;
                    b[n] ^= 1;
                    replace(&p, &b);
                })
            },
            "verify {D}/m",
            &["drafter/model.safetensors", "sha256"],
        ),
        with(
            "verify a short file",
            |d| {
                model(d, |m| {
                    let p = m.join("tokenizer.json");
                    let b = std::fs::read(&p).unwrap();
                    replace(&p, &b[..10]);
                })
            },
            "verify {D}/m",
            &["tokenizer.json", "size"],
        ),
        with(
            "verify an extra file",
            |d| model(d, |m| file(m, "extra.bin", b"x")),
            "verify {D}/m",
            &["extra.bin", "not listed"],
        ),
        with(
            "verify a missing file",
            |d| {
                model(d, |m| {
                    std::fs::remove_file(m.join("tokenizer.json")).unwrap()
                })
            },
            "verify {D}/m",
            &["tokenizer.json", "missing"],
        ),
        with(
            "verify a FIFO",
            |d| model(d, |m| mkfifo(&m.join("pipe"))),
            "verify {D}/m",
            &["pipe", "FIFO"],
        ),
        with(
            "verify a malformed MANIFEST",
            |d| model(d, |m| replace(&m.join("MANIFEST"), b"abc 5 x\n")),
            "verify {D}/m",
            &["MANIFEST line 1"],
        ),
        with(
            "verify MANIFEST with ..",
            |d| {
                model(d, |m| {
                    replace(
                        &m.join("MANIFEST"),
                        format!("{} 5 ../x\n", "a".repeat(64)).as_bytes(),
                    )
                })
            },
            "verify {D}/m",
            &["MANIFEST line 1", "inside"],
        ),
        with(
            "verify MANIFEST FIFO",
            |d| {
                model(d, |m| {
                    std::fs::remove_file(m.join("MANIFEST")).unwrap();
                    mkfifo(&m.join("MANIFEST"));
                })
            },
            "verify {D}/m",
            &["MANIFEST", "FIFO"],
        ),
        with(
            "verify a listed link out",
            |d| {
                model(d, |m| {
                    std::fs::remove_file(m.join("tokenizer.json")).unwrap();
                    file(d, "outside.json", b"{}");
                    std::os::unix::fs::symlink(d.join("outside.json"), m.join("tokenizer.json"))
                        .unwrap();
                })
            },
            "verify {D}/m",
            &["tokenizer.json", "outside"],
        ),
        with(
            "verify --write a link out",
            |d| {
                model(d, |m| {
                    file(d, "secret", b"s");
                    std::os::unix::fs::symlink(d.join("secret"), m.join("leak")).unwrap();
                })
            },
            "verify --write {D}/m",
            &["leak", "outside"],
        ),
        with(
            "verify --write /etc/passwd link",
            |d| {
                model(d, |m| {
                    std::os::unix::fs::symlink("/etc/passwd", m.join("passwd")).unwrap();
                })
            },
            "verify --write {D}/m",
            &["passwd", "outside"],
        ),
        with(
            "verify --write a FIFO",
            |d| model(d, |m| mkfifo(&m.join("pipe"))),
            "verify --write {D}/m",
            &["pipe", "FIFO"],
        ),
        with(
            "verify --write a dir link",
            |d| {
                model(d, |m| {
                    std::os::unix::fs::symlink("drafter", m.join("again")).unwrap();
                })
            },
            "verify --write {D}/m",
            &["again", "directory"],
        ),
        with(
            "verify --write a dangling link",
            |d| {
                model(d, |m| {
                    std::os::unix::fs::symlink("nowhere", m.join("dangling")).unwrap();
                })
            },
            "verify --write {D}/m",
            &["dangling", "cannot be followed"],
        ),
        with(
            "verify --write a partial",
            |d| model(d, |m| file(m, ".x.abc.partial", b"half")),
            "verify --write {D}/m",
            &[".x.abc.partial", "unfinished"],
        ),
        with(
            "verify --write a newline name",
            |d| model(d, |m| file(m, "a\nb", b"x")),
            "verify --write {D}/m",
            &["printable"],
        ),
        with(
            "verify --write a file",
            |d| file(d, "f", b"x"),
            "verify --write {D}/f",
            &["f", "not a directory"],
        ),
        // generate
        case(
            "generate --block-size 0",
            "generate --model {M} --prompt-ids 1 --block-size 0",
            &["--block-size"],
        ),
        case(
            "generate --block-size 17",
            "generate --model {M} --prompt-ids 1 --block-size 17",
            &["--block-size"],
        ),
        case(
            "generate --max-new-tokens 0",
            "generate --model {M} --prompt-ids 1 --max-new-tokens 0",
            &["--max-new-tokens"],
        ),
        case(
            "generate --max-new-tokens -3",
            "generate --model {M} --prompt-ids 1 --max-new-tokens -3",
            &["--max-new-tokens"],
        ),
        case(
            "generate --max-new-tokens 10^12",
            "generate --model {M} --prompt-ids 1 --max-new-tokens 1000000000000",
            &["--max-new-tokens", "max_position_embeddings"],
        ),
        case(
            "generate --max-new-tokens 2^64",
            "generate --model {M} --prompt-ids 1 --max-new-tokens 18446744073709551616",
            &["--max-new-tokens"],
        ),
        case(
            "generate id past vocab",
            "generate --model {M} --prompt-ids 1,600",
            &["--prompt-ids", "600"],
        ),
        case(
            "generate id not a number",
            "generate --model {M} --prompt-ids 1,x",
            &["--prompt-ids"],
        ),
        case(
            "generate id negative",
            "generate --model {M} --prompt-ids -1",
            &["--prompt-ids"],
        ),
        case(
            "generate empty ids",
            "generate --model {M} --prompt-ids ,",
            &["--prompt-ids"],
        ),
        case(
            "generate empty prompt",
            "generate --model {M} --prompt=",
            &["--prompt"],
        ),
        case(
            "generate oracle 1.5",
            "generate --model {M} --prompt-ids 1 --block-size 2 --draft oracle:1.5",
            &["--draft", "oracle probability"],
        ),
        case(
            "generate oracle NaN",
            "generate --model {M} --prompt-ids 1 --block-size 2 --draft oracle:NaN",
            &["--draft"],
        ),
        case(
            "generate draft junk",
            "generate --model {M} --prompt-ids 1 --block-size 2 --draft junk",
            &["--draft", "junk"],
        ),
        case(
            "generate backend tpu",
            "generate --model {M} --prompt-ids 1 --backend tpu",
            &["--backend"],
        ),
        case(
            "generate seed -1",
            "generate --model {M} --prompt-ids 1 --seed -1",
            &["--seed"],
        ),
        case(
            "generate no model",
            "generate --model {D}/none --prompt-ids 1",
            &["none", "config.json"],
        ),
        case(
            "generate model is a file",
            "generate --model {B} --prompt-ids 1",
            &["config.json"],
        ),
        with(
            "generate text without tokenizer",
            |d| {
                model(d, |m| {
                    std::fs::remove_file(m.join("tokenizer.json")).unwrap()
                })
            },
            "generate --model {D}/m --prompt hi",
            &["tokenizer.json", "--prompt-ids"],
        ),
        with(
            "generate NaN norm",
            |d| {
                model(d, |m| {
                    patch_bf16(&m.join("model.safetensors"), "model.norm.weight", 1, 0x7fc0)
                })
            },
            "generate --model {D}/m --prompt-ids 1",
            &["model.norm.weight", "NaN"],
        ),
        with(
            "generate Inf embedding",
            |d| {
                model(d, |m| {
                    patch_bf16(
                        &m.join("model.safetensors"),
                        "model.embed_tokens.weight",
                        9,
                        0x7f80,
                    )
                })
            },
            "generate --model {D}/m --prompt-ids 1",
            &["model.embed_tokens.weight", "inf"],
        ),
        with(
            "generate NaN scale",
            |d| {
                model(d, |m| {
                    patch_u8(
                        &m.join("model.safetensors"),
                        "model.layers.1.mlp.switch_mlp.down_proj.scales",
                        3,
                        0xFF,
                    )
                })
            },
            "generate --model {D}/m --prompt-ids 1",
            &[
                "model.layers.1.mlp.switch_mlp.down_proj.scales",
                "byte 3",
                "NaN",
            ],
        ),
        with(
            "generate positive NaN scale",
            |d| {
                model(d, |m| {
                    patch_u8(
                        &m.join("model.safetensors"),
                        "model.layers.1.mlp.shared_expert.gate_proj.scales",
                        0,
                        0x7F,
                    )
                })
            },
            "generate --model {D}/m --prompt-ids 1",
            &["model.layers.1.mlp.shared_expert.gate_proj.scales", "NaN"],
        ),
        with(
            "generate tensor named twice",
            |d| {
                model(d, |m| {
                    repeat_header_entry(&m.join("model.safetensors"), "model.norm.weight")
                })
            },
            "generate --model {D}/m --prompt-ids 1",
            &["model.norm.weight", "named twice", "model.safetensors"],
        ),
        with(
            "gate golden vocab 2^64-1",
            |d| golden(d, |g| g["vocab_size"] = serde_json::json!(u64::MAX)),
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["g.json", "vocab_size", "18446744073709551615"],
        ),
        with(
            "bisect golden vocab off by one",
            |d| {
                golden(d, |g| {
                    let v = g["vocab_size"].as_u64().unwrap();
                    g["vocab_size"] = serde_json::json!(v + 1)
                })
            },
            "bisect --model {M} --golden {D}/g.json",
            &["g.json", "vocab_size"],
        ),
        with(
            "generate NaN attention",
            |d| {
                model(d, |m| {
                    patch_bf16(
                        &m.join("model.safetensors"),
                        "model.layers.2.self_attn.q_proj.weight",
                        0,
                        0xffc0,
                    )
                })
            },
            "generate --model {D}/m --prompt-ids 1",
            &["model.layers.2.self_attn.q_proj.weight"],
        ),
        with(
            "generate NaN drafter, drafting",
            |d| {
                model(d, |m| {
                    patch_bf16(&m.join("drafter/model.safetensors"), "fc.weight", 0, 0x7fc0)
                })
            },
            "generate --model {D}/m --prompt-ids 1 --block-size 2",
            &["fc.weight", "drafter"],
        ),
        with(
            "generate foreign tokenizer",
            |d| {
                model(d, |m| {
                    let t = Path::new(env!("CARGO_MANIFEST_DIR"))
                        .join("../../assets/laguna-tiny/tokenizer.json");
                    replace(&m.join("tokenizer.json"), &std::fs::read(t).unwrap());
                })
            },
            "generate --model {D}/m --prompt hello",
            &["tokenizer.json", "512"],
        ),
        with(
            "generate broken tokenizer",
            |d| model(d, |m| replace(&m.join("tokenizer.json"), b"[]")),
            "generate --model {D}/m --prompt hello",
            &["tokenizer.json"],
        ),
        with(
            "generate broken drafter, drafting",
            |d| model(d, |m| replace(&m.join("drafter/config.json"), b"{")),
            "generate --model {D}/m --prompt-ids 1 --block-size 2",
            &["drafter/config.json"],
        ),
        with(
            "generate drafter without config",
            |d| {
                model(d, |m| {
                    std::fs::remove_file(m.join("drafter/config.json")).unwrap()
                })
            },
            "generate --model {D}/m --prompt-ids 1 --block-size 2",
            &["drafter", "config.json"],
        ),
        with(
            "generate drafter block 4, K 8",
            |d| drafter_config(d, |v| v["block_size"] = json!(4)),
            "generate --model {D}/m --prompt-ids 1 --block-size 8",
            &["block size 8"],
        ),
        with(
            "generate missing tensor",
            |d| {
                model(d, |m| {
                    // A shard the model cannot use: the same tensors again.
                    std::fs::copy(m.join("model.safetensors"), m.join("extra.safetensors"))
                        .unwrap();
                })
            },
            "generate --model {D}/m --prompt-ids 1",
            &["appears in both"],
        ),
        with(
            "generate safetensors FIFO",
            |d| model(d, |m| mkfifo(&m.join("more.safetensors"))),
            "generate --model {D}/m --prompt-ids 1",
            &["more.safetensors", "FIFO"],
        ),
        with(
            "generate safetensors garbage",
            |d| {
                model(d, |m| {
                    file(m, "more.safetensors", b"\x08\0\0\0\0\0\0\0{}{}{}{}")
                })
            },
            "generate --model {D}/m --prompt-ids 1",
            &["more.safetensors"],
        ),
        with(
            "generate sliding_window 2^62, too long",
            |d| config(d, |v| v["sliding_window"] = json!(1u64 << 62)),
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 40000",
            &["--max-new-tokens", "max_position_embeddings"],
        ),
        // bench
        case(
            "bench --decode-tokens 1",
            "bench --model {M} --decode-tokens 1",
            &["--decode-tokens"],
        ),
        case(
            "bench --repeats 0",
            "bench --model {M} --repeats 0",
            &["--repeats"],
        ),
        case(
            "bench --block-sizes 1",
            "bench --model {M} --block-sizes 1",
            &["--block-sizes"],
        ),
        case(
            "bench --block-sizes 2,99",
            "bench --model {M} --block-sizes 2,99",
            &["--block-sizes"],
        ),
        case(
            "bench --prompt-tokens 0",
            "bench --model {M} --prompt-tokens 0",
            &["--prompt-tokens"],
        ),
        case(
            "bench --prompt-tokens 10^8",
            "bench --model {M} --prompt-tokens 100000000",
            &["--prompt-tokens", "max_position_embeddings"],
        ),
        case(
            "bench --max-prompts 0",
            "bench --model {M} --max-prompts 0",
            &["--max-prompts"],
        ),
        case(
            "bench missing prompts",
            "bench --model {M} --prompts {D}/none.txt",
            &["none.txt"],
        ),
        case(
            "bench /dev/zero prompts",
            "bench --model {M} --prompts /dev/zero",
            &["/dev/zero", "device"],
        ),
        with(
            "bench bad traces",
            |d| file(d, "bad.json", b"{\"prompts\": 3}"),
            "bench --model {M} --prompts {D}/bad.json",
            &["bad.json"],
        ),
        with(
            "bench ids past vocab",
            |d| file(d, "ids.json", br#"{"prompts":[{"prompt_ids":[1,2,999]}]}"#),
            "bench --model {M} --prompts {D}/ids.json",
            &["ids.json", "prompt_ids", "999"],
        ),
        with(
            "bench prompt too long",
            |d| {
                let ids: Vec<u32> = (0..32760).map(|i| i % 500).collect();
                file(
                    d,
                    "long.json",
                    serde_json::json!({"prompts":[{"prompt_ids": ids}]})
                        .to_string()
                        .as_bytes(),
                );
            },
            "bench --model {M} --prompts {D}/long.json --decode-tokens 64",
            &["--decode-tokens", "max_position_embeddings"],
        ),
        with(
            "bench text without tokenizer",
            |d| {
                model(d, |m| {
                    std::fs::remove_file(m.join("tokenizer.json")).unwrap()
                });
                file(d, "p.txt", b"hello\n");
            },
            "bench --model {D}/m --prompts {D}/p.txt",
            &["tokenizer.json"],
        ),
        with(
            "bench FIFO prompts",
            |d| mkfifo(&d.join("p.txt")),
            "bench --model {M} --prompts {D}/p.txt",
            &["p.txt", "FIFO"],
        ),
        case(
            "bench --synthetic on cpu",
            "bench --model {M} --synthetic xs2.1",
            &["--synthetic"],
        ),
        case(
            "bench --trace on cpu",
            "bench --model {M} --trace {D}/t.csv",
            &["--backend cuda"],
        ),
        case(
            "bench --trace-rows without --trace",
            "bench --backend cuda --synthetic xs2.1 --trace-rows 8",
            &["--trace-rows", "--trace"],
        ),
        case(
            "bench --trace-rows 17",
            "bench --backend cuda --synthetic xs2.1 --trace {D}/t.csv --trace-rows 17",
            &["--trace-rows", "17"],
        ),
        case(
            "bench --trace-rows 0",
            "bench --backend cuda --synthetic xs2.1 --trace {D}/t.csv --trace-rows 0",
            &["--trace-rows", "0"],
        ),
        // timeline
        case("timeline missing", "timeline {D}/none.csv", &["none.csv"]),
        with(
            "timeline --window inf",
            |d| file(d, "t.csv", TRACE.as_bytes()),
            "timeline {D}/t.csv --window inf",
            &["--window"],
        ),
        with(
            "timeline --window 0",
            |d| file(d, "t.csv", TRACE.as_bytes()),
            "timeline {D}/t.csv --window 0",
            &["--window"],
        ),
        with(
            "timeline --window NaN",
            |d| file(d, "t.csv", TRACE.as_bytes()),
            "timeline {D}/t.csv --window NaN",
            &["--window"],
        ),
        with(
            "timeline --window 1e9",
            |d| file(d, "t.csv", TRACE.as_bytes()),
            "timeline {D}/t.csv --window 1e9",
            &["--window"],
        ),
        with(
            "timeline FIFO",
            |d| mkfifo(&d.join("t.csv")),
            "timeline {D}/t.csv",
            &["t.csv", "FIFO"],
        ),
        with(
            "timeline garbage",
            |d| file(d, "t.csv", b"a,b\n1,2\n"),
            "timeline {D}/t.csv",
            &["t.csv"],
        ),
        with(
            "timeline --svg under a file",
            |d| {
                file(d, "t.csv", TRACE.as_bytes());
                file(d, "f", b"x");
            },
            "timeline {D}/t.csv --svg {D}/f/t.svg",
            &["--svg", "f"],
        ),
        // An output that names an input, by any name, is refused before anything is written.
        with(
            "timeline --svg onto its own trace",
            |d| file(d, "t.csv", TRACE.as_bytes()),
            "timeline {D}/t.csv --svg {D}/t.csv",
            &["--svg", "same file as the trace", "t.csv"],
        ),
        with(
            "timeline --svg onto its trace through ..",
            |d| {
                file(d, "t.csv", TRACE.as_bytes());
                std::fs::create_dir(d.join("x")).unwrap();
            },
            "timeline {D}/t.csv --svg {D}/x/../t.csv",
            &["--svg", "same file as the trace"],
        ),
        with(
            "timeline --svg onto its trace through a link",
            |d| {
                file(d, "t.csv", TRACE.as_bytes());
                std::os::unix::fs::symlink(d.join("t.csv"), d.join("l.svg")).unwrap();
            },
            "timeline {D}/t.csv --svg {D}/l.svg",
            &["--svg", "same file as the trace"],
        ),
        with(
            "timeline --svg onto a hard link of its trace",
            |d| {
                file(d, "t.csv", TRACE.as_bytes());
                std::fs::hard_link(d.join("t.csv"), d.join("h.svg")).unwrap();
            },
            "timeline {D}/t.csv --svg {D}/h.svg",
            &["--svg", "same file as the trace"],
        ),
        // worker
        case("worker missing model", "worker --model {D}/none", &["none"]),
        case(
            "worker unknown flag",
            "worker --model {M} --flags warp",
            &["warp"],
        ),
        case(
            "worker unknown backend",
            "worker --model {M} --backend gpu",
            &["--backend"],
        ),
        with(
            "worker tampered model",
            |d| {
                model(d, |m| {
                    let p = m.join("config.json");
                    let mut b = std::fs::read(&p).unwrap();
                    b.push(b'\n');
                    replace(&p, &b);
                })
            },
            "worker --model {D}/m",
            &["config.json", "size"],
        ),
        // golden make
        case(
            "golden --count 0",
            "golden make --model {M} --out {D}/g --count 0",
            &["--count"],
        ),
        case(
            "golden --tokens 0",
            "golden make --model {M} --out {D}/g --tokens 0",
            &["--tokens"],
        ),
        case(
            "golden --prompt-tokens 0",
            "golden make --model {M} --out {D}/g --prompt-tokens 0",
            &["--prompt-tokens"],
        ),
        case(
            "golden --count with --prompt-ids",
            "golden make --model {M} --out {D}/g --count 3 --prompt-ids 1,2",
            &["--count"],
        ),
        case(
            "golden id past vocab",
            "golden make --model {M} --out {D}/g --prompt-ids 9999",
            &["--prompt-ids", "9999"],
        ),
        case(
            "golden --tokens too long",
            "golden make --model {M} --out {D}/g --tokens 40000",
            &["--tokens", "max_position_embeddings"],
        ),
        case(
            "golden --ngram longer than --tokens",
            "golden make --model {M} --out {D}/g --ngram 1000000",
            &["--ngram 1000000", "--tokens 64"],
        ),
        case(
            "golden --out in the model",
            "golden make --model {M} --out {M}/goldens",
            &["--out", "inside the model directory"],
        ),
        with(
            "golden --out not empty",
            |d| {
                std::fs::create_dir(d.join("g")).unwrap();
                file(&d.join("g"), "golden-000.json", b"old");
            },
            "golden make --model {M} --out {D}/g",
            &["--out", "not empty"],
        ),
        with(
            "golden --out a file",
            |d| file(d, "g", b"x"),
            "golden make --model {M} --out {D}/g",
            &["--out", "already exists"],
        ),
        case(
            "golden --max-ngram-hit-rate 2",
            "golden make --model {M} --out {D}/g --max-ngram-hit-rate 2",
            &["--max-ngram-hit-rate"],
        ),
        case(
            "golden --min-distinct-fraction -1",
            "golden make --model {M} --out {D}/g --min-distinct-fraction -1",
            &["--min-distinct-fraction"],
        ),
        case(
            "golden --near-tie-gap inf",
            "golden make --model {M} --out {D}/g --near-tie-gap inf",
            &["--near-tie-gap"],
        ),
        case(
            "golden --near-tie-rows too many",
            "golden make --model {M} --out {D}/g --tokens 10 --min-near-tie-rows 11",
            &["--min-near-tie-rows"],
        ),
        case(
            "golden --attempts 0",
            "golden make --model {M} --out {D}/g --attempts-per-golden 0",
            &["--attempts-per-golden"],
        ),
        case(
            "golden --ngram 0",
            "golden make --model {M} --out {D}/g --ngram 0",
            &["--ngram"],
        ),
        case(
            "golden --timeout 0",
            "golden make --model {M} --out {D}/g --timeout 0",
            &["--timeout"],
        ),
        case(
            "golden --ready-timeout NaN",
            "golden make --model {M} --out {D}/g --ready-timeout NaN",
            &["--ready-timeout"],
        ),
        case(
            "golden missing reference",
            "golden make --model {M} --out {D}/g --reference {D}/nope",
            &["--reference", "nope"],
        ),
        case(
            "golden missing model",
            "golden make --model {D}/none --out {D}/g",
            &["none/config.json"],
        ),
        with(
            "golden model without MANIFEST",
            |d| model(d, |m| std::fs::remove_file(m.join("MANIFEST")).unwrap()),
            "golden make --model {D}/m --out {D}/g",
            &["MANIFEST"],
        ),
        // gate
        case(
            "gate --oracle-p 2",
            "gate --reference {B} --candidate {B} --model {M} --golden {G} --oracle-p 2",
            &["--oracle-p"],
        ),
        case(
            "gate --block-size 17",
            "gate --reference {B} --candidate {B} --model {M} --golden {G} --block-size 17",
            &["--block-size"],
        ),
        case(
            "gate --block-size 0",
            "gate --reference {B} --candidate {B} --model {M} --golden {G} --block-size 0",
            &["--block-size"],
        ),
        case(
            "gate --envelope inf",
            "gate --reference {B} --candidate {B} --model {M} --golden {G} --envelope inf",
            &["--envelope"],
        ),
        case(
            "gate --envelope -1",
            "gate --reference {B} --candidate {B} --model {M} --golden {G} --envelope -1",
            &["--envelope"],
        ),
        case(
            "gate --budget 5000",
            "gate --reference {B} --candidate {B} --model {M} --golden {G} --budget 5000",
            &["--budget"],
        ),
        case(
            "gate --budget NaN",
            "gate --reference {B} --candidate {B} --model {M} --golden {G} --budget NaN",
            &["--budget"],
        ),
        case(
            "gate --timeout -5",
            "gate --reference {B} --candidate {B} --model {M} --golden {G} --timeout -5",
            &["--timeout"],
        ),
        case(
            "gate --timeout NaN",
            "gate --reference {B} --candidate {B} --model {M} --golden {G} --timeout NaN",
            &["--timeout"],
        ),
        case(
            "gate --timeout 1e300",
            "gate --reference {B} --candidate {B} --model {M} --golden {G} --timeout 1e300",
            &["--timeout"],
        ),
        case(
            "gate --ready-timeout inf",
            "gate --reference {B} --candidate {B} --model {M} --golden {G} --ready-timeout inf",
            &["--ready-timeout"],
        ),
        case(
            "gate missing golden",
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/none.json",
            &["none.json"],
        ),
        with(
            "gate empty golden dir",
            |d| std::fs::create_dir(d.join("e")).unwrap(),
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/e",
            &["no *.json"],
        ),
        with(
            "gate truncated golden",
            |d| file(d, "g.json", b"{\"format\": \"fastdecode-go"),
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["g.json", "not a valid golden"],
        ),
        with(
            "gate FIFO golden",
            |d| mkfifo(&d.join("g.json")),
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["g.json", "FIFO"],
        ),
        with(
            "gate golden unknown field",
            |d| golden(d, |v| v["extra"] = serde_json::json!(1)),
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["g.json", "extra"],
        ),
        with(
            "gate golden of another model",
            |d| {
                golden(d, |v| {
                    v["model_digest"] = serde_json::json!("ab".repeat(32))
                })
            },
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["golden_model_mismatch", "g.json"],
        ),
        with(
            "gate golden token past vocab",
            |d| golden(d, |v| v["prompt"][0] = serde_json::json!(100000)),
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["g.json", "vocab"],
        ),
        with(
            "gate golden steps short",
            |d| {
                golden(d, |v| {
                    v["steps"].as_array_mut().unwrap().pop();
                })
            },
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["g.json", "steps"],
        ),
        case(
            "gate missing candidate",
            "gate --reference {B} --candidate {D}/nope --model {M} --golden {G}",
            &["--candidate", "nope"],
        ),
        with(
            "gate candidate not executable",
            |d| file(d, "c", b"#!/bin/sh\n"),
            "gate --reference {B} --candidate {D}/c --model {M} --golden {G}",
            &["--candidate", "execute"],
        ),
        case(
            "gate candidate a directory",
            "gate --reference {B} --candidate {D} --model {M} --golden {G}",
            &["--candidate", "directory"],
        ),
        with(
            "gate --json under a file",
            |d| file(d, "f", b"x"),
            "gate --reference {B} --candidate {B} --model {M} --golden {G} --json {D}/f/r.json",
            &["--json", "f"],
        ),
        case(
            "gate --json in the model",
            "gate --reference {B} --candidate {B} --model {M} --golden {G} --json {M}/r.json",
            &["--json", "inside the model directory"],
        ),
        case(
            "gate --json a directory",
            "gate --reference {B} --candidate {B} --model {M} --golden {G} --json {D}",
            &["--json", "directory"],
        ),
        with(
            "gate --json onto the candidate",
            |d| {
                std::fs::copy(BIN, d.join("cand")).unwrap();
            },
            "gate --reference {B} --candidate {D}/cand --model {M} --golden {G} --json {D}/cand",
            &["--json", "same file as the --candidate build"],
        ),
        with(
            "gate --json onto a golden",
            |d| golden(d, |_| {}),
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json --json {D}/g.json",
            &["--json", "same file as the --golden"],
        ),
        with(
            "bisect --json onto a golden",
            |d| golden(d, |_| {}),
            "bisect --model {M} --golden {D}/g.json --json {D}/g.json",
            &["--json", "same file as the --golden"],
        ),
        with(
            "price --out the model",
            |d| model(d, |_| {}),
            "price --baseline {B} --model {D}/m --out {D}/m",
            &["--out", "the model directory"],
        ),
        with(
            "price --out onto the candidate",
            |d| {
                std::fs::copy(BIN, d.join("cand")).unwrap();
            },
            "price --baseline {B} --candidate {D}/cand --model {M} --out {D}/cand",
            &["--out", "same file as the --candidate build"],
        ),
        // bisect
        case(
            "bisect missing golden",
            "bisect --model {M} --golden {D}/none.json",
            &["none.json"],
        ),
        case(
            "bisect --criterion",
            "bisect --model {M} --golden {G} --criterion speed",
            &["--criterion"],
        ),
        with(
            "bisect --json under a file",
            |d| file(d, "f", b"x"),
            "bisect --model {M} --golden {G} --json {D}/f/b.json",
            &["--json", "f"],
        ),
        case(
            "bisect --flags with an empty name",
            "bisect --model {M} --golden {G} --flags ,",
            &["--flags", "empty flag name"],
        ),
        case(
            "bisect missing candidate",
            "bisect --model {M} --golden {G} --candidate {D}/nope",
            &["--candidate", "nope"],
        ),
        // price: only what is shared with the other worker commands
        case(
            "price --timeout NaN",
            "price --baseline {B} --timeout NaN --out {D}/p",
            &["--timeout"],
        ),
        case(
            "price missing model",
            "price --baseline {B} --model {D}/none --out {D}/p",
            &["none/config.json"],
        ),
        // check (the GPU check's own options are refused before any GPU is looked for)
        case(
            "check --backend cpu",
            "check --backend cpu --model {M}",
            &["--backend"],
        ),
        case(
            "check --positions 0",
            "check --positions 0 --model {M}",
            &["--positions"],
        ),
        case(
            "check --near-tie -1",
            "check --near-tie -1 --model {M}",
            &["--near-tie"],
        ),
        case(
            "check --prefill-rows 0",
            "check --prefill-rows 0 --model {M}",
            &["--prefill-rows"],
        ),
        case(
            "generate oracle -0.1",
            "generate --model {M} --prompt-ids 1 --block-size 2 --draft oracle:-0.1",
            &["--draft"],
        ),
        with(
            "hidden_size 0",
            |d| config(d, |v| v["hidden_size"] = json!(0)),
            "inspect {D}/m",
            &["config.json", "hidden_size", "positive"],
        ),
        with(
            "hidden_size a string",
            |d| config(d, |v| v["hidden_size"] = json!("128")),
            "inspect {D}/m",
            &["config.json", "hidden_size", "string"],
        ),
        with(
            "hidden_size 2^64",
            |d| {
                model(d, |m| {
                    let p = m.join("config.json");
                    let t = std::fs::read_to_string(&p).unwrap();
                    replace(
                        &p,
                        t.replace(
                            "\"hidden_size\": 128",
                            "\"hidden_size\": 18446744073709551616",
                        )
                        .as_bytes(),
                    )
                })
            },
            "inspect {D}/m",
            &["config.json", "hidden_size"],
        ),
        with(
            "hidden_size missing",
            |d| {
                config(d, |v| {
                    v.as_object_mut().unwrap().remove("hidden_size");
                })
            },
            "inspect {D}/m",
            &["hidden_size", "missing"],
        ),
        with(
            "kv heads 0",
            |d| config(d, |v| v["num_key_value_heads"] = json!(0)),
            "inspect {D}/m",
            &["num_key_value_heads"],
        ),
        with(
            "kv heads 3 of 4",
            |d| config(d, |v| v["num_key_value_heads"] = json!(3)),
            "inspect {D}/m",
            &["num_key_value_heads 3"],
        ),
        with(
            "head_dim 0",
            |d| config(d, |v| v["head_dim"] = json!(0)),
            "inspect {D}/m",
            &["head_dim", "positive"],
        ),
        with(
            "head_dim odd",
            |d| config(d, |v| v["head_dim"] = json!(33)),
            "inspect {D}/m",
            &["head_dim", "even"],
        ),
        with(
            "experts 0",
            |d| config(d, |v| v["num_experts"] = json!(0)),
            "inspect {D}/m",
            &["num_experts", "positive"],
        ),
        with(
            "top-k 0",
            |d| config(d, |v| v["num_experts_per_tok"] = json!(0)),
            "inspect {D}/m",
            &["num_experts_per_tok"],
        ),
        with(
            "vocab_size 0",
            |d| config(d, |v| v["vocab_size"] = json!(0)),
            "inspect {D}/m",
            &["vocab_size", "positive"],
        ),
        with(
            "vocab_size -1",
            |d| config(d, |v| v["vocab_size"] = json!(-1)),
            "inspect {D}/m",
            &["vocab_size", "-1"],
        ),
        with(
            "layers 0",
            |d| config(d, |v| v["num_hidden_layers"] = json!(0)),
            "inspect {D}/m",
            &["num_hidden_layers", "positive"],
        ),
        with(
            "layer_types short",
            |d| {
                config(d, |v| {
                    v["layer_types"].as_array_mut().unwrap().pop();
                })
            },
            "inspect {D}/m",
            &["layer_types", "3 entries"],
        ),
        with(
            "layer_types unknown",
            |d| config(d, |v| v["layer_types"][0] = json!("global")),
            "inspect {D}/m",
            &["layer_types[0]", "global"],
        ),
        with(
            "mlp_layer_types unknown",
            |d| config(d, |v| v["mlp_layer_types"][1] = json!("huge")),
            "inspect {D}/m",
            &["mlp_layer_types[1]", "huge"],
        ),
        with(
            "mlp_layer_types short",
            |d| {
                config(d, |v| {
                    v["mlp_layer_types"].as_array_mut().unwrap().pop();
                })
            },
            "inspect {D}/m",
            &["mlp_layer_types", "3 entries"],
        ),
        with(
            "heads per layer short",
            |d| {
                config(d, |v| {
                    v["num_attention_heads_per_layer"]
                        .as_array_mut()
                        .unwrap()
                        .pop();
                })
            },
            "inspect {D}/m",
            &["num_attention_heads_per_layer", "3 entries"],
        ),
        with(
            "heads per layer 3",
            |d| config(d, |v| v["num_attention_heads_per_layer"][1] = json!(3)),
            "inspect {D}/m",
            &["num_attention_heads_per_layer[1]"],
        ),
        with(
            "gating_types unknown",
            |d| config(d, |v| v["gating_types"][0] = json!("sigmoid")),
            "inspect {D}/m",
            &["gating_types[0]", "sigmoid"],
        ),
        with(
            "gating none",
            |d| config(d, |v| v["gating"] = json!("none")),
            "inspect {D}/m",
            &["gating", "none"],
        ),
        with(
            "rope_type linear",
            |d| {
                config(d, |v| {
                    v["rope_parameters"]["full_attention"]["rope_type"] = json!("linear")
                })
            },
            "inspect {D}/m",
            &["full_attention.rope_type", "linear"],
        ),
        with(
            "partial_rotary_factor 2",
            |d| {
                config(d, |v| {
                    v["rope_parameters"]["sliding_attention"]["partial_rotary_factor"] = json!(2.0)
                })
            },
            "inspect {D}/m",
            &["sliding_attention.partial_rotary_factor"],
        ),
        with(
            "sliding rope missing",
            |d| {
                config(d, |v| {
                    v["rope_parameters"]
                        .as_object_mut()
                        .unwrap()
                        .remove("sliding_attention");
                })
            },
            "inspect {D}/m",
            &["rope_parameters.sliding_attention", "missing"],
        ),
        with(
            "quantization bits 8",
            |d| config(d, |v| v["quantization"]["bits"] = json!(8)),
            "inspect {D}/m",
            &["quantization", "bits 4"],
        ),
        with(
            "quantization mode int4",
            |d| config(d, |v| v["quantization"]["mode"] = json!("int4")),
            "inspect {D}/m",
            &["quantization.mode", "int4"],
        ),
        with(
            "intermediate_size 0",
            |d| config(d, |v| v["intermediate_size"] = json!(0)),
            "inspect {D}/m",
            &["intermediate_size"],
        ),
        with(
            "moe_intermediate_size 0",
            |d| config(d, |v| v["moe_intermediate_size"] = json!(0)),
            "inspect {D}/m",
            &["moe_intermediate_size"],
        ),
        with(
            "shared expert size 0",
            |d| config(d, |v| v["shared_expert_intermediate_size"] = json!(0)),
            "inspect {D}/m",
            &["shared_expert_intermediate_size"],
        ),
        with(
            "moe scaling 1e300",
            |d| config(d, |v| v["moe_routed_scaling_factor"] = json!(1e300)),
            "inspect {D}/m",
            &["moe_routed_scaling_factor", "finite"],
        ),
        with(
            "bos outside vocab",
            |d| config(d, |v| v["bos_token_id"] = json!(9999)),
            "inspect {D}/m",
            &["bos_token_id", "9999"],
        ),
        with(
            "pad outside vocab",
            |d| config(d, |v| v["pad_token_id"] = json!(9999)),
            "inspect {D}/m",
            &["pad_token_id", "9999"],
        ),
        with(
            "model_type llama",
            |d| config(d, |v| v["model_type"] = json!("llama")),
            "inspect {D}/m",
            &["model_type", "llama"],
        ),
        with(
            "sliding_window a string",
            |d| config(d, |v| v["sliding_window"] = json!("32")),
            "inspect {D}/m",
            &["sliding_window", "string"],
        ),
        with(
            "config empty",
            |d| model(d, |m| replace(&m.join("config.json"), b"")),
            "inspect {D}/m",
            &["config.json", "EOF"],
        ),
        with(
            "config an array",
            |d| model(d, |m| replace(&m.join("config.json"), b"[]")),
            "inspect {D}/m",
            &["config.json", "invalid JSON"],
        ),
        with(
            "tied embeddings, lm_head present",
            |d| config(d, |v| v["tie_word_embeddings"] = json!(true)),
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 2",
            &["lm_head.weight", "not in the config's inventory"],
        ),
        with(
            "drafter hidden_size 64",
            |d| drafter_config(d, |v| v["hidden_size"] = json!(64)),
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 2 --block-size 2",
            &["drafter/model.safetensors", "expected [64]"],
        ),
        with(
            "drafter vocab 256",
            |d| drafter_config(d, |v| v["vocab_size"] = json!(256)),
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 2 --block-size 2",
            &["drafter/config.json", "vocab_size"],
        ),
        with(
            "drafter target layer 9",
            |d| {
                drafter_config(d, |v| {
                    v["dflash_config"]["target_layer_ids"] = json!([1, 9])
                })
            },
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 2 --block-size 2",
            &["drafter/config.json", "target_layer_ids[1]"],
        ),
        with(
            "drafter target layers none",
            |d| drafter_config(d, |v| v["dflash_config"]["target_layer_ids"] = json!([])),
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 2 --block-size 2",
            &["drafter/config.json", "target_layer_ids"],
        ),
        with(
            "drafter mask outside vocab",
            |d| drafter_config(d, |v| v["dflash_config"]["mask_token_id"] = json!(9999)),
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 2 --block-size 2",
            &["drafter/config.json", "mask_token_id"],
        ),
        with(
            "drafter without dflash_config",
            |d| {
                drafter_config(d, |v| {
                    v.as_object_mut().unwrap().remove("dflash_config");
                })
            },
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 2 --block-size 2",
            &["drafter/config.json", "dflash_config", "missing"],
        ),
        with(
            "drafter num_target_layers 8",
            |d| drafter_config(d, |v| v["num_target_layers"] = json!(8)),
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 2 --block-size 2",
            &["drafter/config.json", "num_target_layers"],
        ),
        with(
            "drafter rope_theta 0",
            |d| drafter_config(d, |v| v["rope_theta"] = json!(0)),
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 2 --block-size 2",
            &["drafter/config.json", "rope_theta"],
        ),
        with(
            "drafter layer_types short",
            |d| {
                drafter_config(d, |v| {
                    v["layer_types"].as_array_mut().unwrap().pop();
                })
            },
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 2 --block-size 2",
            &["drafter/config.json", "layer_types"],
        ),
        with(
            "drafter head_dim 0",
            |d| drafter_config(d, |v| v["head_dim"] = json!(0)),
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 2 --block-size 2",
            &["drafter/config.json", "head_dim"],
        ),
        with(
            "drafter kv heads 3",
            |d| drafter_config(d, |v| v["num_key_value_heads"] = json!(3)),
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 2 --block-size 2",
            &["drafter/config.json", "num_key_value_heads 3"],
        ),
        with(
            "drafter config an array",
            |d| model(d, |m| replace(&m.join("drafter/config.json"), b"[1]")),
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 2 --block-size 2",
            &["drafter/config.json", "invalid JSON"],
        ),
        with(
            "transform hidden_size 0",
            |d| {
                hf(d, |h| {
                    edit_json(&h.join("config.json"), |v| v["hidden_size"] = json!(0))
                })
            },
            "transform {D}/h {D}/o",
            &["config.json", "hidden_size"],
        ),
        with(
            "norm stored as F16",
            |d| {
                model(d, |m| {
                    edit_header(&m.join("model.safetensors"), |h| {
                        h["model.norm.weight"]["dtype"] = json!("F16")
                    })
                })
            },
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 2",
            &["model.norm.weight", "F16", "BF16"],
        ),
        with(
            "norm of shape [64, 2]",
            |d| {
                model(d, |m| {
                    edit_header(&m.join("model.safetensors"), |h| {
                        h["model.norm.weight"]["shape"] = json!([64, 2])
                    })
                })
            },
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 2",
            &["model.norm.weight", "[64, 2]", "[128]"],
        ),
        with(
            "scales stored as I8",
            |d| {
                model(d, |m| {
                    edit_header(&m.join("model.safetensors"), |h| {
                        h["model.layers.1.mlp.switch_mlp.down_proj.scales"]["dtype"] = json!("I8")
                    })
                })
            },
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 2",
            &["model.layers.1.mlp.switch_mlp.down_proj.scales", "I8"],
        ),
        with(
            "tensor past the end",
            |d| {
                model(d, |m| {
                    edit_header(&m.join("model.safetensors"), |h| {
                        h["model.norm.weight"]["data_offsets"] = json!([0u64, 1u64 << 40])
                    })
                })
            },
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 2",
            &["model.safetensors", "model.norm.weight"],
        ),
        with(
            "safetensors header 2^64-1",
            |d| {
                model(d, |m| {
                    let p = m.join("model.safetensors");
                    let mut b = std::fs::read(&p).unwrap();
                    b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
                    replace(&p, &b)
                })
            },
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 2",
            &["model.safetensors", "header too large"],
        ),
        with(
            "safetensors empty",
            |d| model(d, |m| replace(&m.join("model.safetensors"), b"")),
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 2",
            &["model.safetensors", "header too small"],
        ),
        with(
            "safetensors a directory",
            |d| {
                model(d, |m| {
                    std::fs::remove_file(m.join("model.safetensors")).unwrap();
                    std::fs::create_dir(m.join("model.safetensors")).unwrap();
                })
            },
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 2",
            &["model.safetensors", "directory"],
        ),
        with(
            "safetensors a dangling link",
            |d| {
                model(d, |m| {
                    std::fs::remove_file(m.join("model.safetensors")).unwrap();
                    std::os::unix::fs::symlink("nowhere", m.join("model.safetensors")).unwrap();
                })
            },
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 2",
            &["model.safetensors"],
        ),
        with(
            "drafter fc.weight of shape [1, 1]",
            |d| {
                model(d, |m| {
                    edit_header(&m.join("drafter/model.safetensors"), |h| {
                        h["fc.weight"]["shape"] = json!([1, 1])
                    })
                })
            },
            "generate --model {D}/m --prompt-ids 1 --max-new-tokens 2 --block-size 2",
            &["drafter/model.safetensors"],
        ),
        with(
            "transform lm_head of shape [1, 1]",
            |d| {
                hf(d, |h| {
                    edit_header(&h.join("model.safetensors"), |x| {
                        x["lm_head.weight"]["shape"] = json!([1, 1])
                    })
                })
            },
            "transform {D}/h {D}/o",
            &["model.safetensors"],
        ),
        with(
            "transform tensor removed",
            |d| {
                hf(d, |h| {
                    edit_header(&h.join("model.safetensors"), |x| {
                        x.as_object_mut().unwrap().remove("model.norm.weight");
                    })
                })
            },
            "transform {D}/h {D}/o",
            &["model.safetensors", "not fully covered"],
        ),
        with(
            "tokenizer a directory",
            |d| {
                model(d, |m| {
                    std::fs::remove_file(m.join("tokenizer.json")).unwrap();
                    std::fs::create_dir(m.join("tokenizer.json")).unwrap();
                })
            },
            "generate --model {D}/m --prompt hello",
            &["tokenizer.json", "directory"],
        ),
        with(
            "verify an empty MANIFEST",
            |d| model(d, |m| replace(&m.join("MANIFEST"), b"")),
            "verify {D}/m",
            &["config.json", "not listed"],
        ),
        with(
            "verify without drafter/",
            |d| model(d, |m| std::fs::remove_dir_all(m.join("drafter")).unwrap()),
            "verify {D}/m",
            &["drafter/config.json", "missing"],
        ),
        case("worker model is a file", "worker --model {B}", &["config.json"]),
        with(
            "golden format",
            |d| golden(d, |g| g["format"] = json!("other")),
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["g.json", "format", "other"],
        ),
        with(
            "golden version 2",
            |d| golden(d, |g| g["version"] = json!(2)),
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["g.json", "version"],
        ),
        with(
            "golden digest not hex",
            |d| golden(d, |g| g["model_digest"] = json!("abc")),
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["g.json", "model_digest"],
        ),
        with(
            "golden vocab 0",
            |d| golden(d, |g| g["vocab_size"] = json!(0)),
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["g.json", "vocab_size"],
        ),
        with(
            "golden prompt empty",
            |d| golden(d, |g| g["prompt"] = json!([])),
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["g.json", "prompt", "empty"],
        ),
        with(
            "golden prompt a string",
            |d| golden(d, |g| g["prompt"] = json!("1,2")),
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["g.json", "string"],
        ),
        with(
            "golden tokens empty",
            |d| {
                golden(d, |g| {
                    g["tokens"] = json!([]);
                    g["steps"] = json!([]);
                })
            },
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["g.json", "tokens", "empty"],
        ),
        with(
            "golden token not its step's best",
            |d| {
                golden(d, |g| {
                    g["tokens"][0] = json!((g["tokens"][0].as_u64().unwrap() + 1) % 512)
                })
            },
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["g.json", "steps[0].top[0].id", "tokens[0]"],
        ),
        with(
            "golden top-2 worst first",
            |d| {
                golden(d, |g| {
                    g["steps"][0]["top"].as_array_mut().unwrap().reverse();
                })
            },
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["g.json", "steps[0].top"],
        ),
        with(
            "golden top-2 the same id",
            |d| {
                golden(d, |g| {
                    g["steps"][1]["top"][1]["id"] = g["steps"][1]["top"][0]["id"].clone()
                })
            },
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["g.json", "steps[1].top", "distinct"],
        ),
        with(
            "golden logit null",
            |d| golden(d, |g| g["steps"][0]["top"][0]["logit"] = json!(null)),
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["g.json", "null"],
        ),
        with(
            "golden steps one too many",
            |d| {
                golden(d, |g| {
                    let s = g["steps"][0].clone();
                    g["steps"].as_array_mut().unwrap().push(s);
                })
            },
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["g.json", "steps"],
        ),
        with(
            "golden without made_by",
            |d| {
                golden(d, |g| {
                    g.as_object_mut().unwrap().remove("made_by");
                })
            },
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["g.json", "made_by"],
        ),
        with(
            "golden screen unknown field",
            |d| golden(d, |g| g["screen"]["x"] = json!(1)),
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["g.json", "`x`"],
        ),
        with(
            "golden an array",
            |d| file(d, "g.json", b"[]"),
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["g.json"],
        ),
        with(
            "golden empty",
            |d| file(d, "g.json", b""),
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/g.json",
            &["g.json", "EOF"],
        ),
        with(
            "golden dir with a non-golden",
            |d| {
                std::fs::create_dir(d.join("e")).unwrap();
                file(&d.join("e"), "x.json", b"{}");
            },
            "gate --reference {B} --candidate {B} --model {M} --golden {D}/e",
            &["x.json", "format"],
        ),
        with(
            "bisect golden of another model",
            |d| golden(d, |g| g["model_digest"] = json!("cd".repeat(32))),
            "bisect --model {M} --golden {D}/g.json",
            &["g.json", "model_digest", "another model"],
        ),
        case(
            "generate --max-new-tokens abc",
            "generate --model {M} --prompt-ids 1 --max-new-tokens abc",
            &["--max-new-tokens", "abc"],
        ),
        case(
            "generate --prompt with --prompt-ids",
            "generate --model {M} --prompt hi --prompt-ids 1",
            &["--prompt", "--prompt-ids"],
        ),
        case(
            "generate oracle without P",
            "generate --model {M} --prompt-ids 1 --block-size 2 --draft oracle:",
            &["--draft"],
        ),
        case(
            "generate id 2^32",
            "generate --model {M} --prompt-ids 4294967296",
            &["--prompt-ids", "4294967296"],
        ),
        case(
            "bench --decode-tokens abc",
            "bench --model {M} --decode-tokens abc",
            &["--decode-tokens"],
        ),
        case("bench --prompts a directory", "bench --model {M} --prompts {D}", &["directory"]),
        with(
            "bench empty prompts file",
            |d| file(d, "p.txt", b""),
            "bench --model {M} --prompts {D}/p.txt",
            &["p.txt", "no prompts"],
        ),
        with(
            "bench traces without prompts",
            |d| file(d, "p.json", br#"{"prompts":[]}"#),
            "bench --model {M} --prompts {D}/p.json",
            &["p.json", "no prompts"],
        ),
        with(
            "bench trace id -1",
            |d| file(d, "p.json", br#"{"prompts":[{"prompt_ids":[-1]}]}"#),
            "bench --model {M} --prompts {D}/p.json",
            &["p.json", "prompt_ids"],
        ),
        case(
            "golden --synthetic on cpu",
            "golden make --synthetic xs2.1 --out {D}/g",
            &["--synthetic", "--backend cuda"],
        ),
        with(
            "golden --out under a file",
            |d| file(d, "f", b"x"),
            "golden make --model {M} --out {D}/f/g",
            &["--out", "f"],
        ),
        with(
            "golden --reference not executable",
            |d| file(d, "r", b"#!/bin/sh\n"),
            "golden make --model {M} --out {D}/g --reference {D}/r",
            &["--reference", "execute"],
        ),
        case(
            "gate --draft junk",
            "gate --reference {B} --candidate {B} --model {M} --golden {G} --draft junk",
            &["--draft", "junk"],
        ),
        case(
            "gate --draft-block-size 1",
            "gate --draft drafter --draft-block-size 1 --golden {G}",
            &["--draft-block-size"],
        ),
        case(
            "gate --draft-block-size without --draft",
            "gate --reference {B} --candidate {B} --model {M} --golden {G} --draft-block-size 4",
            &["--draft"],
        ),
        case(
            "gate --candidate-flags warp",
            "gate --reference {B} --candidate {B} --model {M} --golden {G} --candidate-flags warp",
            &["warp"],
        ),
        case(
            "gate missing reference",
            "gate --reference {D}/nope --candidate {B} --model {M} --golden {G}",
            &["--reference", "nope"],
        ),
        case(
            "gate --synthetic on cpu",
            "gate --reference {B} --candidate {B} --synthetic xs2.1 --golden {G}",
            &["--synthetic"],
        ),
        case("bisect --flags warp", "bisect --model {M} --golden {G} --flags warp", &["warp"]),
        case(
            "bisect --candidate a directory",
            "bisect --model {M} --golden {G} --candidate {D}",
            &["--candidate", "directory"],
        ),
        case(
            "bisect --json in the model",
            "bisect --model {M} --golden {G} --json {M}/b.json",
            &["--json", "inside the model directory"],
        ),
        case(
            "price --pairs 3",
            "price --baseline {B} --model {M} --out {D}/p --pairs 3",
            &["--pairs"],
        ),
        case(
            "price --target-ci 0",
            "price --baseline {B} --model {M} --out {D}/p --target-ci 0",
            &["--target-ci"],
        ),
        case(
            "price --target-ci 1.5",
            "price --baseline {B} --model {M} --out {D}/p --target-ci 1.5",
            &["--target-ci"],
        ),
        case(
            "price --min-pairs 0",
            "price --baseline {B} --model {M} --out {D}/p --min-pairs 0",
            &["--min-pairs"],
        ),
        case(
            "price --max-pairs below --min-pairs",
            "price --baseline {B} --model {M} --out {D}/p --min-pairs 20 --max-pairs 10",
            &["--max-pairs", "--min-pairs"],
        ),
        case(
            "price --floor 0",
            "price --baseline {B} --model {M} --out {D}/p --floor 0",
            &["--floor"],
        ),
        case(
            "price --noise-windows 1",
            "price --baseline {B} --model {M} --out {D}/p --noise-windows 1",
            &["--noise-windows"],
        ),
        case(
            "price --windows 0",
            "price --baseline {B} --model {M} --out {D}/p --windows 0",
            &["--windows"],
        ),
        case(
            "price --warmup-windows 100",
            "price --baseline {B} --model {M} --out {D}/p --warmup-windows 100",
            &["--warmup-windows"],
        ),
        case(
            "price --stall 0",
            "price --baseline {B} --model {M} --out {D}/p --stall 0",
            &["--stall"],
        ),
        case(
            "price --outlier-factor 0.5",
            "price --baseline {B} --model {M} --out {D}/p --outlier-factor 0.5",
            &["--outlier-factor"],
        ),
        case(
            "price --max-speedup 1",
            "price --baseline {B} --model {M} --out {D}/p --max-speedup 1",
            &["--max-speedup"],
        ),
        case(
            "price --budget 2000",
            "price --baseline {B} --model {M} --out {D}/p --budget 2000",
            &["--budget"],
        ),
        case(
            "price --block-size 99",
            "price --baseline {B} --model {M} --out {D}/p --track dflash --block-size 99",
            &["--block-size"],
        ),
        case(
            "price --draft junk",
            "price --baseline {B} --model {M} --out {D}/p --draft junk",
            &["--draft", "junk"],
        ),
        case(
            "price --track quick",
            "price --baseline {B} --model {M} --out {D}/p --track quick",
            &["--track"],
        ),
        case(
            "price --time-budget 0",
            "price --baseline {B} --model {M} --out {D}/p --time-budget 0",
            &["--time-budget"],
        ),
        case(
            "price --prompt-tokens 0",
            "price --baseline {B} --model {M} --out {D}/p --prompt-tokens 0",
            &["--prompt-tokens"],
        ),
        case(
            "price --decode-tokens 0",
            "price --baseline {B} --model {M} --out {D}/p --decode-tokens 0",
            &["--decode-tokens"],
        ),
        case(
            "price --quiet-gpu-temp NaN",
            "price --baseline {B} --model {M} --out {D}/p --quiet-gpu-temp NaN",
            &["--quiet-gpu-temp"],
        ),
        case(
            "price --quiet-cpu 50",
            "price --baseline {B} --model {M} --out {D}/p --quiet-cpu 50",
            &["--quiet-cpu"],
        ),
        case(
            "price --quiet-wait -1",
            "price --baseline {B} --model {M} --out {D}/p --quiet-wait=-1",
            &["--quiet-wait"],
        ),
        case(
            "price --prompt-tokens 10^6",
            "price --baseline {B} --model {M} --out {D}/p --prompt-tokens 1000000",
            &["--prompt-tokens", "max_position_embeddings"],
        ),
        case(
            "price missing candidate",
            "price --baseline {B} --model {M} --out {D}/p --candidate {D}/nope",
            &["nope"],
        ),
        case(
            "price missing noop",
            "price --baseline {B} --model {M} --out {D}/p --noop {D}/nope",
            &["nope"],
        ),
        case(
            "price --baseline-ref with --baseline",
            "price --baseline {B} --model {M} --out {D}/p --baseline-ref HEAD",
            &["--baseline", "--baseline-ref"],
        ),
        case(
            "price missing baseline",
            "price --baseline {D}/nope --model {M} --out {D}/p",
            &["nope", "no such build"],
        ),
        case(
            "price --baseline-ref outside a repository",
            "price --baseline-ref HEAD --repo {D} --model {M} --out {D}/p",
            &["HEAD", "not a git repository"],
        ),
        with(
            "price --out a file",
            |d| file(d, "p", b"x"),
            "price --baseline {B} --model {M} --out {D}/p",
            &["--out", "not a directory"],
        ),
        with(
            "price --out under a file",
            |d| file(d, "f", b"x"),
            "price --baseline {B} --model {M} --out {D}/f/p",
            &["--out", "not a directory"],
        ),
        case("selftest --runs 0", "price selftest --model {M} --out {D}/s --runs 0", &["--runs"]),
        case("selftest --load 1", "price selftest --model {M} --out {D}/s --load 1", &["--load"]),
        case(
            "selftest --slowdown 1000",
            "price selftest --model {M} --out {D}/s --slowdown 1000",
            &["--slowdown"],
        ),
        case(
            "selftest missing --faulty",
            "price selftest --model {M} --out {D}/s --faulty {D}/nope",
            &["--faulty", "nope"],
        ),
        case("check missing model", "check --model {D}/none", &["none", "config.json"]),
        case("check --positions abc", "check --positions abc --model {M}", &["--positions"]),
        with(
            "timeline --svg its directory",
            |d| file(d, "t.csv", TRACE.as_bytes()),
            "timeline {D}/t.csv --svg {D}",
            &["--svg", "t.csv"],
        ),
        with(
            "timeline empty",
            |d| file(d, "t.csv", b""),
            "timeline {D}/t.csv",
            &["t.csv", "no trace records"],
        ),
        case("timeline a directory", "timeline {D}", &["directory"]),
        with(
            "timeline a bad number",
            |d| {
                file(
                    d,
                    "t.csv",
                    b"module,ns,kind,event,block,clock\nm,x,2,0,0,0\n",
                )
            },
            "timeline {D}/t.csv",
            &["t.csv", "line: 2"],
        ),
        with(
            "timeline a short row",
            |d| file(d, "t.csv", b"module,ns,kind,event,block,clock\nm,0,2\n"),
            "timeline {D}/t.csv",
            &["t.csv", "3 fields"],
        ),
        with(
            "timeline --window abc",
            |d| file(d, "t.csv", TRACE.as_bytes()),
            "timeline {D}/t.csv --window abc",
            &["--window"],
        ),
        case("kernels --arch sm_10", "kernels --out {D}/k --arch sm_10", &["--arch", "sm_10"]),
        with(
            "kernels --out not empty",
            |d| {
                std::fs::create_dir(d.join("k")).unwrap();
                file(&d.join("k"), "x", b"x");
            },
            "kernels --out {D}/k --arch sm_90a",
            &["--out", "not empty"],
        ),
        with(
            "kernels --out a file",
            |d| file(d, "k", b"x"),
            "kernels --out {D}/k --arch sm_90a",
            &["--out", "not a directory"],
        ),
        with(
            "kernels --out under a file",
            |d| file(d, "f", b"x"),
            "kernels --out {D}/f/k --arch sm_90a",
            &["--out", "f/k"],
        ),
        with(
            "track name ../x",
            |d| track(d, r#"name = "serial-tiny""#, r#"name = "../x""#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "name"],
        ),
        with(
            "track clock_track fast",
            |d| track(d, r#"clock_track = "serial""#, r#"clock_track = "fast""#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "clock_track"],
        ),
        with(
            "track runner_kind tpu",
            |d| track(d, r#"runner_kind = "cpu""#, r#"runner_kind = "tpu""#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "runner_kind"],
        ),
        with(
            "track surface empty",
            |d| track(d, r#"surface = ["#, r#"surface = [] #"#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "surface"],
        ),
        with(
            "track surface from a wildcard",
            |d| track(d, r#"surface = ["#, r#"surface = ["**/*.rs", "#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "surface", "wildcard"],
        ),
        with(
            "track surface with ..",
            |d| track(d, r#"surface = ["#, r#"surface = ["crates/../x", "#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "surface", "'..'"],
        ),
        with(
            "track baseline abc",
            |d| track(d, r#"baseline = ""#, r#"baseline = "abc" #""#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "baseline"],
        ),
        with(
            "track publish_code sometimes",
            |d| track(d, r#"publish_code = ""#, r#"publish_code = "sometimes" #""#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "publish_code"],
        ),
        with(
            "track model.dir /etc",
            |d| track(d, r#"dir = "assets"#, r#"dir = "/etc" #""#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "model.dir"],
        ),
        with(
            "track model.digest md5",
            |d| track(d, r#"digest = "sha256:"#, r#"digest = "md5:"#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "model.digest"],
        ),
        with(
            "track model.backend gpu",
            |d| track(d, r#"backend = "cpu""#, r#"backend = "gpu""#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "model.backend"],
        ),
        with(
            "track goldens.hidden bare hex",
            |d| track(d, r#"hidden = "sha256:"#, r#"hidden = ""#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "goldens.hidden"],
        ),
        with(
            "track goldens.public_count 0",
            |d| track(d, r#"public_count = 1"#, r#"public_count = 0"#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "goldens.public_count"],
        ),
        with(
            "track goldens.tokens 10^10",
            |d| track(d, r#"tokens = 64"#, r#"tokens = 10000000000"#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "goldens.prompt_tokens"],
        ),
        with(
            "track goldens.block_size 0",
            |d| track(d, r#"block_size = 4"#, r#"block_size = 0"#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "goldens.block_size"],
        ),
        with(
            "track clock.floor 0",
            |d| track(d, r#"floor = 0.95"#, r#"floor = 0.0"#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "clock.floor"],
        ),
        with(
            "track clock.target_ci 1",
            |d| track(d, r#"target_ci = 0.01"#, r#"target_ci = 1.0"#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "clock.target_ci"],
        ),
        with(
            "track clock.min_pairs 2",
            |d| track(d, r#"min_pairs = 10"#, r#"min_pairs = 2"#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "clock.min_pairs"],
        ),
        with(
            "track clock.time_budget -1",
            |d| track(d, r#"time_budget = 600.0"#, r#"time_budget = -1.0"#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "clock.time_budget"],
        ),
        with(
            "track caps.file_bytes 0",
            |d| track(d, r#"file_bytes = 262144"#, r#"file_bytes = 0"#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "caps", "file_bytes"],
        ),
        with(
            "track caps.failures_per_day 0",
            |d| track(d, r#"failures_per_day = 10"#, r#"failures_per_day = 0"#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "caps.failures_per_day"],
        ),
        with(
            "track caps.free_infra_per_day 5000",
            |d| {
                track(
                    d,
                    r#"free_infra_per_day = 2"#,
                    r#"free_infra_per_day = 5000"#,
                )
            },
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "caps.free_infra_per_day"],
        ),
        with(
            "track promotion.margin -0.01",
            |d| track(d, r#"margin = 0.01"#, r#"margin = -0.01"#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "promotion.margin"],
        ),
        with(
            "track build.cargo_args empty",
            |d| track(d, r#"cargo_args = ["#, r#"cargo_args = [] #"#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "cargo_args"],
        ),
        with(
            "track an unknown field",
            |d| track(d, r#"[model]"#, "color = \"red\"\n[model]"),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "color"],
        ),
        with(
            "track synthetic weights on cpu",
            |d| track(d, r#"dir = "assets/laguna-tiny""#, r#"synthetic = "xs2.1""#),
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "model.synthetic"],
        ),
        with(
            "track not TOML",
            |d| {
                std::fs::create_dir(d.join("t")).unwrap();
                file(&d.join("t"), "x.toml", b"name = ");
            },
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "TOML parse error"],
        ),
        case("tracks missing", "arena admin tracks --tracks {D}/none", &["--tracks", "none"]),
        with(
            "tracks none in the directory",
            |d| std::fs::create_dir(d.join("t")).unwrap(),
            "arena admin tracks --tracks {D}/t",
            &["--tracks", "no *.toml"],
        ),
        with(
            "track named twice",
            |d| {
                track(d, "name", "name");
                std::fs::copy(d.join("t/x.toml"), d.join("t/y.toml")).unwrap();
            },
            "arena admin tracks --tracks {D}/t",
            &["y.toml", "a second track named serial-tiny"],
        ),
        with(
            "track a FIFO",
            |d| {
                std::fs::create_dir(d.join("t")).unwrap();
                mkfifo(&d.join("t/x.toml"));
            },
            "arena admin tracks --tracks {D}/t",
            &["x.toml", "FIFO"],
        ),
        with(
            "serve a bad track",
            |d| track(d, r#"runner_kind = "cpu""#, r#"runner_kind = "tpu""#),
            "arena serve --tracks {D}/t --data {D}/data",
            &["x.toml", "runner_kind"],
        ),
        case(
            "serve --lease-seconds 0",
            "arena serve --lease-seconds 0 --data {D}/data",
            &["--lease-seconds"],
        ),
        case(
            "runner --server not a URL",
            "arena runner --server not-a-url --token r.s --cache {D}/c",
            &["--server", "not-a-url"],
        ),
        case(
            "runner --poll-seconds 0",
            "arena runner --server http://127.0.0.1:1 --token r.s --cache {D}/c --poll-seconds 0",
            &["--poll-seconds"],
        ),
        case(
            "runner --kind gpu",
            "arena runner --server http://127.0.0.1:1 --token r.s --kind gpu",
            &["--kind", "gpu"],
        ),
        case(
            "status --server ftp",
            "arena status --server ftp://127.0.0.1:1 1",
            &["--server", "ftp://127.0.0.1:1"],
        ),
        case(
            "status of a closed port",
            "arena status --server http://127.0.0.1:1 1",
            &["127.0.0.1:1", "refused"],
        ),
        with(
            "submit to a closed port",
            |d| file(d, "n.md", b"why"),
            "submit --server http://127.0.0.1:1 --token a.b --track t --note-file {D}/n.md",
            &["127.0.0.1:1", "refused"],
        ),
        case(
            "submit --mode of no mode",
            "submit --server http://127.0.0.1:1 --token a.b --track t --note-file {D}/n.md \
             --mode trace",
            &["--mode", "trace", "test, benchmark, profile, leaderboard"],
        ),
        case(
            "submit missing note",
            "submit --server http://127.0.0.1:1 --token a.b --track t --note-file {D}/none.md",
            &["--note-file", "none.md"],
        ),
        case(
            "submit note a directory",
            "submit --server http://127.0.0.1:1 --token a.b --track serial-tiny --note-file {D}",
            &["--note-file", "directory"],
        ),
        with(
            "submit empty note",
            |d| file(d, "n.md", b""),
            "submit --server http://127.0.0.1:1 --token a.b --track t --note-file {D}/n.md",
            &["--note-file", "empty"],
        ),
        with(
            "submit note a FIFO",
            |d| mkfifo(&d.join("n.md")),
            "submit --server http://127.0.0.1:1 --token a.b --track t --note-file {D}/n.md",
            &["--note-file", "FIFO"],
        ),
        with(
            "submit note not UTF-8",
            |d| file(d, "n.md", b"\xff\xfe\x00"),
            "submit --server http://127.0.0.1:1 --token a.b --track t --note-file {D}/n.md",
            &["--note-file", "UTF-8"],
        ),
        with(
            "submit --claimed-score NaN",
            |d| file(d, "n.md", b"why"),
            "submit --claimed-score NaN --server http://h:1 --token a.b --track t --note-file n.md",
            &["--claimed-score"],
        ),
        with(
            "submit --server not a URL",
            |d| file(d, "n.md", b"why"),
            "submit --server junk --token a.b --track serial-tiny --note-file {D}/n.md",
            &["--server", "junk"],
        ),
        case("solver add ../x", "arena admin solver add ../x --data {D}/data", &["NAME", "../x"]),
        case("runner add a/b", "arena admin runner add a/b --data {D}/data", &["NAME", "a/b"]),
        case(
            "runner add --kind gpu",
            "arena admin runner add r --kind gpu --data {D}/data",
            &["--kind", "gpu"],
        ),
        case(
            "admin --database bogus://",
            "arena admin solver list --database bogus://x",
            &["--database", "bogus://x"],
        ),
        case(
            "admin --database in a missing dir",
            "arena admin solver list --database sqlite://{D}/no/such/a.db",
            &["--database", "unable to open"],
        ),
        with(
            "admin --data a file",
            |d| file(d, "f", b"x"),
            "arena admin solver list --data {D}/f",
            &["--data", "f"],
        ),
        with(
            "hidden new --data a file",
            |d| file(d, "f", b"x"),
            "arena admin hidden new --data {D}/f",
            &["f/hidden"],
        ),
        case("cheat without --reason", "arena admin cheat 1 --data {D}/data", &["--reason"]),
        case(
            "cheat with no arena at --data",
            "arena admin cheat s-0000000000000000 --reason r --data {D}/data",
            &["--data", "no arena there"],
        ),
        case(
            "cancel with no arena at --data",
            "arena admin cancel s-0000000000000000 --data {D}/data",
            &["--data", "no arena there"],
        ),
        case(
            "stages with no arena at --data",
            "arena admin stages s-0000000000000000 --data {D}/data",
            &["--data", "no arena there"],
        ),
        case(
            "redteam missing corpus",
            "arena redteam --server http://127.0.0.1:1 --token a.b --cases {D}/none",
            &["none"],
        ),
        with(
            "demo --dir a file",
            |d| file(d, "f", b"x"),
            "arena demo --dir {D}/f",
            &["--dir", "f"],
        ),
        case("demo --repo missing", "arena demo --dir {D}/x --repo {D}/none", &["--repo", "none"]),

    ]
}

fn expand(args: &str, d: &Path) -> Vec<String> {
    let f = fixture();
    let sub = |s: &str| {
        s.replace("{M}", f.model.to_str().unwrap())
            .replace("{H}", f.hf.to_str().unwrap())
            .replace("{G}", goldens().to_str().unwrap())
            .replace("{B}", BIN)
            .replace("{D}", d.to_str().unwrap())
    };
    args.split(' ').map(sub).collect()
}

/// Runs one case; `Err` says how it went wrong.
fn check(c: &Case) -> Result<(), String> {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().canonicalize().unwrap();
    if let Some(s) = &c.setup {
        s(&d);
    }
    let before = snapshot(&d);
    let args = expand(c.args, &d);
    let o = run_with(
        fd().args(&args)
            .current_dir(&d)
            .env("FASTDECODE_HOME", d.join(".none")),
        b"",
        Duration::from_secs(60),
    );
    let mut why = vec![];
    if !matches!(o.code, Some(code) if code != 0) {
        why.push(format!("exit {:?}", o.code));
    }
    if ["panicked", "RUST_BACKTRACE"]
        .iter()
        .any(|p| o.stderr.contains(p))
    {
        why.push("panic text".to_string());
    }
    let missing: Vec<&&str> = c.must.iter().filter(|m| !o.stderr.contains(**m)).collect();
    if !missing.is_empty() {
        why.push(format!("message lacks {missing:?}"));
    }
    let after = snapshot(&d);
    if after != before {
        let new: Vec<_> = after
            .iter()
            .filter(|(k, v)| before.get(*k) != Some(v))
            .map(|(k, _)| k)
            .collect();
        why.push(format!("the directory changed: {new:?}"));
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{}: {} ({:?})\n    stderr: {}",
            c.name,
            why.join("; "),
            args,
            o.stderr.trim().replace('\n', "\n    ")
        ))
    }
}

#[test]
fn every_bad_input_fails_cleanly_by_name_and_leaves_nothing() {
    let cases = cases();
    assert!(cases.len() >= 100, "only {} cases", cases.len());
    let f = fixture();
    let fixtures_before = [snapshot(&f.model), snapshot(&f.hf), snapshot(goldens())];
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(vec![]);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(c) = cases.get(i) else { return };
                // A case that hangs (its command killed past its limit) is one failure among
                // the others, not the end of the table.
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(c)))
                    .unwrap_or_else(|p| {
                        let why = p
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        Err(format!("{}: {why}", c.name))
                    });
                if let Err(e) = outcome {
                    failures.lock().unwrap().push(e);
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} bad inputs misbehaved:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    let fixtures_after = [snapshot(&f.model), snapshot(&f.hf), snapshot(goldens())];
    assert!(
        fixtures_after == fixtures_before,
        "a case changed a shared fixture"
    );
    eprintln!("{} bad inputs, each refused cleanly", cases.len());
}

/// A mistyped developer knob of the CUDA backend is refused by name before anything runs, GPU or
/// not (it used to fall back to the default silently, so a measurement of it timed the default).
#[test]
fn a_bad_cuda_knob_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    for (var, bad, accepted) in [
        ("FASTDECODE_MOE", "mm4", "f32, mma2"),
        ("FASTDECODE_PDL", "no", "0, 1"),
    ] {
        let o = run_with(
            fd().args(["bench", "--backend", "cuda", "--synthetic", "xs2.1"])
                .current_dir(tmp.path())
                .env("FASTDECODE_HOME", tmp.path().join(".none"))
                .env(var, bad),
            b"",
            Duration::from_secs(60),
        );
        assert!(
            matches!(o.code, Some(c) if c != 0),
            "{var}={bad}: exit {:?}",
            o.code
        );
        assert!(
            o.stderr.contains(var) && o.stderr.contains(bad) && o.stderr.contains(accepted),
            "{var}={bad}: {}",
            o.stderr
        );
        assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    }
}

/// Runs `args` with `stdout` as its standard output (stdin empty); how it ended.
fn run_to(args: &[&std::ffi::OsStr], stdout: std::process::Stdio) -> Out {
    use std::process::Stdio;
    let t0 = std::time::Instant::now();
    let mut child = fd()
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A closed stdout: the read end of the pipe is dropped before the child writes.
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    Out {
        code: o.status.code(),
        stdout: String::new(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        max_rss_kib: 0,
        seconds: t0.elapsed().as_secs_f64(),
    }
}

fn dev_full() -> std::process::Stdio {
    std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap()
        .into()
}

/// The commands that print on stdout, with a full stdout (`> /dev/full`) and with a closed one
/// (the reader gone before the first write): a clean failure that says stdout is the trouble,
/// never a panic. Where SIGPIPE has its default action (the engine's commands, like other Unix
/// tools in a pipe to `head`), a closed stdout ends the process by that signal instead, silently.
#[test]
fn a_full_or_closed_stdout_is_a_clean_error() {
    let f = fixture();
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    // Something for the lists to print.
    ok(fd()
        .args(["arena", "admin", "solver", "add", "alice", "--data"])
        .arg(&data));
    ok(fd()
        .args([
            "arena", "admin", "runner", "add", "r1", "--kind", "cpu", "--data",
        ])
        .arg(&data));
    let m = f.model.as_os_str();
    let data = data.as_os_str();
    let s = |t: &'static str| std::ffi::OsStr::new(t);
    let commands: Vec<Vec<&std::ffi::OsStr>> = vec![
        vec![s("inspect"), m],
        vec![s("inspect"), m, s("--inventory")],
        vec![s("inspect"), s("--preset"), s("tiny")],
        vec![s("verify"), m],
        vec![
            s("generate"),
            s("--model"),
            m,
            s("--prompt-ids"),
            s("1,2,3"),
            s("--max-new-tokens"),
            s("2"),
        ],
        vec![
            s("arena"),
            s("admin"),
            s("hidden"),
            s("new"),
            s("--data"),
            data,
        ],
        vec![
            s("arena"),
            s("admin"),
            s("solver"),
            s("list"),
            s("--data"),
            data,
        ],
        vec![
            s("arena"),
            s("admin"),
            s("runner"),
            s("list"),
            s("--data"),
            data,
        ],
    ];
    for args in &commands {
        let what = format!("{args:?} > /dev/full");
        let o = run_to(args, dev_full());
        assert_clean_failure(&what, &o);
        assert!(
            o.stderr.contains("writing to stdout"),
            "{what}: {}",
            o.stderr
        );

        let what = format!("{args:?} | (closed)");
        let o = run_to(args, std::process::Stdio::piped());
        assert_ne!(o.code, Some(0), "{what}: succeeded");
        assert!(!o.stderr.contains("panicked"), "{what}: {}", o.stderr);
        if args[0] == "arena" {
            assert_clean_failure(&what, &o);
            assert!(
                o.stderr.contains("writing to stdout"),
                "{what}: {}",
                o.stderr
            );
        }
    }
}

/// A solver's token that could not be written is not committed: the account does not exist
/// and the same name can be added again, this time with its token delivered.
#[test]
fn a_token_that_was_not_delivered_leaves_no_account() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    let s = std::ffi::OsStr::new;
    let add = [
        s("arena"),
        s("admin"),
        s("solver"),
        s("add"),
        s("bob"),
        s("--data"),
        data.as_os_str(),
    ];
    let o = run_to(&add, dev_full());
    assert_clean_failure("solver add > /dev/full", &o);
    assert!(o.stderr.contains("writing to stdout"), "{}", o.stderr);
    let listed = ok(fd()
        .args(["arena", "admin", "solver", "list", "--data"])
        .arg(&data));
    assert!(!listed.contains("bob"), "{listed}");
    let token = ok(fd().args(add));
    assert!(token.starts_with("bob."), "{token}");
}

/// A run stopped by a signal removes what it was staging: `golden make` stopped by SIGINT,
/// SIGTERM or SIGHUP once its staging directory holds a golden leaves neither that directory nor
/// --out, and ends by the signal it was sent.
#[test]
fn a_signal_during_golden_make_leaves_nothing_staged() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let f = fixture();
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        let d = tempfile::tempdir().unwrap();
        let mut child = fd()
            .args([
                "golden", "make", "--count", "100000", "--tokens", "8", "--model",
            ])
            .arg(&f.model)
            .arg("--out")
            .arg(d.path().join("goldens"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // The staging directory beside --out, once a golden is in it.
        let staged_golden = || {
            std::fs::read_dir(d.path()).unwrap().any(|e| {
                let p = e.unwrap().path();
                p.is_dir() && p.join("golden-000.json").exists()
            })
        };
        let t0 = std::time::Instant::now();
        while !staged_golden() {
            assert!(
                child.try_wait().unwrap().is_none(),
                "golden make ended early"
            );
            assert!(t0.elapsed() < Duration::from_secs(120), "no golden staged");
            std::thread::sleep(Duration::from_millis(10));
        }
        // SAFETY: a signal to the child this test started and has not reaped.
        assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, signal) }, 0);
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(signal), "{status:?}");
        let left: Vec<PathBuf> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert!(left.is_empty(), "signal {signal} left {left:?}");
    }
}

#[test]
fn database_errors_name_the_database_once_and_say_what_happened() {
    let d = tempfile::tempdir().unwrap();
    let arena = |data: &Path, extra: &[&str]| {
        run(fd()
            .args(["arena", "admin", "solver"])
            .args(extra)
            .arg("--data")
            .arg(data))
    };
    // A text file where the SQLite database should be: named, and said once.
    let text = d.path().join("text");
    std::fs::create_dir(&text).unwrap();
    std::fs::write(text.join("arena.db"), "hello\n").unwrap();
    let o = arena(&text, &["list"]);
    assert_clean_failure("a text file as the database", &o);
    assert!(o.stderr.contains("arena.db"), "{}", o.stderr);
    assert_eq!(
        o.stderr.matches("file is not a database").count(),
        1,
        "{}",
        o.stderr
    );
    // A database another process holds locked: the lock is said, not "already exists".
    let locked = d.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    ok(fd()
        .args(["arena", "admin", "solver", "list", "--data"])
        .arg(&locked));
    let mut holder = std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3, sys, time\n\
             c = sqlite3.connect(sys.argv[1], isolation_level=None)\n\
             c.execute('BEGIN EXCLUSIVE')\n\
             print('locked', flush=True)\n\
             time.sleep(60)",
        ])
        .arg(locked.join("arena.db"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()),
        &mut said,
    )
    .unwrap();
    assert_eq!(said.trim(), "locked");
    let o = arena(&locked, &["add", "nobody"]);
    let _ = holder.kill();
    let _ = holder.wait();
    assert_clean_failure("a locked database", &o);
    assert!(o.stderr.contains("locked"), "{}", o.stderr);
    assert!(!o.stderr.contains("already exists"), "{}", o.stderr);
    // A PostgreSQL port nobody listens on: the refused connection, not a pool's timeout.
    let o = arena(
        d.path(),
        &["list", "--database", "postgres://fd@127.0.0.1:1/arena"],
    );
    assert_clean_failure("a refused PostgreSQL port", &o);
    assert!(o.stderr.contains("127.0.0.1:1"), "{}", o.stderr);
    assert!(o.stderr.to_lowercase().contains("refused"), "{}", o.stderr);
    assert!(!o.stderr.contains("timed out"), "{}", o.stderr);
    // An in-memory SQLite database holds the migrations' tables for the command's life.
    let o = arena(d.path(), &["add", "mem", "--database", "sqlite::memory:"]);
    assert!(o.ok(), "{}", o.stderr);
    assert!(o.stdout.starts_with("mem."), "{}", o.stdout);
}
