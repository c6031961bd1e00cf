//! File formats: GGUF, safetensors, HF config.json; dequantization.
//!
//! * [`gguf`]: bounded, validated GGUF v2/v3 reader over a memory map
//!   ([`GgufFile`]), plus [`GgufWriter`] for fixtures and synthetic files.
//! * [`dequant`]: ggml types to f32, bit-exact to ggml's reference code.
//! * [`safetensors`]: single-file or sharded checkpoints ([`SafeTensors`]) and
//!   a streaming writer.
//! * [`config`]: generic HF `config.json` access ([`HfConfig`]).
//! * [`convert`]: f16/bf16 scalar conversions; [`hash`]: SHA-256 of files.
//!
//! Every malformed input yields a [`FormatError`] naming the file and the
//! key, tensor or byte offset involved.

pub mod cache;
pub mod config;
pub mod convert;
pub mod dequant;
pub mod error;
pub mod ggml_type;
pub mod gguf;
pub mod gguf_writer;
pub mod hash;
pub mod safetensors;

pub use config::{ConfigView, HfConfig};
pub use dequant::{dequantize, tensor_f32};
pub use error::FormatError;
pub use ggml_type::GgmlType;
pub use gguf::{GgufFile, GgufTensorInfo, MetaArray, MetaValue};
pub use gguf_writer::GgufWriter;
pub use safetensors::{write_safetensors, DType, SafeTensors, TensorView};
