//! The red-team corpus end to end: every case of `redteam/` submitted to a real local arena
//! (SQLite, one CPU runner that builds, gates and prices) by `fastdecode arena redteam`, which
//! prints the table and exits 0 only when each cheat ended at the stage and category its file
//! names and both honest controls passed. A cheat that gets through fails CI here.
//!
//! Cheats stop at the first stage that catches them: policy and review in milliseconds, before
//! anything is built; the gate's cases build (incrementally, in the runners' shared cache) and
//! gate; the controls and the price stage's cases are priced.

mod arena_support;

use std::process::Command;

use arena_support::*;
use serde_json::Value;

#[test]
fn every_cheat_is_stopped_where_its_case_says_and_the_controls_pass() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // The corpus fails on purpose once a case: the solver's daily cap must let it. The timed
    // window (128 + 16 tokens) reaches past the goldens' last position (32 + 64 = 96), as a
    // real track's does (512 + 128), so a build that behaves differently only there
    // (price-argument-shapes, from position 96 on, its prefill included) has somewhere to do it.
    let mut a = Arena::on_tracks(Database::Sqlite, 30, &[TRACK, "dflash-tiny"], |t| {
        quick_clock(t);
        // A floor that one case must fall below: price-oversubscribed, slow by its own busy
        // threads (4 per CPU beside the decode: about 1/4.5 of a no-op's speed on an idle
        // machine, less under load), whose rejection must stand rather than be overruled as the
        // machine's. Its whole interval must reach 0.5, 2.25 times the idle truth, to escape;
        // a no-op is rejected only with its whole interval below 0.5, twice as slow as the
        // truth. Over the CI run that priced a no-op while clippy shared the cores (the clock's
        // `price::tests::CI_PAIRS`: 0.85 [0.77, 0.94] over 40 pairs) neither came near; the
        // case priced 0.2165 [0.1985, 0.2361] beside its controls (0.9639, 2.6306) on a busy
        // 2-core machine. An inconclusive pricing runs once more. Four helpers a CPU, not more:
        // they spin for the whole of the case's slowed windows, taking both cores from the
        // other lane (its price stage 72 s, against 237 s with twelve a CPU).
        // The dflash track's cases keep quick_clock's floor.
        if t.name == TRACK {
            t.clock.floor = 0.5;
        }
        t.caps.failures_per_day = 1000;
        // The case that holds the compiler for good is stopped at this deadline; it holds the
        // runners' shared build lock until then, so every other build on the machine waits for
        // it (the other lane's too). A candidate's build starts from the baseline's: the
        // corpus's took at most 15 s under CI's two lanes, the 232 MB binary of
        // build-huge-artifact 32 s with its storing, so 60 s leaves them a factor of 1.9 for
        // load beyond the lanes' (the pinned baseline's own build gets four times it).
        t.deadlines.build = 60.0;
        t.window.prompt_tokens = 128;
        // The quick clock runs no warm-up window; the corpus's pricings keep one a phase, as
        // the harness's clock has it: a build that warms itself before saying `ready` (time
        // never priced) must not find the baseline's first window colder than its own.
        set_clock_arg(t, "--warmup-windows", "1");
        assert!(
            t.window.prompt_tokens + t.window.decode_tokens
                > t.goldens.prompt_tokens + t.goldens.tokens
        );
    });
    let mut runner = a.runner("r1");
    let o = Command::new(BIN)
        .args(["arena", "redteam", "--server", &a.url(), "--json"])
        .arg("--cases")
        .arg(checkout().join("redteam"))
        .arg("--repo")
        .arg(a.path("repo"))
        .env("FASTDECODE_ARENA_TOKEN", &a.solver)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&o.stderr);
    eprintln!("{table}");
    assert!(o.status.success(), "the corpus:\n{table}");
    let rows: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    let cases = std::fs::read_dir(checkout().join("redteam"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "toml")
        })
        .count();
    assert_eq!(rows.len(), cases);
    assert!(rows.iter().all(|r| r["ok"] == true));
    // No cheat passed; both controls did.
    let passed: Vec<&str> = rows
        .iter()
        .filter(|r| r["actual"] == "verdict passed")
        .map(|r| r["case"].as_str().unwrap())
        .collect();
    assert_eq!(passed, ["control-noop", "control-speedup"]);
    // What the solver sees of a failure on the hidden pool is one category; the operator's
    // record keeps the clock's own account of it (`arena admin stages`).
    let shapes = rows
        .iter()
        .find(|r| r["case"] == "price-argument-shapes")
        .unwrap();
    let mut args = vec!["arena", "admin", "stages"];
    args.push(shapes["submission"].as_str().unwrap());
    let state = a.state();
    args.extend(state.iter().map(String::as_str));
    let private: Vec<Value> = fd(&args)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let price = private.iter().find(|r| r["stage"] == "price").unwrap();
    assert_eq!(price["outcome"], "price:hidden_prompt", "{price}");
    assert_eq!(price["result"]["culprit"], "candidate", "{price}");
    let verdict = price["result"]["verdict"].as_str().unwrap();
    assert!(verdict.starts_with("violation:"), "{price}");
    assert!(price["result"]["clock_detail"].is_string(), "{price}");
    // Nothing crashed the service or the runner.
    assert!(runner.0.try_wait().unwrap().is_none(), "the runner died");
    let service = a.service.as_mut().unwrap();
    assert!(service.0.try_wait().unwrap().is_none(), "the service died");
    assert_eq!(a.track().name, TRACK);
}
