//! Helpers of the replicated-partition tests.

pub mod cluster;
