//! Reads of segments whose local copy is gone: the object's footer (the
//! sparse index) once, then ranged GETs of whole blocks (`block_bytes`,
//! aligned), cached in the bounded LRU ([`super::cache`]); every record is
//! checked against its CRC-32C before an entry of it is served, and a
//! mismatch, a missing object or a bad footer is
//! [`StorageError::Corrupt`] (DATA_LOSS to a client), never a shorter
//! answer.

use super::object::{self, Index};
use super::{SegmentState, Tiered};
use crate::segments::record::{RECORD_HEADER_LEN, RecordHeader};
use crate::segments::segment;
use crate::{StorageError, StorageResult as Result};
use object_store::path::Path as ObjectPath;
use std::sync::Arc;
use std::time::Instant;

fn damaged(s: &SegmentState, why: impl std::fmt::Display) -> StorageError {
    StorageError::Corrupt(format!(
        "log of {}: offloaded segment {} (object {}): {why}",
        s.topic, s.first, s.key
    ))
}

impl Tiered {
    /// GETs `range` of `s`'s object on the store's runtime.
    fn get_range(&self, s: &SegmentState, range: std::ops::Range<u64>) -> Result<Vec<u8>> {
        let store = self.store.clone();
        let path = ObjectPath::from(s.key.as_str());
        let len = range.end - range.start;
        let started = Instant::now();
        let got = self.block(async move { store.get_range(&path, range).await })?;
        match got {
            Ok(b) if b.len() as u64 == len => {
                metrics::counter!("ricochet_tiered_read_bytes_total").increment(len);
                metrics::histogram!("ricochet_tiered_read_seconds")
                    .record(started.elapsed().as_secs_f64());
                Ok(b.to_vec())
            }
            Ok(b) => Err(damaged(
                s,
                format!("a range of {len} bytes came back as {}", b.len()),
            )),
            Err(object_store::Error::NotFound { .. }) => {
                Err(damaged(s, "the object is missing from the object store"))
            }
            Err(e) => {
                metrics::counter!("ricochet_tiered_read_errors_total").increment(1);
                Err(StorageError::Remote(format!("reading {}: {e}", s.key)))
            }
        }
    }

    /// The object's sparse index (its footer, fetched once and cached).
    fn index_of(&self, s: &SegmentState) -> Result<Arc<Index>> {
        let key: Arc<str> = Arc::from(s.key.as_str());
        if let Some(i) = crate::util::lock(&self.cache).index(&key) {
            return Ok(i);
        }
        if s.object_size < s.file_len + object::TRAILER_LEN as u64 {
            return Err(damaged(s, "its recorded size is too small"));
        }
        // One GET for the trailer and, most often, the whole index.
        let guess = (s.object_size - s.file_len).min(64 * 1024);
        let tail = self.get_range(s, s.object_size - guess..s.object_size)?;
        let trailer = &tail[tail.len() - object::TRAILER_LEN..];
        let footer_len = object::footer_len(trailer, s.file_len).map_err(|e| damaged(s, e))?;
        if footer_len as u64 != s.object_size - s.file_len {
            return Err(damaged(s, "its footer does not end the segment"));
        }
        let footer = if footer_len <= tail.len() {
            tail[tail.len() - footer_len..].to_vec()
        } else {
            self.get_range(s, s.file_len..s.object_size)?
        };
        let index = Arc::new(object::parse_footer(&footer).map_err(|e| damaged(s, e))?);
        crate::util::lock(&self.cache).put_index(key, index.clone());
        Ok(index)
    }

