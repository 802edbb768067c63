//! The behaviour gate: golden traces (`golden`), how they are made (`make`), the gate itself
//! (`check`) and the search for the optimisation flag that makes a build diverge (`bisect`).

pub mod bisect;
pub mod check;
pub mod golden;
pub mod make;

pub use golden::{Golden, ScreenParams};
