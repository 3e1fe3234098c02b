//! Test harness (filled in).
