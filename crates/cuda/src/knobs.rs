//! The backend's developer knobs (README, "Developer knobs"), read from the environment once when
//! a GPU is opened. Each value is checked: a knob set to something it does not take is an error
//! that names the variable and what it accepts, never a silent fallback to the default (a
//! measurement of `FASTDECODE_MOE=mm4` would otherwise time the default and say nothing).

use crate::error::{CudaError, Result};

/// The expert GEMVs behind `Gpu::moe_gate_up` and `Gpu::moe_down` (`FASTDECODE_MOE`, knobs.rs):
/// the tensor-core kernels, whose gate/up warps take 2 (`mma2`, the default) or 4 (`mma4`) chunks
/// of 128 input columns (down: 4), or the f32 ones (`f32`); shapes past what the tensor-core
/// blocks cover fall back to f32. Each gives a row the same bits whatever the launch's row count,
/// but not the others' bits. On the H200 (XS 2.1, BENCHMARKS, thirteenth measurement) `mma2`
/// took the 8-row verify from 3.80 to 3.51 serial steps (DFlash at K = 4 1.37× → 1.47×) and the
/// serial step from 2.252 to 2.245 ms; `mma4` the serial step to 2.218 and the verify nowhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeKernel {
    F32,
    Mma2,
    Mma4,
}

impl MoeKernel {
    /// Input columns per warp of the tensor-core gate/up kernel (none for f32).
    pub(crate) fn slice(self) -> Option<usize> {
        match self {
            MoeKernel::F32 => None,
            MoeKernel::Mma2 => Some(256),
            MoeKernel::Mma4 => Some(512),
        }
    }
}

/// The knobs' values; unset (or empty) variables give the defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Knobs {
    /// `FASTDECODE_PDL=0|1`: programmatic dependent launches in the decode step (default on;
    /// used only where the GPU has them).
    pub pdl: bool,
    /// `FASTDECODE_GEMV_GROUP=1|2|4`: weight rows per warp of the multi-row GEMV, forced
    /// (default: chosen by output count, `None`).
    pub gemv_group: Option<usize>,
    /// `FASTDECODE_GEMV_STAGE=0|1`: normed rows of the multi-row GEMV staged in shared memory
    /// (default on).
    pub gemv_stage: bool,
    /// `FASTDECODE_GEMV_HALVES=0|1`: plain rows of the multi-row GEMV whose weight rows would go
    /// in pairs go in fours over half of the rows of x each (default on).
    pub gemv_halves: bool,
    /// `FASTDECODE_MOE=f32|mma2|mma4`: the expert GEMVs (default `mma2`).
    pub moe: MoeKernel,
    /// `FASTDECODE_ATT_MERGE=last|kernel`: a multi-row attention's splits merged by the last
    /// block of each (row, kv head) to arrive, as one row's are, or by a kernel of their own
    /// after the launch (default `kernel`).
    pub att_merge_kernel: bool,
    /// `FASTDECODE_DENSE=f32|mma`: the bf16 GEMVs on the f32 cores or the tensor cores
    /// (default `f32`).
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
            gemv_group: match pick("FASTDECODE_GEMV_GROUP", &["1", "2", "4"])? {
                Some("1") => Some(1),
                Some("2") => Some(2),
                Some(_) => Some(4),
                None => None,
            },
            gemv_stage: pick("FASTDECODE_GEMV_STAGE", &["0", "1"])? != Some("0"),
            gemv_halves: pick("FASTDECODE_GEMV_HALVES", &["0", "1"])? != Some("0"),
            moe: match pick("FASTDECODE_MOE", &["f32", "mma2", "mma4"])? {
                Some("f32") => MoeKernel::F32,
                Some("mma4") => MoeKernel::Mma4,
                _ => MoeKernel::Mma2,
            },
            att_merge_kernel: pick("FASTDECODE_ATT_MERGE", &["last", "kernel"])? != Some("last"),
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
            gemv_group: None,
            gemv_stage: true,
            gemv_halves: true,
            moe: MoeKernel::Mma2,
            att_merge_kernel: true,
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
            ("FASTDECODE_GEMV_GROUP", "4"),
            ("FASTDECODE_GEMV_STAGE", "0"),
            ("FASTDECODE_GEMV_HALVES", "0"),
            ("FASTDECODE_MOE", "f32"),
            ("FASTDECODE_ATT_MERGE", "last"),
            ("FASTDECODE_DENSE", "mma"),
        ])
        .unwrap();
        assert_eq!(
            k,
            Knobs {
                pdl: false,
                gemv_group: Some(4),
                gemv_stage: false,
                gemv_halves: false,
                moe: MoeKernel::F32,
                att_merge_kernel: false,
                dense_mma: true,
            }
        );
        assert_eq!(
            knobs(&[("FASTDECODE_MOE", "mma4")]).unwrap().moe,
            MoeKernel::Mma4
        );
        assert_eq!(
            knobs(&[("FASTDECODE_MOE", "mma2")]).unwrap().moe,
            MoeKernel::Mma2
        );
        assert_eq!(
            knobs(&[("FASTDECODE_GEMV_GROUP", "2")]).unwrap().gemv_group,
            Some(2)
        );
        assert!(knobs(&[("FASTDECODE_PDL", "1")]).unwrap().pdl);
        assert!(knobs(&[("FASTDECODE_GEMV_STAGE", "1")]).unwrap().gemv_stage);
        assert!(
            knobs(&[("FASTDECODE_GEMV_HALVES", "1")])
                .unwrap()
                .gemv_halves
        );
        assert!(!knobs(&[("FASTDECODE_DENSE", "f32")]).unwrap().dense_mma);
        assert!(
            knobs(&[("FASTDECODE_ATT_MERGE", "kernel")])
                .unwrap()
                .att_merge_kernel
        );
    }

    #[test]
    fn a_bad_value_names_the_variable_the_value_and_what_it_takes() {
        for (var, bad, accepted) in [
            ("FASTDECODE_MOE", "mm4", "f32, mma2, mma4"),
            ("FASTDECODE_GEMV_GROUP", "3", "1, 2, 4"),
            ("FASTDECODE_GEMV_STAGE", "yes", "0, 1"),
            ("FASTDECODE_GEMV_HALVES", "2", "0, 1"),
            ("FASTDECODE_ATT_MERGE", "1", "last, kernel"),
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
