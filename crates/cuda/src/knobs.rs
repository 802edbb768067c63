//! The backend's developer knobs (README, "Developer knobs"), read from the environment once when
//! a GPU is opened. Each value is checked: a knob set to something it does not take is an error
//! that names the variable and what it accepts, never a silent fallback to the default (a
//! measurement of `FASTDECODE_MOE=mm4` would otherwise time the default and say nothing).

use crate::error::{CudaError, Result};

/// The expert GEMVs behind `Gpu::moe_gate_up` and `Gpu::moe_down` (`FASTDECODE_MOE`, knobs.rs):
/// the tensor-core kernels, whose gate/up warps take 2 chunks of 128 input columns (down: 4)
/// (`mma2`, the default), or the f32 ones (`f32`); shapes past what the tensor-core blocks cover
/// fall back to f32. Each gives a row the same bits whatever the launch's row count, but not the
/// other's bits. On the H200 (XS 2.1, BENCHMARKS, thirteenth measurement) `mma2` took the 8-row
/// verify from 3.80 to 3.51 serial steps (DFlash at K = 4 1.37× → 1.47×) and the serial step from
/// 2.252 to 2.245 ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeKernel {
    F32,
    Mma2,
}

/// The knobs' values; unset (or empty) variables give the defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Knobs {
    /// `FASTDECODE_PDL=0|1`: programmatic dependent launches in the decode step (default on;
    /// used only where the GPU has them).
    pub pdl: bool,
    /// `FASTDECODE_MOE=f32|mma2`: the expert GEMVs (default `mma2`).
    pub moe: MoeKernel,
    /// `FASTDECODE_DENSE=f32|mma`: the bf16 GEMVs on the f32 cores (default `f32`: the
    /// column-owned kernel for inputs up to 2048 columns, the row-owned ones for wider) or the
    /// tensor cores.
    pub dense_mma: bool,
}

impl Knobs {
    /// The knobs of this process's environment.
    pub fn from_env() -> Result<Knobs> {
        Knobs::parse(|name| match std::env::var(name) {
            Ok(v) => Some(v),
            Err(std::env::VarError::NotPresent) => None,
            Err(std::env::VarError::NotUnicode(v)) => Some(v.to_string_lossy().into_owned()),
        })
    }

    /// The knobs from `get` (a variable's value, `None` when unset).
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<Knobs> {
        // The value of `name`, one of `accepted` (None when unset or empty).
        let pick =
            |name: &'static str,
             accepted: &'static [&'static str]|
             -> Result<Option<&'static str>> {
                match get(name).filter(|v| !v.is_empty()) {
                    None => Ok(None),
                    Some(v) => accepted.iter().find(|a| **a == v).map(|a| Some(*a)).ok_or(
                        CudaError::Knob {
                            var: name,
                            value: v,
                            accepted,
                        },
                    ),
                }
            };
        Ok(Knobs {
            pdl: pick("FASTDECODE_PDL", &["0", "1"])? != Some("0"),
            moe: match pick("FASTDECODE_MOE", &["f32", "mma2"])? {
                Some("f32") => MoeKernel::F32,
                _ => MoeKernel::Mma2,
            },
            dense_mma: pick("FASTDECODE_DENSE", &["f32", "mma"])? == Some("mma"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn knobs(vars: &[(&str, &str)]) -> Result<Knobs> {
        Knobs::parse(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn unset_and_empty_knobs_give_the_defaults() {
        let want = Knobs {
            pdl: true,
            moe: MoeKernel::Mma2,
            dense_mma: false,
        };
        assert_eq!(knobs(&[]).unwrap(), want);
        assert_eq!(
            knobs(&[("FASTDECODE_MOE", ""), ("FASTDECODE_PDL", "")]).unwrap(),
            want
        );
    }

    #[test]
    fn every_accepted_value_is_read() {
        let k = knobs(&[
            ("FASTDECODE_PDL", "0"),
            ("FASTDECODE_MOE", "f32"),
            ("FASTDECODE_DENSE", "mma"),
        ])
        .unwrap();
        assert_eq!(
            k,
            Knobs {
                pdl: false,
                moe: MoeKernel::F32,
                dense_mma: true,
            }
        );
        assert_eq!(
            knobs(&[("FASTDECODE_MOE", "mma2")]).unwrap().moe,
            MoeKernel::Mma2
        );
        assert!(knobs(&[("FASTDECODE_PDL", "1")]).unwrap().pdl);
        assert!(!knobs(&[("FASTDECODE_DENSE", "f32")]).unwrap().dense_mma);
    }

    #[test]
    fn a_bad_value_names_the_variable_the_value_and_what_it_takes() {
        for (var, bad, accepted) in [
            ("FASTDECODE_MOE", "mma4", "f32, mma2"),
            ("FASTDECODE_PDL", "off", "0, 1"),
            ("FASTDECODE_DENSE", "tc", "f32, mma"),
        ] {
            let msg = knobs(&[(var, bad)]).unwrap_err().to_string();
            assert!(
                msg.contains(var) && msg.contains(&format!("\"{bad}\"")) && msg.contains(accepted),
                "{msg}"
            );
        }
    }
}
