//! Damaged stores: a store is built by the real binary (messages large and
//! small, dead letters, scheduled retries) and stopped cleanly; then copies
//! of it are damaged — `db` truncated at several points or deleted, `blobs`
//! deleted, single bytes of `db` flipped, 256 bytes of `db` flipped, a sled
//! segment header copied over another, 4 KiB blocks of `db` zeroed, the
//! manifest flipped, the segment-file log deleted or its files flipped, cut
//! or deleted — and the binary is started on each copy. Every start must
//! either refuse, with one line naming what is wrong and `ricochet-broker
//! check`, or serve all of the data (every message byte for byte, every
//! dead letter, every scheduled retry): never a smaller broker, never a
//! panic. `ricochet-broker check` must pass the intact store and fail every
//! store the broker refused. The broker runs in each `--verify-on-start`
//! mode that promises this before serving: `before` and the default,
//! `background` (which checks the manifest's facts before serving and reads
//! every value after). Two more tests: a store that silently lost a dead
//! letter or a scheduled retry since its clean stop is refused by default;
//! a store on which sled panics inside its open (a duplicated segment
//! header, in a store sled reads every header of) is refused with one line.

use crate::common;
use common::*;
use ricochet_broker::storage::prelude::*;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::*;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ricochet-broker");
const TOPIC: &str = "orders";
const SUB: &str = "s";
/// Small messages published.
const SMALL: usize = 3_000;
/// Large messages (sled keeps big values in `blobs`).
const LARGE: usize = 4;
const LARGE_BYTES: usize = 200 * 1024;
/// Entry ids dead-lettered (the large ones too: the dead-letter tier is in
/// sled, and with the topic's entries in segment files they are what makes
/// sled's log span several of its segments for the damage to hit), and
/// sent to the retry tier for an hour.
const DEAD: [u64; 7] = [10, 11, 12, 3000, 3001, 3002, 3003];
const RETRIED: [u64; 2] = [20, 21];

fn payload(i: usize) -> Vec<u8> {
    if i < SMALL {
        format!("message {i} {}", "x".repeat(i % 500)).into_bytes()
    } else {
        (0..LARGE_BYTES).map(|b| (b * 31 + i) as u8).collect()
    }
}

/// Builds the store in `dir` with the binary and stops it cleanly.
async fn build_store(dir: &Path) {
    let broker = spawn(dir).await;
    let url = broker.url();
    let mut p = RawProducer::open(url, TOPIC, "p").await.unwrap();
    for chunk in (0..SMALL + LARGE).collect::<Vec<_>>().chunks(20) {
        let msgs = chunk.iter().map(|i| p.msg(payload(*i))).collect();
        p.send_messages(msgs).await;
    }
    let mut c = RawConsumer::simple(url, TOPIC, SUB, SubscriptionType::Shared).await;
    c.flow(10_000).await;
    let got = c.take(SMALL + LARGE, WAIT).await;
    let id_of = |n: u64| got[n as usize].id.clone().unwrap();
    let mut request = 0;
    for n in DEAD {
        request += 1;
        c.terminate(id_of(n), "broken", request).await;
    }
    for n in RETRIED {
        request += 1;
        c.reconsume_later(
            id_of(n),
            reconsume_later::Delay::DelayMs(3_600_000),
            request,
        )
        .await;
    }
    for _ in 0..request {
        assert_eq!(c.result(WAIT).await.expect("a result").code, 0);
    }
    drop(c);
    drop(p);
    // Each dead-lettering's failure event is published after the move is
    // answered: wait for all of them, so the store holds a known count.
    let mut admin = AdminClient::new(channel(url).await);
    let events = "persistent://public/default/__failure_events";
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let stored = admin
            .topic_stats(TopicRequest {
                topic: events.into(),
            })
            .await
            .map(|r| r.into_inner().message_count)
            .unwrap_or(0);
        if stored >= DEAD.len() as u64 || std::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(broker.stop().await.success(), "clean stop");
}

