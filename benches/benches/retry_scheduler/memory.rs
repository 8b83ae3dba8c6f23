//! Part 3: memory and restart with many scheduled retries — a data
//! directory written by the broker's own tier move, then the release broker
//! binary started on it (and on an empty baseline) three times: time to
//! listen, time to dispatch a fresh message, and resident memory once idle.

use ricochet_broker::storage::prelude::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use prost::Message as _;
use ricochet_broker::storage::{
    Arrival, AttemptRecord, FailureRecord, MoveItem, SledStorage, SubMessage, SubscriptionRecord,
    TierId, TierMove, TopicKind, TopicRecord,
};
use ricochet_proto::{Ack, AckType, SubscriptionType, consume_request, props};
use ricochet_testkit::now_ms;

use crate::broker::{broker_bin, spawn_broker};
use crate::raw::{RawConsumer, publish};
use crate::{BoxError, env_or};

const MEM_TOPIC: &str = "persistent://public/default/mem";
const MEM_RETRY: &str = "persistent://public/default/mem-s-RETRY";

/// Writes a data directory as a broker holding `n` scheduled retries due in
/// 1–2 h leaves it: topic and retry-tier records, one subscription, and the
/// retries themselves written by `Storage::move_messages` (the broker's own
/// tier move) from main-tier entries that failed once, 1 000 per move
/// (`RS_MEM_MOVE`); the
/// main-tier segments are then trimmed as consumed.
async fn write_scheduled(dir: &Path, n: usize) -> Result<(u64, Duration), BoxError> {
    let t = Instant::now();
    let storage = SledStorage::open(dir, 16_384, 256 * 1024 * 1024)?;
    let now = now_ms();
    for (name, kind) in [
        (MEM_TOPIC, TopicKind::Normal),
        (MEM_RETRY, TopicKind::Retry),
    ] {
        storage.put_topic(&TopicRecord {
            name: name.into(),
            created_ms: now,
            kind,
            replicas: 1,
            trimmed_below: 0,
        })?;
    }
    let mut sub = SubscriptionRecord::new(
        storage.next_id()?,
        MEM_TOPIC,
        "s",
        SubscriptionType::Shared,
        0,
    );
    sub.created_ms = now;
    storage.put_subscription(&sub)?;
    let hour = 3_600_000u64;
    // RS_MEM_MOVE=k: messages per tier move (1 = every retry moved alone).
    let move_size: usize = env_or("RS_MEM_MOVE", 1_000usize).clamp(1, 1_000);
    for start in (0..n).step_by(1_000) {
        let end = (start + 1_000).min(n);
        let mut items = Vec::with_capacity(end - start);
        for i in start..end {
            let due = now + hour + hour * i as u64 / n as u64;
            let delay = due - now;
            let mut m = ricochet_proto::Message {
                payload: vec![7u8; 100],
                publish_time_ms: now,
                producer_name: "bench".into(),
                sequence_id: i as u64,
                deliver_at_ms: due,
                delivery_count: 1,
                ..Default::default()
            };
            for (k, v) in [
                (props::REAL_TOPIC, MEM_TOPIC.to_owned()),
                (props::ORIGIN_MESSAGE_ID, format!("{MEM_TOPIC}:{i}")),
                (props::RECONSUME_TIMES, "1".to_owned()),
                (props::DELAY_TIME, delay.to_string()),
            ] {
                m.properties.insert(k.into(), v);
            }
            sub.main.ack(i as u64);
            items.push(MoveItem {
                from: SubMessage {
                    sub_id: sub.id,
                    tier: TierId::Main,
                    entry_id: i as u64,
                },
                from_schedule: None,
                payload: m.encode_to_vec(),
                target_entry_id: i as u64,
                failures: FailureRecord {
                    count: 1,
                    first_failure_ms: now,
                    attempts: vec![AttemptRecord {
                        time_ms: now,
                        delivery_count: 1,
                        consumer: "bench".into(),
                        reason: ricochet_policy::FailureReason::ReconsumeLater,
                        detail: String::new(),
                    }],
                    hold_until_ms: 0,
                    edits: Vec::new(),
                },
                arrival: Arrival::Retry { due_ms: due },
                source: None,
            });
        }
        // The failed originals, published as one batch (one stored frame).
        let originals: Vec<Vec<u8>> = (start..end)
            .map(|i| {
                ricochet_proto::Message {
                    payload: vec![7u8; 100],
                    publish_time_ms: now,
                    producer_name: "bench".into(),
                    sequence_id: i as u64,
                    ..Default::default()
                }
                .encode_to_vec()
            })
            .collect();
        storage.append(MEM_TOPIC, start as u64, &originals, None)?;
        for part in items.chunks(move_size) {
            storage.move_messages(&TierMove {
                target_topic: MEM_RETRY.into(),
                subscription: sub.clone(),
                items: part.to_vec(),
            })?;
        }
    }
    // Every original was acked by its move: its segments go, as the broker's
    // retention does once all subscriptions are past them.
    storage.trim(MEM_TOPIC, n as u64)?;
    storage.flush().await?;
    let size = storage.size_on_disk()?;
    drop(storage);
    Ok((size, t.elapsed()))
}

