//! safetensors checkpoints: memory-mapped reading with dtype/shape checks against the inventory,
//! and reproducible writing (sorted tensors, no timestamps, temporary name then rename).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::tensor::{SafeTensors, TensorInfo, View};
use safetensors::Dtype;

use crate::error::{Error, Result};
use crate::inventory::{dtype_name, TensorSpec};

struct MappedFile {
    path: PathBuf,
    mmap: Mmap,
    /// Byte offset of the data section (8 + header length).
    data_start: usize,
}

/// All tensors of the `*.safetensors` files of one directory, memory-mapped.
pub struct TensorStore {
    dir: PathBuf,
    files: Vec<MappedFile>,
    index: BTreeMap<String, (usize, TensorInfo)>,
}

/// A borrowed tensor: its bytes live in the mapped file.
pub struct TensorRef<'a> {
    pub name: &'a str,
    pub file: &'a Path,
    pub dtype: Dtype,
    pub shape: &'a [usize],
    pub data: &'a [u8],
}

impl TensorStore {
    /// Opens every `*.safetensors` file directly inside `dir` (sorted by file name). A tensor name
    /// that appears in two files is an error.
    pub fn open_dir(dir: &Path) -> Result<TensorStore> {
        let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
        let mut paths = vec![];
        for entry in rd {
            let p = entry.map_err(|e| Error::io(dir, e))?.path();
            // Any entry with the extension counts: one that is not a regular file (a FIFO, a
            // directory) is `add_file`'s error to name, not a file to skip silently.
            if p.extension().is_some_and(|x| x == "safetensors") {
                paths.push(p);
            }
        }
        paths.sort();
        if paths.is_empty() {
            return Err(Error::Checkpoint(format!(
                "{}: no *.safetensors file in this directory",
                dir.display()
            )));
        }
        let mut store = TensorStore {
            dir: dir.to_path_buf(),
            files: vec![],
            index: BTreeMap::new(),
        };
        for p in paths {
            store.add_file(&p)?;
        }
        Ok(store)
    }

    fn add_file(&mut self, path: &Path) -> Result<()> {
        let f = crate::files::open_regular(path)?;
        // SAFETY: the map is read-only; a checkpoint modified while it is open is outside what
        // any reader of memory-mapped weights can defend against.
        let mmap = unsafe { Mmap::map(&f) }.map_err(|e| Error::io(path, e))?;
        // Full validation (header, offsets inside the file, no overlaps) before trusting offsets.
        SafeTensors::deserialize(&mmap).map_err(|e| {
            Error::Checkpoint(format!(
                "{}: not a valid safetensors file (truncated or corrupt?): {e}",
                path.display()
            ))
        })?;
        let (header_len, meta) = SafeTensors::read_metadata(&mmap).map_err(|e| {
            Error::Checkpoint(format!("{}: bad safetensors header: {e}", path.display()))
        })?;
        if let Some(name) = repeated_name(&mmap[8..8 + header_len]) {
            return Err(Error::tensor(
                &name,
                format!("named twice in the header of {}", path.display()),
            ));
        }
        let fi = self.files.len();
        for (name, info) in meta.tensors() {
            if let Some((other, _)) = self.index.get(&name) {
                return Err(Error::Checkpoint(format!(
                    "tensor {name} appears in both {} and {}",
                    self.files[*other].path.display(),
                    path.display()
                )));
            }
            self.index.insert(name, (fi, info.clone()));
        }
        self.files.push(MappedFile {
            path: path.to_path_buf(),
            mmap,
            data_start: 8 + header_len,
        });
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    pub fn get(&self, name: &str) -> Result<TensorRef<'_>> {
        let (key, (fi, info)) = self.index.get_key_value(name).ok_or_else(|| {
            Error::tensor(
                name,
                format!("missing from the checkpoint in {}", self.dir.display()),
            )
        })?;
        let f = &self.files[*fi];
        let (a, b) = info.data_offsets;
        Ok(TensorRef {
            name: key,
            file: &f.path,
            dtype: info.dtype,
            shape: &info.shape,
            data: &f.mmap[f.data_start + a..f.data_start + b],
        })
    }

