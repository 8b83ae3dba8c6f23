//! The [`MetaStore`] side of [`SledStorage`]: grants, retention policies and
//! the other small records of the `meta` tree, each sealed JSON under its
//! prefix.

use super::codec::{json, seal};
use super::keys::*;
use super::*;

#[async_trait::async_trait]
impl MetaStore for SledStorage {
    fn grants(&self) -> Result<Vec<GrantRecord>> {
        self.meta_records(GRANT_PREFIX)
    }

    fn put_grant(&self, record: &GrantRecord) -> Result<()> {
        let key = grant_key(&record.role, &record.resource);
        self.meta
            .insert(key.as_slice(), seal(&key, &json(record)))?;
        Ok(())
    }

    fn delete_grant(&self, role: &str, resource: &str) -> Result<()> {
        self.meta.remove(grant_key(role, resource))?;
        Ok(())
    }

    fn retention_policies(&self) -> Result<Vec<RetentionRecord>> {
        self.meta_records(RETENTION_PREFIX)
    }

    fn put_retention(&self, record: &RetentionRecord) -> Result<()> {
        let key = retention_key(&record.target);
        self.meta
            .insert(key.as_slice(), seal(&key, &json(record)))?;
        Ok(())
    }

    fn delete_retention(&self, target: &str) -> Result<()> {
        self.meta.remove(retention_key(target))?;
        Ok(())
    }

    fn list_topics(&self) -> Result<Vec<TopicRecord>> {
        self.meta_records(b"t:")
    }

    fn put_topic(&self, record: &TopicRecord) -> Result<()> {
        let key = format!("t:{}", record.name);
        self.meta
            .insert(key.as_bytes(), seal(key.as_bytes(), &json(record)))?;
        Ok(())
    }

    fn list_partitioned(&self) -> Result<Vec<PartitionedRecord>> {
        self.meta_records(b"p:")
    }

    fn put_partitioned(&self, record: &PartitionedRecord) -> Result<()> {
        let key = format!("p:{}", record.name);
        self.meta
            .insert(key.as_bytes(), seal(key.as_bytes(), &json(record)))?;
        Ok(())
    }

    fn delete_partitioned(&self, name: &str) -> Result<()> {
        self.meta.remove(format!("p:{name}"))?;
        Ok(())
    }

    fn delete_topic(&self, name: &str) -> Result<()> {
        for sub in self.list_subscriptions(name)? {
            self.delete_subscription(&sub)?;
        }
        let segs = {
            let mut map = crate::util::lock(&self.segments);
            map.remove(name).unwrap_or_default()
        };
        for seg in segs.keys() {
            self.drop_segment(name, *seg)?;
        }
        self.forget_pending_sequences(name);
        let mut batch = Batch::default();
        for k in self.prodseq.scan_prefix(format!("{name}\0")).keys() {
            batch.remove(k?);
        }
        self.prodseq.apply_batch(batch)?;
        self.meta.remove(format!("t:{name}"))?;
        self.meta.remove(format!("n:{name}"))?;
        Ok(())
    }

    fn next_id(&self) -> Result<u64> {
        Ok(self.db.generate_id()?)
    }

    fn size_on_disk(&self) -> Result<u64> {
        Ok(self.db.size_on_disk()?)
    }

    async fn flush(&self) -> Result<()> {
        // Blob files, sled's flush, its data file (see `sled_sync`).
        self.sync.flush(&self.db).await?;
        Ok(())
    }