/// `VmRSS` and `VmHWM` of a process, in bytes.
pub(crate) fn rss(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

struct Run {
    listening: Duration,
    dispatched: Duration,
    rss: u64,
    hwm: u64,
}

/// Starts the broker on `dir`, then publishes and receives one fresh message.
async fn start_and_dispatch(
    bin: &Path,
    dir: &Path,
    config: Option<&Path>,
) -> Result<Run, BoxError> {
    let t = Instant::now();
    let child = spawn_broker(bin, dir, config).await;
    let listening = t.elapsed();
    let url = child.url();
    let mut c = RawConsumer::subscribe(url, "mem", None).await?;
    c.flow(10).await?;
    publish(url, "mem", 1).await?;
    let got = c.messages(Duration::from_secs(30)).await?;
    let dispatched = t.elapsed();
    let Some(ids) = got.map(|m| m.into_iter().filter_map(|m| m.id).collect::<Vec<_>>()) else {
        return Err("the fresh message was not dispatched".into());
    };
    // Acked, so the next start begins from the same state.
    c.send(consume_request::Request::Ack(Ack {
        request_id: 0,
        ack_type: AckType::Individual as i32,
        ids,
    }))
    .await?;
    // Idle for a while: the scheduler's refills and sled's flusher settle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (rss, hwm) = rss(child.pid());
    drop(c);
    drop(child);
    Ok(Run {
        listening,
        dispatched,
        rss,
        hwm,
    })
}

pub(crate) async fn memory_and_restart(n: usize) -> Result<(), BoxError> {
    println!(
        "\n3. memory and restart with {n} scheduled retries due in 1-2 h (data written by Storage::move_messages; the release ricochet-broker binary started on it)"
    );
    let bin = match broker_bin() {
        Ok(bin) => bin,
        Err(e) => {
            println!("  skipped: {e}");
            return Ok(());
        }
    };
    println!("  broker binary: {}", bin.display());
    // RS_MEM_DIR keeps the data directories (and reuses them when present).
    let tmp = tempfile::tempdir()?;
    let root = std::env::var_os("RS_MEM_DIR").map_or_else(|| tmp.path().to_owned(), PathBuf::from);
    let base_dir = root.join("base");
    let full_dir = root.join(format!(
        "full-{n}-move-{}",
        env_or("RS_MEM_MOVE", 1_000usize)
    ));
    for (dir, count) in [(&base_dir, 0), (&full_dir, n)] {
        if dir.exists() {
            println!("  setup: reusing {}", dir.display());
            continue;
        }
        let (size, took) = write_scheduled(dir, count).await?;
        println!(
            "  setup: {count} retries written in {took:.1?}; sled size on disk {:.1} MB",
            size as f64 / 1e6
        );
    }
    let config = std::env::var_os("RS_MEM_CONFIG").map(PathBuf::from);
    if let Some(c) = &config {
        println!(
            "  broker config: {}",
            std::fs::read_to_string(c)?.trim().replace('\n', "; ")
        );
    }
    // sled takes a moment to release its files after the last handle drops.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut base = Vec::new();
    let mut full = Vec::new();
    for round in 0..3 {
        base.push(start_and_dispatch(&bin, &base_dir, config.as_deref()).await?);
        full.push(start_and_dispatch(&bin, &full_dir, config.as_deref()).await?);
        let (b, f) = (&base[round], &full[round]);
        println!(
            "  restart {}: baseline listening {:.2?}, dispatching {:.2?}, RSS {:.1} MB (peak {:.1} MB) | with {n}: listening {:.2?}, dispatching {:.2?}, RSS {:.1} MB (peak {:.1} MB)",
            round + 1,
            b.listening,
            b.dispatched,
            b.rss as f64 / 1e6,
            b.hwm as f64 / 1e6,
            f.listening,
            f.dispatched,
            f.rss as f64 / 1e6,
            f.hwm as f64 / 1e6,
        );
    }
    let median = |v: &mut Vec<u64>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    let base_rss = median(&mut base.iter().map(|r| r.rss).collect());
    let full_rss = median(&mut full.iter().map(|r| r.rss).collect());
    let base_hwm = median(&mut base.iter().map(|r| r.hwm).collect());
    let full_hwm = median(&mut full.iter().map(|r| r.hwm).collect());
    let per = |a: u64, b: u64| (a as f64 - b as f64) / n.max(1) as f64;
    let dispatch = full.iter().map(|r| r.dispatched).max().unwrap_or_default();
    println!(
        "  resident memory per scheduled retry (median of 3, idle): {:.1} B above the baseline ({:.1} MB vs {:.1} MB); peak {:.1} B",
        per(full_rss, base_rss),
        full_rss as f64 / 1e6,
        base_rss as f64 / 1e6,
        per(full_hwm, base_hwm),
    );
    println!(
        "  restart with {n} scheduled: dispatching within {dispatch:.2?} (worst of 3; target 3 s)"
    );
    Ok(())
}
