//! Gemma model definitions and the CPU reference forward.
//!
//! Nothing here knows about CUDA: the GPU backend reads the same [`spec::ModelSpec`] and
//! [`weights::ModelWeights`] and is tested against [`cpu`] (the executable specification).

pub mod assistant;
pub mod cpu;
pub mod error;
pub mod gemma4;
pub mod ggml;
pub mod load;
pub mod random;
pub mod runner;
pub mod spec;
pub mod synth;
pub mod weights;

pub use error::ModelError;
pub use runner::{argmax, Rows, Runner, RunnerInfo};
pub use spec::{Arch, LayerSpec, ModelSpec, PleSpec, RopeSpec};
pub use weights::{Matrix, Model, ModelWeights};