    /// Bytes `at..at + len` of the segment file inside `s`'s object,
    /// through the block cache (missing blocks fetched in one GET).
    fn bytes_at(&self, s: &SegmentState, at: u64, len: u64) -> Result<Vec<u8>> {
        let end = at + len;
        if end > s.file_len {
            return Err(damaged(s, format!("a record runs past its end at {at}")));
        }
        let b = self.config.block_bytes;
        let key: Arc<str> = Arc::from(s.key.as_str());
        let (first, last) = (at / b, (end - 1) / b);
        let mut blocks = Vec::with_capacity((last - first + 1) as usize);
        {
            let mut cache = crate::util::lock(&self.cache);
            for n in first..=last {
                blocks.push(cache.block(&key, n));
            }
        }
        if let (Some(lo), Some(hi)) = (
            blocks.iter().position(Option::is_none),
            blocks.iter().rposition(Option::is_none),
        ) {
            let (lo_n, hi_n) = (first + lo as u64, first + hi as u64);
            let range = lo_n * b..((hi_n + 1) * b).min(s.file_len);
            let fetched = self.get_range(s, range.clone())?;
            let mut cache = crate::util::lock(&self.cache);
            for n in lo_n..=hi_n {
                let from = ((n * b) - range.start) as usize;
                let to = (((n + 1) * b).min(s.file_len) - range.start) as usize;
                let block = Arc::new(fetched[from..to].to_vec());
                cache.put_block(key.clone(), n, block.clone());
                blocks[(n - first) as usize] = Some(block);
            }
            metrics::gauge!("ricochet_tiered_cache_bytes").set(cache.bytes() as f64);
        } else {
            metrics::counter!("ricochet_tiered_cache_hits_total").increment(1);
        }
        let mut out = Vec::with_capacity(len as usize);
        for (i, block) in blocks.into_iter().enumerate() {
            let Some(block) = block else {
                return Err(damaged(s, "a block was not fetched"));
            };
            let n = first + i as u64;
            let from = at.max(n * b) - n * b;
            let to = end.min((n + 1) * b) - n * b;
            out.extend_from_slice(&block[from as usize..to as usize]);
        }
        Ok(out)
    }

    /// Appends to `out` entries `>= from` of `s`, until `max` entries or
    /// `max_bytes` (counted in `bytes`); returns whether it stopped there.
    fn read_segment(
        &self,
        s: &SegmentState,
        from: u64,
        max: usize,
        max_bytes: usize,
        out: &mut Vec<(u64, Vec<u8>)>,
        bytes: &mut usize,
    ) -> Result<bool> {
        let index = self.index_of(s)?;
        let mut pos = object::offset_for(&index, from);
        while pos < s.file_len {
            let head = self.bytes_at(s, pos, RECORD_HEADER_LEN as u64)?;
            let head: [u8; RECORD_HEADER_LEN] = head
                .as_slice()
                .try_into()
                .map_err(|_| damaged(s, "short record header"))?;
            let header = RecordHeader::decode(&head)
                .ok_or_else(|| damaged(s, format!("offset {pos}: no record header")))?;
            let len = header.len();
            if header.next_id() <= from {
                pos += len;
                continue;
            }
            let rec = self.bytes_at(s, pos, len)?;
            object::record_at(&rec, 0).map_err(|e| damaged(s, format!("at {pos}: {e}")))?;
            let body = &rec[RECORD_HEADER_LEN..];
            for (id, entry) in segment::entries_of(&header, body)? {
                if id < from {
                    continue;
                }
                *bytes += entry.len();
                out.push((id, entry.to_vec()));
                if out.len() >= max || *bytes >= max_bytes {
                    return Ok(true);
                }
            }
            pos += len;
        }
        Ok(false)
    }

    /// Up to `max` entries `>= from` from the remote-only segments (as
    /// [`crate::Storage::read`]); `bytes` counts what was read.
    pub fn read(
        &self,
        topic: &str,
        from: u64,
        max: usize,
        max_bytes: usize,
        bytes: &mut usize,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        let mut out = Vec::new();
        if max == 0 {
            return Ok(out);
        }
        for s in self.remote(topic).iter().filter(|s| s.next > from) {
            if self.read_segment(s, from, max, max_bytes, &mut out, bytes)? {
                break;
            }
        }
        Ok(out)
    }

    /// The entries `ids` held by remote-only segments (`None` for others).
    pub fn read_many(&self, topic: &str, ids: &[u64]) -> Result<Vec<Option<Vec<u8>>>> {
        let remote = self.remote(topic);
        let mut out = Vec::with_capacity(ids.len());
        for &id in ids {
            let seg = remote.iter().find(|s| s.first <= id && id < s.next);
            let found = match seg {
                Some(s) => {
                    let mut got = Vec::new();
                    self.read_segment(s, id, 1, usize::MAX, &mut got, &mut 0)?;
                    got.pop().filter(|(i, _)| *i == id).map(|(_, e)| e)
                }
                None => None,
            };
            out.push(found);
        }
        Ok(out)
    }
}
