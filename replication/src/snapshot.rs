//! Snapshot files of a group on one node, and the framing of their
//! content.
//!
//! A snapshot is one file, `<snapshot dir>/<group dir>/<snapshot id>.snap`:
//! a sequence of frames, each `[length: u32 LE][crc32c: u32 LE][bytes]`,
//! whose bytes the [`crate::Apply`] implementation chose (CBOR records in
//! the broker). A frame whose checksum does not match, or a file that ends
//! inside a frame, fails the read: a damaged snapshot is never installed.
//! The file is written under a temporary name, fsynced and renamed, so a
//! `.snap` file is always whole. Which snapshot is the group's current one
//! is recorded in the group's `meta/<group>` tree (see
//! [`crate::state_machine`]); older files are removed once a newer one is
//! recorded.

use crate::{ReplicationError, Result};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The largest frame accepted when reading (a corrupt length must not
/// allocate gigabytes).
pub const MAX_FRAME: usize = 256 << 20;

/// Writes frames to `W`.
#[derive(Debug)]
pub struct FrameWriter<W: Write> {
    out: W,
    frames: u64,
    bytes: u64,
}

impl<W: Write> FrameWriter<W> {
    /// Frames written to `out`.
    pub fn new(out: W) -> Self {
        Self {
            out,
            frames: 0,
            bytes: 0,
        }
    }

    /// Writes `value` (CBOR) as one frame.
    pub fn put<T: serde::Serialize>(&mut self, value: &T) -> Result<()> {
        let bytes = crate::encode(value)?;
        self.put_bytes(&bytes)
    }

    /// Writes `bytes` as one frame.
    pub fn put_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        if bytes.len() > MAX_FRAME {
            return Err(ReplicationError::Codec(format!(
                "a snapshot frame of {} bytes (at most {MAX_FRAME})",
                bytes.len()
            )));
        }
        self.out.write_all(&(bytes.len() as u32).to_le_bytes())?;
        self.out.write_all(&crc32c::crc32c(bytes).to_le_bytes())?;
        self.out.write_all(bytes)?;
        self.frames += 1;
        self.bytes += 8 + bytes.len() as u64;
        Ok(())
    }

    /// Frames and bytes written so far.
    pub fn written(&self) -> (u64, u64) {
        (self.frames, self.bytes)
    }

    /// The writer back (to flush and sync it).
    pub fn into_inner(self) -> W {
        self.out
    }
}

/// Reads frames from `R`, checking each one's checksum.
#[derive(Debug)]
pub struct FrameReader<R: Read> {
    input: R,
}

impl<R: Read> FrameReader<R> {
    /// Frames read from `input`.
    pub fn new(input: R) -> Self {
        Self { input }
    }

    /// The next frame's value; `None` at the end of the input (exactly
    /// between two frames).
    pub fn read<T: serde::de::DeserializeOwned>(&mut self) -> Result<Option<T>> {
        match self.next_bytes()? {
            Some(b) => Ok(Some(crate::decode(&b)?)),
            None => Ok(None),
        }
    }

    /// The next frame's bytes; `None` at the end of the input.
    pub fn next_bytes(&mut self) -> Result<Option<Vec<u8>>> {
        let mut head = [0u8; 8];
        let mut got = 0;
        while got < head.len() {
            let n = self.input.read(&mut head[got..])?;
            if n == 0 {
                if got == 0 {
                    return Ok(None);
                }
                return Err(ReplicationError::Codec(
                    "a snapshot ends inside a frame header".into(),
                ));
            }
            got += n;
        }
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        if len > MAX_FRAME {
            return Err(ReplicationError::Codec(format!(
                "a snapshot frame claims {len} bytes (at most {MAX_FRAME})"
            )));
        }
        let mut body = vec![0u8; len];
        self.input
            .read_exact(&mut body)
            .map_err(|e| ReplicationError::Codec(format!("a snapshot ends inside a frame: {e}")))?;
        if crc32c::crc32c(&body) != crc {
            return Err(ReplicationError::Codec(
                "a snapshot frame fails its checksum".into(),
            ));
        }
        Ok(Some(body))
    }
}

/// A group's directory under `root`: the group name made safe for a file
/// name, with its checksum (two names that map to the same safe text stay
/// apart).
pub fn group_dir(root: &Path, group: &str) -> PathBuf {
    let safe: String = group
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(120)
        .collect();
    root.join(format!("{safe}-{:08x}", crc32c::crc32c(group.as_bytes())))
}

/// The file of snapshot `id` in `dir`.
pub fn snap_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.snap"))
}

/// Removes every file of `dir` but `keep` (older snapshots, abandoned
/// transfers).
pub fn remove_others(dir: &Path, keep: &Path) {
    let Ok(list) = std::fs::read_dir(dir) else {
        return;
    };
    for e in list.flatten() {
        let p = e.path();
        if p != keep
            && let Err(err) = std::fs::remove_file(&p)
        {
            tracing::warn!(path = %p.display(), error = %err, "cannot remove an old snapshot file");
        }
    }
}

/// Fsyncs directory `dir` (a rename in it is durable after this).
pub fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

/// A reader that fails after `limit` bytes (a crash test's cut: the
/// install stops part-way, as a `kill -9` would stop it).
#[derive(Debug)]
pub(crate) struct CutAfter<R> {
    pub(crate) inner: R,
    pub(crate) left: u64,
}

impl<R: Read> Read for CutAfter<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return Err(std::io::Error::other("snapshot install cut (test fault)"));
        }
        let max = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        let n = self.inner.read(&mut buf[..max])?;
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_damage_is_refused() {
        let mut w = FrameWriter::new(Vec::new());
        w.put(&("a", 1u64)).unwrap();
        w.put_bytes(b"raw").unwrap();
        assert_eq!(w.written().0, 2);
        let bytes = w.into_inner();
        let mut r = FrameReader::new(bytes.as_slice());
        assert_eq!(r.read::<(String, u64)>().unwrap(), Some(("a".into(), 1)));
        assert_eq!(r.next_bytes().unwrap(), Some(b"raw".to_vec()));
        assert_eq!(r.next_bytes().unwrap(), None);

        let mut flipped = bytes.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        let mut r = FrameReader::new(flipped.as_slice());
        r.next_bytes().unwrap();
        assert!(r.next_bytes().is_err(), "a flipped byte is caught");

        let cut = &bytes[..bytes.len() - 2];
        let mut r = FrameReader::new(cut);
        r.next_bytes().unwrap();
        assert!(r.next_bytes().is_err(), "a truncated frame is caught");
    }

    #[test]
    fn group_dirs_are_safe_and_distinct() {
        let root = Path::new("/r");
        let a = group_dir(root, "persistent://p/d/t@1");
        let b = group_dir(root, "persistent://p/d/t_1");
        assert_ne!(a, b);
        assert!(!a.file_name().unwrap().to_str().unwrap().contains('/'));
    }
}
