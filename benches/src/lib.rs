//! Ricochet's criterion benchmarks live in `benches/` of this crate, one
//! file per area (`policy.rs`: the cost of a dead-letter decision and of
//! explaining a schedule). This library holds what the benchmarks share: the
//! allocator of those that set one ([`allocator`]: jemalloc by default,
//! mimalloc with `--no-default-features`).
//!
//! Run one with `cargo bench -p ricochet-benches --bench policy`.

pub mod allocator;
