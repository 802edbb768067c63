//! Named, switchable numerics-affecting fast paths of the CPU backend.
//!
//! The reference arithmetic (every flag off) is the executable specification. A flag swaps one
//! kernel for a faster one that rounds differently, so a build with a flag on can drift from the
//! reference by a few ulps per operation; `fastdecode bisect` switches flags one by one to find the
//! one that makes a build diverge from a golden. Every fast path keeps batch invariance: a row's
//! arithmetic never depends on how many rows share a forward, so DFlash output still equals
//! serial output with any flags on.
//!
//! Flags are process-wide (a build setting, chosen once at start-up from `--flags` or
//! `FASTDECODE_FLAGS`), read with a relaxed atomic load at the top of each kernel call.

use std::sync::atomic::{AtomicU32, Ordering};

/// One named fast path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flag {
    pub name: &'static str,
    bit: u32,
    pub what: &'static str,
}

pub const UNROLLED_DOT: Flag = Flag {
    name: "unrolled_dot",
    bit: 1,
    what: "matvec dot products with 8 interleaved partial sums (reference: one running sum)",
};
pub const FAST_EXP: Flag = Flag {
    name: "fast_exp",
    bit: 2,
    what: "attention softmax with a polynomial exp (reference: libm expf)",
};

/// Every flag this backend knows, in a fixed order.
pub const ALL: [Flag; 2] = [UNROLLED_DOT, FAST_EXP];

/// Environment variable read by `Flags::from_env` (a comma-separated list of names).
pub const ENV: &str = "FASTDECODE_FLAGS";

/// A set of flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flags(u32);

impl Flags {
    pub const NONE: Flags = Flags(0);

    pub fn has(self, f: Flag) -> bool {
        self.0 & f.bit != 0
    }

    pub fn with(self, f: Flag) -> Flags {
        Flags(self.0 | f.bit)
    }

    /// Parses `a,b,c` (empty = no flags); an unknown name is an error listing the known ones.
    pub fn parse(list: &str) -> Result<Flags, String> {
        let mut out = Flags::NONE;
        for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let f = ALL.iter().find(|f| f.name == name).ok_or_else(|| {
                format!(
                    "unknown optimisation flag {name:?} (known: {})",
                    ALL.map(|f| f.name).join(", ")
                )
            })?;
            out = out.with(*f);
        }
        Ok(out)
    }

    /// `FASTDECODE_FLAGS`, or no flags when it is unset.
    pub fn from_env() -> Result<Flags, String> {
        match std::env::var(ENV) {
            Ok(v) => Flags::parse(&v).map_err(|e| format!("{ENV}: {e}")),
            Err(_) => Ok(Flags::NONE),
        }
    }

    /// Names of the flags that are on, in `ALL` order.
    pub fn names(self) -> Vec<&'static str> {
        ALL.iter()
            .filter(|f| self.has(**f))
            .map(|f| f.name)
            .collect()
    }
}

static ACTIVE: AtomicU32 = AtomicU32::new(0);

/// Switches the process's fast paths (call once at start-up, before any forward).
pub fn set_active(flags: Flags) {
    ACTIVE.store(flags.0, Ordering::Relaxed);
}

pub fn active() -> Flags {
    Flags(ACTIVE.load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_round_trips_and_rejects_unknown_names() {
        let f = Flags::parse("fast_exp, unrolled_dot").unwrap();
        assert_eq!(f.names(), vec!["unrolled_dot", "fast_exp"]);
        assert_eq!(Flags::parse("").unwrap(), Flags::NONE);
        let e = Flags::parse("unrolled_dot,warp_speed").unwrap_err();
        assert!(e.contains("warp_speed") && e.contains("fast_exp"), "{e}");
    }
}
