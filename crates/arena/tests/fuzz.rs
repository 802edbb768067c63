//! Property-based fuzzing of the arena's parsers of untrusted input: track files
//! (`Track::parse`, then `on_surface` / `frozen`), submission bundles (`bundle::read`, then
//! `policy::check`), the API's request bodies (`NewSubmission` with its base64 bundle,
//! `LeaseRequest`, `Heartbeat`, `Report`) and bearer tokens (`tokens::split`). Random bytes and
//! structured mutations of valid examples; asserts no panic, a bounded time per case, and errors
//! that name what is wrong (the file and field, the bundle entry, the JSON position).
//!
//! The CI run is short (256 cases per property). The benchmark-sized run:
//! `FASTDECODE_FUZZ_CASES=100000 cargo test --release -p fastdecode-arena --test fuzz`

use std::io::{Read, Write};
use std::path::Path;
use std::time::Instant;

use base64::Engine;
use fastdecode_arena::api::{Heartbeat, LeaseRequest, NewSubmission, Report};
use fastdecode_arena::bundle::{self, Content, Kind};
use fastdecode_arena::runner::policy;
use fastdecode_arena::service::tokens;
use fastdecode_arena::track::Track;
use fastdecode_fuzzing::{
    config, damage, keys, mutate_at, mutation, text_damage, timed, Mutation, Seg, BOUND,
};
use proptest::prelude::*;
use serde_json::{json, Value};

fn track_text() -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tracks/serial-tiny.toml"),
    )
    .unwrap()
}

fn track() -> Track {
    Track::parse(&track_text(), Path::new("tracks/serial-tiny.toml")).unwrap()
}

const TRACK_FILE: &str = "tracks/fuzzed.toml";

// ---------------------------------------------------------------------------------------------
// Track files.

