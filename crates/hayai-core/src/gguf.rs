//! GGUF (v2/v3) reader.
//!
//! Layout (little-endian): magic `GGUF`, version u32, tensor count u64, KV
//! count u64, KV pairs, tensor infos, padding to `general.alignment`, tensor
//! data. Every count and length is checked against the bytes that remain
//! before anything is allocated, so a hostile file cannot trigger huge
//! allocations or panics.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::ops::Range;
use std::path::Path;

use crate::ggml_type::GgmlType;
use crate::FormatError;

/// Default alignment of the tensor data section and of each tensor.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: usize = 4;
/// Nesting limit for arrays of arrays (keeps recursion bounded).
const MAX_ARRAY_DEPTH: u32 = 8;

const MAGIC: &[u8; 4] = b"GGUF";

/// On-disk value type ids (`enum gguf_type`).
pub mod value_type {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// A scalar, string or array metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
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
    Array(MetaArray),
}

/// A typed array. Element vectors are kept typed (not `Vec<MetaValue>`) so a
/// 262,144-entry vocabulary loads as three flat vectors.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    /// Array of arrays (each inner array may have its own element type).
    Array(Vec<MetaArray>),
}

impl MetaValue {
    /// Human-readable type name, used in error messages.
    pub fn type_name(&self) -> String {
        match self {
            MetaValue::U8(_) => "u8".into(),
            MetaValue::I8(_) => "i8".into(),
            MetaValue::U16(_) => "u16".into(),
            MetaValue::I16(_) => "i16".into(),
            MetaValue::U32(_) => "u32".into(),
            MetaValue::I32(_) => "i32".into(),
            MetaValue::U64(_) => "u64".into(),
            MetaValue::I64(_) => "i64".into(),
            MetaValue::F32(_) => "f32".into(),
            MetaValue::F64(_) => "f64".into(),
            MetaValue::Bool(_) => "bool".into(),
            MetaValue::String(_) => "string".into(),
            MetaValue::Array(a) => format!("array<{}>[{}]", a.elem_type_name(), a.len()),
        }
    }

