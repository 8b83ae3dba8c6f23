//! The `ricochet` binary's end-to-end tests, one binary (one module per former test file).
//! `readme.rs`, which runs every command of the README and the book, stays a binary of its own:
//! the README names it.

mod admin;
mod auth;
mod breaker;
mod cluster;
mod common;
mod dlq;
mod dlq_fix;
mod events;
mod key_order;
mod partitions;
mod perf;
mod policy;
mod pubsub;
mod retention;
mod tiered;
