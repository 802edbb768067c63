//! Shared test fixtures: a tiny synthetic model written once per test binary.

use std::path::PathBuf;
use std::sync::OnceLock;

use fastdecode_model::inventory::Layout;
use fastdecode_model::synth::{preset, write_synthetic};

/// A `tiny` synthetic checkpoint (seed 1) in a temporary directory that lives for the test run.
pub fn tiny_dir() -> PathBuf {
    static DIR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    DIR.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tiny");
        write_synthetic(
            &dir,
            &preset("tiny").unwrap(),
            1,
            Layout::Runtime,
            &indicatif::ProgressBar::hidden(),
        )
        .unwrap();
        (tmp, dir)
    })
    .1
    .clone()
}