    /// Checks the store against an inventory: every expected tensor present with the expected
    /// shape, and with the expected dtype (or, for `float_ok`, any float dtype for float tensors, as
    /// HF checkpoints may be saved in f32 or f16). Tensors not in the inventory are an error too,
    /// except `ignored` ones (e.g. HF's `rotary_emb.inv_freq` buffers).
    pub fn check(&self, expected: &[TensorSpec], float_ok: bool) -> Result<()> {
        for spec in expected {
            let t = self.get(&spec.name)?;
            t.expect_shape(&spec.shape)?;
            let is_float = |d: Dtype| matches!(d, Dtype::BF16 | Dtype::F16 | Dtype::F32);
            let dtype_ok =
                t.dtype == spec.dtype || (float_ok && is_float(spec.dtype) && is_float(t.dtype));
            if !dtype_ok {
                return Err(Error::tensor(
                    &spec.name,
                    format!(
                        "dtype {} in {}, expected {}",
                        dtype_name(t.dtype),
                        t.file.display(),
                        dtype_name(spec.dtype)
                    ),
                ));
            }
            if spec.name.ends_with(".scales") {
                t.expect_finite_scales()?;
            }
        }
        let known: std::collections::HashSet<&str> =
            expected.iter().map(|s| s.name.as_str()).collect();
        for name in self.names() {
            if !known.contains(name) && !name.ends_with("rotary_emb.inv_freq") {
                return Err(Error::tensor(
                    name,
                    format!(
                        "unexpected in the checkpoint in {} (not in the config's inventory)",
                        self.dir.display()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The first name a safetensors header (a JSON object) holds twice. `safetensors` reads the
/// header into a map, where a second entry silently replaces the first: which tensor the engine
/// would load is then the file's word against a reader's that keeps the first.
fn repeated_name(header: &[u8]) -> Option<String> {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
    struct FirstRepeat;
    impl<'de> Visitor<'de> for FirstRepeat {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(
            self,
            mut m: A,
        ) -> std::result::Result<Self::Value, A::Error> {
            let mut seen = std::collections::HashSet::new();
            let mut first = None;
            while let Some(k) = m.next_key::<String>()? {
                m.next_value::<IgnoredAny>()?;
                if !seen.insert(k.clone()) && first.is_none() {
                    first = Some(k);
                }
            }
            Ok(first)
        }
    }
    // The header already parsed as a map (`read_metadata`): an error here cannot happen.
    serde_json::Deserializer::from_slice(header)
        .deserialize_map(FirstRepeat)
        .ok()
        .flatten()
}

impl TensorRef<'_> {
    pub fn expect_shape(&self, shape: &[usize]) -> Result<()> {
        if self.shape != shape {
            return Err(Error::tensor(
                self.name,
                format!(
                    "shape {:?} in {}, expected {:?}",
                    self.shape,
                    self.file.display(),
                    shape
                ),
            ));
        }
        Ok(())
    }

    /// An NVFP4 scale tensor holds no E4M3 NaN (0x7F or 0xFF, `nvfp4::e4m3_decode`): the GPU
    /// reads one as NaN, and every logit its weight reaches would be garbage.
    pub fn expect_finite_scales(&self) -> Result<()> {
        // In blocks, so the scan vectorises: an XS 2.1 load reads gigabytes of scales.
        const BLOCK: usize = 1 << 16;
        let nan = |b: &u8| b & 0x7F == 0x7F;
        for (k, block) in self.data.chunks(BLOCK).enumerate() {
            if block.iter().fold(false, |any, b| any | nan(b)) {
                let i = k * BLOCK + block.iter().position(nan).expect("the block has one");
                return Err(Error::tensor(
                    self.name,
                    format!(
                        "scale byte {i} is {:#04x} in {}: NaN in E4M3; scales must be finite",
                        self.data[i],
                        self.file.display()
                    ),
                ));
            }
        }
        Ok(())
    }

    fn wrong_dtype(&self, want: &str) -> Error {
        Error::tensor(
            self.name,
            format!(
                "dtype {} in {}, expected {want}",
                dtype_name(self.dtype),
                self.file.display()
            ),
        )
    }

    /// The values widened to f32 (BF16, F16 or F32 tensors). A NaN or infinite weight is an
    /// error naming the tensor and element: every engine computes on these values, and a
    /// non-finite one turns every logit it reaches into NaN (tokens chosen from garbage).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let v = self.to_f32_unchecked()?;
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(Error::tensor(
                self.name,
                format!(
                    "element {i} is {} in {}; weights must be finite",
                    v[i],
                    self.file.display()
                ),
            ));
        }
        Ok(v)
    }

    fn to_f32_unchecked(&self) -> Result<Vec<f32>> {
        let d = self.data;
        Ok(match self.dtype {
            Dtype::F32 => d
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::BF16 => d
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::F16 => d
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            _ => return Err(self.wrong_dtype("a float dtype (BF16, F16 or F32)")),
        })
    }

    pub fn to_u32(&self) -> Result<Vec<u32>> {
        if self.dtype != Dtype::U32 {
            return Err(self.wrong_dtype("U32"));
        }
        Ok(self
            .data
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    pub fn to_u8(&self) -> Result<Vec<u8>> {
        if self.dtype != Dtype::U8 {
            return Err(self.wrong_dtype("U8"));
        }
        Ok(self.data.to_vec())
    }
}

/// A tensor to be written whose bytes are produced on demand, so a writer holds one tensor in
/// memory at a time (a 21 GB checkpoint is written tensor by tensor).
pub struct LazyTensor<'a> {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub produce: Box<dyn Fn() -> Vec<u8> + 'a>,
}

impl View for LazyTensor<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        let bytes = (self.produce)();
        debug_assert_eq!(bytes.len(), self.data_len());
        Cow::Owned(bytes)
    }
    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * (self.dtype.bitsize() / 8)
    }
}

/// Writes a safetensors file reproducibly: no metadata, tensors in safetensors' canonical order
/// (by dtype alignment, then name). Written under a temporary name and renamed when complete.
pub fn write_safetensors(path: &Path, tensors: Vec<(String, LazyTensor<'_>)>) -> Result<()> {
    crate::files::write_through(path, |tmp| {
        safetensors::serialize_to_file(tensors, None, tmp).map_err(|e| {
            Error::Checkpoint(format!(
                "{}: writing safetensors failed: {e}",
                path.display()
            ))
        })
    })
}

/// Writes small files (configs, manifests) atomically.
pub use crate::files::write_atomic;

pub fn f32_to_bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
        .collect()
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
