//! safetensors reader (single file or sharded directory, memory-mapped) and
//! writer.
//!
//! File layout: u64 LE header length `N`, `N` bytes of JSON header
//! (`{"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {..}}`),
//! then the data section; offsets are relative to its start.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::convert::{bf16_to_f32, f16_to_f32};
use crate::FormatError;

/// Largest accepted JSON header (same bound as the reference implementation).
pub const MAX_HEADER_LEN: u64 = 100_000_000;
/// Name of the shard index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Element types of safetensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    Bool,
    U8,
    I8,
    F8E4M3,
    F8E5M2,
    U16,
    I16,
    F16,
    BF16,
    U32,
    I32,
    F32,
    U64,
    I64,
    F64,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        use DType::*;
        match self {
            Bool | U8 | I8 | F8E4M3 | F8E5M2 => 1,
            U16 | I16 | F16 | BF16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 => 8,
        }
    }

    /// The header spelling (`"BF16"`, `"F8_E4M3"`, ...).
    pub fn name(self) -> &'static str {
        use DType::*;
        match self {
            Bool => "BOOL",
            U8 => "U8",
            I8 => "I8",
            F8E4M3 => "F8_E4M3",
            F8E5M2 => "F8_E5M2",
            U16 => "U16",
            I16 => "I16",
            F16 => "F16",
            BF16 => "BF16",
            U32 => "U32",
            I32 => "I32",
            F32 => "F32",
            U64 => "U64",
            I64 => "I64",
            F64 => "F64",
        }
    }

    pub fn from_name(s: &str) -> Option<Self> {
        use DType::*;
        Some(match s {
            "BOOL" => Bool,
            "U8" => U8,
            "I8" => I8,
            "F8_E4M3" => F8E4M3,
            "F8_E5M2" => F8E5M2,
            "U16" => U16,
            "I16" => I16,
            "F16" => F16,
            "BF16" => BF16,
            "U32" => U32,
            "I32" => I32,
            "F32" => F32,
            "U64" => U64,
            "I64" => I64,
            "F64" => F64,
            _ => return None,
        })
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A borrowed tensor of an opened checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorView<'a> {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: &'a [u8],
}

/// `float8_e4m3fn` (no infinities; S.1111.111 is NaN) → f32.
fn f8e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> 3) & 0x0f) as i32;
    let m = (b & 0x07) as f32;
    if e == 0x0f && b & 0x07 == 0x07 {
        return f32::NAN;
    }
    let mag = if e == 0 {
        m / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + m / 8.0) * 2f32.powi(e - 7)
    };
    sign * mag
}

