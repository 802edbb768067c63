//! The `fastdecode` binary end to end: help texts, reproducible synth/transform, verify, and clear
//! errors (never panics) for every kind of bad model directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use fastdecode_model::checkpoint::{write_safetensors, LazyTensor, TensorStore};
use safetensors::Dtype;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fastdecode"))
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("binary runs")
}

fn ok(args: &[&str]) -> String {
    let o = run(args);
    assert!(
        o.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Runs a command that must succeed; returns its stderr (the notes it printed there).
fn notes(args: &[&str]) -> String {
    let o = run(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{args:?} failed: {err}");
    err
}

/// `generate --model MODEL` followed by `rest`.
fn generate<'a>(model: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    [&["generate", "--model", model][..], rest].concat()
}

/// Runs a command that must fail cleanly; returns its stderr.
fn fails(args: &[&str]) -> String {
    let o = run(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{args:?} should fail");
    // 1 for errors found while running, 2 for clap's argument errors.
    assert!(
        matches!(o.status.code(), Some(1) | Some(2)),
        "{args:?}: {err}"
    );
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    err
}

fn synth(dir: &Path, seed: &str) {
    ok(&[
        "synth",
        "--preset",
        "tiny",
        "--seed",
        seed,
        "--out",
        dir.to_str().unwrap(),
    ]);
}

#[test]
fn every_subcommand_has_help() {
    for (cmd, must) in [
        ("synth", "--preset"),
        ("transform", "<INPUT>"),
        ("inspect", "--inventory"),
        ("verify", "<DIR>"),
        ("generate", "--block-size"),
        ("bench", "--decode-tokens"),
        ("timeline", "--svg"),
    ] {
        let out = ok(&[cmd, "--help"]);
        assert!(out.contains(must), "{cmd} --help lacks {must}: {out}");
    }
}

#[test]
fn synth_is_byte_reproducible_and_verifies() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    synth(&a, "9");
    synth(&b, "9");
    for f in [
        "model.safetensors",
        "drafter/model.safetensors",
        "config.json",
        "tokenizer.json",
        "MANIFEST",
    ] {
        assert!(
            std::fs::read(a.join(f)).unwrap() == std::fs::read(b.join(f)).unwrap(),
            "{f}"
        );
    }
    let out = ok(&["verify", a.to_str().unwrap()]);
    let digest = out
        .lines()
        .find(|l| l.starts_with("digest sha256:"))
        .expect("a digest line");
    assert_eq!(digest.len(), "digest sha256:".len() + 64);
    // Refuses to overwrite.
    let e = fails(&["synth", "--preset", "tiny", "--out", a.to_str().unwrap()]);
    assert!(e.contains("already exists"), "{e}");
    let e = fails(&[
        "synth",
        "--preset",
        "huge",
        "--out",
        tmp.path().join("c").to_str().unwrap(),
    ]);
    assert!(e.contains("unknown preset"), "{e}");
}

#[test]
fn verify_names_the_bad_file() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    synth(&a, "1");
    let mut bytes = std::fs::read(a.join("drafter/model.safetensors")).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(a.join("drafter/model.safetensors"), bytes).unwrap();
    let e = fails(&["verify", a.to_str().unwrap()]);
    assert!(
        e.contains("drafter/model.safetensors") && e.contains("sha256"),
        "{e}"
    );
}

#[test]
fn inventory_of_xs21_is_the_912_tensors_of_the_release() {
    let out = ok(&["inspect", "--inventory", "--preset", "xs2.1"]);
    assert_eq!(out.lines().count(), 912);
    assert!(out.contains("model.layers.39.mlp.switch_mlp.down_proj.scales\tU8\t256,2048,32\n"));
    // --inventory DIR gives the same text for a synth of the same shapes.
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    synth(&a, "0");
    let from_dir = ok(&["inspect", "--inventory", a.to_str().unwrap()]);
    assert_eq!(
        from_dir,
        ok(&["inspect", "--inventory", "--preset", "tiny"])
    );
}

#[test]
fn transform_via_cli_is_reproducible() {
    let tmp = tempfile::tempdir().unwrap();
    let hf = tmp.path().join("hf");
    ok(&[
        "synth",
        "--preset",
        "tiny",
        "--layout",
        "hf",
        "--out",
        hf.to_str().unwrap(),
    ]);
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    ok(&["transform", hf.to_str().unwrap(), a.to_str().unwrap()]);
    ok(&["transform", hf.to_str().unwrap(), b.to_str().unwrap()]);
    assert!(
        std::fs::read(a.join("MANIFEST")).unwrap() == std::fs::read(b.join("MANIFEST")).unwrap()
    );
    ok(&["verify", a.to_str().unwrap()]);
    // The engine reads both layouts and they compute the same tokens.
    let gen = |d: &PathBuf| {
        ok(&[
            "generate",
            "--model",
            d.to_str().unwrap(),
            "--prompt-ids",
            "5,6,7",
            "--max-new-tokens",
            "12",
            "--ignore-eos",
            "--json",
        ])
    };
    let tokens =
        |s: String| serde_json::from_str::<serde_json::Value>(&s).unwrap()["tokens"].clone();
    assert_eq!(tokens(gen(&hf)), tokens(gen(&a)));
}

/// A tensor's dtype, shape and bytes.
type Raw = (Dtype, Vec<usize>, Vec<u8>);
/// Maps one tensor to the tensors written in its place.
type Edit<'a> = dyn Fn(&str, Raw) -> Vec<(String, Raw)> + 'a;

/// Copies a synth dir, rewriting its target safetensors: `edit` maps each tensor to the tensors
/// written in its place (none to drop it, several to add some).
fn broken(tmp: &Path, name: &str, edit: &Edit<'_>) -> PathBuf {
    let src = tmp.join("src");
    if !src.exists() {
        synth(&src, "2");
    }
    let dst = tmp.join(name);
    std::fs::create_dir_all(&dst).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(src.join(f), dst.join(f)).unwrap();
    }
    let store = TensorStore::open_dir(&src).unwrap();
    let mut tensors = vec![];
    for n in store.names() {
        let t = store.get(n).unwrap();
        for (name, (dtype, shape, data)) in edit(n, (t.dtype, t.shape.to_vec(), t.data.to_vec())) {
            tensors.push((
                name,
                LazyTensor {
                    dtype,
                    shape,
                    produce: Box::new(move || data.clone()),
                },
            ));
        }
    }
    write_safetensors(&dst.join("model.safetensors"), tensors).unwrap();
    dst
}

