//! Helpers that Ricochet's tests and benches share, so that no crate
//! rebuilds its own: a broker in this process ([`InProcessBroker`]) or as a
//! child process ([`BrokerProcess`], with SIGKILL, SIGTERM, SIGSTOP and
//! SIGCONT), the broker binary's location from any crate ([`broker_bin`]),
//! loopback ports ([`free_addr`]), wall clocks ([`now_ms`], [`now_us`]), a
//! producer and consumer speaking the gRPC protocol directly ([`raw`]),
//! calls carrying any bytes at all ([`wire`]), etcd with a cluster of
//! broker processes for cluster tests ([`etcd`]), an S3-compatible server for
//! tiered storage ([`moto`]), a stand-in for a cluster's lookup service
//! ([`FakeCluster`]), a TCP proxy that delays, cuts one direction or drops
//! connections ([`FaultProxy`]), a checker of what a run with faults confirmed against
//! where its messages ended ([`history`]), and the README and book pages with their code blocks
//! and links ([`docs`]).
//!
//! A dev-dependency only: everything here panics on failure, as a test
//! wants, unless its name says otherwise (`find_broker_bin`).

pub mod clock;
pub mod docs;
pub mod etcd;
pub mod fake_cluster;
pub mod fault_proxy;
pub mod history;
pub mod in_process;
pub mod moto;
pub mod net;
pub mod process;
pub mod raw;
pub mod wire;

pub use clock::{now_ms, now_us};
pub use etcd::{ClusterBroker, EtcdProcess, etcd_or_skip, spawn_cluster, spawn_cluster_each};
pub use fake_cluster::{FakeAnswer, FakeCluster};
pub use fault_proxy::{Direction, FaultProxy};
pub use history::{History, Place, Violation};
pub use in_process::InProcessBroker;
pub use moto::{MotoServer, moto_or_skip};
pub use net::free_addr;
pub use process::{
    BrokerBinNotFound, BrokerProcess, SpawnOptions, broker_bin, find_broker_bin, listening_addr,
};