impl TensorView<'_> {
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    fn unsupported(&self, op: &str) -> FormatError {
        FormatError::Unsupported {
            ty: self.dtype.name().into(),
            op: op.into(),
        }
    }

    /// Converts any float, integer or bool tensor to f32 values.
    pub fn to_f32_vec(&self) -> Result<Vec<f32>, FormatError> {
        let d = self.data;
        macro_rules! le {
            ($t:ty, $n:expr) => {
                d.chunks_exact($n)
                    .map(|c| <$t>::from_le_bytes(c.try_into().unwrap()) as f32)
                    .collect()
            };
        }
        Ok(match self.dtype {
            DType::F32 => le!(f32, 4),
            DType::F64 => le!(f64, 8),
            DType::F16 => d
                .chunks_exact(2)
                .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            DType::BF16 => d
                .chunks_exact(2)
                .map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            // E5M2 is the upper byte of an IEEE half.
            DType::F8E5M2 => d.iter().map(|&b| f16_to_f32((b as u16) << 8)).collect(),
            DType::F8E4M3 => d.iter().map(|&b| f8e4m3_to_f32(b)).collect(),
            DType::Bool | DType::U8 => d.iter().map(|&b| b as f32).collect(),
            DType::I8 => d.iter().map(|&b| b as i8 as f32).collect(),
            DType::U16 => le!(u16, 2),
            DType::I16 => le!(i16, 2),
            DType::U32 => le!(u32, 4),
            DType::I32 => le!(i32, 4),
            DType::U64 => le!(u64, 8),
            DType::I64 => le!(i64, 8),
        })
    }

    /// bf16 bit patterns: BF16 as stored, F32/F16 rounded to nearest even.
    pub fn to_bf16_bits(&self) -> Result<Vec<u16>, FormatError> {
        match self.dtype {
            DType::BF16 => Ok(self
                .data
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect()),
            DType::F32 | DType::F16 => Ok(self
                .to_f32_vec()?
                .into_iter()
                .map(crate::convert::f32_to_bf16)
                .collect()),
            _ => Err(self.unsupported("to_bf16_bits")),
        }
    }

    /// Integer tensors (I8..I32, U8, U16, BOOL) as i32; U32 is reinterpreted
    /// bit-for-bit (packed-weight checkpoints store nibbles in I32/U32).
    pub fn to_i32_vec(&self) -> Result<Vec<i32>, FormatError> {
        let d = self.data;
        Ok(match self.dtype {
            DType::I32 => d
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            DType::U32 => d
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as i32)
                .collect(),
            DType::I16 => d
                .chunks_exact(2)
                .map(|c| i16::from_le_bytes([c[0], c[1]]) as i32)
                .collect(),
            DType::U16 => d
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]) as i32)
                .collect(),
            DType::I8 => d.iter().map(|&b| b as i8 as i32).collect(),
            DType::U8 | DType::Bool => d.iter().map(|&b| b as i32).collect(),
            _ => return Err(self.unsupported("to_i32_vec")),
        })
    }

    /// Integer tensors as i64 (U64 values above i64::MAX are an error).
    pub fn to_i64_vec(&self) -> Result<Vec<i64>, FormatError> {
        match self.dtype {
            DType::I64 => Ok(self
                .data
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .collect()),
            DType::U64 => self
                .data
                .chunks_exact(8)
                .map(|c| {
                    i64::try_from(u64::from_le_bytes(c.try_into().unwrap()))
                        .map_err(|_| FormatError::Invalid("U64 value does not fit in i64".into()))
                })
                .collect(),
            DType::U32 => Ok(self
                .data
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as i64)
                .collect()),
            _ => Ok(self.to_i32_vec()?.into_iter().map(i64::from).collect()),
        }
    }
}

enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

struct Shard {
    path: String,
    backing: Backing,
    data_start: usize,
}

impl Shard {
    fn bytes(&self) -> &[u8] {
        match &self.backing {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

#[derive(Clone, Debug)]
struct Entry {
    shard: usize,
    dtype: DType,
    shape: Vec<usize>,
    begin: usize,
    end: usize,
}

/// An opened checkpoint: one or more memory-mapped safetensors files.
pub struct SafeTensors {
    origin: String,
    shards: Vec<Shard>,
    entries: BTreeMap<String, Entry>,
    metadata: BTreeMap<String, String>,
}

impl std::fmt::Debug for SafeTensors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafeTensors")
            .field("origin", &self.origin)
            .field("shards", &self.shards.len())
            .field("tensors", &self.entries.len())
            .finish()
    }
}

fn st_err(origin: &str, msg: impl Into<String>) -> FormatError {
    FormatError::Safetensors {
        origin: origin.to_string(),
        msg: msg.into(),
    }
}

impl SafeTensors {
    /// Opens a `.safetensors` file, or a directory: with
    /// `model.safetensors.index.json` the shards it names, otherwise every
    /// `*.safetensors` file in it.
    pub fn open(path: &Path) -> Result<Self, FormatError> {
        let meta = std::fs::metadata(path).map_err(|e| FormatError::io(path, e))?;
        if meta.is_file() {
            return Self::open_files(&[path.to_path_buf()]);
        }
        let index = path.join(INDEX_FILE);
        if index.is_file() {
            return Self::open_index(&index);
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| FormatError::io(path, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors") && p.is_file())
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(st_err(
                &path.display().to_string(),
                "directory has no *.safetensors files",
            ));
        }
        let mut st = Self::open_files(&files)?;
        st.origin = path.display().to_string();
        Ok(st)
    }

    /// Opens a sharded checkpoint from its index file; every tensor the index
    /// names must be in the shard it names.
    pub fn open_index(index_path: &Path) -> Result<Self, FormatError> {
        let origin = index_path.display().to_string();
        let text =
            std::fs::read_to_string(index_path).map_err(|e| FormatError::io(index_path, e))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| FormatError::Json {
            origin: origin.clone(),
            source: e,
        })?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| st_err(&origin, "index has no `weight_map` object"))?;
        let dir = index_path.parent().unwrap_or(Path::new("."));
        let mut shard_names: Vec<&str> = Vec::new();
        for (tensor, file) in map {
            let file = file.as_str().ok_or_else(|| {
                st_err(&origin, format!("weight_map[`{tensor}`] is not a string"))
            })?;
            // Shards must live next to the index: no paths.
            if file.is_empty() || file.contains(['/', '\\']) || file == "." || file == ".." {
                return Err(st_err(&origin, format!("invalid shard file name `{file}`")));
            }
            if !shard_names.contains(&file) {
                shard_names.push(file);
            }
        }
        shard_names.sort();
        let paths: Vec<PathBuf> = shard_names.iter().map(|n| dir.join(n)).collect();
        let mut st = Self::open_files(&paths)?;
        for (tensor, file) in map {
            let file = file.as_str().unwrap_or_default();
            let ok = st
                .entries
                .get(tensor)
                .is_some_and(|e| st.shards[e.shard].path == dir.join(file).display().to_string());
            if !ok {
                return Err(st_err(
                    &origin,
                    format!("tensor `{tensor}` is not in shard `{file}` as the index says"),
                ));
            }
        }
        if let Some(m) = v.get("metadata").and_then(Value::as_object) {
            for (k, val) in m {
                let s = match val {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                st.metadata.entry(k.clone()).or_insert(s);
            }
        }
        st.origin = origin;
        Ok(st)
    }

