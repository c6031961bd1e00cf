//! hayai-cuda
