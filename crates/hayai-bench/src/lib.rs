//! hayai-bench
