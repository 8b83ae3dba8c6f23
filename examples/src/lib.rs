//! Ricochet's runnable examples live in `examples/` of this crate; run one
//! with `cargo run -p ricochet-examples --example NAME`:
//!
//! - `policy_schedule`: the retry schedules of the built-in dead-letter
//!   policies at their defaults.
//!
//! This library is empty; it holds helpers shared by the examples when they
//! need any.
