//! Reading many log entries at once: the entries asked for are taken in id
//! order, so the entries of one stored frame come together and the frame is
//! read, checked and split once for all of them (a frame holds a run of up
//! to 7 KiB of a published batch, or one larger message, and reading it per
//! entry costs the whole frame each time).

use super::codec::{be, read_be, unseal};
use super::frame;
use super::*;

impl SledStorage {
    /// [`Storage::read_many`]: the entries `ids`, in the order asked.
    pub(super) fn read_entries(&self, topic: &str, ids: &[u64]) -> Result<Vec<Option<Vec<u8>>>> {
        // In id order, so the entries of one frame come together and the
        // frame is read, checked and split once for all of them.
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_by_key(|&i| ids[i]);
        let mut out = vec![None; ids.len()];
        let mut k = 0;
        while k < order.len() {
            let id = ids[order[k]];
            let segment = id / self.segment_entries;
            let frame = match self.segment_if_open(topic, segment)? {
                Some(tree) => tree.range(..=be(id)).next_back().transpose()?,
                None => None,
            };
            let Some((key, value)) = frame else {
                k += 1;
                continue;
            };
            let first = read_be(&key)?;
            let slots = frame::slots(first, unseal(&key, &value)?)?;
            let end = first + slots.len() as u64;
            if id >= end {
                // A gap: not in this frame.
                k += 1;
                continue;
            }
            // Every asked id this frame holds (read_one finds an id in its
            // own segment's tree, so stay within this one).
            while let Some(&j) = order.get(k) {
                let i = ids[j];
                if i >= end || i / self.segment_entries != segment {
                    break;
                }
                // (An id asked twice gets its entry twice.)
                out[j] = slots[(i - first) as usize].1.as_deref().map(<[u8]>::to_vec);
                k += 1;
            }
        }
        Ok(out)
    }
}
