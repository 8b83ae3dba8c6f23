//! Damaged stores: a store is built by the real binary (messages large and
//! small, dead letters, scheduled retries) and stopped cleanly; then copies
//! of it are damaged — `db` truncated at several points or deleted, `blobs`
//! deleted, single bytes of `db` flipped, 4 KiB blocks of `db` zeroed, the
//! manifest flipped — and the binary is started on each copy. Every start
//! must either refuse, with one line naming what is wrong, or serve all of
//! the data (every message byte for byte, every dead letter, every
//! scheduled retry): never a smaller broker. `ricochet-broker check` must
//! pass the intact store and fail every store the broker refused. The
//! broker runs with `--verify-on-start before`, the mode that promises this.

mod common;
use common::*;
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
/// Entry ids dead-lettered, and sent to the retry tier for an hour.
const DEAD: [u64; 3] = [10, 11, 12];
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
    assert!(broker.stop().await.success(), "clean stop");
}

/// A started broker, or why it refused.
enum Start {
    Serving(Child, String),
    Refused(String),
}

/// Starts the binary on `dir` (no metrics listener), verifying every value
/// before serving, and reads whether it listens or exits.
fn start(dir: &Path) -> Start {
    let mut child = Command::new(BIN)
        .arg("--data-dir")
        .arg(dir)
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        // The mode that refuses damage before serving (the default,
        // `background`, serves and reports it: see the broker's unit tests).
        .args(["--verify-on-start", "before"])
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the broker");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let addr = lines.by_ref().map_while(Result::ok).find_map(|l| {
        l.strip_prefix("ricochet-broker listening on ")
            .and_then(|r| r.split(' ').next())
            .map(str::to_owned)
    });
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
    if (stats.scheduled_retries, stats.dead_lettered) != (2, 3) {
        return Err(format!(
            "{} scheduled retries and {} dead letters",
            stats.scheduled_retries, stats.dead_lettered
        ));
    }
    Ok(())
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
            std::fs::remove_dir_all(d.join("blobs")).unwrap()
        }),
        damage("manifest byte flipped", |d| {
            let path = d.join("ricochet.manifest");
            let mut b = std::fs::read(&path).unwrap();
            let at = b.len() / 2;
            b[at] ^= 0x01;
            std::fs::write(path, b).unwrap();
        }),
    ];
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
async fn a_damaged_store_is_refused_or_served_whole() {
    let root = tempfile::tempdir().unwrap();
    let store: PathBuf = root.path().join("store");
    build_store(&store).await;
    let db_len = std::fs::metadata(store.join("db")).unwrap().len();
    assert!(
        dir_bytes(&store.join("blobs")) > 0,
        "the store keeps its large values in blobs"
    );
    let (ok, out) = check(&store);
    assert!(ok, "check passes the intact store:\n{out}");
    assert!(out.contains("problems:          0"), "{out}");
    assert!(
        out.contains(&format!("entries:           {}", SMALL + LARGE + 5)),
        "{out}"
    );

    // The intact store, started: everything is there.
    let intact = root.path().join("intact");
    copy_dir(&store, &intact);
    match start(&intact) {
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
        match start(&copy) {
            Start::Serving(mut child, url) => {
                let served = serves_everything(&url).await;
                let _ = child.kill();
                let _ = child.wait();
                match served {
                    Ok(()) => outcomes.push(format!("{}: served everything", d.name)),
                    Err(e) => {
                        failures.push(format!("{}: started and served a subset: {e}", d.name))
                    }
                }
            }
            Start::Refused(why) => {
                let lines: Vec<&str> = why.lines().filter(|l| !l.trim().is_empty()).collect();
                let line = lines.last().copied().unwrap_or("");
                if lines.len() != 1 || !line.starts_with("ricochet-broker: ") {
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
