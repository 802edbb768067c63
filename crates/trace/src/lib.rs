//! The kernel ids of a traced decode step: kernels built with `-DFD_TRACE` stamp each block's
//! events under `FD_TRACE_KERNEL(id, tag)` (`crates/cuda/kernels/common.cuh`), the id in the top
//! 4 of 24 bits of the record's kind and the tag in the rest. Both readers of a trace name them
//! here: the engine's `fastdecode timeline` (`fastdecode_cuda::timeline`) and the arena's profile
//! stage (`fastdecode_arena::profile`), which does not depend on the engine's crates. The table
//! sits outside the tracks' editable surface (`crates/cuda/**`): the arena names a candidate's
//! kernels by it, never by the candidate's own text, so the two views agree by construction.

/// The kernel a kind stands for, with its tag when it has one (a GEMV's output rows, the
/// attention's kv heads); an id not in the table as a number. The ids are those of the
/// `FD_TRACE_KERNEL` calls in `crates/cuda/kernels/*.cu`.
pub fn kind_name(kind: u32) -> String {
    let name = match kind >> 20 {
        1 => "embed_rows",
        2 => "gemv_bf16",
        3 => "attend_decode",
        4 => "router",
        5 => "moe_gate_up",
        6 => "moe_down",
        7 => "argmax_rows",
        8 => "silu_mul",
        9 => "router_topk",
        10 => "copy_taps",
        11 => "rms_norm_rows",
        12 => "attend_merge",
        _ => "kernel",
    };
    match (kind >> 20, kind & 0xfffff) {
        (1..=12, 0) => name.to_string(),
        (1..=12, tag) => format!("{name} ({tag})"),
        (id, _) => format!("{name} {id}"),
    }
}
