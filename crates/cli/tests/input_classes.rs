//! One test per class of defect that issue 16's sweep of bad inputs found, each built on the
//! example the issue gives and run as a user would: the real `fastdecode` binary, real files,
//! real processes (including hostile stand-in workers written as shell scripts).

mod support;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

fn stdout_digest(out: &str) -> String {
    out.split("digest sha256:")
        .nth(1)
        .expect("a digest")
        .trim()
        .to_string()
}

/// Names in `dir` that start with a dot: what a staging directory or file would leave.
fn hidden_entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with('.'))
        .collect()
}

/// Class 1: data loss and corrupt "success" from a fixed staging name.
#[test]
fn class1_staging_is_unique_per_run_and_never_touches_what_it_did_not_create() {
    let f = fixture();
    let t = tempfile::tempdir().unwrap();
    // Concurrent transforms into one output: exactly one wins, and what it printed verifies.
    for round in 0..4 {
        let out = t.path().join(format!("o{round}"));
        let runs: Vec<_> = (0..3)
            .map(|_| {
                fd().arg("transform")
                    .arg(&f.hf)
                    .arg(&out)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let outs: Vec<_> = runs
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect();
        let winners: Vec<_> = outs.iter().filter(|o| o.status.success()).collect();
        assert_eq!(winners.len(), 1, "round {round}: exactly one run succeeds");
        let printed = stdout_digest(&String::from_utf8_lossy(&winners[0].stdout));
        let verified = ok(fd().arg("verify").arg(&out));
        assert_eq!(stdout_digest(&verified), printed, "round {round}");
        for o in outs.iter().filter(|o| !o.status.success()) {
            let e = String::from_utf8_lossy(&o.stderr);
            assert!(e.contains(&*out.to_string_lossy()), "{e}");
            assert!(!e.contains("panicked"), "{e}");
        }
        assert!(hidden_entries(t.path()).is_empty(), "staging left behind");
    }
    // A user's own `victim.partial/` (the old fixed staging name) is not deleted.
    let victim = t.path().join("victim.partial");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("mine"), b"keep me").unwrap();
    ok(fd()
        .args(["synth", "--preset", "tiny", "--out"])
        .arg(t.path().join("victim")));
    assert_eq!(std::fs::read(victim.join("mine")).unwrap(), b"keep me");
    // `--out x/..` names no new directory: refused, nothing hidden is left anywhere.
    let x = t.path().join("x");
    std::fs::create_dir(&x).unwrap();
    let o = run(fd()
        .args(["synth", "--preset", "tiny", "--out"])
        .arg(x.join("..")));
    assert_clean_failure("synth --out x/..", &o);
    assert!(
        o.stderr.contains("does not name a new directory"),
        "{}",
        o.stderr
    );
    assert!(hidden_entries(t.path()).is_empty() && hidden_entries(&x).is_empty());
    // An output inside the input is refused, and the input still verifies.
    let hf = t.path().join("hf");
    link_copy(&f.hf, &hf);
    let o = run(fd().arg("transform").arg(&hf).arg(hf.join("out")));
    assert_clean_failure("transform into its input", &o);
    assert!(
        o.stderr.contains("inside the input directory"),
        "{}",
        o.stderr
    );
    ok(fd().arg("verify").arg(&hf));
    // golden make refuses a folder of goldens (it would overwrite some and keep others) ...
    let goldens = t.path().join("goldens");
    std::fs::create_dir(&goldens).unwrap();
    std::fs::write(goldens.join("golden-000.json"), b"old").unwrap();
    let o = run(fd()
        .args(["golden", "make", "--count", "1", "--tokens", "8", "--model"])
        .arg(&f.model)
        .arg("--out")
        .arg(&goldens));
    assert_clean_failure("golden make into goldens", &o);
    assert!(o.stderr.contains("not empty"), "{}", o.stderr);
    assert_eq!(
        std::fs::read(goldens.join("golden-000.json")).unwrap(),
        b"old"
    );
    // ... and one that makes fewer goldens than asked writes none of them.
    let empty = t.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let o = run(fd()
        .args([
            "golden",
            "make",
            "--count",
            "2",
            "--tokens",
            "8",
            "--attempts-per-golden",
            "1",
            "--min-distinct-fraction",
            "1",
            "--min-near-tie-rows",
            "8",
            "--model",
        ])
        .arg(&f.model)
        .arg("--out")
        .arg(&empty));
    assert_clean_failure("golden make with an impossible screen", &o);
    assert!(o.stderr.contains("nothing was written"), "{}", o.stderr);
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
    assert!(hidden_entries(t.path()).is_empty());
}

/// Class 2: sizes from configs and options checked, with checked arithmetic, before allocating.
#[test]
fn class2_lengths_are_checked_against_the_model_before_anything_is_allocated() {
    let f = fixture();
    let t = tempfile::tempdir().unwrap();
    // Sliding windows of 2^62 and 10^9 positions: a model like any other, that allocates only
    // for the positions it runs (these used to panic in kv_cache.rs, or abort on 256 GB).
    for w in [1u64 << 62, 1_000_000_000] {
        let m = t.path().join(format!("w{w}"));
        link_copy(&f.model, &m);
        edit_json(&m.join("config.json"), |v| v["sliding_window"] = w.into());
        let o = run(fd()
            .args([
                "generate",
                "--prompt-ids",
                "1,2,3",
                "--max-new-tokens",
                "8",
                "--model",
            ])
            .arg(&m)
            .args(["--block-size", "4", "--draft", "oracle:0.5"]));
        assert!(o.ok(), "sliding_window {w}: {}", o.stderr);
        assert!(
            o.max_rss_kib < 1 << 20,
            "sliding_window {w}: {} KiB",
            o.max_rss_kib
        );
    }
    // Lengths past max_position_embeddings are refused at once, naming the option.
    for (args, option) in [
        (
            &[
                "generate",
                "--prompt-ids",
                "1",
                "--max-new-tokens",
                "1000000000000",
            ][..],
            "--max-new-tokens",
        ),
        (
            &["bench", "--prompt-tokens", "100000000", "--repeats", "1"][..],
            "--prompt-tokens",
        ),
        (
            &["golden", "make", "--tokens", "40000", "--out", "g"][..],
            "--tokens",
        ),
    ] {
        let o = run(fd()
            .args(args)
            .arg("--model")
            .arg(&f.model)
            .current_dir(t.path()));
        assert_clean_failure(option, &o);
        assert!(
            o.stderr.contains(option) && o.stderr.contains("max_position_embeddings"),
            "{option}: {}",
            o.stderr
        );
        assert!(o.seconds < 30.0, "{option} took {} s", o.seconds);
    }
    // A config whose sizes overflow 64 bits is refused by field, not by a panic.
    let big = t.path().join("big");
    link_copy(&f.model, &big);
    edit_json(&big.join("config.json"), |v| {
        v["hidden_size"] = (1u64 << 40).into()
    });
    let o = run(fd().arg("inspect").arg(&big));
    assert_clean_failure("hidden_size 2^40", &o);
    assert!(
        o.stderr.contains("hidden_size") && o.stderr.contains("limit"),
        "{}",
        o.stderr
    );
    // A worker asked for u64::MAX tokens answers with an error (it used to wrap and send a
    // reply that broke the protocol), then serves the next request.
    let reqs = format!(
        "{}\n{}\n{{\"op\":\"shutdown\"}}\n",
        r#"{"op":"window","id":1,"prompt":[1,2],"decode_tokens":18446744073709551615,"block_size":1}"#,
        r#"{"op":"window","id":2,"prompt":[1,2],"decode_tokens":3,"block_size":1}"#
    );
    let o = run_with(
        fd().arg("worker").arg("--model").arg(&f.model),
        reqs.as_bytes(),
        Duration::from_secs(120),
    );
    assert!(o.ok(), "{}", o.stderr);
    let replies: Vec<serde_json::Value> = o
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(replies[1]["type"], "error", "{}", o.stdout);
    assert_eq!(replies[1]["id"], 1);
    assert_eq!(replies[2]["type"], "seeded");
    assert_eq!(replies[3]["tokens"].as_array().unwrap().len(), 4);
}

/// Class 3: every numeric option has a range, checked as it is parsed, naming the option.
#[test]
fn class3_numeric_options_are_range_checked_by_name() {
    let f = fixture();
    let t = tempfile::tempdir().unwrap();
    let m = f.model.to_str().unwrap();
    let golden = t.path().join("g.json");
    std::fs::write(&golden, "{}").unwrap();
    let g = golden.to_str().unwrap();
    let csv = t.path().join("t.csv");
    std::fs::write(
        &csv,
        "module,ns,kind,event,block,clock\nm,0,2,0,0,0\nm,5,2,2,0,9\n",
    )
    .unwrap();
    let c = csv.to_str().unwrap();
    let gate = [
        "gate",
        "--reference",
        BIN,
        "--candidate",
        BIN,
        "--model",
        m,
        "--golden",
        g,
    ];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "generate",
                "--model",
                m,
                "--prompt-ids",
                "1",
                "--block-size",
                "0",
            ],
            "--block-size",
        ),
        ([&gate[..], &["--timeout", "-5"]].concat(), "--timeout"),
        ([&gate[..], &["--timeout", "NaN"]].concat(), "--timeout"),
        ([&gate[..], &["--timeout", "1e300"]].concat(), "--timeout"),
        ([&gate[..], &["--envelope", "inf"]].concat(), "--envelope"),
        ([&gate[..], &["--budget", "NaN"]].concat(), "--budget"),
        (vec!["timeline", c, "--window", "inf"], "--window"),
        (vec!["bench", "--model", m, "--repeats", "0"], "--repeats"),
        (
            vec![
                "golden",
                "make",
                "--model",
                m,
                "--out",
                "g",
                "--count",
                "4",
                "--prompt-ids",
                "1,2",
            ],
            "--count",
        ),
    ];
    for (args, option) in cases {
        let o = run_with(
            fd().args(&args).current_dir(t.path()),
            b"",
            Duration::from_secs(30),
        );
        assert_clean_failure(option, &o);
        assert!(o.stderr.contains(option), "{args:?}: {}", o.stderr);
        assert!(!t.path().join("g").exists());
    }
}