/// The binary on `dir` (no metrics listener) with `--verify-on-start mode`
/// and `RUST_LOG=rust_log`, its stdout piped.
fn broker_command(dir: &Path, mode: &str, rust_log: &str) -> Command {
    let mut c = Command::new(BIN);
    c.arg("--data-dir")
        .arg(dir)
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(["--verify-on-start", mode])
        .env("RUST_LOG", rust_log)
        .stdout(Stdio::piped());
    c
}

/// A started broker, or why it refused.
enum Start {
    Serving(Child, String),
    Refused(String),
}

/// Starts the binary on `dir` with `--verify-on-start mode` and reads
/// whether it listens or exits.
fn start(dir: &Path, mode: &str) -> Start {
    let mut child = broker_command(dir, mode, "error")
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the broker");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let addr = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| ricochet_testkit::listening_addr(&l).map(str::to_owned));
    match addr {
        Some(addr) => {
            // Keep draining the log so the broker never blocks on the pipe.
            std::thread::spawn(move || lines.for_each(drop));
            Start::Serving(child, format!("http://{addr}"))
        }
        None => {
            let status = child.wait().expect("wait");
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                e.read_to_string(&mut err).expect("read stderr");
            }
            assert!(!status.success(), "exited 0 without listening: {err}");
            Start::Refused(err)
        }
    }
}

/// `ricochet-broker check --data-dir dir`: (success, output).
fn check(dir: &Path) -> (bool, String) {
    let out = Command::new(BIN)
        .args(["check", "--data-dir"])
        .arg(dir)
        .env("RUST_LOG", "error")
        .output()
        .expect("run check");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// Everything the store held, read back through the broker; `Err` names
/// the first thing missing or different.
async fn serves_everything(url: &str) -> Result<(), String> {
    let mut c = RawConsumer::subscribe(
        url,
        TOPIC,
        "verify",
        SubOpts {
            sub_type: SubscriptionType::Exclusive,
            initial: InitialPosition::Earliest,
            ..Default::default()
        },
    )
    .await
    .map_err(|e| format!("cannot subscribe: {e}"))?;
    c.flow(10_000).await;
    let mut seen = vec![false; SMALL + LARGE];
    while let Some(m) = c.next(Duration::from_secs(2)).await {
        let id = m.id.as_ref().map_or(u64::MAX, |i| i.entry_id) as usize;
        if id >= seen.len() {
            return Err(format!("unexpected entry {id}"));
        }
        if m.payload != payload(id) {
            return Err(format!("entry {id} has a different payload"));
        }
        seen[id] = true;
        if seen.iter().all(|s| *s) {
            break;
        }
    }
    if let Some(missing) = seen.iter().position(|s| !s) {
        let n = seen.iter().filter(|s| !**s).count();
        return Err(format!("{n} entries missing, e.g. {missing}"));
    }
    let mut admin = AdminClient::new(channel(url).await);
    let dead = admin
        .list_dead_letters(ListDeadLettersRequest {
            topic: TOPIC.into(),
            subscription: SUB.into(),
            limit: 100,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("dead letters: {e}"))?
        .into_inner()
        .dead_letters;
    let mut origins: Vec<u64> = dead
        .iter()
        .filter_map(|d| d.origin.as_ref().map(|o| o.entry_id))
        .collect();
    origins.sort_unstable();
    if origins != DEAD {
        return Err(format!("dead letters of entries {origins:?}"));
    }
    for d in &dead {
        let origin = d.origin.as_ref().map_or(0, |o| o.entry_id) as usize;
        if d.message.as_ref().map(|m| &m.payload) != Some(&payload(origin)) {
            return Err(format!("dead letter of {origin} has a different payload"));
        }
    }
    let stats = admin
        .subscription_stats(SubscriptionRequest {
            topic: TOPIC.into(),
            subscription: SUB.into(),
        })
        .await
        .map_err(|e| format!("stats: {e}"))?
        .into_inner();
    if (stats.scheduled_retries, stats.dead_lettered) != (2, DEAD.len() as u64) {
        return Err(format!(
            "{} scheduled retries and {} dead letters",
            stats.scheduled_retries, stats.dead_lettered
        ));
    }
    Ok(())
}

/// Whether the broker at `url` reports bad storage (gRPC health of the
/// broker service NOT_SERVING) within a few seconds.
async fn reports_damage(url: &str) -> bool {
    use tonic_health::pb::health_check_response::ServingStatus;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel(url).await);
    for _ in 0..50 {
        let status = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: "ricochet.v1.Broker".into(),
            })
            .await
            .map(|r| r.into_inner().status);
        if status.is_ok_and(|s| s == ServingStatus::NotServing as i32) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |rd| {
        rd.map(|e| {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                dir_bytes(&e.path())
            } else {
                e.metadata().unwrap().len()
            }
        })
        .sum()
    })
}

