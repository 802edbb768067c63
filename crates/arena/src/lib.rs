//! The arena: a submission service, its runners and the pipeline that judges solvers' changes
//! (`docs/spec/arena.md`). The service owns the database, the tracks, the queue and the record;
//! runners lease jobs and run a submission's stages (policy, review, build, then the existing
//! gate and clock driven as `fastdecode gate` / `fastdecode price`); the service writes the
//! verdict and promotes winners. Its parts, one folder each, each folder's `mod.rs` saying more:
//!
//! - `service/`, the service core: what `fastdecode arena serve` holds (`service`), the
//!   database (`db`), where an arena lives and what an operator adds (`state`), bearer tokens
//!   (`tokens`), a submission's stages (`stages`: their order, which kind of runner runs each,
//!   their rows), the lease of a job (`lease`), the daily cap (`caps`).
//! - `record/`, the public record: its queries (`record`) and what writes it: the verdict
//!   (`verdict`), promotion (`promotion`), an operator's cancel (`cancel`), a submission's note
//!   (`notes`), the metrics a pricing keeps (`metrics`).
//! - `server/`, the HTTP API and pages: the routes (`server`), the public pages (`pages`, HTML)
//!   and their plots (`plots`, SVG).
//! - `runner/`, a runner and the stages it runs, one file each (`checks`, `build`, `kernels`,
//!   `gate`, `price`), with what they use: `policy`, `review`, `builder`, `sandbox`, `child`.
//! - `client/`, what drives an arena from outside: `fastdecode submit` and `arena status`
//!   (`client`), the demo (`demo`) and the red team (`redteam`, the corpus in `redteam/`).
//!
//! Shared by them, at the top and using no folder: the JSON they exchange (`api`), a
//! submission's bundle (`bundle`), a profile run's profile parsed and bounded (`profile`), the
//! tracks (`track`), the files beside the database (`store`), the arena's repository (`git`),
//! the blocking HTTP client of runners and `submit` (`http`). A folder uses only those and the folders listed before it (`runner/` only the
//! stage names of `service::stages` and the metric names of `record::metrics`). `cli` holds
//! every `arena` command's arguments and what each does.

#![deny(clippy::print_stdout)] // stdout goes through out!/outln! (fastdecode_out)

#[macro_use]
extern crate fastdecode_out;

#[cfg(test)]
mod abuse_tests;
pub mod api;
pub mod bundle;
pub mod cli;
pub mod client;
pub mod git;
pub mod http;
pub mod profile;
pub mod record;
pub mod runner;
pub mod server;
pub mod service;
pub mod store;
pub mod track;
