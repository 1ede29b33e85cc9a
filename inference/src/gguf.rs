//! GGUF (v2/v3) file parsing: header, metadata key/values of every type (arrays included), tensor infos and
//! the aligned tensor data section.
//!
//! Owns the file format only; what the tensors mean belongs to [`crate::model`]. The file is read whole with
//! ordinary buffered `read(2)` calls of [`READ_CHUNK`] bytes (no mmap): llmprof's model-file probes account the
//! bytes read on load, and a test checks that they equal the file size. Never interprets tensor contents.
//!
//! Format reference: ggml's `docs/gguf.md` (little-endian; strings are u64 length + UTF-8 bytes; v1 used u32
//! counts and is not supported).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;

/// Size of each `read(2)` while loading a model file (8 MiB: large enough that syscall overhead is negligible,
/// small enough that a probe sees steady progress).
pub const READ_CHUNK: usize = 8 << 20;

/// `GGUF` magic, the first four bytes of every file (gguf.md: "GGUF" as bytes).
const MAGIC: &[u8; 4] = b"GGUF";

/// Default data alignment when `general.alignment` is absent (gguf.md: `GGUF_DEFAULT_ALIGNMENT` = 32).
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Errors while reading or parsing a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or read.
    #[error("cannot read {path}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with the GGUF magic.
    #[error("not a GGUF file (bad magic); pass a .gguf model file")]
    BadMagic,
    /// The GGUF version is not 2 or 3.
    #[error("unsupported GGUF version {0} (supported: 2, 3); re-convert the model with a recent llama.cpp")]
    UnsupportedVersion(u32),
    /// The file ended before a structure it declares.
    #[error("truncated GGUF file: {0}")]
    Truncated(&'static str),
    /// A structure has an invalid value (unknown type tag, bad UTF-8, offsets out of range).
    #[error("malformed GGUF file: {0}")]
    Malformed(String),
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// uint8
    U8(u8),
    /// int8
    I8(i8),
    /// uint16
    U16(u16),
    /// int16
    I16(i16),
    /// uint32
    U32(u32),
    /// int32
    I32(i32),
    /// float32
    F32(f32),
    /// bool
    Bool(bool),
    /// string
    String(String),
    /// array (elements all of one type)
    Array(Vec<Value>),
    /// uint64
    U64(u64),
    /// int64
    I64(i64),
    /// float64
    F64(f64),
}

impl Value {
    /// The value as an unsigned integer, when it is a non-negative integer of any width.
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
            Value::Bool(_) | Value::F32(_) | Value::F64(_) | Value::String(_) | Value::Array(_) => None,
        }
    }

    /// The value as an i64, when it is an integer of any width.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// The value as f32 (floats and integers).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => self.as_i64().map(|v| v as f32),
        }
    }

    /// The value as a string slice.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// ggml tensor type ids (ggml.h `enum ggml_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// GGML_TYPE_F32 = 0
    F32,
    /// GGML_TYPE_F16 = 1
    F16,
    /// GGML_TYPE_Q4_0 = 2
    Q4_0,
    /// GGML_TYPE_Q4_1 = 3
    Q4_1,
    /// GGML_TYPE_Q8_0 = 8
    Q8_0,
    /// Any other type id (not supported by this engine).
    Other(u32),
}

impl GgmlType {
    /// From the on-disk id.
    pub fn from_id(id: u32) -> Self {
        match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            other => GgmlType::Other(other),
        }
    }

    /// The on-disk id.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q8_0 => 8,
            GgmlType::Other(id) => id,
        }
    }

    /// (elements per block, bytes per block) of the ggml layout; None for unsupported types.
    pub fn block_layout(self) -> Option<(usize, usize)> {
        // ggml-common.h: block_q4_0 = f16 d + 16 bytes; block_q4_1 = f16 d, f16 m + 16 bytes;
        // block_q8_0 = f16 d + 32 i8; QK4_0 = QK4_1 = QK8_0 = 32.
        match self {
            GgmlType::F32 => Some((1, 4)),
            GgmlType::F16 => Some((1, 2)),
            GgmlType::Q4_0 => Some((32, 18)),
            GgmlType::Q4_1 => Some((32, 20)),
            GgmlType::Q8_0 => Some((32, 34)),
            GgmlType::Other(_) => None,
        }
    }

    /// Bytes taken by `n` elements (n a multiple of the block size); None for unsupported types.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let (per, bytes) = self.block_layout()?;
        (n / per as u64).checked_mul(bytes as u64)
    }
}

/// One tensor's description.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// Name (e.g. `blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions, ggml order: `dims[0]` is the contiguous (row) dimension.
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        // Saturating: a hostile file must not overflow; the size check against the file then fails.
        self.dims.iter().fold(1u64, |a, &d| a.saturating_mul(d))
    }
}

