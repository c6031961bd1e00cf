//! hayai-server
