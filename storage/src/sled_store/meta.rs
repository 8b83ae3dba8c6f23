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
        for kv in self.meta.iter().keys() {
            has_data |= kv? != STORE_ID_KEY;
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
