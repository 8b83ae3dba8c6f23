//! Support for other crates' tests (feature `testing`; always in this
//! crate's own tests): the [`contract`] suite every engine must pass, with
//! [`storage_contract!`](crate::storage_contract) to run it for an engine.
//! The engines' test hooks stay on their types: `SledStorage::damage_entry`
//! (damage a stored entry) and `LogStorage::route_to_log` (keep a topic's
//! entries in the log without a topic record).

pub mod contract;
mod engines;
