//! The engine as a worker process (`fastdecode worker`), driven by a parent over the versioned
//! line protocol of `PROTOCOL.md`; and the parent's side (`client`), which owns the clock and
//! turns every way a worker can misbehave into a named fault instead of a score.

pub mod client;
pub mod lines;
pub mod protocol;
pub mod serve;

pub use client::{Fault, ModelId, NoTick, Spec, Tick, TimedWindow, Worker};
pub use protocol::{
    Build, ModelSource, Ready, Reply, Request, Scored, Step, DRAFTER_VAR, PROTOCOL, VERSION,
};
pub use serve::{Backend, WorkerOptions};
