//! The CPU reference backend: plain f32 math, multithreaded with rayon.

pub mod forward;
pub mod ops;
pub mod simd;

pub use forward::{nudge, CpuRunner, MatmulInputs};
