//! GGUF files: the container that llama.cpp and most quantized checkpoints
//! use. This module owns reading one: the header, the metadata key/value
//! pairs, the tensor index, and each tensor's bytes straight from a
//! memory map. Turning those bytes into numbers is [`dequant`]'s job.
//!
//! Reference: the format description in ggml's `docs/gguf.md` (version 3;
//! version 2 has the same layout). All integers are little-endian.

pub mod dequant;
pub mod model;
mod spm;
pub mod tokenizer;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

pub use dequant::{GgmlType, dequantize};

/// Whether `path` names a GGUF file (a file ending in `.gguf`).
pub fn is_gguf(path: &Path) -> bool {
    path.is_file()
        && path
            .extension()
            .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
}

/// Why a GGUF file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a GGUF file (magic {magic:?}, expected \"GGUF\")")]
    NotGguf { path: PathBuf, magic: [u8; 4] },
    #[error("{path}: GGUF version {0} is not supported (only 2 and 3)", .version)]
    Version { path: PathBuf, version: u32 },
    #[error("{path}: malformed GGUF at byte {offset}: {what}")]
    Malformed {
        path: PathBuf,
        offset: usize,
        what: String,
    },
    #[error(
        "tensor `{tensor}` uses quantization type {kind}, which gyre cannot read (supported: {supported})"
    )]
    UnsupportedType {
        tensor: String,
        kind: String,
        supported: &'static str,
    },
    #[error("tensor `{0}` is not in the file")]
    MissingTensor(String),
    #[error("tensor `{tensor}`: {what}")]
    BadTensor { tensor: String, what: String },
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Where one tensor lives in the file.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` varies fastest (the reverse of PyTorch's shape).
    pub dims: Vec<u64>,
    /// The raw ggml type id (see [`GgmlType`]).
    pub kind: u32,
    /// Offset from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The PyTorch-order shape (`dims` reversed).
    pub fn shape(&self) -> Vec<i64> {
        self.dims.iter().rev().map(|&d| d as i64).collect()
    }
}

/// An open GGUF file: metadata and tensor index parsed, tensor data mapped.
pub struct GgufFile {
    path: PathBuf,
    map: memmap2::Mmap,
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    data_start: usize,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// Most array elements a metadata value may hold (a vocabulary of 1M tokens
/// fits); guards allocations against a corrupt length.
const MAX_ARRAY: u64 = 1 << 24;

impl GgufFile {
    /// Maps `path` and parses its header, metadata and tensor index.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process; gyre does
        // not write model files while serving them. A file truncated by
        // someone else while mapped would fault, as with any mmap-based loader.
        #[allow(unsafe_code)]
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let mut r = Reader {
            buf: &map,
            pos: 0,
            path,
        };
        let magic: [u8; 4] = r.bytes(4)?.try_into().unwrap_or([0; 4]);
        if &magic != b"GGUF" {
            return Err(GgufError::NotGguf {
                path: path.to_owned(),
                magic,
            });
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::Version {
                path: path.to_owned(),
                version,
            });
        }
        let n_tensors = r.u64()?;
        let n_kv = r.u64()?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = r.string()?;
            let ty = r.u32()?;
            let value = r.value(ty)?;
            metadata.insert(key, value);
        }
        let mut tensors = Vec::with_capacity(n_tensors.min(MAX_ARRAY) as usize);
        for _ in 0..n_tensors {
            let name = r.string()?;
            let n_dims = r.u32()?;
            if n_dims > 8 {
                return Err(r.malformed(format!("tensor `{name}` has {n_dims} dimensions")));
            }
            let dims = (0..n_dims)
                .map(|_| r.u64())
                .collect::<Result<Vec<_>, _>>()?;
            let kind = r.u32()?;
            let offset = r.u64()?;
            tensors.push(TensorInfo {
                name,
                dims,
                kind,
                offset,
            });
        }
        let alignment = metadata
            .get("general.alignment")
            .and_then(Value::as_u64)
            .unwrap_or(32) as usize;
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(r.malformed(format!(
                "general.alignment {alignment} is not a power of two"
            )));
        }
        let data_start = r.pos.div_ceil(alignment) * alignment;
        let file = Self {
            path: path.to_owned(),
            map,
            version,
            metadata,
            tensors,
            data_start,
        };
        for t in &file.tensors {
            file.check_extent(t)?;
        }
        Ok(file)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_owned()))
    }

    /// The raw bytes of `t`, exactly as stored.
    pub fn raw(&self, t: &TensorInfo) -> Result<&[u8], GgufError> {
        let (start, len) = self.check_extent(t)?;
        Ok(&self.map[start..start + len])
    }

    /// `t` dequantized to f32, in ggml order (`dims[0]` fastest).
    pub fn dequantize(&self, t: &TensorInfo) -> Result<Vec<f32>, GgufError> {
        let kind = self.kind_of(t)?;
        dequantize(kind, self.raw(t)?, t.elements() as usize).map_err(|what| GgufError::BadTensor {
            tensor: t.name.clone(),
            what,
        })
    }

    fn kind_of(&self, t: &TensorInfo) -> Result<GgmlType, GgufError> {
        GgmlType::from_id(t.kind).ok_or_else(|| GgufError::UnsupportedType {
            tensor: t.name.clone(),
            kind: dequant::type_name(t.kind),
            supported: GgmlType::SUPPORTED,
        })
    }

    /// Start and length of `t`'s bytes, checked against the file.
    fn check_extent(&self, t: &TensorInfo) -> Result<(usize, usize), GgufError> {
        let bad = |what: String| GgufError::BadTensor {
            tensor: t.name.clone(),
            what,
        };
        let kind = self.kind_of(t)?;
        let elements = t.elements();
        let (block, bytes) = kind.block();
        if !elements.is_multiple_of(block as u64) {
            return Err(bad(format!(
                "{elements} elements are not a whole number of {block}-element {kind:?} blocks"
            )));
        }
        let len = (elements / block as u64)
            .checked_mul(bytes as u64)
            .ok_or_else(|| bad("size overflows".into()))?;
        let start = (self.data_start as u64)
            .checked_add(t.offset)
            .ok_or_else(|| bad("offset overflows".into()))?;
        if start.saturating_add(len) > self.map.len() as u64 {
            return Err(bad(format!(
                "its {len} bytes at offset {} run past the end of the file",
                t.offset
            )));
        }
        Ok((start as usize, len as usize))
    }
}

/// A cursor over the header with bounds-checked reads.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl Reader<'_> {
    fn malformed(&self, what: String) -> GgufError {
        GgufError::Malformed {
            path: self.path.to_owned(),
            offset: self.pos,
            what,
        }
    }

    fn bytes(&mut self, n: usize) -> Result<&[u8], GgufError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| self.malformed(format!("needs {n} more bytes, the file ends")))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn string(&mut self) -> Result<String, GgufError> {
        let len = self.u64()?;
        let len = usize::try_from(len).map_err(|_| self.malformed("string too long".into()))?;
        let bytes = self.bytes(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.malformed("string is not UTF-8".into()))
    }

    fn value(&mut self, ty: u32) -> Result<Value, GgufError> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>()?[0]),
            1 => Value::I8(self.array::<1>()?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array()?)),
            3 => Value::I16(i16::from_le_bytes(self.array()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.array()?)),
            6 => Value::F32(f32::from_le_bytes(self.array()?)),
            7 => match self.array::<1>()?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.malformed(format!("bool value {b}"))),
            },
            8 => Value::String(self.string()?),
            9 => {
                let elem = self.u32()?;
                let n = self.u64()?;
                if n > MAX_ARRAY || elem == 9 {
                    return Err(self.malformed(format!("array of {n} elements of type {elem}")));
                }
                let items = (0..n).map(|_| self.value(elem)).collect::<Result<_, _>>()?;
                Value::Array(items)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.array()?)),
            12 => Value::F64(f64::from_le_bytes(self.array()?)),
            other => return Err(self.malformed(format!("unknown metadata value type {other}"))),
        })
    }
}

#[cfg(test)]
mod tests;
