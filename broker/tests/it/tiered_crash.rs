//! Tiered storage across crashes: a child-process broker offloading to a
//! local directory is aborted by a test failpoint at each step of an
//! offload (`tiered.offload.after_put`: the object written, its state not
//! yet verified; `after_verified`: recorded offloaded durably, the local
//! copy still there; `after_drop`: the local copy dropped from what is
//! served, its file not yet deleted), then restarted without it. Every
//! acknowledged message is still read, in order, from the earliest
//! position; the next offload finishes the work; and the directory holds
//! exactly the objects the topic's segments reference (a redone offload
//! writes the same key: no duplicate).

use crate::common;

use common::tiered::*;
use common::*;
use ricochet_testkit::BrokerProcess;
use std::path::Path;

const TOPIC: &str = "persistent://public/default/crashy";
const N: u32 = 200;

async fn spawn_with(dir: &Path, config: &Path, failpoint: Option<&str>) -> BrokerProcess {
    let mut o = options()
        .rust_log("error")
        .args(["--config".as_ref(), config.as_os_str()]);
    if let Some(f) = failpoint {
        o = o.env("RICOCHET_FAILPOINT", f);
    }
    BrokerProcess::spawn(dir, &o).await
}

async fn crash_at(failpoint: &str) {
    let data = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let config = data.path().join("broker.toml");
    std::fs::write(
        &config,
        format!(
            "segment_entries = 50\n[tiered]\nurl = \"file://{}\"\ninterval = \"1h\"\n",
            root.path().display()
        ),
    )
    .unwrap();
    let b = spawn_with(data.path(), &config, Some(failpoint)).await;
    publish(b.url(), TOPIC, 0..N).await;
    let r = offload(b.url(), TOPIC).await;
    assert!(
        r.is_err(),
        "{failpoint}: the broker should have died: {r:?}"
    );
    b.kill9(); // reaps it (it is already gone)
    let b = spawn_with(data.path(), &config, None).await;
    // Everything acknowledged is there, in order, whatever tier holds it.
    let got = read_all(b.url(), TOPIC, "first", N as usize).await;
    assert_eq!(got, (0..N).collect::<Vec<_>>(), "{failpoint}");
    // The next offload finishes the work.
    offload(b.url(), TOPIC)
        .await
        .expect("offload after restart");
    let s = status(b.url(), TOPIC).await;
    assert_eq!(s.remote_only_segments, 4, "{failpoint}: {s:?}");
    assert_eq!(s.local_segments, 1, "{failpoint}: {s:?}");
    assert_eq!(
        files_under(root.path()),
        referenced(&s),
        "{failpoint}: unreferenced or missing objects"
    );
    let got = read_all(b.url(), TOPIC, "second", N as usize).await;
    assert_eq!(got, (0..N).collect::<Vec<_>>(), "{failpoint}");
    b.stop().await;
}

#[tokio::test]
async fn a_crash_after_the_object_is_written_redoes_the_offload_onto_the_same_key() {
    crash_at("tiered.offload.after_put").await;
}

#[tokio::test]
async fn a_crash_after_the_offload_is_verified_keeps_the_local_copy_until_the_next_pass() {
    crash_at("tiered.offload.after_verified").await;
}

#[tokio::test]
async fn a_crash_after_the_local_copy_is_dropped_loses_nothing() {
    crash_at("tiered.offload.after_drop").await;
}