/// `gate` of the reference against the build `cand` on the fixture model and its one golden.
fn gate_against(cand: &Path) -> Command {
    let mut gate = fd();
    gate.args(["gate", "--reference", BIN, "--candidate"])
        .arg(cand)
        .arg("--model")
        .arg(&fixture().model)
        .arg("--golden")
        .arg(goldens());
    gate
}

/// Class 4: the user's mistake reported as the user's, and a worker's stated reason carried.
#[test]
fn class4_user_mistakes_are_found_before_spawning_and_worker_reasons_are_kept() {
    let t = tempfile::tempdir().unwrap();
    // A marker script as the candidate tells whether any worker was started.
    let marker = t.path().join("started");
    let cand = t.path().join("cand.sh");
    script(
        &cand,
        &format!("touch {}\nexec {BIN} \"$@\"", marker.display()),
    );
    let gate = |extra: &[&str]| run(gate_against(&cand).args(extra));
    for (extra, option) in [
        (&["--oracle-p", "2"][..], "--oracle-p"),
        (&["--block-size", "17"][..], "--block-size"),
    ] {
        let o = gate(extra);
        assert_clean_failure(option, &o);
        assert!(o.stderr.contains(option), "{}", o.stderr);
        assert!(
            !o.stderr.contains("infra:"),
            "blamed on a build: {}",
            o.stderr
        );
        assert!(!marker.exists(), "{option}: a worker was started");
    }
    // A worker that refuses what it was given says why, and the failure carries it.
    let json = t.path().join("report.json");
    let o = gate(&[
        "--candidate-flags",
        "warp",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_clean_failure("--candidate-flags warp", &o);
    let rep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(rep["failure"]["side"], "candidate");
    let detail = rep["failure"]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("unknown optimisation flag"), "{rep}");
    assert!(
        o.stderr.contains("unknown optimisation flag"),
        "{}",
        o.stderr
    );
}

/// Class 5: hostile workers: their children die with them, their output is bounded, and the
/// worker survives bad bytes on its input.
#[test]
fn class5_hostile_workers_are_contained() {
    let f = fixture();
    let t = tempfile::tempdir().unwrap();
    // The gate of a worker that is the script `body`, which must fail cleanly (`what` says how).
    let gate_hostile = |file: &str, body: &str, what: &str| {
        let cand = t.path().join(file);
        script(&cand, body);
        let o = run(gate_against(&cand).args(["--ready-timeout", "3"]));
        assert_clean_failure(what, &o);
        o
    };
    // A worker that starts a child and never answers: the child dies with it.
    let pidfile = t.path().join("child.pid");
    let o = gate_hostile(
        "kids.sh",
        &format!("sleep 300 &\necho $! > {}\nsleep 300", pidfile.display()),
        "a hung worker with a child",
    );
    assert!(o.stderr.contains("infra:worker_hung"), "{}", o.stderr);
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !process_gone(pid) {
        assert!(
            Instant::now() < deadline,
            "the worker's child {pid} outlived the gate"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A worker that sends 300 MB without a newline: a protocol fault, the parent stays small.
    let o = gate_hostile(
        "flood.sh",
        "head -c 300000000 /dev/zero | tr '\\0' x\nsleep 300",
        "a flooding worker",
    );
    assert!(o.stderr.contains("infra:protocol"), "{}", o.stderr);
    assert!(
        o.max_rss_kib < 100 << 10,
        "the parent grew to {} KiB",
        o.max_rss_kib
    );
    // A worker that writes 200 MB to stderr without a newline and dies: the user's terminal gets
    // the first 64 KiB and a count of the rest, and the gate's own message a line of its own (no
    // race: the gate reports a crash once the worker's stderr has ended, `Worker::last_words`).
    let o = gate_hostile(
        "noisy.sh",
        "head -c 200000000 /dev/zero | tr '\\0' x >&2\nexit 3",
        "a worker flooding stderr",
    );
    assert!(
        o.stderr.len() < 80 << 10,
        "{} bytes on stderr",
        o.stderr.len()
    );
    let cut = format!(
        "[the worker's stderr: {} more byte(s) not shown]",
        200_000_000 - (64 << 10)
    );
    assert!(
        o.stderr.contains(&format!("x\n{cut}\n")),
        "{}",
        &o.stderr[o.stderr.len() - 300..]
    );
    let after = &o.stderr[o.stderr.find(&cut).unwrap() + cut.len()..];
    // Its message starts a line, quoting at most 500 characters of the worker's last words.
    assert!(
        after.trim_start().starts_with("error: gate:") && !after.contains(&"x".repeat(501)),
        "the gate's message: {after}"
    );
    // Invalid UTF-8, and a request line longer than any request, get error replies; the worker
    // then serves the next request (PROTOCOL.md: it keeps reading).
    let mut w = WorkerProcess::start(&f.model);
    assert_eq!(w.next()["type"], "ready");
    w.input.write_all(b"\xff\xfe{\"op\":\n").unwrap();
    let e = w.next();
    assert_eq!(e["type"], "error");
    assert!(e["message"].as_str().unwrap().contains("UTF-8"), "{e}");
    w.input.write_all(&vec![b'x'; 8 << 20]).unwrap();
    w.input.write_all(b"\n").unwrap();
    let e = w.next();
    assert!(
        e["message"].as_str().unwrap().contains("longer than"),
        "{e}"
    );
    w.send(r#"{"op":"window","id":9,"prompt":[1,2],"decode_tokens":2,"block_size":1}"#);
    assert_eq!(w.next()["type"], "seeded");
    assert_eq!(w.next()["tokens"].as_array().unwrap().len(), 3);
    w.shut_down();
}

/// Pauses `child` while it is hashing `file` (its read offset strictly inside the file);
/// false when it went past the file before it could be caught.
fn pause_mid_file(child: &std::process::Child, file: &Path) -> bool {
    let pid = child.id();
    let len = file.metadata().unwrap().len();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let fds = match std::fs::read_dir(format!("/proc/{pid}/fd")) {
            Ok(d) => d,
            Err(_) => return false,
        };
        for e in fds.flatten() {
            if std::fs::read_link(e.path()).ok().as_deref() != Some(file) {
                continue;
            }
            let info = format!("/proc/{pid}/fdinfo/{}", e.file_name().to_string_lossy());
            let pos = |s: String| -> u64 {
                s.lines()
                    .find_map(|l| l.strip_prefix("pos:"))
                    .and_then(|p| p.trim().parse().ok())
                    .unwrap_or(0)
            };
            if std::fs::read_to_string(&info).map(pos).unwrap_or(0) == 0 {
                continue;
            }
            // SAFETY: a signal to our own child.
            unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
            let at = std::fs::read_to_string(&info).map(pos).unwrap_or(len);
            if at > 0 && at < len {
                return true;
            }
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    false
}

/// Class 6: `verify --write` stays inside the model folder, never blocks, reports success only
/// after it, and notices a file changing while it is hashed.
#[test]
fn class6_manifests_pin_only_regular_files_inside_and_notice_changes() {
    let f = fixture();
    let t = tempfile::tempdir().unwrap();
    let m = t.path().join("m");
    link_copy(&f.model, &m);
    let manifest = std::fs::read(m.join("MANIFEST")).unwrap();
    let secret = t.path().join("secret");
    std::fs::write(&secret, b"not part of the model").unwrap();
    let write = |what: &str| {
        let o = run_with(
            fd().args(["verify", "--write"]).arg(&m),
            b"",
            Duration::from_secs(60),
        );
        assert_clean_failure(what, &o);
        assert!(
            !o.stdout.contains("wrote"),
            "{what}: reported success: {}",
            o.stdout
        );
        assert_eq!(
            std::fs::read(m.join("MANIFEST")).unwrap(),
            manifest,
            "{what}"
        );
        o.stderr
    };
    std::os::unix::fs::symlink(&secret, m.join("leak")).unwrap();
    let e = write("a link out of the folder");
    assert!(e.contains("leak") && e.contains("outside"), "{e}");
    std::fs::remove_file(m.join("leak")).unwrap();
    mkfifo(&m.join("pipe"));
    let e = write("a FIFO");
    assert!(e.contains("pipe") && e.contains("FIFO"), "{e}");
    // `verify` does not block on it either.
    let o = run_with(fd().arg("verify").arg(&m), b"", Duration::from_secs(60));
    assert_clean_failure("verify with a FIFO", &o);
    std::fs::remove_file(m.join("pipe")).unwrap();
    // A link to a file inside the folder is pinned like the file.
    std::os::unix::fs::symlink("config.json", m.join("alias.json")).unwrap();
    ok(fd().args(["verify", "--write"]).arg(&m));
    ok(fd().arg("verify").arg(&m));
    std::fs::remove_file(m.join("alias.json")).unwrap();
    ok(fd().args(["verify", "--write"]).arg(&m));
    let manifest = std::fs::read(m.join("MANIFEST")).unwrap();
    // A file that grows while it is hashed: caught mid-hash (the process paused there), the
    // file appended to, the process resumed.
    let big = m.join("big.bin");
    for attempt in 0..3 {
        let f = std::fs::File::create(&big).unwrap();
        f.set_len((1u64 << 31) << attempt).unwrap();
        drop(f);
        let child = fd()
            .args(["verify", "--write"])
            .arg(&m)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let caught = pause_mid_file(&child, &big.canonicalize().unwrap());
        if caught {
            let mut a = std::fs::OpenOptions::new().append(true).open(&big).unwrap();
            a.write_all(b"more").unwrap();
            // SAFETY: a signal to our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
        }
        let o = child.wait_with_output().unwrap();
        if !caught {
            continue;
        }
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "a changing file was pinned");
        assert!(e.contains("big.bin") && e.contains("changed while"), "{e}");
        assert!(!String::from_utf8_lossy(&o.stdout).contains("wrote"));
        assert_eq!(std::fs::read(m.join("MANIFEST")).unwrap(), manifest);
        return;
    }
    panic!(
        "verify --write was never caught in the middle of the file (attempt {})",
        3
    );
}

/// Class 7: no silent garbage: non-finite weights, a tokenizer of another vocabulary, broken
/// optional files are refused by name or skipped with a note, never an empty result.
#[test]
fn class7_bad_weights_and_parts_are_refused_or_reported() {
    let f = fixture();
    let t = tempfile::tempdir().unwrap();
    let gen = |m: &Path, args: &[&str]| {
        run(fd()
            .arg("generate")
            .arg("--model")
            .arg(m)
            .args(["--max-new-tokens", "6", "--ignore-eos"])
            .args(args))
    };
    let gen_ok = |m: &Path, args: &[&str]| {
        let o = gen(m, args);
        assert!(o.ok(), "{}", o.stderr);
        o
    };
    // NaN and Inf outside the experts, in the runtime and the HF layout.
    for (name, tensor, bits) in [
        ("nan", "model.norm.weight", 0x7fc0u16),
        ("inf", "model.embed_tokens.weight", 0x7f80),
        ("hfnan", "model.layers.0.input_layernorm.weight", 0xffc0),
    ] {
        let src = if name.starts_with("hf") {
            &f.hf
        } else {
            &f.model
        };
        let m = t.path().join(name);
        link_copy(src, &m);
        patch_bf16(&m.join("model.safetensors"), tensor, 3, bits);
        let o = gen(&m, &["--prompt-ids", "1,2"]);
        assert_clean_failure(name, &o);
        assert!(
            o.stderr.contains(tensor) && o.stderr.contains("model.safetensors"),
            "{name}: {}",
            o.stderr
        );
        if name.starts_with("hf") {
            let out = t.path().join("rt");
            let o = run(fd().arg("transform").arg(&m).arg(&out));
            assert_clean_failure("transform of NaN", &o);
            assert!(o.stderr.contains(tensor), "{}", o.stderr);
            assert!(!out.exists());
        }
    }
    // A tokenizer of a larger vocabulary (the bundled model's) on the tiny model.
    let bundled =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/laguna-tiny/tokenizer.json");
    let m = t.path().join("tok");
    link_copy(&f.model, &m);
    replace(&m.join("tokenizer.json"), &std::fs::read(&bundled).unwrap());
    let o = gen(&m, &["--prompt", "hello"]);
    assert_clean_failure("a tokenizer of another model", &o);
    assert!(
        o.stderr.contains("tokenizer.json") && o.stderr.contains("512"),
        "{}",
        o.stderr
    );
    let o = gen_ok(&m, &["--prompt-ids", "1,2"]);
    assert!(
        o.stderr.contains("tokenizer.json") && o.stderr.contains("left out"),
        "{}",
        o.stderr
    );
    assert!(!o.stdout.trim().is_empty());
    // A tokenizer of a smaller vocabulary: ids it cannot spell are said, never dropped silently.
    let m = t.path().join("small");
    link_copy(&f.model, &m);
    edit_json(&m.join("tokenizer.json"), |v| {
        v["model"]["vocab"]
            .as_object_mut()
            .unwrap()
            .retain(|_, id| id.as_u64().unwrap() < 300);
        v["added_tokens"]
            .as_array_mut()
            .unwrap()
            .retain(|t| t["id"].as_u64().unwrap() < 300);
    });
    let json = gen_ok(&m, &["--prompt-ids", "1,2", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let unknown = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t.as_u64().unwrap() >= 300)
        .count();
    let o = gen_ok(&m, &["--prompt-ids", "1,2"]);
    assert!(!o.stdout.trim().is_empty(), "an empty result");
    assert_eq!(
        o.stderr.contains("have no entry"),
        unknown > 0,
        "{unknown}: {}",
        o.stderr
    );
    // A broken drafter: a serial run goes on and says so, a run that drafts with it stops.
    let m = t.path().join("drafter");
    link_copy(&f.model, &m);
    replace(&m.join("drafter/config.json"), b"{ broken");
    let o = gen_ok(&m, &["--prompt-ids", "1,2"]);
    assert!(
        o.stderr.contains("drafter/config.json") && o.stderr.contains("not needed"),
        "{}",
        o.stderr
    );
    let o = gen(&m, &["--prompt-ids", "1,2", "--block-size", "2"]);
    assert_clean_failure("drafting with a broken drafter", &o);
    assert!(o.stderr.contains("drafter/config.json"), "{}", o.stderr);
}

/// Class 8: clear messages: one OS error once, a path in every error, output paths checked
/// before the run, the default model not taken from the current directory.
#[test]
fn class8_messages_name_the_path_once_and_come_before_the_work() {
    let t = tempfile::tempdir().unwrap();
    let file = t.path().join("afile");
    std::fs::write(&file, b"x").unwrap();
    let under = file.join("x");
    for args in [
        vec!["verify".into(), under.clone()],
        vec!["inspect".into(), under.clone()],
        vec![
            "generate".into(),
            "--prompt-ids".into(),
            "1".into(),
            "--model".into(),
            file.clone(),
        ],
        vec!["transform".into(), under.clone(), t.path().join("out")],
        vec![
            "synth".into(),
            "--preset".into(),
            "tiny".into(),
            "--out".into(),
            under.clone(),
        ],
    ] {
        let o = run(fd().args(&args));
        assert_clean_failure(&format!("{args:?}"), &o);
        assert!(
            o.stderr.contains(&*file.to_string_lossy()),
            "{args:?}: {}",
            o.stderr
        );
        assert!(
            o.stderr.matches("os error").count() <= 1,
            "{args:?}: {}",
            o.stderr
        );
    }
    // A build that cannot start: the path and the OS's reason.
    let broken = t.path().join("broken.sh");
    std::fs::write(&broken, "#!/nonexistent/interpreter\n").unwrap();
    std::fs::set_permissions(&broken, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let gate = |cand: &Path, extra: &[&str]| run(gate_against(cand).args(extra));
    let o = gate(&broken, &[]);
    assert_clean_failure("a build that cannot start", &o);
    assert!(
        o.stderr.contains("infra:spawn_failed")
            && o.stderr.contains("broken.sh")
            && o.stderr.contains("No such file"),
        "{}",
        o.stderr
    );
    // The report path is checked before any worker runs.
    let marker = t.path().join("started");
    let cand = t.path().join("cand.sh");
    script(
        &cand,
        &format!("touch {}\nexec {BIN} \"$@\"", marker.display()),
    );
    let o = gate(
        &cand,
        &["--json", under.join("report.json").to_str().unwrap()],
    );
    assert_clean_failure("an unwritable --json", &o);
    assert!(
        o.stderr.contains("--json") && o.stderr.contains("afile"),
        "{}",
        o.stderr
    );
    assert!(
        !marker.exists(),
        "a worker ran before the report path was checked"
    );
    // The default model is not looked up in the current directory.
    let cwd = t.path().join("elsewhere");
    std::fs::create_dir_all(cwd.join("assets/laguna-tiny")).unwrap();
    std::fs::write(cwd.join("assets/laguna-tiny/config.json"), b"not a config").unwrap();
    let o = run(fd()
        .args([
            "generate",
            "--prompt-ids",
            "1,2",
            "--max-new-tokens",
            "2",
            "--json",
        ])
        .current_dir(&cwd));
    assert!(
        o.ok(),
        "the current directory's assets/ was used: {}",
        o.stderr
    );
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert!(
        !v["model"]
            .as_str()
            .unwrap()
            .starts_with(&*cwd.to_string_lossy()),
        "{v}"
    );
}
