//! The GPU kernels' own code run on the CPU (tools/emu: a fiber per CUDA thread, the
//! kernel module compiled by g++ with the PTX-only helpers replaced by host versions), so that a
//! change to a kernel's indexing, barriers or reduction order fails here, on any machine, before
//! a GPU call. Not the GPU's bits or speed: `kernels.rs` checks those on the GPU.

use std::path::Path;
use std::process::Command;

/// Asserts that the driver's output says every one of `lines`.
fn assert_says(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(text.contains(line), "{line:?} missing:\n{text}");
    }
}

/// `tools/emu/run.py MODULE DRIVER` from the repository root: its output, after asserting that it
/// exited 0.
fn emulate(module: &str, driver: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("python3")
        .current_dir(&root)
        .args(["tools/emu/run.py", module, driver])
        .output()
        .expect("python3 runs tools/emu/run.py (tools/test.sh installs python3 and g++)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("all passed"), "{text}");
    text
}

#[test]
fn the_emulator_catches_a_missing_barrier_one_never_reached_and_a_stack_overflow() {
    let text = emulate("none", "tools/emu/selftest.cpp");
    assert_says(
        &text,
        &[
            "shuffles and ballots checked",
            "with a barrier: 0 stale reads",
            "a barrier never reached: the run aborted",
            "a stack overflow: the run faulted",
        ],
    );
}

#[test]
fn persistent_kernel_counters_and_page_rings_work_and_their_misuse_is_caught_run_on_the_cpu() {
    let text = emulate("tools/emu/persistent_toy.cu", "tools/emu/persistent.cpp");
    assert_says(
        &text,
        &[
            "a wait for a later block: a deadlock block after block, released grid-resident",
            "persistent toy: 50 shapes x 3 steps right",
            "a missing release: deadlock reported",
            "a target one past: deadlock reported",
            "a dependency read without waiting: wrong output in",
            "a target one short: wrong output in",
            "a page read before it is full: wrong output in",
            "a page refilled before it is empty: wrong output in",
            "a bulk copy: a read without the wait stale in",
            "persistent toy, bulk ring: 30 shapes x 3 steps right",
            "bulk ring, 16 bytes too many expected: deadlock reported",
            "bulk ring, a page read before its copies land: wrong output in",
            "bulk ring, a page refilled before it is empty: wrong output in",
        ],
    );
}

#[test]
fn the_gemvs_are_batch_invariant_and_exact_run_on_the_cpu() {
    let text = emulate("dense", "tools/emu/gemv_bf16.cpp");
    // Every shape was checked, and the driver says so.
    assert_eq!(
        text.matches("every multi-row entry and the tensor-core GEMV")
            .count(),
        3,
        "{text}"
    );
    // The column-owned GEMV on the two shapes of at most 2048 columns.
    assert_eq!(
        text.matches("and the column-owned one").count(),
        2,
        "{text}"
    );
}

#[test]
fn argmax_takes_the_lowest_index_and_the_row_kernels_do_what_they_say_run_on_the_cpu() {
    let text = emulate("dense", "tools/emu/rows.cpp");
    assert_says(
        &text,
        &[
            "argmax_rows: ties, -inf, NaN, three vocabularies",
            "rms_norm_rows, embed_rows, silu_mul, copy_taps checked",
        ],
    );
}

#[test]
fn the_router_and_expert_gemvs_are_batch_invariant_run_on_the_cpu() {
    let text = emulate("moe", "tools/emu/moe.cpp");
    assert_eq!(
        text.matches("router, gate/up and down (f32 and tensor-core) checked")
            .count(),
        3,
        "{text}"
    );
}

#[test]
fn decode_attention_k_rows_equal_k_serial_launches_run_on_the_cpu() {
    let text = emulate("attention", "tools/emu/attention.cpp");
    assert_eq!(
        text.matches("checked against serial launches, prefill's cache writes")
            .count(),
        4,
        "{text}"
    );
}

#[test]
fn the_prefill_moe_and_attention_match_their_references_run_on_the_cpu() {
    let text = emulate("prefill+moe+dense", "tools/emu/prefill.cpp");
    assert_says(
        &text,
        &[
            "placement: pf_moe_place and pf_moe_tiles checked on 5 shapes",
            "pipeline rows 37: prefill MoE against the decode kernels",
            "attention D 64 window 24 ring 32: pf_attend against double precision",
            "attention D 128 window 0 ring 0: pf_attend against double precision",
            "norm split: pf_rms_norm_split against its pieces",
        ],
    );
}
