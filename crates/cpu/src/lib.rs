//! The CPU reference backend: a plain f32 forward of the Laguna target and the DFlash drafter.
//! It is the executable specification every faster backend is checked against.

pub mod drafter;
pub mod flags;
pub mod kv_cache;
pub mod layers;
pub mod ops;
pub mod profile;
pub mod target;

pub use drafter::{DrafterContext, DrafterModel};
pub use kv_cache::KvCache;
pub use target::{ForwardOut, TargetModel};
