//! Prefill on tensor cores: launch wrappers of `kernels/prefill.cu`.
