//! The CUDA worker from the command line, on any machine: where there is no GPU it fails at
//! start-up with the reason (never a panic, never a `ready` line); where there is one it serves
//! the bundled model and says so. Options that only make sense on the GPU are refused before
//! anything starts.

use std::path::PathBuf;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_fastdecode");

fn bundled() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../assets/laguna-tiny")
}

#[test]
fn the_cuda_worker_starts_or_says_why_not() {
    let o = Command::new(BIN)
        .args(["worker", "--backend", "cuda", "--model"])
        .arg(bundled())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(!err.contains("panicked"), "{err}");
    if o.status.success() {
        // A GPU machine: ready on the GPU, then end of input ends the worker.
        let ready: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
        assert_eq!(ready["backend"], "cuda", "{out}");
    } else {
        assert!(out.is_empty(), "no ready line without a GPU: {out}");
        assert!(
            ["driver", "device", "NVRTC", "headers"]
                .iter()
                .any(|w| err.contains(w)),
            "the reason names what is missing: {err}"
        );
    }
}

#[test]
fn synthetic_weights_need_the_cuda_backend() {
    for args in [
        vec!["worker", "--synthetic", "xs2.1"],
        vec!["price", "--baseline", BIN, "--synthetic", "xs2.1"],
    ] {
        let o = Command::new(BIN).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?}");
        assert!(err.contains("--backend cuda"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
