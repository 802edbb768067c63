//! Property-based fuzzing of the model layer's parsers of untrusted input: `config.json`
//! (`LagunaConfig`, `DrafterConfig`), safetensors headers (`TensorStore::open_dir` and `check`)
//! and `MANIFEST` (`manifest::parse`, `manifest::verify`). Each property feeds random bytes and
//! structured mutations of a valid example, and asserts no panic, a bounded time per case and an
//! error that names what is wrong (the field, tensor, file or line).
//!
//! The CI run is short (256 cases per property). The benchmark-sized run:
//! `FASTDECODE_FUZZ_CASES=100000 cargo test --release -p fastdecode-model --test fuzz`

use std::path::{Path, PathBuf};
use std::time::Instant;

use fastdecode_fuzzing::{
    apply, config, damage, keys, mutate_at, mutation, paths, text_damage, timed, Mutation, Seg,
    BOUND,
};
use fastdecode_model::checkpoint::TensorStore;
use fastdecode_model::inventory::TensorSpec;
use fastdecode_model::{manifest, DrafterConfig, LagunaConfig};
use proptest::prelude::*;
use safetensors::Dtype;
use serde_json::{json, Value};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read_json(rel: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(repo().join(rel)).unwrap()).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Configs.

/// A JSON syntax error as the config parser wraps it: it belongs to no field, so it is located
/// (`line L column C`).
fn is_located_json_error(msg: &str) -> bool {
    msg.starts_with("config: invalid JSON: ")
        && msg.contains(" at line ")
        && msg.contains(" column ")
}

/// A config error that names a field (`field `name` ...`).
fn names_a_field(msg: &str) -> bool {
    msg.starts_with("config: field `") && msg[15..].contains('`')
}

fn check_config_error(msg: &str) {
    assert!(
        is_located_json_error(msg) || names_a_field(msg),
        "an error that names neither a field nor a position: {msg:?}"
    );
}

/// The structured property shared by both configs: a mutation at `path` either parses, or fails
/// naming a field or the JSON position; a deletion (or null) of a field fails naming that field.
fn check_config_mutation(path: &[Seg], m: &Mutation, result: Result<(), String>) {
    let Err(msg) = result else { return };
    check_config_error(&msg);
    // A value of the wrong type or range is named by its field, not only located.
    if msg.contains("invalid type") || msg.contains("invalid value") {
        assert!(names_a_field(&msg), "a retyped value not named: {msg:?}");
    }
    let ks = keys(path);
    let leaf_is_key = matches!(path.last(), Some(Seg::Key(_)));
    let deleted = matches!(m, Mutation::Delete) || matches!(m, Mutation::Set(Value::Null));
    if deleted && leaf_is_key {
        // A missing required field (or its null) is named: its own name or its parent's (a
        // nested object that became incomplete is named by the path to it).
        assert!(
            ks.iter().any(|k| msg.contains(k)),
            "deleting {ks:?} gave an error not naming it: {msg:?}"
        );
    }
}

fn laguna_example() -> Value {
    read_json("assets/laguna-tiny/config.json")
}

