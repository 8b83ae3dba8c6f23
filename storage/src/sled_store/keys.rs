//! How the sled engine names its trees and keys: segment trees
//! (`seg/<topic>/<segment, hex>`), and the keys of subscriptions, grants,
//! retention policies (in `meta`) and dead letters.

use super::codec::be;

/// Segment trees are named `seg/<topic>/<n>`.
pub(super) const SEG_PREFIX: &str = "seg/";

/// Grants live in `meta` under `g:<role>\0<resource>` (a role or resource
/// never holds a NUL).
pub(super) const GRANT_PREFIX: &[u8] = b"g:";
/// Retention policies, keyed by namespace or topic name.
pub(super) const RETENTION_PREFIX: &[u8] = b"r:";

/// Tiered storage's records (offload states and policies), as JSON:
/// `o:s:<topic>\0<first>` and `o:p:<target>` (`storage::tiered`).
pub(super) const TIERED_PREFIX: &[u8] = b"o:";

pub(super) fn retention_key(target: &str) -> Vec<u8> {
    let mut k = RETENTION_PREFIX.to_vec();
    k.extend_from_slice(target.as_bytes());
    k
}

pub(super) fn grant_key(role: &str, resource: &str) -> Vec<u8> {
    let mut k = GRANT_PREFIX.to_vec();
    k.extend_from_slice(role.as_bytes());
    k.push(0);
    k.extend_from_slice(resource.as_bytes());
    k
}

pub(super) fn sub_key(topic: &str, sub: &str) -> Vec<u8> {
    format!("s:{topic}\0{sub}").into_bytes()
}

pub(super) fn seg_tree_name(topic: &str, seg: u64) -> String {
    format!("{SEG_PREFIX}{topic}/{seg:016x}")
}

pub(super) fn parse_seg_tree_name(name: &[u8]) -> Option<(String, u64)> {
    let name = std::str::from_utf8(name).ok()?.strip_prefix(SEG_PREFIX)?;
    let (topic, seg) = name.rsplit_once('/')?;
    Some((topic.to_owned(), u64::from_str_radix(seg, 16).ok()?))
}

pub(super) fn dl_key(sub_id: u64, entry: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&be(sub_id));
    k[8..].copy_from_slice(&be(entry));
    k
}