    /// Opens and merges the given files (tensor names must be unique).
    pub fn open_files(paths: &[PathBuf]) -> Result<Self, FormatError> {
        let mut shards = Vec::with_capacity(paths.len());
        for p in paths {
            let file = File::open(p).map_err(|e| FormatError::io(p, e))?;
            // SAFETY: read-only mapping; the file must not change while open.
            let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| FormatError::io(p, e))?;
            shards.push((p.display().to_string(), Backing::Mmap(mmap)));
        }
        let origin = paths
            .first()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        Self::build(origin, shards)
    }

    /// Parses an in-memory safetensors image (tests).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, FormatError> {
        Self::build(
            "<memory>".into(),
            vec![("<memory>".into(), Backing::Owned(bytes))],
        )
    }

    fn build(origin: String, files: Vec<(String, Backing)>) -> Result<Self, FormatError> {
        let mut st = SafeTensors {
            origin,
            shards: Vec::with_capacity(files.len()),
            entries: BTreeMap::new(),
            metadata: BTreeMap::new(),
        };
        for (i, (path, backing)) in files.into_iter().enumerate() {
            let mut shard = Shard {
                path,
                backing,
                data_start: 0,
            };
            let (data_start, entries, meta) = parse_header(shard.bytes(), &shard.path, i)?;
            shard.data_start = data_start;
            for (name, e) in entries {
                if st.entries.contains_key(&name) {
                    return Err(st_err(
                        &shard.path,
                        format!("tensor `{name}` appears in more than one file"),
                    ));
                }
                st.entries.insert(name, e);
            }
            for (k, v) in meta {
                st.metadata.entry(k).or_insert(v);
            }
            st.shards.push(shard);
        }
        Ok(st)
    }

    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Tensor names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// `__metadata__` of all files (first file wins on conflicts), plus the
    /// index's `metadata` for sharded checkpoints.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    pub fn get(&self, name: &str) -> Option<TensorView<'_>> {
        let e = self.entries.get(name)?;
        let shard = &self.shards[e.shard];
        let base = shard.data_start;
        Some(TensorView {
            dtype: e.dtype,
            shape: e.shape.clone(),
            data: &shard.bytes()[base + e.begin..base + e.end],
        })
    }

    /// Like [`get`](Self::get) but a missing tensor is an error.
    pub fn require(&self, name: &str) -> Result<TensorView<'_>, FormatError> {
        self.get(name).ok_or_else(|| FormatError::TensorNotFound {
            origin: self.origin.clone(),
            name: name.to_string(),
        })
    }

    /// The file holding `name` (for diagnostics).
    pub fn file_of(&self, name: &str) -> Option<&str> {
        self.entries
            .get(name)
            .map(|e| self.shards[e.shard].path.as_str())
    }
}

