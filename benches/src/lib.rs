//! Ricochet's criterion benchmarks live in `benches/` of this crate, one
//! file per area (`policy.rs`: the cost of a dead-letter decision and of
//! explaining a schedule). This library is empty; it holds helpers shared by
//! the benchmarks when they need any.
//!
//! Run one with `cargo bench -p ricochet-benches --bench policy`.
