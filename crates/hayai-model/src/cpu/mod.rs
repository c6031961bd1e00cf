//! The CPU reference backend: plain f32 math, multithreaded with rayon.

pub mod simd;