type ParsedHeader = (usize, Vec<(String, Entry)>, BTreeMap<String, String>);

fn parse_header(bytes: &[u8], origin: &str, shard: usize) -> Result<ParsedHeader, FormatError> {
    if bytes.len() < 8 {
        return Err(st_err(
            origin,
            format!("file is {} bytes, too short for a header", bytes.len()),
        ));
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    if n > MAX_HEADER_LEN {
        return Err(st_err(
            origin,
            format!("header length {n} exceeds the {MAX_HEADER_LEN}-byte limit"),
        ));
    }
    if n > (bytes.len() - 8) as u64 {
        return Err(st_err(
            origin,
            format!("header length {n} exceeds the file ({} bytes)", bytes.len()),
        ));
    }
    let data_start = 8 + n as usize;
    let header = &bytes[8..data_start];
    let v: Value = serde_json::from_slice(header).map_err(|e| FormatError::Json {
        origin: format!("{origin} (safetensors header)"),
        source: e,
    })?;
    let obj = v
        .as_object()
        .ok_or_else(|| st_err(origin, "header is not a JSON object"))?;
    let data_len = bytes.len() - data_start;
    let mut meta = BTreeMap::new();
    let mut entries = Vec::with_capacity(obj.len());
    for (name, val) in obj {
        if name == "__metadata__" {
            let m = val
                .as_object()
                .ok_or_else(|| st_err(origin, "`__metadata__` is not an object"))?;
            for (k, v) in m {
                let s = v
                    .as_str()
                    .ok_or_else(|| st_err(origin, format!("`__metadata__.{k}` is not a string")))?;
                meta.insert(k.clone(), s.to_string());
            }
            continue;
        }
        entries.push((
            name.clone(),
            parse_entry(name, val, data_len, origin, shard)?,
        ));
    }
    // Tensors must not overlap.
    let mut spans: Vec<(usize, usize, &str)> = entries
        .iter()
        .map(|(n, e)| (e.begin, e.end, n.as_str()))
        .filter(|(b, e, _)| e > b)
        .collect();
    spans.sort();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(st_err(
                origin,
                format!("tensors `{}` and `{}` overlap", w[0].2, w[1].2),
            ));
        }
    }
    Ok((data_start, entries, meta))
}

fn parse_entry(
    name: &str,
    val: &Value,
    data_len: usize,
    origin: &str,
    shard: usize,
) -> Result<Entry, FormatError> {
    let bad = |msg: String| st_err(origin, format!("tensor `{name}`: {msg}"));
    let o = val
        .as_object()
        .ok_or_else(|| bad("entry is not an object".into()))?;
    let dtype_s = o
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("missing `dtype`".into()))?;
    let dtype =
        DType::from_name(dtype_s).ok_or_else(|| bad(format!("unsupported dtype `{dtype_s}`")))?;
    let shape_v = o
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("missing `shape`".into()))?;
    let mut shape = Vec::with_capacity(shape_v.len().min(16));
    for d in shape_v {
        let d = d
            .as_u64()
            .and_then(|d| usize::try_from(d).ok())
            .ok_or_else(|| bad(format!("invalid dimension {d}")))?;
        shape.push(d);
    }
    let offs = o
        .get("data_offsets")
        .and_then(Value::as_array)
        .filter(|a| a.len() == 2)
        .ok_or_else(|| bad("`data_offsets` must be [begin, end]".into()))?;
    let off = |i: usize| {
        offs[i]
            .as_u64()
            .and_then(|x| usize::try_from(x).ok())
            .ok_or_else(|| bad(format!("invalid offset {}", offs[i])))
    };
    let (begin, end) = (off(0)?, off(1)?);
    if begin > end || end > data_len {
        return Err(bad(format!(
            "data_offsets [{begin}, {end}] outside the {data_len}-byte data section"
        )));
    }
    let n_bytes = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .and_then(|n| n.checked_mul(dtype.size()))
        .ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
    if n_bytes != end - begin {
        return Err(bad(format!(
            "shape {shape:?} of {dtype} needs {n_bytes} bytes but data_offsets span {}",
            end - begin
        )));
    }
    Ok(Entry {
        shard,
        dtype,
        shape,
        begin,
        end,
    })
}

