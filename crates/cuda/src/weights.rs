//! Where uploaded weights come from: a runtime checkpoint on disk, or the synthetic generator run
//! directly in GPU memory (`--synthetic xs2.1`: no 21 GB file), bit-identical to `synth`'s bytes.

use std::collections::HashMap;

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use half::bf16;
use safetensors::Dtype;

use fastdecode_model::checkpoint::TensorStore;
use fastdecode_model::inventory::TensorSpec;
use fastdecode_model::synth::{float_law, nvfp4_base_scale, tensor_key};

use crate::device::{launch_cfg, Gpu};
use crate::error::{CudaError, Result};
use crate::params::{kernel_params, Order};

kernel_params! {
    /// synth.cu's `synth_fill`: `n` values of law (`c`, `a`) and `kind` from `key`.
    struct SynthFill<'a, T>("synth", "synth_fill") {
        key: u64,
        n: u64,
        kind: i32,
        c: f32,
        a: f32,
        base: i32,
        out: &'a mut CudaSlice<T>,
    }
}

pub enum WeightSource<'a> {
    Store(&'a TensorStore),
    Synthetic {
        seed: u64,
        specs: HashMap<String, TensorSpec>,
    },
}

impl WeightSource<'_> {
    pub fn synthetic(seed: u64, specs: &[TensorSpec]) -> WeightSource<'static> {
        WeightSource::Synthetic {
            seed,
            specs: specs.iter().map(|s| (s.name.clone(), s.clone())).collect(),
        }
    }

    fn spec(&self, name: &str) -> Result<&TensorSpec> {
        match self {
            WeightSource::Synthetic { specs, .. } => specs.get(name).ok_or_else(|| {
                CudaError::Shape(format!(
                    "synthetic weights: no tensor {name} in the inventory"
                ))
            }),
            WeightSource::Store(_) => unreachable!("only synthetic sources look up specs"),
        }
    }

    fn generate<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        gpu: &Gpu,
        name: &str,
        kind: i32,
    ) -> Result<CudaSlice<T>> {
        let WeightSource::Synthetic { seed, .. } = self else {
            unreachable!()
        };
        let spec = self.spec(name)?;
        let n = spec.numel();
        let mut out = gpu.stream.alloc_zeros::<T>(n)?;
        let (c, a) = float_law(&spec.name, &spec.shape);
        let base = if kind == 3 {
            nvfp4_base_scale(spec.shape.last().copied().unwrap_or(1) * 16) as i32
        } else {
            0
        };
        let key = tensor_key(*seed, &spec.name);
        let params = SynthFill {
            key,
            n: n as u64,
            kind,
            c,
            a,
            base,
            out: &mut out,
        };
        let cfg = launch_cfg((n.div_ceil(256).min(65535) as u32, 1), 256, 0);
        // SAFETY: `out` holds n elements of the kind's type; the kernel writes exactly those.
        unsafe { gpu.run(Order::AfterPredecessor, params, cfg) }?;
        Ok(out)
    }

    pub fn bf16(&self, gpu: &Gpu, name: &str) -> Result<CudaSlice<bf16>> {
        match self {
            WeightSource::Store(s) => {
                let t = s.get(name)?;
                if t.dtype != Dtype::BF16 {
                    return Err(fastdecode_model::Error::tensor(name, "expected BF16").into());
                }
                let v: Vec<bf16> = t
                    .data
                    .chunks_exact(2)
                    .map(|b| bf16::from_le_bytes([b[0], b[1]]))
                    .collect();
                Ok(gpu.stream.clone_htod(&v)?)
            }
            WeightSource::Synthetic { .. } => self.generate(gpu, name, 0),
        }
    }

    pub fn f32(&self, gpu: &Gpu, name: &str) -> Result<CudaSlice<f32>> {
        match self {
            WeightSource::Store(s) => Ok(gpu.stream.clone_htod(&s.get(name)?.to_f32()?)?),
            WeightSource::Synthetic { .. } => self.generate(gpu, name, 1),
        }
    }

    pub fn u32(&self, gpu: &Gpu, name: &str) -> Result<CudaSlice<u32>> {
        match self {
            WeightSource::Store(s) => Ok(gpu.stream.clone_htod(&s.get(name)?.to_u32()?)?),
            WeightSource::Synthetic { .. } => self.generate(gpu, name, 2),
        }
    }

    pub fn u8(&self, gpu: &Gpu, name: &str) -> Result<CudaSlice<u8>> {
        match self {
            WeightSource::Store(s) => Ok(gpu.stream.clone_htod(&s.get(name)?.to_u8()?)?),
            WeightSource::Synthetic { .. } => self.generate(gpu, name, 3),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launch_struct_follows_its_kernels_parameters() {
        crate::params::tests::check::<SynthFill<u8>>();
    }
}
