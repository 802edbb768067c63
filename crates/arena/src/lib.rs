//! The arena: a submission service, its runners and the pipeline that judges solvers' changes
//! (`docs/spec/arena.md`). The service (`service`: what it holds; `server`: its routes) owns the
//! database (`db`), the tracks (`track`), the queue and the record; runners (`runner`) lease jobs (`lease`) and run a
//! submission's stages (`stages`: `policy`, `review`, `build`, then the existing gate and clock
//! driven as `fastdecode gate` / `fastdecode price`); the service writes the verdict
//! (`verdict`) and promotes winners (`promotion`). `caps` is what counts against a solver's
//! daily cap, `cancel` an operator's cancel of a job, `notes` a note's bounded rendering.
//! `client` is `fastdecode submit` and `arena status`; `cli` holds every `arena` command's
//! arguments. The public record is `record` (its queries), `pages` (HTML) and `plots` (SVG);
//! `redteam` runs the corpus of cheats that the pipeline must stop (`redteam/`).

#![deny(clippy::print_stdout)] // stdout goes through out!/outln! (out.rs)

#[macro_use]
mod out;

#[cfg(test)]
mod abuse_tests;
pub mod api;
pub mod bundle;
pub mod cli;
pub mod client;
pub mod git;
pub mod http;
pub mod record;
pub mod runner;
pub mod server;
pub mod service;
pub mod store;
pub mod track;