proptest! {
    #![proptest_config(config())]

    #[test]
    fn track_random_or_damaged_text(bytes in proptest::collection::vec(any::<u8>(), 0..400), d in text_damage(), d2 in text_damage(), random in any::<bool>()) {
        let bytes = if random { bytes } else { damage(&damage(track_text().as_bytes(), d), d2) };
        let text = String::from_utf8_lossy(&bytes);
        match timed("Track::parse", || Track::parse(&text, Path::new(TRACK_FILE))) {
            Ok(t) => prop_assert!(t.validate().is_ok()),
            Err(e) => {
                let msg = format!("{e:#}");
                prop_assert!(msg.starts_with(TRACK_FILE) && msg.len() > TRACK_FILE.len() + 10, "{:?}", msg);
            }
        }
    }

    #[test]
    fn track_mutated_field(which in any::<prop::sample::Index>(), m in mutation(), probe in "[a-z/._*]{0,40}") {
        let mut v: Value = serde_json::to_value(toml::from_str::<toml::Value>(&track_text()).unwrap()).unwrap();
        // TOML has no null: a null is a deletion.
        let m = match m { Mutation::Set(Value::Null) => Mutation::Delete, m => m };
        let path = mutate_at(&mut v, which, &m);
        let Ok(text) = toml::to_string(&v) else { return Ok(()) };
        match timed("Track::parse", || Track::parse(&text, Path::new(TRACK_FILE))) {
            Ok(t) => {
                // What parses, validates; its surface and frozen checks answer quickly.
                prop_assert!(t.validate().is_ok());
                let _ = timed("Track::on_surface", || (t.on_surface(&probe), t.frozen(&probe)));
            }
            Err(e) => {
                let msg = format!("{e:#}");
                prop_assert!(msg.starts_with(TRACK_FILE), "{:?}", msg);
                // The error names the mutated field (or the array or table holding it), or, for
                // a table replaced by another shape, the field it lacks or does not know.
                let ks = keys(&path);
                let named = ks.iter().any(|k| msg.contains(k))
                    || msg.contains("unknown field `")
                    || msg.contains("missing field `");
                prop_assert!(named, "mutating {:?} gave {:?}", ks, msg);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Bundles and policy.

fn example_entries() -> Vec<(String, Content)> {
    vec![
        (
            "crates/cpu/src/ops.rs".into(),
            Content::File(b"fn f() {}\n".to_vec(), 0o644),
        ),
        (
            "crates/engine/src/decode.rs".into(),
            Content::File(vec![b'x'; 700], 0o755),
        ),
        ("crates/cpu/src/new.rs".into(), Content::File(vec![], 0o644)),
    ]
}

fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut out = vec![];
    flate2::read::GzDecoder::new(b)
        .read_to_end(&mut out)
        .unwrap();
    out
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(vec![], flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

fn plain(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('/')
        && !p.contains('\\')
        && !p.contains('\0')
        && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// Reads `bytes` as a bundle and judges it by policy; asserts what each error names and what
/// each pass guarantees.
fn read_and_judge(bytes: &[u8], cap: u64) -> Result<(), TestCaseError> {
    let t = Instant::now();
    let entries = match bundle::read(bytes, cap) {
        Ok(e) => e,
        Err(e) => {
            let msg = format!("{e:#}");
            prop_assert!(
                msg.starts_with("the bundle") || msg.starts_with("reading "),
                "{:?}",
                msg
            );
            prop_assert!(msg.len() > 20, "{:?}", msg);
            prop_assert!(t.elapsed() < BOUND);
            return Ok(());
        }
    };
    let total: u64 = entries.iter().map(|e| e.data.len() as u64).sum();
    prop_assert!(total <= cap, "{} bytes read under a cap of {}", total, cap);
    let track = track();
    match policy::check(&track, &entries, &|_| Some(100)) {
        Ok(files) => {
            let mut seen = std::collections::BTreeSet::new();
            for (f, e) in files.iter().zip(&entries) {
                prop_assert!(e.raw_ok && e.kind == Kind::File && e.mode & 0o7000 == 0);
                prop_assert!(
                    plain(f.path.trim_end_matches('/'))
                        && track.on_surface(&f.path)
                        && !track.frozen(&f.path)
                );
                prop_assert!(seen.insert(f.path.clone()));
                prop_assert!(f.data.len() as u64 <= track.caps.file_bytes);
            }
            prop_assert_eq!(files.len(), entries.len());
        }
        Err(f) => {
            prop_assert!(f.category.starts_with("policy:"));
            let names_entry = entries
                .iter()
                .any(|e| f.detail.starts_with(&format!("{}: ", e.path)));
            prop_assert!(
                names_entry || (f.category == "policy:too_large" && f.detail.contains("bytes")),
                "{:?}",
                f
            );
        }
    }
    prop_assert!(
        t.elapsed() < BOUND,
        "read and policy took {:?}",
        t.elapsed()
    );
    Ok(())
}

/// A bundle entry to pack (`Content` is neither `Clone` nor `Debug`).
#[derive(Debug, Clone)]
enum Spec {
    File(Vec<u8>, u32),
    Symlink(String),
    Hardlink(String),
    Device,
    Fifo,
}

fn content(s: &Spec) -> Content {
    match s {
        Spec::File(d, m) => Content::File(d.clone(), *m),
        Spec::Symlink(t) => Content::Symlink(t.clone()),
        Spec::Hardlink(t) => Content::Hardlink(t.clone()),
        Spec::Device => Content::Device,
        Spec::Fifo => Content::Fifo,
    }
}

fn entry() -> impl Strategy<Value = (String, Spec)> {
    let path = prop_oneof![
        Just("crates/cpu/src/ops.rs".to_string()),
        Just("crates/cpu/src/../../etc/x".to_string()),
        Just("/etc/cron.d/x".to_string()),
        Just("crates/cpu/src/./a.rs".to_string()),
        Just("crates//cpu/src/a.rs".to_string()),
        Just("assets/laguna-tiny/model.safetensors".to_string()),
        Just("crates/cpu/src/MANIFEST".to_string()),
        Just("crates/clock/src/price.rs".to_string()),
        Just("crates/cpu/src/".to_string()),
        Just(format!("crates/cpu/src/{}.rs", "a".repeat(200))),
        "crates/(cpu|engine)/src/[a-z./]{0,20}",
        "[ -~]{0,30}",
    ];
    let content = prop_oneof![
        4 => (proptest::collection::vec(any::<u8>(), 0..64), prop_oneof![Just(0o644u32), Just(0o4755), Just(0o2755), Just(0o1777), any::<u32>()]).prop_map(|(d, m)| Spec::File(d, m)),
        1 => (0usize..300_000).prop_map(|n| Spec::File(vec![0; n], 0o644)),
        1 => "[ -~]{0,20}".prop_map(Spec::Symlink),
        1 => "[ -~]{0,20}".prop_map(Spec::Hardlink),
        1 => Just(Spec::Device),
        1 => Just(Spec::Fifo),
    ];
    (path, content)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn bundle_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..600), wrap in any::<bool>()) {
        // Random bytes, raw or gzipped (so the tar reader, not gzip, is what refuses them).
        let bytes = if wrap { gzip(&bytes) } else { bytes };
        read_and_judge(&bytes, 1 << 20)?;
    }

    #[test]
    fn bundle_damaged(d in text_damage(), d2 in text_damage(), inside in any::<bool>(), cap in prop_oneof![Just(1u64 << 20), 0u64..800]) {
        let good = bundle::pack(&example_entries()).unwrap();
        let bytes = if inside {
            // Damage to the tar itself (headers, sizes, checksums), gzipped again.
            gzip(&damage(&damage(&gunzip(&good), d), d2))
        } else {
            damage(&damage(&good, d), d2)
        };
        read_and_judge(&bytes, cap)?;
    }

    #[test]
    fn bundle_hostile_entries(entries in proptest::collection::vec(entry(), 0..6)) {
        // What a hostile client's own tar can hold: it round-trips through `read`, and policy
        // refuses every breach by name.
        let packed: Vec<(String, Content)> = entries.iter().map(|(p, c)| (p.clone(), content(c))).collect();
        let Ok(bytes) = bundle::pack(&packed) else { return Ok(()) };
        let back = bundle::read(&bytes, u64::MAX).unwrap();
        // (`pack` is the client's side and may normalise a path, e.g. drop a `./`.)
        prop_assert_eq!(back.len(), entries.len());
        read_and_judge(&bytes, 1 << 20)?;
    }
}

// ---------------------------------------------------------------------------------------------
// API request bodies and tokens.

/// A serde_json error on a request body: it locates the fault, and names a field where one is
/// missing or unknown.
fn check_body_error(msg: &str) -> Result<(), TestCaseError> {
    prop_assert!(
        msg.contains(" at line ") && msg.contains(" column "),
        "{:?}",
        msg
    );
    Ok(())
}

fn new_submission() -> Value {
    let bundle = bundle::pack(&example_entries()).unwrap();
    json!({
        "track": "serial-tiny",
        "note": "a faster matmul",
        "model": "claude",
        "claimed_score": 1.25,
        "bundle": fastdecode_arena::api::encode_bundle(&bundle),
    })
}

fn bodies() -> Vec<Value> {
    vec![
        new_submission(),
        json!({"builder": true}),
        json!({"submission": "s-1", "lease_id": "l-1"}),
        json!({"submission": "s-1", "lease_id": "l-1", "stage": "policy", "outcome": "ok",
               "detail": "", "result": {"files": 3}, "builder": false}),
    ]
}

/// Parses `body` as request body `i` (0 NewSubmission, 1 LeaseRequest, 2 Heartbeat, 3 Report);
/// a NewSubmission goes on through the service's own intake checks (base64, then the bundle
/// under the track's cap). Returns the error message, if any.
fn intake(i: usize, body: &[u8]) -> Result<Option<String>, TestCaseError> {
    let t = Instant::now();
    let r = match i {
        0 => match serde_json::from_slice::<NewSubmission>(body) {
            Err(e) => Some(e.to_string()),
            Ok(s) => match base64::engine::general_purpose::STANDARD.decode(s.bundle.as_bytes()) {
                Err(e) => {
                    prop_assert!(!e.to_string().is_empty());
                    None
                }
                Ok(b) => {
                    read_and_judge(&b, track().caps.total_bytes)?;
                    None
                }
            },
        },
        1 => serde_json::from_slice::<LeaseRequest>(body)
            .err()
            .map(|e| e.to_string()),
        2 => serde_json::from_slice::<Heartbeat>(body)
            .err()
            .map(|e| e.to_string()),
        _ => serde_json::from_slice::<Report>(body)
            .err()
            .map(|e| e.to_string()),
    };
    prop_assert!(t.elapsed() < BOUND);
    if let Some(msg) = &r {
        check_body_error(msg)?;
    }
    Ok(r)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn api_random_body(i in 0usize..4, bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        intake(i, &bytes)?;
    }

    #[test]
    fn api_mutated_body(i in 0usize..4, which in any::<prop::sample::Index>(), m in mutation(), d in proptest::option::of(text_damage())) {
        let mut v = bodies()[i].clone();
        let path = mutate_at(&mut v, which, &m);
        let mut body = v.to_string().into_bytes();
        if let Some(d) = d {
            body = damage(&body, d);
        }
        let msg = intake(i, &body)?;
        if let (None, Mutation::Delete, Some(Seg::Key(k)), Some(msg)) = (d, &m, path.last(), &msg) {
            // Only `model` and `claimed_score` (options) may be left out; a missing field is named.
            if path.len() == 1 {
                prop_assert!(msg.contains(&format!("missing field `{k}`")), "deleting {:?}: {:?}", k, msg);
            }
        }
        if let (None, Mutation::Delete, Some(Seg::Key(k)), None) = (d, &m, path.last(), &msg) {
            prop_assert!(path.len() > 1 || ["model", "claimed_score"].contains(&k.as_str()), "{:?} is required", k);
        }
    }

    #[test]
    fn bearer_token_split(token in prop_oneof!["[ -~]{0,40}", "[a-z0-9-]{0,10}\\.[0-9a-f]{0,64}"]) {
        if let Some((id, secret)) = tokens::split(&token) {
            prop_assert!(!id.is_empty() && !secret.is_empty() && !secret.contains('.'));
            prop_assert_eq!(format!("{id}.{secret}"), token);
        } else {
            prop_assert!(!token.contains('.') || token.starts_with('.') || token.ends_with('.'));
        }
    }
}
