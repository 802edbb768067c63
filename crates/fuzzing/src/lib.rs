//! The helpers the parsers' property-based fuzz tests share: the case count from
//! `FASTDECODE_FUZZ_CASES`, the per-case time bound, mutations at the paths of a JSON value and
//! text-level damage to a serialised example.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;
use serde_json::{json, Value};

/// Cases per property: `FASTDECODE_FUZZ_CASES`, else 256 (the CI run).
pub fn cases() -> u32 {
    std::env::var("FASTDECODE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

pub fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// The bound on one parse: every parser here is linear in its (small) input.
pub const BOUND: Duration = Duration::from_secs(1);

pub fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let out = f();
    let took = t.elapsed();
    assert!(took < BOUND, "{what} took {took:?} (bound {BOUND:?})");
    out
}

// ---------------------------------------------------------------------------------------------
// JSON mutations.

/// Every path into a JSON value (object keys and array indices), the root excluded.
pub fn paths(v: &Value, prefix: &mut Vec<Seg>, out: &mut Vec<Vec<Seg>>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                prefix.push(Seg::Key(k.clone()));
                out.push(prefix.clone());
                paths(x, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                prefix.push(Seg::Index(i));
                out.push(prefix.clone());
                paths(x, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Seg {
    Key(String),
    Index(usize),
}

/// What to do at one path.
#[derive(Debug, Clone)]
pub enum Mutation {
    Delete,
    Set(Value),
}

pub fn extreme_values() -> Vec<Value> {
    vec![
        Value::Null,
        json!(-1),
        json!(0),
        json!(1),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(1e300),
        json!(-1e300),
        json!(0.5),
        json!(true),
        json!("x"),
        json!(""),
        json!([]),
        json!({}),
        json!([1, 2, 3]),
        json!({"rope_theta": 10000.0}),
    ]
}

pub fn mutation() -> impl Strategy<Value = Mutation> {
    let extremes = extreme_values();
    prop_oneof![
        2 => Just(Mutation::Delete),
        4 => (0..extremes.len()).prop_map(move |i| Mutation::Set(extremes[i].clone())),
        1 => any::<u64>().prop_map(|n| Mutation::Set(json!(n))),
        1 => (0u64..1 << 26).prop_map(|n| Mutation::Set(json!(n))),
        1 => any::<i64>().prop_map(|n| Mutation::Set(json!(n))),
        1 => any::<f64>().prop_map(|x| Mutation::Set(serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number))),
        1 => "[a-z_.-]{0,20}".prop_map(|s| Mutation::Set(json!(s))),
    ]
}

/// Applies `m` at `path` (which exists in `v`).
pub fn apply(v: &mut Value, path: &[Seg], m: &Mutation) {
    let (last, parent) = path.split_last().unwrap();
    let mut cur = v;
    for s in parent {
        cur = match s {
            Seg::Key(k) => cur.get_mut(k).unwrap(),
            Seg::Index(i) => cur.get_mut(*i).unwrap(),
        };
    }
    match (last, m, cur) {
        (Seg::Key(k), Mutation::Delete, Value::Object(o)) => {
            o.remove(k);
        }
        (Seg::Index(i), Mutation::Delete, Value::Array(a)) => {
            a.remove(*i);
        }
        (Seg::Key(k), Mutation::Set(x), Value::Object(o)) => {
            o.insert(k.clone(), x.clone());
        }
        (Seg::Index(i), Mutation::Set(x), Value::Array(a)) => a[*i] = x.clone(),
        _ => unreachable!("paths() yields only existing paths"),
    }
}

/// Applies `m` at the path into `v` that `which` picks of all its paths; returns that path.
pub fn mutate_at(v: &mut Value, which: prop::sample::Index, m: &Mutation) -> Vec<Seg> {
    let mut all = vec![];
    paths(v, &mut vec![], &mut all);
    let path = which.get(&all).clone();
    apply(v, &path, m);
    path
}

/// The key names along a path (what an error about it may name): `a.b[2]` gives `a`, `b`.
pub fn keys(path: &[Seg]) -> Vec<&str> {
    path.iter()
        .filter_map(|s| match s {
            Seg::Key(k) => Some(k.as_str()),
            Seg::Index(_) => None,
        })
        .collect()
}

/// Text-level damage to a serialised example: truncation, a flipped byte, an inserted byte.
pub fn text_damage() -> impl Strategy<Value = (u8, usize, u8)> {
    (0u8..3, any::<usize>(), any::<u8>())
}

pub fn damage(text: &[u8], (kind, at, byte): (u8, usize, u8)) -> Vec<u8> {
    let mut b = text.to_vec();
    let i = at % (b.len() + 1);
    match kind {
        0 => b.truncate(i),
        1 if i < b.len() => b[i] ^= byte.max(1),
        _ => b.insert(i, byte),
    }
    b
}