    /// Any integer type, as i128 (lossless for every width).
    fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(v) => v as i128,
            MetaValue::I8(v) => v as i128,
            MetaValue::U16(v) => v as i128,
            MetaValue::I16(v) => v as i128,
            MetaValue::U32(v) => v as i128,
            MetaValue::I32(v) => v as i128,
            MetaValue::U64(v) => v as i128,
            MetaValue::I64(v) => v as i128,
            _ => return None,
        })
    }

    /// Any integer type whose value fits in u64.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// Any integer type whose value fits in u32.
    pub fn as_u32(&self) -> Option<u32> {
        self.as_i128().and_then(|v| u32::try_from(v).ok())
    }

    /// Any integer type whose value fits in i64.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|v| i64::try_from(v).ok())
    }

    /// F32 or F64 (F64 narrowed).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            MetaValue::F32(v) => Some(v),
            MetaValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// F32 or F64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v as f64),
            MetaValue::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&MetaArray> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl MetaArray {
    pub fn len(&self) -> usize {
        match self {
            MetaArray::U8(v) => v.len(),
            MetaArray::I8(v) => v.len(),
            MetaArray::U16(v) => v.len(),
            MetaArray::I16(v) => v.len(),
            MetaArray::U32(v) => v.len(),
            MetaArray::I32(v) => v.len(),
            MetaArray::U64(v) => v.len(),
            MetaArray::I64(v) => v.len(),
            MetaArray::F32(v) => v.len(),
            MetaArray::F64(v) => v.len(),
            MetaArray::Bool(v) => v.len(),
            MetaArray::String(v) => v.len(),
            MetaArray::Array(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element type name, used in error messages.
    pub fn elem_type_name(&self) -> &'static str {
        match self {
            MetaArray::U8(_) => "u8",
            MetaArray::I8(_) => "i8",
            MetaArray::U16(_) => "u16",
            MetaArray::I16(_) => "i16",
            MetaArray::U32(_) => "u32",
            MetaArray::I32(_) => "i32",
            MetaArray::U64(_) => "u64",
            MetaArray::I64(_) => "i64",
            MetaArray::F32(_) => "f32",
            MetaArray::F64(_) => "f64",
            MetaArray::Bool(_) => "bool",
            MetaArray::String(_) => "string",
            MetaArray::Array(_) => "array",
        }
    }

    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            MetaArray::String(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_f32(&self) -> Option<&[f32]> {
        match self {
            MetaArray::F32(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_i32(&self) -> Option<&[i32]> {
        match self {
            MetaArray::I32(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_u32(&self) -> Option<&[u32]> {
        match self {
            MetaArray::U32(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<&[bool]> {
        match self {
            MetaArray::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// Any integer element type converted to i64 (None if a u64 overflows).
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        fn conv<T: Copy>(v: &[T], f: impl Fn(T) -> Option<i64>) -> Option<Vec<i64>> {
            v.iter().map(|x| f(*x)).collect()
        }
        match self {
            MetaArray::U8(v) => conv(v, |x| Some(x as i64)),
            MetaArray::I8(v) => conv(v, |x| Some(x as i64)),
            MetaArray::U16(v) => conv(v, |x| Some(x as i64)),
            MetaArray::I16(v) => conv(v, |x| Some(x as i64)),
            MetaArray::U32(v) => conv(v, |x| Some(x as i64)),
            MetaArray::I32(v) => conv(v, |x| Some(x as i64)),
            MetaArray::U64(v) => conv(v, |x| i64::try_from(x).ok()),
            MetaArray::I64(v) => Some(v.clone()),
            _ => None,
        }
    }

    /// F32 or F64 elements converted to f32.
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        match self {
            MetaArray::F32(v) => Some(v.clone()),
            MetaArray::F64(v) => Some(v.iter().map(|x| *x as f32).collect()),
            _ => None,
        }
    }
}

/// One tensor's header entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` (ne0) is the fastest-varying (row length).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Byte offset relative to the start of the data section.
    pub offset: u64,
    pub n_elements: u64,
    pub n_bytes: u64,
}

impl GgufTensorInfo {
    /// Row-major shape, outermost first (dims reversed): `[rows, cols]` for a
    /// matrix whose rows are `dims[0]` elements long.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// Elements per row (`ne0`); 1 for a 0-dim tensor.
    pub fn row_len(&self) -> usize {
        self.dims.first().copied().unwrap_or(1) as usize
    }

    /// Number of rows (product of all dims but the first).
    pub fn n_rows(&self) -> usize {
        self.dims.iter().skip(1).product::<u64>() as usize
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.row_len() / self.ggml_type.block_size() * self.ggml_type.type_size()
    }
}

enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// An opened GGUF file: parsed header plus the (memory-mapped) bytes.
pub struct GgufFile {
    backing: Backing,
    origin: String,
    version: u32,
    metadata: BTreeMap<String, MetaValue>,
    tensors: Vec<GgufTensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("origin", &self.origin)
            .field("version", &self.version)
            .field("n_metadata", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses a GGUF file.
    pub fn open(path: &Path) -> Result<Self, FormatError> {
        let file = File::open(path).map_err(|e| FormatError::io(path, e))?;
        // SAFETY: the mapping is read-only; like every mmap-based model loader
        // we rely on the file not being truncated or rewritten while open.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| FormatError::io(path, e))?;
        Self::parse(Backing::Mmap(mmap), path.display().to_string())
    }

    /// Parses an in-memory GGUF image (tests, small files).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, FormatError> {
        Self::parse(Backing::Owned(bytes), "<memory>".to_string())
    }

    fn parse(backing: Backing, origin: String) -> Result<Self, FormatError> {
        let header = parse_header(backing.bytes(), &origin)?;
        Ok(GgufFile {
            backing,
            origin,
            version: header.version,
            metadata: header.metadata,
            tensor_index: header
                .tensors
                .iter()
                .enumerate()
                .map(|(i, t)| (t.name.clone(), i))
                .collect(),
            tensors: header.tensors,
            alignment: header.alignment,
            data_offset: header.data_offset,
        })
    }

    /// Where the file came from (path or `<memory>`), for error messages.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the tensor data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The whole file.
    pub fn as_bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    pub fn metadata(&self) -> &BTreeMap<String, MetaValue> {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    /// Any integer type whose value fits in u32.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.get(key)?.as_u32()
    }

    /// Any integer type whose value fits in u64.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// Any integer type whose value fits in i64.
    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key)?.as_i64()
    }

    /// F32 or F64.
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f32()
    }

    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key)?.as_f64()
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    pub fn get_array(&self, key: &str) -> Option<&MetaArray> {
        self.get(key)?.as_array()
    }

    pub fn get_str_array(&self, key: &str) -> Option<Vec<&str>> {
        Some(
            self.get_array(key)?
                .as_strings()?
                .iter()
                .map(String::as_str)
                .collect(),
        )
    }

    pub fn get_f32_array(&self, key: &str) -> Option<&[f32]> {
        self.get_array(key)?.as_f32()
    }

    pub fn get_i32_array(&self, key: &str) -> Option<&[i32]> {
        self.get_array(key)?.as_i32()
    }

    fn require<'a, T>(
        &'a self,
        key: &str,
        expected: &str,
        f: impl FnOnce(&'a MetaValue) -> Option<T>,
    ) -> Result<T, FormatError> {
        let v = self.get(key).ok_or_else(|| FormatError::MissingKey {
            origin: self.origin.clone(),
            key: key.to_string(),
        })?;
        f(v).ok_or_else(|| FormatError::WrongType {
            origin: self.origin.clone(),
            key: key.to_string(),
            expected: expected.to_string(),
            found: v.type_name(),
        })
    }

    /// Like [`get_str`](Self::get_str) but a missing key or wrong type is an error.
    pub fn require_str(&self, key: &str) -> Result<&str, FormatError> {
        self.require(key, "string", MetaValue::as_str)
    }

    pub fn require_u32(&self, key: &str) -> Result<u32, FormatError> {
        self.require(key, "integer fitting u32", MetaValue::as_u32)
    }

    pub fn require_u64(&self, key: &str) -> Result<u64, FormatError> {
        self.require(key, "integer fitting u64", MetaValue::as_u64)
    }

    pub fn require_f32(&self, key: &str) -> Result<f32, FormatError> {
        self.require(key, "float", MetaValue::as_f32)
    }

    pub fn require_bool(&self, key: &str) -> Result<bool, FormatError> {
        self.require(key, "bool", MetaValue::as_bool)
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// Like [`tensor`](Self::tensor) but a missing tensor is an error.
    pub fn require_tensor(&self, name: &str) -> Result<&GgufTensorInfo, FormatError> {
        self.tensor(name)
            .ok_or_else(|| FormatError::TensorNotFound {
                origin: self.origin.clone(),
                name: name.to_string(),
            })
    }

    /// The raw bytes of a tensor. Bounds were validated while parsing; an
    /// info that does not belong to this file is an error, not a panic.
    pub fn tensor_data(&self, t: &GgufTensorInfo) -> Result<&[u8], FormatError> {
        let range = self.tensor_range(t).ok_or_else(|| FormatError::Gguf {
            origin: self.origin.clone(),
            offset: self.data_offset.saturating_add(t.offset),
            msg: format!("tensor `{}` lies outside the data section", t.name),
        })?;
        Ok(&self.as_bytes()[range])
    }

    /// Dequantizes a whole tensor to f32; see [`crate::dequant::tensor_f32`].
    pub fn tensor_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>), FormatError> {
        crate::dequant::tensor_f32(self, name)
    }

    /// Raw bytes of rows `rows` of a tensor (rows as in [`GgufTensorInfo::n_rows`]).
    pub fn tensor_rows_data(
        &self,
        t: &GgufTensorInfo,
        rows: Range<usize>,
    ) -> Result<&[u8], FormatError> {
        let data = self.tensor_data(t)?;
        let rb = t.row_bytes();
        if rows.start > rows.end || rows.end > t.n_rows() {
            return Err(FormatError::Invalid(format!(
                "{}: rows {}..{} out of range for tensor `{}` with {} rows",
                self.origin,
                rows.start,
                rows.end,
                t.name,
                t.n_rows()
            )));
        }
        // `get` rather than indexing: an info not from this file may carry
        // dims that disagree with its byte size.
        data.get(rows.start * rb..rows.end * rb).ok_or_else(|| {
            FormatError::Invalid(format!(
                "{}: tensor `{}`: rows {}..{} exceed its data",
                self.origin, t.name, rows.start, rows.end
            ))
        })
    }

    fn tensor_range(&self, t: &GgufTensorInfo) -> Option<Range<usize>> {
        let start = self.data_offset.checked_add(t.offset)?;
        let end = start.checked_add(t.n_bytes)?;
        if end > self.as_bytes().len() as u64 {
            return None;
        }
        Some(start as usize..end as usize)
    }
}

struct Header {
    version: u32,
    metadata: BTreeMap<String, MetaValue>,
    tensors: Vec<GgufTensorInfo>,
    alignment: u64,
    data_offset: u64,
}

/// Bounds-checked little-endian reader.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    origin: &'a str,
}

impl<'a> Reader<'a> {
    fn err(&self, msg: impl Into<String>) -> FormatError {
        FormatError::Gguf {
            origin: self.origin.to_string(),
            offset: self.pos as u64,
            msg: msg.into(),
        }
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], FormatError> {
        if n > self.remaining() {
            return Err(self.err(format!(
                "truncated: need {n} bytes for {what}, {} left",
                self.remaining()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], FormatError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Checks that `count` items of at least `min_size` bytes each can fit in
    /// the rest of the file; returns the count as usize.
    fn bounded_count(&self, count: u64, min_size: usize, what: &str) -> Result<usize, FormatError> {
        let max = (self.remaining() / min_size.max(1)) as u64;
        if count > max {
            return Err(self.err(format!(
                "{what} count {count} cannot fit in the {} remaining bytes",
                self.remaining()
            )));
        }
        Ok(count as usize)
    }

    fn string(&mut self, what: &str) -> Result<String, FormatError> {
        let start = self.pos;
        let len = self.u64(what)?;
        let len = self.bounded_count(len, 1, &format!("{what} length"))?;
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(e) => {
                self.pos = start;
                Err(self.err(format!("{what} is not valid UTF-8: {e}")))
            }
        }
    }

    fn value(&mut self, ty: u32, depth: u32, what: &str) -> Result<MetaValue, FormatError> {
        use value_type as vt;
        Ok(match ty {
            vt::U8 => MetaValue::U8(self.array::<1>(what)?[0]),
            vt::I8 => MetaValue::I8(self.array::<1>(what)?[0] as i8),
            vt::U16 => MetaValue::U16(u16::from_le_bytes(self.array(what)?)),
            vt::I16 => MetaValue::I16(i16::from_le_bytes(self.array(what)?)),
            vt::U32 => MetaValue::U32(u32::from_le_bytes(self.array(what)?)),
            vt::I32 => MetaValue::I32(i32::from_le_bytes(self.array(what)?)),
            vt::U64 => MetaValue::U64(u64::from_le_bytes(self.array(what)?)),
            vt::I64 => MetaValue::I64(i64::from_le_bytes(self.array(what)?)),
            vt::F32 => MetaValue::F32(f32::from_le_bytes(self.array(what)?)),
            vt::F64 => MetaValue::F64(f64::from_le_bytes(self.array(what)?)),
            vt::BOOL => MetaValue::Bool(self.bool(what)?),
            vt::STRING => MetaValue::String(self.string(what)?),
            vt::ARRAY => MetaValue::Array(self.meta_array(depth, what)?),
            other => {
                self.pos -= 4; // report the position of the type field
                return Err(self.err(format!("{what}: unknown value type {other}")));
            }
        })
    }

    fn bool(&mut self, what: &str) -> Result<bool, FormatError> {
        match self.array::<1>(what)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => {
                self.pos -= 1;
                Err(self.err(format!("{what}: invalid bool byte {b}")))
            }
        }
    }

    fn fixed<T, const N: usize>(
        &mut self,
        count: u64,
        what: &str,
        f: impl Fn([u8; N]) -> T,
    ) -> Result<Vec<T>, FormatError> {
        let n = self.bounded_count(count, N, what)?;
        let bytes = self.take(n * N, what)?;
        Ok(bytes
            .chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                f(a)
            })
            .collect())
    }

    fn meta_array(&mut self, depth: u32, what: &str) -> Result<MetaArray, FormatError> {
        use value_type as vt;
        if depth >= MAX_ARRAY_DEPTH {
            return Err(self.err(format!(
                "{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}"
            )));
        }
        let ety = self.u32(what)?;
        let count = self.u64(what)?;
        Ok(match ety {
            vt::U8 => MetaArray::U8(self.fixed(count, what, |a: [u8; 1]| a[0])?),
            vt::I8 => MetaArray::I8(self.fixed(count, what, |a: [u8; 1]| a[0] as i8)?),
            vt::U16 => MetaArray::U16(self.fixed(count, what, u16::from_le_bytes)?),
            vt::I16 => MetaArray::I16(self.fixed(count, what, i16::from_le_bytes)?),
            vt::U32 => MetaArray::U32(self.fixed(count, what, u32::from_le_bytes)?),
            vt::I32 => MetaArray::I32(self.fixed(count, what, i32::from_le_bytes)?),
            vt::U64 => MetaArray::U64(self.fixed(count, what, u64::from_le_bytes)?),
            vt::I64 => MetaArray::I64(self.fixed(count, what, i64::from_le_bytes)?),
            vt::F32 => MetaArray::F32(self.fixed(count, what, f32::from_le_bytes)?),
            vt::F64 => MetaArray::F64(self.fixed(count, what, f64::from_le_bytes)?),
            vt::BOOL => {
                let n = self.bounded_count(count, 1, what)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.bool(what)?);
                }
                MetaArray::Bool(v)
            }
            vt::STRING => {
                // Each string needs at least its 8-byte length prefix.
                let n = self.bounded_count(count, 8, what)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.string(what)?);
                }
                MetaArray::String(v)
            }
            vt::ARRAY => {
                // Each inner array needs at least its type and count fields.
                let n = self.bounded_count(count, 12, what)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.meta_array(depth + 1, what)?);
                }
                MetaArray::Array(v)
            }
            other => {
                self.pos -= 12;
                return Err(self.err(format!("{what}: unknown array element type {other}")));
            }
        })
    }
}

