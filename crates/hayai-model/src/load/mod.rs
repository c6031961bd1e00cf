//! Loading a [`Model`] from a GGUF file or a Hugging Face model directory.

pub mod gguf;
pub mod hf;

use std::path::Path;

use crate::weights::Model;
use crate::ModelError;

/// Load a model from a `.gguf` file or an HF directory (config.json + safetensors).
pub fn load_model(path: &Path) -> Result<Model, ModelError> {
    if !path.exists() {
        return Err(ModelError::Io {
            path: path.display().to_string(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
        });
    }
    let model = if path.is_dir() {
        hf::load_hf_dir(path)?
    } else {
        gguf::load_gguf(path)?
    };
    model.spec.validate().map_err(ModelError::Config)?;
    Ok(model)
}

/// Sanity check of a tensor's shape against what the spec implies.
pub(crate) fn expect_shape(name: &str, got: &[usize], want: &[usize]) -> Result<(), ModelError> {
    if got != want {
        return Err(ModelError::Shape {
            name: name.to_string(),
            got: got.to_vec(),
            want: want.to_vec(),
        });
    }
    Ok(())
}
