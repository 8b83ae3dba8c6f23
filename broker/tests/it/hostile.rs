//! The hostile-input suite: what no well-behaved client sends, on every RPC.
//! Arbitrary and truncated frames (generated with proptest), hostile field
//! values, and floods beyond the configured limits. Every case asserts the
//! exact status the broker answers with, that the broker still serves (a
//! health check and a normal publish), and that the state a client can see
//! did not change where it must not. No case may panic the broker.

use crate::common;
#[path = "hostile/extremes.rs"]
mod extremes;
#[path = "hostile/fields.rs"]
mod fields;
#[path = "hostile/floods.rs"]
mod floods;
#[path = "hostile/frames.rs"]
mod frames;
#[path = "hostile/support.rs"]
mod support;
