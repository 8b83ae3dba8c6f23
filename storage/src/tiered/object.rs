//! The bytes of an offloaded segment's object: the segment file as it is
//! on disk (header and records, each record with its CRC-32C), followed
//! by a footer holding a sparse index, so a read fetches the footer once
//! and then only the range of records it needs:
//!
//! ```text
//! segment file bytes (file_len) | points × (first_id u64, offset u64)
//! | points u32 | file_len u64 | crc32c u32 (of the index and the two fields) | "RCTIX001"
//! ```
//!
//! all little-endian. The object as a whole is checksummed (CRC-32C) when
//! it is written and read back once to verify it; every record read later
//! is checked against its own CRC.

use crate::segments::record::{FILE_HEADER_LEN, RECORD_HEADER_LEN, RecordHeader};

/// Last bytes of every object.
const MAGIC: &[u8; 8] = b"RCTIX001";
/// Bytes after the index points.
pub const TRAILER_LEN: usize = 4 + 8 + 4 + 8;
/// Bytes of records between two index points.
const INDEX_EVERY: u64 = 64 * 1024;

/// The sparse index of an object: (first entry id of a record, offset).
pub type Index = Vec<(u64, u64)>;

/// The object for a segment file's `bytes`: the bytes, then the footer.
/// `Err` if a record does not check out (the local copy is damaged).
pub fn build(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut index: Index = Vec::new();
    let mut pos = FILE_HEADER_LEN as usize;
    while pos < bytes.len() {
        let (header, len) = record_at(bytes, pos)?;
        if index
            .last()
            .is_none_or(|(_, o)| pos as u64 - o >= INDEX_EVERY)
        {
            index.push((header.first_id, pos as u64));
        }
        pos += len;
    }
    let mut out = Vec::with_capacity(bytes.len() + index.len() * 16 + TRAILER_LEN);
    out.extend_from_slice(bytes);
    let footer_at = out.len();
    for (id, off) in &index {
        out.extend_from_slice(&id.to_le_bytes());
        out.extend_from_slice(&off.to_le_bytes());
    }
    out.extend_from_slice(&(index.len() as u32).to_le_bytes());
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    let crc = crc32c::crc32c(&out[footer_at..]);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(MAGIC);
    Ok(out)
}

/// The record at `pos` of `bytes`, checked: its header and length.
pub fn record_at(bytes: &[u8], pos: usize) -> Result<(RecordHeader, usize), String> {
    let head: &[u8; RECORD_HEADER_LEN] = bytes
        .get(pos..pos + RECORD_HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(|| format!("offset {pos}: the data ends inside a record header"))?;
    let header =
        RecordHeader::decode(head).ok_or_else(|| format!("offset {pos}: no record header"))?;
    let len = header.len() as usize;
    let body = bytes
        .get(pos + RECORD_HEADER_LEN..pos + len)
        .ok_or_else(|| format!("offset {pos}: the data ends inside a record"))?;
    if !header.matches(body) {
        return Err(format!("offset {pos}: record checksum mismatch"));
    }
    Ok((header, len))
}

/// How many bytes at the end of an object of `object_len` bytes hold the
/// footer, given its trailer (the last [`TRAILER_LEN`] bytes); checks the
/// magic and that the file length is `file_len`.
pub fn footer_len(trailer: &[u8], file_len: u64) -> Result<usize, String> {
    if trailer.len() != TRAILER_LEN || &trailer[16..] != MAGIC {
        return Err("no tiered-object trailer".into());
    }
    let points = u32::from_le_bytes(trailer[..4].try_into().map_err(|_| "short")?) as usize;
    let len = u64::from_le_bytes(trailer[4..12].try_into().map_err(|_| "short")?);
    if len != file_len {
        return Err(format!(
            "the object holds a segment of {len} bytes, {file_len} were offloaded"
        ));
    }
    Ok(points * 16 + TRAILER_LEN)
}

/// Parses and checks a footer (the last `footer_len` bytes).
pub fn parse_footer(footer: &[u8]) -> Result<Index, String> {
    let crc_at = footer.len() - 12;
    let crc = u32::from_le_bytes(footer[crc_at..crc_at + 4].try_into().map_err(|_| "short")?);
    if crc32c::crc32c(&footer[..crc_at]) != crc {
        return Err("footer checksum mismatch".into());
    }
    let points = (footer.len() - TRAILER_LEN) / 16;
    Ok((0..points)
        .map(|i| {
            let p = &footer[i * 16..i * 16 + 16];
            let mut a = [0u8; 8];
            let mut b = [0u8; 8];
            a.copy_from_slice(&p[..8]);
            b.copy_from_slice(&p[8..]);
            (u64::from_le_bytes(a), u64::from_le_bytes(b))
        })
        .collect())
}

/// The offset to read from for entries `>= id`.
pub fn offset_for(index: &Index, id: u64) -> u64 {
    match index.partition_point(|(first, _)| *first <= id) {
        0 => FILE_HEADER_LEN,
        i => index[i - 1].1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segments::record::{self, FileHeader};

    fn segment(records: u64, entry: usize) -> Vec<u8> {
        let mut b = FileHeader {
            first: 0,
            prev_next: 0,
            created_ms: 1,
            seq: 0,
        }
        .encode()
        .to_vec();
        for i in 0..records {
            b.extend(record::encode(i * 2, &[vec![1u8; entry], vec![2u8; entry]]));
        }
        b
    }

    #[test]
    fn the_footer_indexes_records_and_checks_itself() {
        let file = segment(100, 2000);
        let obj = build(&file).unwrap();
        let trailer = &obj[obj.len() - TRAILER_LEN..];
        let n = footer_len(trailer, file.len() as u64).unwrap();
        let index = parse_footer(&obj[obj.len() - n..]).unwrap();
        assert!(index.len() > 2, "{index:?}");
        // Every point is a record start.
        for (id, off) in &index {
            let (h, _) = record_at(&obj, *off as usize).unwrap();
            assert_eq!(h.first_id, *id);
        }
        let off = offset_for(&index, 150) as usize;
        let (h, _) = record_at(&obj, off).unwrap();
        assert!(h.first_id <= 150);
        // Damage to the footer is found; so is a wrong length.
        let mut bad = obj.clone();
        let at = bad.len() - n + 3;
        bad[at] ^= 1;
        assert!(parse_footer(&bad[bad.len() - n..]).is_err());
        assert!(footer_len(trailer, 5).is_err());
        // A damaged record refuses the build.
        let mut bad = file.clone();
        bad[FILE_HEADER_LEN as usize + 40] ^= 1;
        assert!(build(&bad).unwrap_err().contains("checksum"));
    }
}