    fn inventory(&self, counts: bool) -> Result<Inventory> {
        let store_id = match self.meta.get(STORE_ID_KEY)? {
            Some(v) => Some(
                String::from_utf8(unseal(STORE_ID_KEY, &v)?.to_vec())
                    .map_err(|_| StorageError::Corrupt("unreadable store id".into()))?,
            ),
            None => None,
        };
        let segments = crate::util::lock(&self.segments).clone();
        let mut has_data = !segments.is_empty();
        for tree in [
            &self.prodseq,
            &self.failures,
            &self.schedule,
            &self.sched,
            &self.sched_big,
            &self.deadletters,
        ] {
            has_data |= tree.first()?.is_some();
        }
        if !has_data {
            has_data = self.meta_holds_more_than_the_id()?;
        }
        let by_sub = if counts {
            Some(self.counts_by_subscription()?)
        } else {
            None
        };
        let mut topics = std::collections::BTreeMap::new();
        for t in self.list_topics()? {
            let (first, next) = self.entry_range(&t.name)?;
            let subs = self.list_subscriptions(&t.name)?;
            let counts = by_sub.as_ref().map(|m| {
                subs.iter()
                    .map(|s| (s.name.clone(), m.get(&s.id).copied().unwrap_or_default()))
                    .collect()
            });
            let subscriptions = subs.into_iter().map(|s| s.name).collect();
            let segs = segments
                .get(&t.name)
                .map(|m| m.keys().copied().collect())
                .unwrap_or_default();
            topics.insert(
                t.name,
                TopicInventory {
                    kind: t.kind,
                    first,
                    next,
                    segments: segs,
                    subscriptions,
                    counts,
                },
            );
        }
        let (dead_letters, scheduled) = match &by_sub {
            Some(m) => (
                Some(m.values().map(|c| c.dead_letters).sum()),
                Some(m.values().map(|c| c.scheduled).sum()),
            ),
            None => (None, None),
        };
        Ok(Inventory {
            store_id,
            has_data,
            topics,
            dead_letters,
            scheduled,
        })
    }

    fn set_store_id(&self, id: &str) -> Result<()> {
        self.meta
            .insert(STORE_ID_KEY, seal(STORE_ID_KEY, id.as_bytes()))?;
        Ok(())
    }

    fn load_manifest(&self) -> Result<Option<Manifest>> {
        let path = self.dir.join(manifest::FILE_NAME);
        match std::fs::read(&path) {
            Ok(bytes) => Manifest::decode(&bytes).map(Some).map_err(|why| {
                StorageError::Corrupt(format!("manifest {}: {why}", path.display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StorageError::Io(e)),
        }
    }

    async fn save_manifest(&self, m: &Manifest) -> Result<()> {
        let dir = self.dir.clone();
        let bytes = m.encode();
        tokio::task::spawn_blocking(move || write_durably(&dir, manifest::FILE_NAME, &bytes))
            .await
            .map_err(|e| StorageError::Io(std::io::Error::other(e)))??;
        Ok(())
    }
}

impl SledStorage {
    /// Whether `meta` holds a key besides the store identity: its first
    /// other key answers. (`meta` also holds the retry-reference index, a
    /// key per tier move: after millions of `reconsume_later`s, millions
    /// of keys, which every start's inventory read whole before.)
    fn meta_holds_more_than_the_id(&self) -> Result<bool> {
        for k in self.meta.iter().keys() {
            #[cfg(test)]
            self.meta_keys_read
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if k? != STORE_ID_KEY {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inventory_reads_metas_keys_only_until_one_besides_the_id() {
        let dir = tempfile::tempdir().unwrap();
        let s = SledStorage::open(dir.path(), 64, 8 << 20).unwrap();
        assert!(!s.inventory(false).unwrap().has_data, "a fresh store");
        s.set_store_id("abc").unwrap();
        assert!(!s.inventory(false).unwrap().has_data, "the id alone");
        for i in 0..2_000 {
            s.put_topic(&TopicRecord {
                name: format!("persistent://public/default/t{i}"),
                created_ms: 0,
                kind: TopicKind::Normal,
                replicas: 1,
                trimmed_below: 0,
            })
            .unwrap();
        }
        s.meta_keys_read
            .store(0, std::sync::atomic::Ordering::Relaxed);
        let inv = s.inventory(false).unwrap();
        assert!(inv.has_data);
        assert_eq!(inv.topics.len(), 2_000);
        let read = s.meta_keys_read.load(std::sync::atomic::Ordering::Relaxed);
        assert!(read <= 2, "{read} keys of meta read to learn it holds data");
    }
}