/// sled's log segment size (its default) and segment header length.
const SLED_SEGMENT: usize = 512 * 1024;
const SLED_HEADER: usize = 20;

/// Copies the header of the sled log segment with the highest log sequence
/// number over the header of another segment.
fn duplicate_newest_segment_header(db: &mut [u8]) {
    // A header: crc32 (4 bytes), then the segment's lsn xor 0x7fff.. (8, LE).
    let lsn = |at: usize| {
        let raw: [u8; 8] = db[at + 4..at + 12].try_into().unwrap();
        u64::from_le_bytes(raw) ^ 0x7FFF_FFFF_FFFF_FFFF
    };
    let segments = db.len() / SLED_SEGMENT;
    assert!(segments >= 2, "sled's log spans more than one segment");
    let newest = (0..segments)
        .map(|i| i * SLED_SEGMENT)
        // Plausible headers only: a segment's lsn is a multiple of its size.
        .filter(|at| lsn(*at) % SLED_SEGMENT as u64 == 0 && lsn(*at) < 1 << 40)
        .max_by_key(|at| lsn(*at))
        .expect("a segment header");
    let other = if newest == 0 { SLED_SEGMENT } else { 0 };
    db.copy_within(newest..newest + SLED_HEADER, other);
}

/// The topic's directory in the segment-file log.
fn topic_log(d: &Path) -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(d.join("log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        // Not the namespace's failure events.
        .filter(|p| !p.to_string_lossy().contains("__failure_events"))
        .collect();
    assert_eq!(dirs.len(), 1, "one ordinary topic: {dirs:?}");
    dirs.pop().unwrap()
}

/// The topic's segment files, oldest first.
fn segment_files(d: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(topic_log(d))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    files.sort();
    files
}

/// One way of damaging a store.
struct Damage {
    name: String,
    apply: Box<dyn Fn(&Path)>,
}

fn damage(name: impl Into<String>, apply: impl Fn(&Path) + 'static) -> Damage {
    Damage {
        name: name.into(),
        apply: Box::new(apply),
    }
}

fn damages(db_len: u64) -> Vec<Damage> {
    let mut out = vec![
        damage("db deleted", |d| {
            std::fs::remove_file(d.join("db")).unwrap()
        }),
        // Without its snapshot sled starts an empty database: only the
        // manifest knows there was data.
        damage("db and sled's snapshots deleted", |d| {
            std::fs::remove_file(d.join("db")).unwrap();
            for e in std::fs::read_dir(d).unwrap() {
                let e = e.unwrap();
                if e.file_name().to_string_lossy().starts_with("snap.") {
                    std::fs::remove_file(e.path()).unwrap();
                }
            }
        }),
        damage("blobs deleted", |d| {
            let _ = std::fs::remove_dir_all(d.join("blobs"));
        }),
        damage("the segment-file log deleted", |d| {
            std::fs::remove_dir_all(d.join("log")).unwrap()
        }),
        damage("the topic's segment files deleted", |d| {
            for f in segment_files(d) {
                std::fs::remove_file(f).unwrap();
            }
        }),
        damage("the topic's log start file deleted", |d| {
            std::fs::remove_file(topic_log(d).join("start")).unwrap()
        }),
        damage("manifest byte flipped", |d| {
            let path = d.join("ricochet.manifest");
            let mut b = std::fs::read(&path).unwrap();
            let at = b.len() / 2;
            b[at] ^= 0x01;
            std::fs::write(path, b).unwrap();
        }),
    ];
    // Two log segments claiming one place in sled's log (the newest
    // segment's header copied over another's): sled panics (an assertion)
    // inside its open. Only where sled's log spans two segments: with the
    // topic's entries in segment files it may not
    // (`a_store_sled_panics_on_while_opening_is_refused_with_one_line` covers
    // the panic on a store that does).
    if db_len as usize >= 2 * SLED_SEGMENT {
        out.push(damage(
            "sled's newest segment header copied over another",
            |d| {
                let path = d.join("db");
                let mut b = std::fs::read(&path).unwrap();
                duplicate_newest_segment_header(&mut b);
                std::fs::write(path, b).unwrap();
            },
        ));
    }
    for frac in [0, 1, 4, 8, 12, 15] {
        let len = db_len * frac / 16;
        out.push(damage(format!("db truncated to {len} bytes"), move |d| {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(d.join("db"))
                .unwrap();
            f.set_len(len).unwrap();
        }));
    }
    let edit = |d: &Path, f: &dyn Fn(&mut Vec<u8>)| {
        let path = d.join("db");
        let mut b = std::fs::read(&path).unwrap();
        f(&mut b);
        std::fs::write(path, b).unwrap();
    };
    for n in 0..12u64 {
        // Offsets spread over the file: the header, the start, the middle, the end.
        let at = [3, 20, 100]
            .get(n as usize)
            .copied()
            .unwrap_or(db_len * n / 12 + 37) as usize;
        out.push(damage(format!("db byte {at} flipped"), move |d| {
            edit(d, &|b| {
                let at = at.min(b.len() - 1);
                b[at] ^= 0x40;
            })
        }));
    }
    for n in [1u64, 2, 3] {
        let at = (db_len * n / 4) as usize;
        out.push(damage(format!("db 256 bytes at {at} flipped"), move |d| {
            edit(d, &|b| {
                let end = (at + 256).min(b.len());
                b[at..end].iter_mut().for_each(|x| *x ^= 0xff);
            })
        }));
    }
    for n in 0..8u64 {
        out.push(damage(
            format!("segment file: byte at {n}/8 flipped"),
            move |d| {
                let f = segment_files(d).pop().unwrap();
                let mut b = std::fs::read(&f).unwrap();
                let at = (b.len() as u64 * n / 8) as usize + 5;
                b[at] ^= 0x08;
                std::fs::write(f, b).unwrap();
            },
        ));
        out.push(damage(format!("segment file: cut to {n}/8"), move |d| {
            let f = segment_files(d).pop().unwrap();
            let len = std::fs::metadata(&f).unwrap().len() * n / 8;
            std::fs::OpenOptions::new()
                .write(true)
                .open(f)
                .unwrap()
                .set_len(len)
                .unwrap();
        }));
    }
    for n in [0u64, 1, 2, 3] {
        let at = (db_len * n / 4) as usize & !4095;
        out.push(damage(format!("db 4 KiB at {at} zeroed"), move |d| {
            edit(d, &|b| {
                let end = (at + 4096).min(b.len());
                b[at..end].fill(0);
            })
        }));
    }
    out
}

#[tokio::test]
async fn a_damaged_store_is_refused_or_served_whole_verifying_before_serving() {
    refused_or_served_whole("before").await
}

#[tokio::test]
async fn a_damaged_store_is_refused_or_served_whole_by_default() {
    refused_or_served_whole("background").await
}

async fn refused_or_served_whole(mode: &str) {
    let root = tempfile::tempdir().unwrap();
    let store: PathBuf = root.path().join("store");
    build_store(&store).await;
    let db_len = std::fs::metadata(store.join("db")).unwrap().len();
    assert!(
        dir_bytes(&store.join("log")) > 0,
        "the store keeps the topic's entries in segment files"
    );
    let (ok, out) = check(&store);
    assert!(ok, "check passes the intact store:\n{out}");
    assert!(out.contains("problems:          0"), "{out}");
    assert!(
        // The topic's, each dead letter's and retry's copy in its tier, and
        // each dead-lettering's failure event.
        out.contains(&format!(
            "entries:           {}",
            SMALL + LARGE + 2 * DEAD.len() + RETRIED.len()
        )),
        "{out}"
    );

    // The intact store, started: everything is there.
    let intact = root.path().join("intact");
    copy_dir(&store, &intact);
    match start(&intact, mode) {
        Start::Serving(mut child, url) => {
            let served = serves_everything(&url).await;
            let _ = child.kill();
            let _ = child.wait();
            served.expect("the intact store serves everything");
        }
        Start::Refused(why) => panic!("the intact store was refused: {why}"),
    }

    let mut outcomes = Vec::new();
    let mut failures = Vec::new();
    for (n, d) in damages(db_len).into_iter().enumerate() {
        let copy = root.path().join(format!("case-{n}"));
        copy_dir(&store, &copy);
        (d.apply)(&copy);
        match start(&copy, mode) {
            Start::Serving(mut child, url) => {
                let served = serves_everything(&url).await;
                // In the background mode a damaged value is found by the
                // pass (or the read) once serving: reported, not silent.
                let reported =
                    served.is_err() && mode == "background" && reports_damage(&url).await;
                let _ = child.kill();
                let _ = child.wait();
                match served {
                    Ok(()) => outcomes.push(format!("{}: served everything", d.name)),
                    Err(e) if reported => outcomes.push(format!(
                        "{}: served, damage reported (health NOT_SERVING): {e}",
                        d.name
                    )),
                    Err(e) => failures.push(format!(
                        "{}: started and served a subset, storage healthy: {e}",
                        d.name
                    )),
                }
            }
            Start::Refused(why) => {
                let lines: Vec<&str> = why.lines().filter(|l| !l.trim().is_empty()).collect();
                let line = lines.last().copied().unwrap_or("");
                if lines.len() != 1
                    || !line.starts_with("ricochet-broker: ")
                    || !line.contains("ricochet-broker check")
                {
                    failures.push(format!(
                        "{}: refused without one clear line: {why:?}",
                        d.name
                    ));
                }
                let (ok, out) = check(&copy);
                if ok {
                    failures.push(format!("{}: refused, but check passed:\n{out}", d.name));
                }
                outcomes.push(format!("{}: refused: {line}", d.name));
            }
        }
        let _ = std::fs::remove_dir_all(&copy);
    }
    eprintln!("{}", outcomes.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        outcomes.iter().any(|o| o.contains("refused")),
        "some damage must be refused"
    );
}

/// Starts the binary on `dir` in the default mode with `--accept-data-loss`
/// and WARN logging; returns it with the log lines printed before it
/// listened.
fn start_accepting_loss(dir: &Path) -> (Child, String, Vec<String>) {
    let mut child = broker_command(dir, "background", "warn")
        .arg("--accept-data-loss")
        .stderr(Stdio::null())
        .spawn()
        .expect("start the broker");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut log = Vec::new();
    let mut url = None;
    for line in lines.by_ref().map_while(Result::ok) {
        if let Some(addr) = ricochet_testkit::listening_addr(&line) {
            url = Some(format!("http://{addr}"));
            break;
        }
        log.push(line);
    }
    std::thread::spawn(move || lines.for_each(drop));
    let url = url.unwrap_or_else(|| panic!("did not start: {log:?}"));
    (child, url, log)
}

/// The store of [`build_store`] with one of the subscription's dead letters
/// or one of its scheduled retries removed behind the broker's back, as
/// damage sled does not notice leaves it (no checksum fails: the record is
/// simply gone).
async fn lose_one(dir: &Path, dead_letter: bool) {
    use ricochet_broker::storage::SledStorage;
    let s = SledStorage::open(dir, 16_384, 8 << 20).unwrap();
    let topic = format!("persistent://public/default/{TOPIC}");
    let sub = s
        .list_subscriptions(&topic)
        .unwrap()
        .into_iter()
        .find(|r| r.name == SUB)
        .expect("the subscription");
    if dead_letter {
        let dead = s.dead_letters(sub.id, None).unwrap();
        assert_eq!(dead.len(), DEAD.len());
        s.remove_dead_letters(sub.id, &[dead[0].0]).unwrap();
    } else {
        let due: Vec<_> = s
            .scheduled(None, u64::MAX, 100)
            .unwrap()
            .into_iter()
            .filter(|k| k.message.sub_id == sub.id)
            .collect();
        assert_eq!(due.len(), RETRIED.len());
        s.put_schedule(&[(due[0], false)]).unwrap();
    }
    s.flush().await.unwrap();
}

#[tokio::test]
async fn by_default_a_store_that_lost_dead_letters_or_retries_is_refused_before_serving() {
    let root = tempfile::tempdir().unwrap();
    let store: PathBuf = root.path().join("store");
    build_store(&store).await;
    let cases = [
        (
            true,
            "holds 6 dead letters, the manifest records 7 at the last clean stop (1 missing)",
        ),
        (
            false,
            "holds 1 scheduled messages, the manifest records 2 at the last clean stop (1 missing)",
        ),
    ];
    for (dead_letter, expected) in cases {
        let copy = root.path().join(format!("lost-dead-letter-{dead_letter}"));
        copy_dir(&store, &copy);
        lose_one(&copy, dead_letter).await;
        let what = format!("subscription {SUB} on persistent://public/default/{TOPIC} {expected}");
        match start(&copy, "background") {
            Start::Refused(why) => {
                assert!(why.contains(&what), "{why}");
                assert!(why.contains("ricochet-broker check"), "{why}");
                assert_eq!(why.trim().lines().count(), 1, "{why}");
            }
            Start::Serving(mut child, _) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("a store missing what its manifest records was served ({what})");
            }
        }
        // `check` names it too.
        let (ok, out) = check(&copy);
        assert!(!ok && out.contains(&what), "{out}");
        // Accepted: the broker serves and says exactly what is missing.
        let (mut child, url, log) = start_accepting_loss(&copy);
        assert!(
            log.iter().any(|l| l.contains("WARN") && l.contains(&what)),
            "{log:?}"
        );
        let mut admin = AdminClient::new(channel(&url).await);
        let stats = admin
            .subscription_stats(SubscriptionRequest {
                topic: TOPIC.into(),
                subscription: SUB.into(),
            })
            .await
            .unwrap()
            .into_inner();
        let dead = DEAD.len() as u64;
        let left = if dead_letter {
            (2, dead - 1)
        } else {
            (1, dead)
        };
        assert_eq!((stats.scheduled_retries, stats.dead_lettered), left);
        let _ = child.kill();
        let _ = child.wait();
    }
}

