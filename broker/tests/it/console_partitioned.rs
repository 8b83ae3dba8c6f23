//! The web console on a partitioned topic: listed once by its base name
//! with its partitions summed, a topic page with each partition, and dead
//! letters (numbered per partition) shown with their partition, every row's
//! links and every action naming that partition, never the base name.

use crate::common;
use crate::console_http::{get, post, q, token_of};
use axum::Router;
use axum::http::StatusCode;
use common::*;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::partitions_client::PartitionsClient;
use ricochet_proto::{ReplayDeadLettersRequest, UpdatePartitionsRequest};
use ricochet_testkit::InProcessBroker;

const BASE: &str = "persistent://public/default/console-parted";

fn part(i: u32) -> String {
    format!("{BASE}-partition-{i}")
}

/// Every `href` in `html` (unescaped), in order.
fn hrefs(html: &str) -> Vec<String> {
    html.split("href=\"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .map(|h| h.replace("&amp;", "&"))
        .collect()
}

/// The part of `page` from the element with `id` to the end of its table.
fn table<'a>(page: &'a str, id: &str) -> &'a str {
    let at = page
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in {page}"));
    &page[at..at + page[at..].find("</table>").expect("a table")]
}

/// A broker with `BASE` of three partitions, each with `per` dead letters
/// of subscription `s` (payloads `p<i>-<j>`); and its console.
async fn parted(per: usize) -> (InProcessBroker, Router) {
    let b = InProcessBroker::start().await;
    let app = ricochet_broker::console::router(b.node.clone());
    PartitionsClient::new(channel(&b.url()).await)
        .create_partitioned_topic(UpdatePartitionsRequest {
            topic: BASE.into(),
            partitions: 3,
            replicas: 0,
        })
        .await
        .unwrap();
    for i in 0..3 {
        let payloads: Vec<String> = (0..per).map(|j| format!("p{i}-{j}")).collect();
        let doomed: Vec<Doomed> = payloads
            .iter()
            .map(|p| Doomed {
                payload: p.as_bytes(),
                key: "",
                properties: &[],
                detail: "bad",
            })
            .collect();
        dead_letter_all(&b.url(), &part(i), "s", &doomed).await;
    }
    (b, app)
}

#[tokio::test]
async fn a_partitioned_topic_is_listed_once_and_its_page_shows_each_partition() {
    let (_b, app) = parted(1).await;
    let (status, index) = get(&app, "/").await;
    assert_eq!(status, StatusCode::OK, "{index}");
    let base_link = format!("/topic?topic={}", q(BASE));
    let topic_links: Vec<String> = hrefs(&index)
        .into_iter()
        .filter(|h| h.starts_with("/topic?"))
        .collect();
    assert_eq!(
        topic_links.iter().filter(|h| **h == base_link).count(),
        1,
        "the base name listed once: {topic_links:?}"
    );
    for i in 0..3 {
        assert!(
            !topic_links.contains(&format!("/topic?topic={}", q(&part(i)))),
            "partition {i} is not listed as a topic of its own: {topic_links:?}"
        );
    }
    assert!(index.contains("(3 partitions)"), "{index}");
    // Summed over the partitions.
    assert!(index.contains("3 stored messages"), "{index}");

    let (status, page) = get(&app, &base_link).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("Partitioned topic"), "{page}");
    let rows = table(&page, "partitions");
    for i in 0..3 {
        assert!(
            hrefs(rows).contains(&format!("/topic?topic={}", q(&part(i)))),
            "partition {i} linked: {rows}"
        );
    }
}

