//! Allocator replica library.
#[cfg(feature = "testkit")]
pub mod testkit;