fn parse_header(buf: &[u8], origin: &str) -> Result<Header, FormatError> {
    let mut r = Reader {
        buf,
        pos: 0,
        origin,
    };
    let magic = r.array::<4>("magic")?;
    if &magic != MAGIC {
        r.pos = 0;
        return Err(r.err(format!("bad magic {magic:02x?}, not a GGUF file")));
    }
    let version = r.u32("version")?;
    match version {
        2 | 3 => {}
        1 => return Err(r.err("GGUF version 1 is not supported")),
        v if (1..=3).contains(&v.swap_bytes()) => {
            return Err(r.err("big-endian GGUF files are not supported"));
        }
        v => return Err(r.err(format!("unsupported GGUF version {v}"))),
    }
    let n_tensors = r.u64("tensor count")?;
    let n_kv = r.u64("metadata count")?;
    // Minimum encodings: a KV is key length (8) + type (4) + 1 byte of value;
    // a tensor info is name length (8) + n_dims (4) + type (4) + offset (8).
    let n_kv = r.bounded_count(n_kv, 13, "metadata")?;
    let n_tensors = r.bounded_count(n_tensors, 24, "tensor")?;

    let mut metadata = BTreeMap::new();
    for _ in 0..n_kv {
        let key_pos = r.pos;
        let key = r.string("metadata key")?;
        let ty = r.u32("metadata value type")?;
        let what = format!("value of `{key}`");
        let value = r.value(ty, 0, &what)?;
        if metadata.contains_key(&key) {
            r.pos = key_pos;
            return Err(r.err(format!("duplicate metadata key `{key}`")));
        }
        metadata.insert(key, value);
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u32() {
            Some(a) if a != 0 && a.is_power_of_two() => a as u64,
            _ => {
                return Err(FormatError::WrongType {
                    origin: origin.to_string(),
                    key: "general.alignment".into(),
                    expected: "non-zero power of two u32".into(),
                    found: format!("{v:?}"),
                })
            }
        },
    };

    let mut tensors = Vec::with_capacity(n_tensors);
    let mut seen = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let info_pos = r.pos;
        let name = r.string("tensor name")?;
        let n_dims = r.u32("tensor n_dims")? as usize;
        if n_dims > MAX_DIMS {
            return Err(r.err(format!("tensor `{name}`: {n_dims} dims (max {MAX_DIMS})")));
        }
        let mut dims = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            let d = r.u64("tensor dim")?;
            if d > i64::MAX as u64 {
                return Err(r.err(format!(
                    "tensor `{name}`: dimension {d} is negative/too large"
                )));
            }
            dims.push(d);
        }
        let type_id = r.u32("tensor type")?;
        let ggml_type = GgmlType::from_id(type_id)
            .map_err(|_| r.err(format!("tensor `{name}`: unknown ggml type id {type_id}")))?;
        let offset = r.u64("tensor offset")?;

        let n_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| r.err(format!("tensor `{name}`: element count overflows")))?;
        let ne0 = dims.first().copied().unwrap_or(1);
        if ne0 % ggml_type.block_size() as u64 != 0 {
            return Err(r.err(format!(
                "tensor `{name}`: row length {ne0} is not a multiple of the {ggml_type} block size {}",
                ggml_type.block_size()
            )));
        }
        let n_bytes = ggml_type
            .bytes_for(n_elements)
            .ok_or_else(|| r.err(format!("tensor `{name}`: byte size overflows")))?;
        if offset % alignment != 0 {
            return Err(r.err(format!(
                "tensor `{name}`: offset {offset} is not a multiple of the alignment {alignment}"
            )));
        }
        if seen.insert(name.clone(), i).is_some() {
            r.pos = info_pos;
            return Err(r.err(format!("duplicate tensor name `{name}`")));
        }
        tensors.push(GgufTensorInfo {
            name,
            dims,
            ggml_type,
            offset,
            n_elements,
            n_bytes,
        });
    }

    let header_end = r.pos as u64;
    let data_offset = header_end.div_ceil(alignment) * alignment;
    let file_len = buf.len() as u64;
    if !tensors.is_empty() && data_offset > file_len {
        return Err(r.err(format!(
            "truncated: data section would start at {data_offset} but the file has {file_len} bytes"
        )));
    }
    let data_len = file_len.saturating_sub(data_offset);
    for t in &tensors {
        let end = t.offset.checked_add(t.n_bytes);
        if end.is_none_or(|e| e > data_len) {
            return Err(FormatError::Gguf {
                origin: origin.to_string(),
                offset: header_end,
                msg: format!(
                    "tensor `{}` ({} bytes at data offset {}) extends past the end of the file (data section is {data_len} bytes)",
                    t.name, t.n_bytes, t.offset
                ),
            });
        }
    }

    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}