#[tokio::test]
async fn a_store_sled_panics_on_while_opening_is_refused_with_one_line() {
    use ricochet_broker::storage::SledStorage;
    let dir = tempfile::tempdir().unwrap();
    {
        // Written in one session: sled reads every segment header at the
        // next open (a store a broker reopened may not).
        let s = SledStorage::open(dir.path(), 1024, 8 << 20).unwrap();
        for id in 0..3000u64 {
            s.append("t", id, &[vec![(id % 251) as u8; 1000]], None)
                .unwrap();
        }
        s.flush().await.unwrap();
    }
    let path = dir.path().join("db");
    let mut db = std::fs::read(&path).unwrap();
    duplicate_newest_segment_header(&mut db);
    std::fs::write(&path, db).unwrap();
    match start(dir.path(), "background") {
        Start::Refused(why) => {
            let lines: Vec<&str> = why.lines().filter(|l| !l.trim().is_empty()).collect();
            assert_eq!(lines.len(), 1, "one line, no panic: {why}");
            assert!(lines[0].starts_with("ricochet-broker: "), "{why}");
            assert!(lines[0].contains("sled cannot open the store"), "{why}");
            assert!(lines[0].contains("ricochet-broker check"), "{why}");
        }
        Start::Serving(mut child, _) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("a store sled cannot open was served");
        }
    }
    let (ok, out) = check(dir.path());
    assert!(!ok && out.contains("sled cannot open the store"), "{out}");
}