fn gen_err(dir: &Path) -> String {
    fails(&generate(
        dir.to_str().unwrap(),
        &["--prompt-ids", "1,2", "--max-new-tokens", "2"],
    ))
}

#[test]
fn bad_model_directories_give_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let victim = "model.layers.2.self_attn.k_proj.weight";
    let d = broken(t, "missing", &|n, raw| {
        if n == victim {
            vec![]
        } else {
            vec![(n.into(), raw)]
        }
    });
    let e = gen_err(&d);
    assert!(e.contains(victim) && e.contains("missing"), "{e}");

    let d = broken(t, "dtype", &|n, (dt, s, b)| {
        if n != victim {
            return vec![(n.into(), (dt, s, b))];
        }
        let f32s: Vec<u8> = b
            .chunks(2)
            .flat_map(|c| {
                half::bf16::from_le_bytes([c[0], c[1]])
                    .to_f32()
                    .to_le_bytes()
            })
            .collect();
        vec![(n.into(), (Dtype::F32, s, f32s))]
    });
    let e = gen_err(&d);
    assert!(
        e.contains(victim) && e.contains("dtype F32") && e.contains("expected BF16"),
        "{e}"
    );

    let d = broken(t, "shape", &|n, (dt, s, b)| {
        let s = if n == victim { vec![s[1], s[0]] } else { s };
        vec![(n.into(), (dt, s, b))]
    });
    let e = gen_err(&d);
    assert!(e.contains(victim) && e.contains("shape"), "{e}");

    // An extra tensor that no config names.
    let stray = "model.layers.9.mlp.gate.weight";
    let d = broken(t, "extra", &|n, raw| {
        let mut v = vec![(n.to_string(), raw)];
        if n == "lm_head.weight" {
            v.push((stray.into(), (Dtype::BF16, vec![2], vec![0; 4])));
        }
        v
    });
    let e = gen_err(&d);
    assert!(e.contains(stray) && e.contains("unexpected"), "{e}");

    // Truncated file.
    let d = t.join("truncated");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(t.join("src/config.json"), d.join("config.json")).unwrap();
    let bytes = std::fs::read(t.join("src/model.safetensors")).unwrap();
    std::fs::write(d.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    let e = gen_err(&d);
    assert!(
        e.contains("model.safetensors") && e.contains("truncated"),
        "{e}"
    );

    // Bad config: top-k above the expert count.
    let d = t.join("badcfg");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(t.join("src/model.safetensors"), d.join("model.safetensors")).unwrap();
    let cfg = std::fs::read_to_string(t.join("src/config.json")).unwrap();
    std::fs::write(
        d.join("config.json"),
        cfg.replace("\"num_experts_per_tok\": 4", "\"num_experts_per_tok\": 33"),
    )
    .unwrap();
    let e = gen_err(&d);
    assert!(
        e.contains("config.json") && e.contains("num_experts_per_tok"),
        "{e}"
    );

    // Not a model directory at all.
    let e = gen_err(&t.join("nowhere"));
    assert!(e.contains("nowhere") && e.contains("config.json"), "{e}");
    // A drafter that does not fit the target.
    let d = t.join("baddrafter");
    std::fs::create_dir_all(&d).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(t.join("src").join(f), d.join(f)).unwrap();
    }
    std::fs::create_dir_all(d.join("drafter")).unwrap();
    std::fs::copy(
        t.join("src/drafter/model.safetensors"),
        d.join("drafter/model.safetensors"),
    )
    .unwrap();
    let dc = std::fs::read_to_string(t.join("src/drafter/config.json")).unwrap();
    std::fs::write(
        d.join("drafter/config.json"),
        dc.replace("\"num_target_layers\": 4", "\"num_target_layers\": 40"),
    )
    .unwrap();
    // A run that drafts with it stops on it; a serial run does not need it, goes on and says so.
    let d = d.to_str().unwrap();
    let serial = ["--prompt-ids", "1,2", "--max-new-tokens", "2"];
    let e = fails(&generate(
        d,
        &[&serial[..], &["--block-size", "2"]].concat(),
    ));
    assert!(
        e.contains("drafter") && e.contains("num_target_layers"),
        "{e}"
    );
    let err = notes(&generate(d, &serial));
    assert!(
        err.contains("drafter/config.json")
            && err.contains("num_target_layers")
            && err.contains("not needed by this run"),
        "{err}"
    );
}

