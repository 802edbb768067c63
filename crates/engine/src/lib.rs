//! Decoding on top of a backend: serial greedy and DFlash rounds, draft sources, tokenizer and
//! model directories, and the prompts of greedy traces.

pub mod backend;
pub mod cuda_backend;
pub mod decode;
pub mod limits;
pub mod model_dir;
pub mod oracle;
pub mod session;
pub mod tokenizer;
pub mod traces;

pub use backend::{CpuDrafter, CpuTarget, DraftSource, TargetBackend};
pub use decode::{generate, generate_observed, DecodeOptions, Generation, RoundReport};
pub use model_dir::LoadedModel;
pub use oracle::Oracle;
pub use session::{DraftPlan, DraftSpec};
