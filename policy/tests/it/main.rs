//! The policy crate's property tests, one binary (one module per former test file).

mod breaker;
mod properties;