fn drafter_example() -> Value {
    read_json("assets/laguna-tiny/drafter/config.json")
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn laguna_config_random_text(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let text = String::from_utf8_lossy(&bytes);
        if let Err(e) = timed("LagunaConfig", || LagunaConfig::from_json_str(&text)) {
            check_config_error(&e.to_string());
        }
    }

    #[test]
    fn laguna_config_mutated_field(which in any::<prop::sample::Index>(), m in mutation(), second in proptest::option::of((any::<prop::sample::Index>(), mutation()))) {
        let mut v = laguna_example();
        let path = mutate_at(&mut v, which, &m);
        if let Some((w2, m2)) = second {
            // A second mutation where a path still exists: the error must still be specific.
            let mut again = vec![];
            paths(&v, &mut vec![], &mut again);
            if !again.is_empty() {
                let p2 = w2.get(&again).clone();
                apply(&mut v, &p2, &m2);
                let text = v.to_string();
                if let Err(e) = timed("LagunaConfig", || LagunaConfig::from_json_str(&text)) {
                    check_config_error(&e.to_string());
                }
                return Ok(());
            }
        }
        let text = v.to_string();
        let r = timed("LagunaConfig", || LagunaConfig::from_json_str(&text));
        check_config_mutation(&path, &m, r.map(|_| ()).map_err(|e| e.to_string()));
    }

    #[test]
    fn laguna_config_damaged_text(d in text_damage()) {
        let text = serde_json::to_string_pretty(&laguna_example()).unwrap();
        let bytes = damage(text.as_bytes(), d);
        let text = String::from_utf8_lossy(&bytes);
        if let Err(e) = timed("LagunaConfig", || LagunaConfig::from_json_str(&text)) {
            check_config_error(&e.to_string());
        }
    }

    #[test]
    fn drafter_config_mutated_field(which in any::<prop::sample::Index>(), m in mutation()) {
        let mut v = drafter_example();
        let path = mutate_at(&mut v, which, &m);
        let text = v.to_string();
        let r = timed("DrafterConfig", || DrafterConfig::from_json_str(&text));
        check_config_mutation(&path, &m, r.map(|_| ()).map_err(|e| e.to_string()));
    }

    #[test]
    fn drafter_config_random_or_damaged_text(bytes in proptest::collection::vec(any::<u8>(), 0..256), d in text_damage(), random in any::<bool>()) {
        let bytes = if random {
            bytes
        } else {
            damage(serde_json::to_string_pretty(&drafter_example()).unwrap().as_bytes(), d)
        };
        let text = String::from_utf8_lossy(&bytes);
        if let Err(e) = timed("DrafterConfig", || DrafterConfig::from_json_str(&text)) {
            check_config_error(&e.to_string());
        }
    }

    /// From a file: bytes that are not UTF-8 or not a config; the error names the file.
    #[test]
    fn config_file_names_the_file(d in text_damage(), junk in proptest::collection::vec(any::<u8>(), 0..64)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        let mut bytes = damage(serde_json::to_string(&laguna_example()).unwrap().as_bytes(), d);
        bytes.extend_from_slice(&junk);
        std::fs::write(&path, &bytes).unwrap();
        if let Err(e) = timed("LagunaConfig::from_file", || LagunaConfig::from_file(&path)) {
            let msg = e.to_string();
            prop_assert!(msg.contains(&path.display().to_string()), "{msg:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// safetensors headers.

/// The example checkpoint: three small tensors of different dtypes.
fn st_specs() -> Vec<TensorSpec> {
    vec![
        TensorSpec {
            name: "model.a.weight".into(),
            dtype: Dtype::F32,
            shape: vec![2, 3],
        },
        TensorSpec {
            name: "model.b.weight".into(),
            dtype: Dtype::BF16,
            shape: vec![4],
        },
        TensorSpec {
            name: "model.c.codes".into(),
            dtype: Dtype::U32,
            shape: vec![2, 1],
        },
    ]
}

/// The example's header (as JSON) and its data section.
fn st_example() -> (Value, Vec<u8>) {
    let mut header = serde_json::Map::new();
    let mut data = vec![];
    for s in st_specs() {
        let n = s.nbytes();
        let start = data.len();
        data.extend((0..n).map(|i| (i as u8) & 0x3f));
        header.insert(
            s.name.clone(),
            json!({
                "dtype": fastdecode_model::inventory::dtype_name(s.dtype),
                "shape": s.shape,
                "data_offsets": [start, start + n],
            }),
        );
    }
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    (Value::Object(header), data)
}

fn st_file(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(data);
    out
}

/// Opens `bytes` as the only safetensors file of a fresh directory, checks it against the
/// example's inventory and reads every tensor; asserts what each error names.
fn open_and_check(bytes: &[u8]) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    std::fs::write(&path, bytes).unwrap();
    let specs = st_specs();
    let t = Instant::now();
    let store = match TensorStore::open_dir(dir.path()) {
        Ok(s) => s,
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(
                msg.contains(&path.display().to_string()),
                "an open error not naming the file: {msg:?}"
            );
            prop_assert!(t.elapsed() < BOUND);
            return Ok(());
        }
    };
    match store.check(&specs, false) {
        Ok(()) => {
            // Whatever passed the check is exactly the inventory, and every tensor reads.
            for s in &specs {
                let r = store.get(&s.name).unwrap();
                prop_assert_eq!(r.shape, &s.shape[..]);
                prop_assert_eq!(r.data.len(), s.nbytes());
                let read = match s.dtype {
                    Dtype::U32 => r.to_u32().map(|v| v.len()),
                    _ => r.to_f32().map(|v| v.len()),
                };
                if let Err(e) = read {
                    // Only a non-finite float is refused after a passing check.
                    let msg = e.to_string();
                    prop_assert!(
                        msg.contains(&s.name) && msg.contains("must be finite"),
                        "{msg:?}"
                    );
                }
            }
        }
        Err(e) => {
            let msg = e.to_string();
            let named = specs.iter().any(|s| msg.contains(&s.name))
                || store
                    .names()
                    .any(|n| msg.starts_with(&format!("tensor {n}: ")));
            prop_assert!(named, "a check error naming no tensor: {msg:?}");
        }
    }
    // Reading every tensor the file has, whatever the inventory says, never panics.
    for n in store.names().map(str::to_string).collect::<Vec<_>>() {
        let r = store.get(&n).unwrap();
        let _ = (r.to_f32().is_ok(), r.to_u32().is_ok(), r.to_u8().is_ok());
    }
    prop_assert!(t.elapsed() < BOUND, "open and check took {:?}", t.elapsed());
    Ok(())
}

fn st_value_mutation() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!("F64")),
        Just(json!("F4")),
        Just(json!("BOOL")),
        Just(json!("I8")),
        Just(json!("nope")),
        Just(json!([0, 0])),
        Just(json!([0, 24])),
        Just(json!([24, 0])),
        Just(json!([0, u64::MAX])),
        Just(json!([u64::MAX, u64::MAX])),
        Just(json!([usize::MAX, 2])),
        Just(json!([1u64 << 32, 1u64 << 32])),
        Just(json!([])),
        Just(json!([0])),
        Just(json!(-1)),
        Just(json!(null)),
        Just(json!({})),
        (0u64..64, 0u64..64).prop_map(|(a, b)| json!([a, b])),
        proptest::collection::vec(0u64..8, 0..4).prop_map(|v| json!(v)),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn safetensors_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256), len in proptest::option::of(any::<u64>())) {
        // Random bytes, optionally behind a plausible or absurd header length.
        let bytes = match len {
            Some(n) => {
                let mut b = (n % 512).to_le_bytes().to_vec();
                if n % 3 == 0 { b = n.to_le_bytes().to_vec(); }
                b.extend_from_slice(&bytes);
                b
            }
            None => bytes,
        };
        open_and_check(&bytes)?;
    }

    #[test]
    fn safetensors_mutated_header(which in any::<prop::sample::Index>(), m in prop_oneof![Just(None), st_value_mutation().prop_map(Some)], rename in proptest::option::of("[a-z.]{0,12}")) {
        let (mut header, data) = st_example();
        let m = match m {
            None => Mutation::Delete,
            Some(v) => Mutation::Set(v),
        };
        let path = mutate_at(&mut header, which, &m);
        if let (Some(new), Value::Object(o)) = (rename, &mut header) {
            // A tensor under another name (a duplicate, a stray or an empty one).
            if let Some(Seg::Key(k)) = path.first() {
                if let Some(x) = o.remove(k) {
                    o.insert(new, x);
                }
            }
        }
        let text = header.to_string();
        open_and_check(&st_file(text.as_bytes(), &data))?;
    }

    #[test]
    fn safetensors_damaged_file(d in text_damage(), d2 in text_damage()) {
        let (header, data) = st_example();
        let file = st_file(header.to_string().as_bytes(), &data);
        open_and_check(&damage(&damage(&file, d), d2))?;
    }
}

