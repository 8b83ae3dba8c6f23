//! Ricochet's cluster mode, apart from the broker.
//!
//! For now this crate holds the generated client of etcd's v3 API
//! ([`proto`]), compiled by its own `build.rs`.

/// A minimal client of etcd's v3 API (KV Range/Put/DeleteRange/Txn and
/// the Lease calls), generated from Ricochet's own subset of etcd's
/// `rpc.proto` and `kv.proto` (same names and field numbers).
pub mod proto {
    /// etcd's `etcdserverpb` package: requests, responses, `kv_client` and
    /// `lease_client`.
    pub mod etcdserverpb {
        #![allow(clippy::all, missing_docs, missing_debug_implementations)]
        include!(concat!(env!("OUT_DIR"), "/etcdserverpb.rs"));
    }
    /// etcd's `mvccpb` package: [`mvccpb::KeyValue`].
    pub mod mvccpb {
        #![allow(clippy::all, missing_docs, missing_debug_implementations)]
        include!(concat!(env!("OUT_DIR"), "/mvccpb.rs"));
    }
    pub use etcdserverpb::*;
    pub use mvccpb::KeyValue;
}
