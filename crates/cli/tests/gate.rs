//! Golden traces, the gate, bisection and the worker protocol with the plain `fastdecode`
//! binary (faulty builds are in `faults.rs`).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_fastdecode");

fn run(c: &mut Command) -> Output {
    let o = c.output().expect("runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{c:?} panicked: {err}");
    o
}

fn ok(c: &mut Command) -> String {
    let o = run(c);
    assert!(
        o.status.success(),
        "{c:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn fails(c: &mut Command) -> String {
    let o = run(c);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{c:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn fd() -> Command {
    Command::new(BIN)
}

fn tiny(dir: &Path) -> PathBuf {
    let m = dir.join("tiny");
    ok(fd()
        .args(["synth", "--preset", "tiny", "--seed", "5", "--out"])
        .arg(&m));
    m
}

/// Makes `count` goldens of `tokens` tokens of `model` in `dir`/g; returns that directory.
fn goldens(model: &Path, dir: &Path, count: &str, tokens: &str) -> PathBuf {
    let out = dir.join("g");
    ok(fd()
        .args([
            "golden", "make", "--count", count, "--tokens", tokens, "--model",
        ])
        .arg(model)
        .arg("--out")
        .arg(&out));
    out
}

/// `gate` of this build against itself on `model` and the goldens at `golden`.
fn self_gate(model: &Path, golden: &Path) -> Command {
    let mut gate = fd();
    gate.args(["gate", "--reference", BIN, "--candidate", BIN, "--model"])
        .arg(model)
        .arg("--golden")
        .arg(golden);
    gate
}

#[test]
fn golden_make_gate_and_bisect() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny(tmp.path());
    let g = goldens(&model, tmp.path(), "2", "32");
    let text = std::fs::read_to_string(g.join("golden-000.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["format"], "fastdecode-golden");
    assert_eq!(v["version"], 1);
    assert_eq!(v["tokens"].as_array().unwrap().len(), 32);
    assert_eq!(v["steps"][0]["top"][0]["id"], v["tokens"][0]);
    assert!(v["made_by"]["build"]["commit"]
        .as_str()
        .is_some_and(|c| !c.is_empty()));
    let digest = ok(fd().arg("verify").arg(&model));
    assert!(
        digest.contains(v["model_digest"].as_str().unwrap()),
        "{digest}"
    );

    // The build against itself, with and without its fast paths: every token exact.
    for flags in ["", "unrolled_dot,fast_exp"] {
        let out = ok(self_gate(&model, &g).args(["--candidate-flags", flags]));
        assert!(out.contains("gate: passed (2 goldens)"), "{out}");
        assert!(
            out.contains("replay             64         0      0"),
            "{out}"
        );
    }

    // Each fast path changes the logits (not the tokens, on this model): bisection by logits
    // finds the flag; searching one flag at a time blames exactly that flag.
    let json = tmp.path().join("bisect.json");
    let out = ok(fd()
        .args(["bisect", "--criterion", "logits", "--model"])
        .arg(&model)
        .arg("--golden")
        .arg(&g)
        .arg("--json")
        .arg(&json));
    assert!(out.contains("culprit: unrolled_dot"), "{out}");
    let rep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(rep["trials"][0]["flags"].as_array().unwrap().len(), 0);
    assert_eq!(rep["trials"][0]["diverges"], false);
    let out = ok(fd()
        .args([
            "bisect",
            "--criterion",
            "logits",
            "--flags",
            "fast_exp",
            "--model",
        ])
        .arg(&model)
        .arg("--golden")
        .arg(&g));
    assert!(out.contains("culprit: fast_exp"), "{out}");
    // By tokens, neither flag flips an argmax here.
    let out = ok(fd()
        .args(["bisect", "--model"])
        .arg(&model)
        .arg("--golden")
        .arg(&g));
    assert!(out.contains("no divergence"), "{out}");

    // A golden of another model is refused before anything runs.
    let other = tmp.path().join("other");
    ok(fd()
        .args(["synth", "--preset", "tiny", "--seed", "6", "--out"])
        .arg(&other));
    let err = fails(&mut self_gate(&other, &g));
    assert!(err.contains("golden_model_mismatch"), "{err}");
}

#[test]
fn golden_files_are_parsed_strictly() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny(tmp.path());
    let g = goldens(&model, tmp.path(), "1", "8");
    let good = std::fs::read_to_string(g.join("golden-000.json")).unwrap();
    let cases = [
        (
            "unknown.json",
            good.replacen("\"version\": 1,", "\"version\": 1, \"extra\": true,", 1),
            "unknown field `extra`",
        ),
        (
            "truncated.json",
            good[..good.len() / 3].to_string(),
            "not a valid golden trace",
        ),
        (
            "v9.json",
            good.replacen("\"version\": 1,", "\"version\": 9,", 1),
            "reads version 1",
        ),
        ("empty.json", String::new(), "not a valid golden trace"),
    ];
    for (name, text, want) in cases {
        let p = tmp.path().join(name);
        std::fs::write(&p, text).unwrap();
        let err = fails(&mut self_gate(&model, &p));
        assert!(err.contains(name) && err.contains(want), "{name}: {err}");
    }
    let err = fails(
        fd().args(["bisect", "--model"])
            .arg(&model)
            .arg("--golden")
            .arg(tmp.path().join("missing.json")),
    );
    assert!(err.contains("missing.json"), "{err}");
    let err = fails(
        fd().args(["worker", "--flags", "warp"])
            .arg("--model")
            .arg(&model),
    );
    assert!(err.contains("unknown optimisation flag \"warp\""), "{err}");
}

#[test]
fn worker_speaks_the_protocol() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny(tmp.path());
    let mut worker = support::WorkerProcess::start(&model);
    let ready = worker.next();
    assert_eq!(
        (ready["type"].as_str(), ready["version"].as_u64()),
        (Some("ready"), Some(2))
    );
    assert_eq!(
        ready["known_flags"],
        serde_json::json!(["unrolled_dot", "fast_exp"])
    );
    worker.send(r#"{"op":"window","id":4,"prompt":[1,2,3],"decode_tokens":5,"block_size":1}"#);
    let s = worker.next();
    assert_eq!(
        (s["type"].as_str(), s["kv_len"].as_u64()),
        (Some("seeded"), Some(3))
    );
    let w = worker.next();
    assert_eq!(w["tokens"].as_array().unwrap().len(), 6);
    assert_eq!(w["kv_len"], 3 + 5, "ledger: prompt + tokens - 1");
    assert_eq!(w["tokens"][0], s["token"]);
    // DFlash with forced rejections (every other draft wrong) reproduces the serial tokens.
    let truth = w["tokens"].to_string();
    let drafts: Vec<u64> = w["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, t)| t.as_u64().unwrap() ^ (i % 2) as u64)
        .collect();
    let drafts = serde_json::to_string(&drafts).unwrap();
    worker.send(&format!(r#"{{"op":"window","id":5,"prompt":[1,2,3],"decode_tokens":5,"block_size":3,"draft":"oracle:0.5","drafts":{drafts}}}"#));
    worker.next();
    assert_eq!(worker.next()["tokens"], w["tokens"]);
    worker.send(&format!(
        r#"{{"op":"replay","id":6,"prompt":[1,2,3],"chain":{truth},"probe":true}}"#
    ));
    let r = worker.next();
    for (i, s) in r["steps"].as_array().unwrap().iter().enumerate() {
        assert_eq!(
            s["top"][0]["id"], w["tokens"][i],
            "teacher-forced argmax = greedy token"
        );
        assert_eq!(s["probe_logit"], s["top"][0]["logit"]);
    }
    worker
        .send(r#"{"op":"window","id":7,"prompt":[1],"decode_tokens":1,"block_size":1,"turbo":1}"#);
    let e = worker.next();
    assert_eq!(e["type"], "error");
    assert!(e["message"].as_str().unwrap().contains("turbo"));
    worker.shut_down();
}

#[test]
fn baseline_ref_resolves_and_caches_by_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny(tmp.path());
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cache = tmp.path().join("cache");
    let err = fails(
        fd().args([
            "price",
            "--baseline-ref",
            "no-such-ref-xyz",
            "--pairs",
            "4",
            "--model",
        ])
        .arg(&model)
        .arg("--repo")
        .arg(&repo)
        .arg("--cache")
        .arg(&cache),
    );
    assert!(err.contains("\"no-such-ref-xyz\" is not a commit"), "{err}");
    // A cached baseline is used as is, keyed by the full commit hash (building one takes minutes;
    // `price --baseline-ref` does it on a cache miss).
    let head = String::from_utf8(
        Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(["rev-parse", "HEAD"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let slot = cache.join(head.trim());
    std::fs::create_dir_all(&slot).unwrap();
    std::fs::copy(BIN, slot.join("fastdecode")).unwrap();
    let out_dir = tmp.path().join("out");
    let o = run(fd()
        .args([
            "price",
            "--baseline-ref",
            "HEAD",
            "--pairs",
            "4",
            "--prompt-tokens",
            "16",
            "--decode-tokens",
            "8",
            "--quiet-cpu",
            "1.0",
            "--model",
        ])
        .arg(&model)
        .arg("--repo")
        .arg(&repo)
        .arg("--cache")
        .arg(&cache)
        .arg("--out")
        .arg(&out_dir));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cached at"), "{err}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("result.json")).unwrap())
            .unwrap();
    assert_eq!(
        r["baseline"]["bin"].as_str().unwrap(),
        slot.join("fastdecode").to_str().unwrap()
    );
    assert_eq!(r["accepted_pair_count"], 4);
}