// ---------------------------------------------------------------------------------------------
// MANIFEST.

const FILES: [(&str, &[u8]); 3] = [
    ("a.txt", b"hello"),
    ("sub/b.bin", &[7u8; 300]),
    ("sub/c d", b""),
];

/// A directory with three files and its true MANIFEST text.
fn manifest_dir() -> (tempfile::TempDir, String) {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join("sub")).unwrap();
    for (p, b) in FILES {
        std::fs::write(d.path().join(p), b).unwrap();
    }
    let text = manifest::render(
        &FILES
            .iter()
            .map(|(p, b)| manifest::Entry {
                sha256: hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b)),
                bytes: b.len() as u64,
                path: p.to_string(),
            })
            .collect::<Vec<_>>(),
    );
    (d, text)
}

fn line_mutation() -> impl Strategy<Value = (usize, u8, String)> {
    (
        any::<usize>(),
        0u8..10,
        prop_oneof![
            Just("..".to_string()),
            Just("/etc/passwd".to_string()),
            Just("a//b".to_string()),
            Just("sub".to_string()),
            Just("MANIFEST".to_string()),
            Just("-1".to_string()),
            Just("18446744073709551616".to_string()),
            Just("A".repeat(64)),
            Just(" ".to_string()),
            Just("\t".to_string()),
            "[ -~]{0,70}",
        ],
    )
}