/// Streams a safetensors file whose tensor list is known up front: the
/// header is written at creation, then each tensor's bytes in order. Lets a
/// generator write checkpoints larger than memory.
pub struct SafetensorsWriter {
    path: PathBuf,
    out: BufWriter<File>,
    specs: Vec<(String, DType, Vec<usize>, usize)>,
    next: usize,
}

impl SafetensorsWriter {
    /// `specs` lists (name, dtype, shape) in the order the data will follow.
    pub fn create(
        path: &Path,
        specs: &[(String, DType, Vec<usize>)],
        metadata: Option<&BTreeMap<String, String>>,
    ) -> Result<Self, FormatError> {
        let origin = path.display().to_string();
        let mut header = Map::new();
        if let Some(m) = metadata {
            let mm: Map<String, Value> = m
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect();
            header.insert("__metadata__".into(), Value::Object(mm));
        }
        let mut offset = 0usize;
        let mut sized = Vec::with_capacity(specs.len());
        for (name, dtype, shape) in specs {
            if name == "__metadata__" || header.contains_key(name) {
                return Err(st_err(
                    &origin,
                    format!("duplicate or reserved tensor name `{name}`"),
                ));
            }
            let n_bytes = shape
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .and_then(|n| n.checked_mul(dtype.size()))
                .ok_or_else(|| st_err(&origin, format!("tensor `{name}`: shape overflows")))?;
            header.insert(
                name.clone(),
                serde_json::json!({
                    "dtype": dtype.name(),
                    "shape": shape,
                    "data_offsets": [offset, offset + n_bytes],
                }),
            );
            offset += n_bytes;
            sized.push((name.clone(), *dtype, shape.clone(), n_bytes));
        }
        let mut json =
            serde_json::to_vec(&Value::Object(header)).map_err(|e| FormatError::Json {
                origin: origin.clone(),
                source: e,
            })?;
        // Pad with spaces so the data section starts 8-byte aligned.
        while json.len() % 8 != 0 {
            json.push(b' ');
        }
        let file = File::create(path).map_err(|e| FormatError::io(path, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&(json.len() as u64).to_le_bytes())
            .and_then(|_| out.write_all(&json))
            .map_err(|e| FormatError::io(path, e))?;
        Ok(SafetensorsWriter {
            path: path.to_path_buf(),
            out,
            specs: sized,
            next: 0,
        })
    }

    /// Writes the data of the next tensor; `name` must match the spec order.
    pub fn write_tensor(&mut self, name: &str, data: &[u8]) -> Result<(), FormatError> {
        let origin = self.path.display().to_string();
        let (exp_name, _, _, n_bytes) = self
            .specs
            .get(self.next)
            .ok_or_else(|| st_err(&origin, format!("tensor `{name}` was not declared")))?;
        if exp_name != name {
            return Err(st_err(
                &origin,
                format!("expected tensor `{exp_name}`, got `{name}`"),
            ));
        }
        if data.len() != *n_bytes {
            return Err(st_err(
                &origin,
                format!(
                    "tensor `{name}`: {} bytes given, shape needs {n_bytes}",
                    data.len()
                ),
            ));
        }
        self.out
            .write_all(data)
            .map_err(|e| FormatError::io(&self.path, e))?;
        self.next += 1;
        Ok(())
    }

    /// Flushes the file; every declared tensor must have been written.
    pub fn finish(mut self) -> Result<(), FormatError> {
        if self.next != self.specs.len() {
            return Err(st_err(
                &self.path.display().to_string(),
                format!(
                    "only {} of {} declared tensors were written",
                    self.next,
                    self.specs.len()
                ),
            ));
        }
        self.out.flush().map_err(|e| FormatError::io(&self.path, e))
    }
}

/// Writes a safetensors file readable by the Python `safetensors` package.
pub fn write_safetensors(
    path: &Path,
    tensors: &[(String, DType, Vec<usize>, &[u8])],
    metadata: Option<BTreeMap<String, String>>,
) -> Result<(), FormatError> {
    let specs: Vec<_> = tensors
        .iter()
        .map(|(n, d, s, _)| (n.clone(), *d, s.clone()))
        .collect();
    let mut w = SafetensorsWriter::create(path, &specs, metadata.as_ref())?;
    for (name, _, _, data) in tensors {
        w.write_tensor(name, data)?;
    }
    w.finish()
}
