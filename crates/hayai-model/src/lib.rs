//! Gemma model definitions and the CPU reference forward.
//!
//! Nothing here knows about CUDA: the GPU backend reads the same [`spec::ModelSpec`] and weights
//! and is tested against [`cpu`] (the executable specification).

pub mod error;
pub mod runner;

pub use error::ModelError;
pub use runner::{argmax, Rows, Runner, RunnerInfo};