/// A parsed GGUF file with its bytes in memory.
#[derive(Debug)]
pub struct GgufFile {
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata, by key.
    pub metadata: BTreeMap<String, Value>,
    /// Tensor infos in file order.
    pub tensors: Vec<TensorInfo>,
    /// Data alignment.
    pub alignment: u64,
    /// Offset of the data section in the file.
    pub data_offset: u64,
    /// The whole file.
    pub bytes: Vec<u8>,
}

/// Reads the whole file at `path` with [`READ_CHUNK`]-sized `read(2)` calls.
pub fn read_file(path: &Path) -> Result<Vec<u8>, GgufError> {
    let io = |source| GgufError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut f = File::open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    let mut buf = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    let mut chunk = vec![0u8; READ_CHUNK];
    loop {
        match f.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io(e)),
        }
    }
    Ok(buf)
}

impl GgufFile {
    /// Reads and parses the file at `path`.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        Self::parse(read_file(path)?)
    }

    /// Parses a GGUF file held in memory.
    pub fn parse(bytes: Vec<u8>) -> Result<Self, GgufError> {
        let mut r = Reader { buf: &bytes, pos: 0 };
        if r.take(4, "magic")? != MAGIC {
            return Err(GgufError::BadMagic);
        }
        let version = r.u32()?;
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let n_tensors = r.u64()?;
        let n_kv = r.u64()?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = r.string()?;
            let ty = r.u32()?;
            let value = r.value(ty, 0)?;
            metadata.insert(key, value);
        }
        let mut tensors = Vec::with_capacity(n_tensors.min(1 << 16) as usize);
        for _ in 0..n_tensors {
            let name = r.string()?;
            let n_dims = r.u32()?;
            if n_dims > 8 {
                return Err(GgufError::Malformed(format!(
                    "tensor {name} has {n_dims} dimensions"
                )));
            }
            let dims = (0..n_dims).map(|_| r.u64()).collect::<Result<Vec<_>, _>>()?;
            let ty = GgmlType::from_id(r.u32()?);
            let offset = r.u64()?;
            tensors.push(TensorInfo {
                name,
                dims,
                ty,
                offset,
            });
        }
        let alignment = match metadata.get("general.alignment").and_then(Value::as_u64) {
            Some(a) if a > 0 && a.is_power_of_two() => a,
            Some(a) => {
                return Err(GgufError::Malformed(format!(
                    "general.alignment {a} is not a power of two"
                )));
            }
            None => DEFAULT_ALIGNMENT,
        };
        let data_offset = (r.pos as u64).div_ceil(alignment) * alignment;
        let file = GgufFile {
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
            bytes,
        };
        for t in &file.tensors {
            file.tensor_data(t)?;
        }
        Ok(file)
    }

    /// Metadata value for `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// Tensor info by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of a tensor (checked against the file size).
    pub fn tensor_data(&self, t: &TensorInfo) -> Result<&[u8], GgufError> {
        let len = t.ty.bytes_for(t.n_elements()).ok_or_else(|| {
            GgufError::Malformed(format!("tensor {} has unsupported type id {}", t.name, t.ty.id()))
        })?;
        let start = self.data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(len));
        match (start, end) {
            (Some(s), Some(e)) if e <= self.bytes.len() as u64 => Ok(&self.bytes[s as usize..e as usize]),
            _ => Err(GgufError::Malformed(format!(
                "tensor {} data lies outside the file",
                t.name
            ))),
        }
    }
}

/// Cursor over the file bytes.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// Deepest nesting of arrays accepted (arrays of arrays are legal in GGUF, but never deep).
const MAX_ARRAY_DEPTH: u32 = 4;

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], GgufError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(GgufError::Truncated(what))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let s = self.take(N, "value")?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    fn string(&mut self) -> Result<String, GgufError> {
        let len = self.u64()?;
        let len = usize::try_from(len).map_err(|_| GgufError::Truncated("string"))?;
        let s = self.take(len, "string")?;
        // Some converters wrote invalid UTF-8 in token strings; keep them lossy rather than refusing the model.
        Ok(String::from_utf8_lossy(s).into_owned())
    }
    fn value(&mut self, ty: u32, depth: u32) -> Result<Value, GgufError> {
        // gguf.md `enum gguf_metadata_value_type`.
        Ok(match ty {
            0 => Value::U8(u8::from_le_bytes(self.arr()?)),
            1 => Value::I8(i8::from_le_bytes(self.arr()?)),
            2 => Value::U16(u16::from_le_bytes(self.arr()?)),
            3 => Value::I16(i16::from_le_bytes(self.arr()?)),
            4 => Value::U32(u32::from_le_bytes(self.arr()?)),
            5 => Value::I32(i32::from_le_bytes(self.arr()?)),
            6 => Value::F32(f32::from_le_bytes(self.arr()?)),
            7 => Value::Bool(self.arr::<1>()?[0] != 0),
            8 => Value::String(self.string()?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::Malformed("arrays nested too deep".into()));
                }
                let elem_ty = self.u32()?;
                let n = self.u64()?;
                // Every element takes at least one byte: bound the allocation by what is left.
                if n > (self.buf.len() - self.pos) as u64 {
                    return Err(GgufError::Truncated("array"));
                }
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.value(elem_ty, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(u64::from_le_bytes(self.arr()?)),
            11 => Value::I64(i64::from_le_bytes(self.arr()?)),
            12 => Value::F64(f64::from_le_bytes(self.arr()?)),
            other => {
                return Err(GgufError::Malformed(format!(
                    "unknown metadata value type {other}"
                )));
            }
        })
    }
}

