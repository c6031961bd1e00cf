//! Minimal GGUF writer, used to build test fixtures and small synthetic files.

use std::path::Path;

use crate::ggml_type::GgmlType;
use crate::gguf::{value_type as vt, MetaArray, MetaValue, DEFAULT_ALIGNMENT};
use crate::FormatError;

/// Builds a GGUF (v3 by default) image in memory.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        GgufWriter {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// GGUF version to write (2 and 3 share one encoding).
    pub fn version(mut self, v: u32) -> Self {
        self.version = v;
        self
    }

    /// Adds a metadata entry; `general.alignment` (u32) also sets the
    /// alignment used for tensor data.
    pub fn meta(mut self, key: &str, value: MetaValue) -> Self {
        if key == "general.alignment" {
            if let Some(a) = value.as_u64().filter(|a| a.is_power_of_two()) {
                self.alignment = a;
            }
        }
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Adds a tensor. `dims` are in ggml order (ne0 first); `data` must hold
    /// exactly the tensor's bytes.
    pub fn tensor(mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> Self {
        self.tensors
            .push((name.to_string(), dims.to_vec(), ty, data));
        self
    }

    /// Serializes the file.
    pub fn to_bytes(&self) -> Result<Vec<u8>, FormatError> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut out, k);
            out.extend_from_slice(&value_type_id(v).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for (name, dims, ty, data) in &self.tensors {
            let n: u64 = dims.iter().product();
            if ty.bytes_for(n) != Some(data.len() as u64) {
                return Err(FormatError::Invalid(format!(
                    "GgufWriter: tensor `{name}` has {} bytes, expected {:?} for {n} {ty} elements",
                    data.len(),
                    ty.bytes_for(n)
                )));
            }
            put_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len() as u64).div_ceil(self.alignment) * self.alignment;
        }
        if !self.tensors.is_empty() {
            pad_to(&mut out, self.alignment);
            let base = out.len();
            for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
                out.resize(base + off as usize, 0);
                out.extend_from_slice(data);
            }
            pad_to(&mut out, self.alignment);
        }
        Ok(out)
    }

    /// Writes the file to `path`.
    pub fn write(&self, path: &Path) -> Result<(), FormatError> {
        let bytes = self.to_bytes()?;
        std::fs::write(path, bytes).map_err(|e| FormatError::io(path, e))
    }
}

fn pad_to(out: &mut Vec<u8>, alignment: u64) {
    let len = (out.len() as u64).div_ceil(alignment) * alignment;
    out.resize(len as usize, 0);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn value_type_id(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => vt::U8,
        MetaValue::I8(_) => vt::I8,
        MetaValue::U16(_) => vt::U16,
        MetaValue::I16(_) => vt::I16,
        MetaValue::U32(_) => vt::U32,
        MetaValue::I32(_) => vt::I32,
        MetaValue::U64(_) => vt::U64,
        MetaValue::I64(_) => vt::I64,
        MetaValue::F32(_) => vt::F32,
        MetaValue::F64(_) => vt::F64,
        MetaValue::Bool(_) => vt::BOOL,
        MetaValue::String(_) => vt::STRING,
        MetaValue::Array(_) => vt::ARRAY,
    }
}

fn array_elem_type_id(a: &MetaArray) -> u32 {
    match a {
        MetaArray::U8(_) => vt::U8,
        MetaArray::I8(_) => vt::I8,
        MetaArray::U16(_) => vt::U16,
        MetaArray::I16(_) => vt::I16,
        MetaArray::U32(_) => vt::U32,
        MetaArray::I32(_) => vt::I32,
        MetaArray::U64(_) => vt::U64,
        MetaArray::I64(_) => vt::I64,
        MetaArray::F32(_) => vt::F32,
        MetaArray::F64(_) => vt::F64,
        MetaArray::Bool(_) => vt::BOOL,
        MetaArray::String(_) => vt::STRING,
        MetaArray::Array(_) => vt::ARRAY,
    }
}

fn put_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.push(*x as u8),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(*x as u8),
        MetaValue::String(s) => put_str(out, s),
        MetaValue::Array(a) => put_array(out, a),
    }
}

fn put_array(out: &mut Vec<u8>, a: &MetaArray) {
    out.extend_from_slice(&array_elem_type_id(a).to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    match a {
        MetaArray::U8(v) => out.extend_from_slice(v),
        MetaArray::I8(v) => out.extend(v.iter().map(|x| *x as u8)),
        MetaArray::U16(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        MetaArray::I16(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        MetaArray::U32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        MetaArray::I32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        MetaArray::U64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        MetaArray::I64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        MetaArray::F32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        MetaArray::F64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        MetaArray::Bool(v) => out.extend(v.iter().map(|x| *x as u8)),
        MetaArray::String(v) => v.iter().for_each(|s| put_str(out, s)),
        MetaArray::Array(v) => v.iter().for_each(|inner| put_array(out, inner)),
    }
}
