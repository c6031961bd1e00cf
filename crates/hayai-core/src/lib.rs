//! File formats: GGUF, safetensors, HF config.json; dequantization.

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
