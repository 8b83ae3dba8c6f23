//! Ricochet's runnable examples live in `examples/` of this crate; run one
//! with `cargo run -p ricochet-examples --example NAME`:
//!
//! - `policy_schedule`: the retry schedules of the built-in dead-letter
//!   policies at their defaults.
//! - `quickstart`: produce ten messages, consume and ack them (needs a
//!   broker at `RICOCHET_URL`, default `http://127.0.0.1:6650`).
//! - `nack_backoff`: a consumer failing one message three times under a
//!   multiplier backoff, printing each redelivery's delay and count.
//! - `retry_walkthrough`: one message failed with `reconsume_later` under
//!   delay levels on a millisecond table, each attempt's time, delay and
//!   tier, then its dead-letter entry and history from the admin API.
//! - `dlq_inspect`: list, inspect, replay (by reason, count reset,
//!   rate-limited) and purge dead letters from code.
//!
//! This library is empty; it holds helpers shared by the examples when they
//! need any.