#[tokio::test]
async fn dead_letters_of_a_base_name_link_and_act_on_their_own_partition() {
    let (b, app) = parted(2).await;
    let list = format!("/dead-letters?topic={}&sub=s", q(BASE));
    let (status, page) = get(&app, &list).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("6 dead letters match."), "{page}");
    // Each partition's count, with a link to its own list.
    let per = table(&page, "partition-letters");
    for i in 0..3 {
        assert!(
            hrefs(per).contains(&format!("/dead-letters?topic={}&sub=s", q(&part(i)))),
            "{per}"
        );
    }
    // No bulk action on the base name: its ids would be ambiguous.
    assert!(!page.contains("id=\"replay-all\""), "{page}");
    // Every row's links name the row's partition: ids 0 and 1 exist on each.
    let rows = &page[page.find("class=\"dead-letters\"").expect("the list")..];
    let details: Vec<String> = hrefs(rows)
        .into_iter()
        .filter(|h| h.starts_with("/dead-letter?"))
        .collect();
    assert_eq!(details.len(), 6, "{details:?}");
    for i in 0..3 {
        let mine = details
            .iter()
            .filter(|h| h.contains(&format!("topic={}&", q(&part(i)))))
            .count();
        assert_eq!(mine, 2, "two rows of partition {i}: {details:?}");
    }
    assert!(
        details
            .iter()
            .all(|h| !h.contains(&format!("topic={}&", q(BASE)))),
        "{details:?}"
    );

    // A row's replay: that partition's one dead letter, and nothing else.
    let replay = hrefs(rows)
        .into_iter()
        .find(|h| h.starts_with("/confirm/replay?") && h.contains(&q(&part(1))))
        .expect("a replay link of partition 1");
    let (status, confirm) = get(&app, &replay).await;
    assert_eq!(status, StatusCode::OK, "{confirm}");
    assert!(confirm.contains("Replay 1 dead letter?"), "{confirm}");
    let (status, done) = post(&app, &format!("token={}", token_of(&confirm))).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("Replayed 1 of 1"), "{done}");
    let left: Vec<u64> = {
        let mut v = Vec::new();
        for i in 0..3 {
            v.push(dead_letter_count(&b.url(), &part(i), "s").await);
        }
        v
    };
    assert_eq!(left, [2, 1, 2]);

    // A confirmation on the base name is refused, naming why; nothing changes.
    for action in ["replay", "purge"] {
        let (status, page) = get(&app, &format!("/confirm/{action}?topic={}&sub=s", q(BASE))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
        assert!(page.contains("partitioned topic of 3 partitions"), "{page}");
    }
    for (i, want) in [2, 1, 2].into_iter().enumerate() {
        assert_eq!(
            dead_letter_count(&b.url(), &part(i as u32), "s").await,
            want
        );
    }
}

#[tokio::test]
async fn replay_jobs_of_a_base_name_show_their_partition_and_cancel_there() {
    let (_b, app) = parted(20).await;
    AdminClient::new(channel(&_b.url()).await)
        .replay_dead_letters(ReplayDeadLettersRequest {
            topic: BASE.into(),
            subscription: "s".into(),
            rate_per_second: 1,
            detach: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let (status, page) = get(&app, &format!("/subscription?topic={}&sub=s", q(BASE))).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let jobs = table(&page, "jobs");
    let cancels: Vec<String> = hrefs(jobs)
        .into_iter()
        .filter(|h| h.starts_with("/confirm/cancel-job?"))
        .collect();
    assert_eq!(cancels.len(), 3, "one job per partition: {jobs}");
    for i in 0..3 {
        assert_eq!(
            cancels
                .iter()
                .filter(|h| h.contains(&format!("topic={}&", q(&part(i)))))
                .count(),
            1,
            "partition {i}'s job is cancelled on partition {i}: {cancels:?}"
        );
    }
    let (status, confirm) = get(&app, &cancels[0]).await;
    assert_eq!(status, StatusCode::OK, "{confirm}");
    let (status, done) = post(&app, &format!("token={}", token_of(&confirm))).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("Cancelled replay job"), "{done}");
    let (_, page) = get(&app, &format!("/subscription?topic={}&sub=s", q(BASE))).await;
    let left = hrefs(table(&page, "jobs"))
        .into_iter()
        .filter(|h| h.starts_with("/confirm/cancel-job?"))
        .count();
    assert_eq!(left, 2, "the other partitions' jobs run on");
}