/// Replaces, drops or duplicates a line, or rewrites one of its three fields with `s`.
fn mutate_manifest(text: &str, (at, kind, s): &(usize, u8, String)) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    if lines.is_empty() {
        lines.push(String::new());
    }
    let i = at % lines.len();
    let mut parts: Vec<String> = lines[i].splitn(3, ' ').map(str::to_string).collect();
    match kind {
        0 => lines[i] = s.clone(),
        1 => {
            lines.remove(i);
        }
        2 => {
            let l = lines[i].clone();
            lines.insert(i, l);
        }
        3 => {
            let j = (i + 1) % lines.len();
            lines.swap(i, j)
        }
        4..=6 => {
            parts.resize(3, String::new());
            parts[(*kind - 4) as usize] = s.clone();
            lines[i] = parts.join(" ");
        }
        7 => lines[i].push_str(s),
        8 => lines.insert(i, s.clone()),
        _ => lines[i] = lines[i].replacen(' ', s, 1),
    }
    let mut out = lines.join("\n");
    if at % 2 == 0 {
        out.push('\n');
    }
    out
}

fn check_manifest_error(msg: &str, text: &str) -> Result<(), TestCaseError> {
    // `manifest: <file> line <n>: <why>: <the line>`, n a line of the text.
    prop_assert!(msg.starts_with("manifest: MANIFEST line "), "{msg:?}");
    let n: usize = msg["manifest: MANIFEST line ".len()..]
        .split(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let count = text.lines().count();
    prop_assert!(n >= 1 && n <= count, "line {} of {:?}", n, msg);
    let line = text.lines().nth(n - 1).unwrap();
    prop_assert!(
        msg.ends_with(&format!("{line:?}")),
        "the line is quoted: {msg:?}"
    );
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn manifest_random_text(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let text = String::from_utf8_lossy(&bytes);
        if let Err(e) = timed("manifest::parse", || manifest::parse(&text, Path::new("MANIFEST"))) {
            check_manifest_error(&e.to_string(), &text)?;
        }
    }

    #[test]
    fn manifest_mutated_lines(m in line_mutation(), m2 in proptest::option::of(line_mutation())) {
        let (_d, text) = manifest_dir();
        let mut text = mutate_manifest(&text, &m);
        if let Some(m2) = m2 {
            if !text.is_empty() {
                text = mutate_manifest(&text, &m2);
            }
        }
        match timed("manifest::parse", || manifest::parse(&text, Path::new("MANIFEST"))) {
            Ok(entries) => {
                // What parses is strictly sorted, relative, with hex digests.
                for w in entries.windows(2) {
                    prop_assert!(w[0].path < w[1].path);
                }
                for e in &entries {
                    prop_assert!(e.sha256.len() == 64 && !e.path.starts_with('/'));
                    prop_assert!(e.path.split('/').all(|c| !c.is_empty() && c != ".."));
                }
            }
            Err(e) => check_manifest_error(&e.to_string(), &text)?,
        }
    }

    /// `verify` on a real directory: it succeeds only for a MANIFEST that lists exactly its
    /// files, sizes and hashes; otherwise its error names the MANIFEST or a file of the directory.
    #[test]
    fn manifest_verify_mutated(m in line_mutation(), extra in proptest::option::of("[a-z]{1,6}")) {
        let (d, good) = manifest_dir();
        let text = mutate_manifest(&good, &m);
        std::fs::write(d.path().join("MANIFEST"), &text).unwrap();
        if let Some(x) = &extra {
            std::fs::write(d.path().join("sub").join(x), b"stray").unwrap();
        }
        let hidden = indicatif::ProgressBar::hidden();
        match timed("manifest::verify", || manifest::verify(d.path(), &hidden)) {
            Ok(v) => {
                let stray_known = extra
                    .as_deref()
                    .is_none_or(|x| FILES.iter().any(|(p, _)| *p == format!("sub/{}", x)));
                prop_assert!(stray_known, "a stray file verified");
                let got = manifest::parse(&text, Path::new("MANIFEST")).unwrap();
                let want = manifest::parse(&good, Path::new("MANIFEST")).unwrap();
                prop_assert_eq!(got, want);
                prop_assert_eq!(v.digest, manifest::digest_of(&text));
            }
            Err(e) => {
                let msg = e.to_string();
                let root = d.path().display().to_string();
                prop_assert!(msg.contains(&root), "an error not naming the directory's file: {msg:?}");
            }
        }
    }
}