#[test]
fn generate_and_bench_report_json() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    synth(&a, "3");
    let m = a.to_str().unwrap();
    let out = ok(&generate(
        m,
        &[
            "--prompt",
            "The quick brown fox",
            "--max-new-tokens",
            "20",
            "--block-size",
            "4",
            "--draft",
            "oracle:0.6",
            "--ignore-eos",
            "--json",
        ],
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["tokens"].as_array().unwrap().len(), 20);
    assert!(v["text"].is_string());
    assert!(v["rounds"].as_u64().unwrap() >= 5);
    assert!(v["accepted_drafts"].as_u64().is_some());
    let draft = |block_size, oracle| {
        let rest = [
            "--prompt-ids",
            "1",
            "--block-size",
            block_size,
            "--draft",
            oracle,
        ];
        fails(&generate(m, &rest))
    };
    let e = draft("17", "oracle:0.5");
    assert!(e.contains("--block-size") && e.contains("17"), "{e}");
    let e = draft("2", "oracle:1.5");
    assert!(e.contains("oracle probability"), "{e}");
    // The engine's own output explains itself: a run that ends early says it met an
    // end-of-sequence token (this model and prompt meet one before 40 tokens), and DFlash's
    // slow-down on a CPU says why.
    let err = notes(&generate(
        m,
        &["--prompt-ids", "7", "--max-new-tokens", "40"],
    ));
    let emitted: usize = err
        .split("stopped at an end-of-sequence token after ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no end-of-sequence note: {err}"));
    assert!(emitted < 40, "{err}");
    assert!(err.contains(&format!("serial: {emitted} tokens")), "{err}");
    assert!(err.contains("of the 40 new tokens asked for"), "{err}");
    let err = notes(&generate(
        m,
        &[
            "--prompt-ids",
            "1",
            "--max-new-tokens",
            "16",
            "--ignore-eos",
            "--block-size",
            "4",
            "--draft",
            "oracle:0.6",
            "--compare",
        ],
    ));
    assert!(
        err.contains("identical output; DFlash decode speed-up")
            && err.contains("on a CPU a verify of K rows costs about K one-row forwards")
            && !err.contains("end-of-sequence"),
        "{err}"
    );
    // The GPU-only kernel trace is refused on the CPU, not silently ignored (`--profile` times
    // the CPU forward's ops: `arena_service`'s `the_cpu_benchs_profile_parses_as_a_profile`).
    let e = fails(&[
        "bench",
        "--model",
        m,
        "--decode-tokens",
        "4",
        "--trace",
        "t.csv",
    ]);
    assert!(e.contains("needs --backend cuda"), "{e}");

    let out = ok(&[
        "bench",
        "--backend",
        "cpu",
        "--model",
        m,
        "--json",
        "--prompt-tokens",
        "8",
        "--decode-tokens",
        "24",
        "--block-sizes",
        "2,4",
        "--draft",
        "oracle:0.9",
        "--repeats",
        "1",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        v["serial"]["decode_tokens_per_s"]["median"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    let rows = v["dflash"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        assert_eq!(r["identical_to_serial"], true);
        assert!(r["tokens_per_round"].as_f64().unwrap() > 1.0);
    }
}

#[test]
fn cuda_generate_needs_no_cpu_model_and_fails_clearly_without_a_gpu() {
    // Serial generation on the GPU reads only the config and tokenizer on the host. Without a
    // GPU (CI) it must stop with the driver/device error, never a panic; with one it generates.
    let o = run(&[
        "generate",
        "--backend",
        "cuda",
        "--prompt",
        "def f",
        "--max-new-tokens",
        "4",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    if !o.status.success() {
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            ["driver", "device", "NVRTC", "headers"]
                .iter()
                .any(|w| err.contains(w)),
            "unclear error: {err}"
        );
    }
    let err = fails(&[
        "generate",
        "--backend",
        "cuda",
        "--model",
        "/nonexistent-model-dir",
        "--prompt",
        "x",
    ]);
    assert!(err.contains("not a model directory"), "{err}");
}

#[test]
fn timeline_tabulates_a_trace_draws_it_and_names_bad_files() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    // Two launches of a GEMV (kind 2, tag 2048), one block each, then an attention launch (kind 3)
    // that waits 1 µs after the second GEMV ends and runs 5 µs.
    let (g, a) = (2 << 20 | 2048, 3 << 20);
    let rows = [
        (0, g, 0, 0),
        (500, g, 1, 0),
        (10_000, g, 2, 0),
        (8_000, a, 0, 0),
        (11_000, a, 1, 0),
        (16_000, a, 2, 0),
        (20_000, g, 0, 0),
        (21_000, g, 1, 0),
        (30_000, g, 2, 0),
    ];
    let mut text = String::from("module,ns,kind,event,block,clock\n");
    for (ns, kind, ev, b) in rows {
        text += &format!("m,{ns},{kind},{ev},{b},{}\n", 2 * ns);
    }
    std::fs::write(&csv, text).unwrap();
    let svg = dir.path().join("t.svg");
    let out = ok(&[
        "timeline",
        csv.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    // attend_decode follows the first GEMV: adds 6 µs, waited 1, ran 5; the second GEMV follows it.
    let line = out
        .lines()
        .find(|l| l.starts_with("attend_decode"))
        .unwrap();
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&cols[1..5], ["1", "6.00", "1.00", "5.00"], "{out}");
    assert!(out.contains("gemv_bf16 (2048)"), "{out}");
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(svg.matches("<title>").count(), 3, "{svg}");
    let e = fails(&["timeline", dir.path().join("none.csv").to_str().unwrap()]);
    assert!(e.contains("none.csv"), "{e}");
    std::fs::write(&csv, "module,ns,kind,event,block,clock\nm,1,2,zero,0,0\n").unwrap();
    let e = fails(&["timeline", csv.to_str().unwrap()]);
    assert!(e.contains("t.csv") && e.contains("line: 2"), "{e}");
    let e = fails(&["timeline", csv.to_str().unwrap(), "--window", "0"]);
    assert!(e.contains("--window"), "{e}");
}