/// Writes GGUF v3 files (the tests' tiny models, `e2e::gguf`, and the tests here).
pub mod writer {
    use super::{DEFAULT_ALIGNMENT, GgmlType, Value};

    /// Encodes `metadata` and `tensors` (name, dims in ggml order, type, raw data) as a GGUF v3 file.
    pub fn encode(
        metadata: &[(String, Value)],
        tensors: &[(String, Vec<u64>, GgmlType, Vec<u8>)],
    ) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(super::MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
        for (k, v) in metadata {
            put_str(&mut out, k);
            out.extend_from_slice(&type_id(v).to_le_bytes());
            put_value(&mut out, v);
        }
        let align = DEFAULT_ALIGNMENT;
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for (name, dims, ty, data) in tensors {
            put_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len() as u64).div_ceil(align) * align;
        }
        let data_start = (out.len() as u64).div_ceil(align) * align;
        out.resize(data_start as usize, 0);
        for ((_, _, _, data), off) in tensors.iter().zip(offsets) {
            out.resize((data_start + off) as usize, 0);
            out.extend_from_slice(data);
        }
        out
    }

    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }

    fn type_id(v: &Value) -> u32 {
        match v {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::String(_) => 8,
            Value::Array(_) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }

    fn put_value(out: &mut Vec<u8>, v: &Value) {
        match v {
            Value::U8(x) => out.push(*x),
            Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::Bool(x) => out.push(u8::from(*x)),
            Value::String(s) => put_str(out, s),
            Value::Array(a) => {
                let elem = a.first().map(type_id).unwrap_or(4);
                out.extend_from_slice(&elem.to_le_bytes());
                out.extend_from_slice(&(a.len() as u64).to_le_bytes());
                for e in a {
                    put_value(out, e);
                }
            }
            Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_metadata_and_tensors() {
        let meta = vec![
            ("general.architecture".to_string(), Value::String("llama".into())),
            ("a.u32".to_string(), Value::U32(7)),
            ("a.f32".to_string(), Value::F32(1.5)),
            (
                "a.arr".to_string(),
                Value::Array(vec![Value::String("x".into()), Value::String("y".into())]),
            ),
            ("a.i64".to_string(), Value::I64(-3)),
            ("a.bool".to_string(), Value::Bool(true)),
        ];
        let data: Vec<u8> = (0..4u32 * 3).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let tensors = vec![
            ("t0".to_string(), vec![3, 4], GgmlType::F32, data.clone()),
            ("t1".to_string(), vec![2], GgmlType::F32, vec![0; 8]),
        ];
        let bytes = writer::encode(&meta, &tensors);
        let f = GgufFile::parse(bytes).expect("parse");
        assert_eq!(f.version, 3);
        assert_eq!(f.get("a.u32").and_then(Value::as_u64), Some(7));
        assert_eq!(f.get("a.f32").and_then(Value::as_f32), Some(1.5));
        assert_eq!(f.get("a.i64").and_then(Value::as_i64), Some(-3));
        assert_eq!(f.get("a.arr").and_then(Value::as_array).map(|a| a.len()), Some(2));
        let t0 = f.tensor("t0").expect("t0");
        assert_eq!(t0.dims, vec![3, 4]);
        assert_eq!(f.tensor_data(t0).expect("data"), &data[..]);
        assert_eq!(f.data_offset % 32, 0);
    }

    #[test]
    fn rejects_garbage_and_truncation() {
        assert!(matches!(
            GgufFile::parse(b"NOPE\x03\0\0\0".to_vec()),
            Err(GgufError::BadMagic)
        ));
        let tensor = ("t".to_string(), vec![2u64], GgmlType::F32, vec![1u8; 8]);
        let bytes = writer::encode(&[("k".into(), Value::String("v".into()))], &[tensor]);
        for cut in 4..bytes.len() {
            assert!(
                GgufFile::parse(bytes[..cut].to_vec()).is_err(),
                "cut at {cut} parsed"
            );
        }
    }
}
