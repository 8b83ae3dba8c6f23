//! Coalesced entries (`PartitionCommand::Sequence`): the borrowed
//! encoding, the in-place reading, and the apply — each command as the
//! entry of its own it would have been, with its own reply, on every
//! replica and again after a restart.

use super::append_view;
use super::*;
use crate::storage::{MemoryStorage, TopicKind};
use ricochet_replication::Apply as _;

const T: &str = "persistent://public/default/seq";

fn record() -> TopicRecord {
    TopicRecord {
        name: T.to_owned(),
        created_ms: 1,
        kind: TopicKind::Normal,
        replicas: 3,
        trimmed_below: 0,
    }
}

/// An `Append` of `n` entries from `first`, filled with `fill`.
fn append(first: u64, n: u64, fill: u8, producer: Option<(&str, u64)>) -> PartitionCommand {
    PartitionCommand::Append(AppendBatch {
        topic: T.to_owned(),
        first_id: first,
        entries: (0..n)
            .map(|i| serde_bytes::ByteBuf::from(vec![fill.wrapping_add(i as u8); 30 + i as usize]))
            .collect(),
        producer: producer.map(|(p, s)| (p.to_owned(), s)),
    })
}

fn publish() -> PartitionCommand {
    PartitionCommand::Publish(PublishBatch {
        topic: T.to_owned(),
        producer: String::new(),
        publish_time_ms: 5,
        messages: vec![PublishMessage {
            payload: b"anonymous".to_vec(),
            ..Default::default()
        }],
    })
}

fn replies(bytes: &[u8]) -> Vec<PartitionReply> {
    match decode::<PartitionReply>(bytes).unwrap() {
        PartitionReply::Each(r) => r.iter().map(|b| decode(b).unwrap()).collect(),
        other => panic!("not a sequence's replies: {other:?}"),
    }
}

fn refused(r: &PartitionReply) -> bool {
    matches!(r, PartitionReply::Refused(_))
}

/// What a replica holds that these commands change: its entries and its
/// producer sequences.
type Held = (Vec<(u64, Vec<u8>)>, Vec<(String, u64)>);

/// What a replica holds that these commands change.
fn state(storage: &Arc<dyn Storage>) -> Held {
    let mut seqs = storage.producer_sequences(T).unwrap();
    seqs.sort();
    (storage.read(T, 0, 1000, usize::MAX).unwrap(), seqs)
}

/// The bytes written from borrowed commands are the owned `Sequence`'s,
/// and the in-place reading gives back each command's bytes; anything
/// else (truncated, bytes left over, another command) is no sequence.
#[test]
fn a_sequence_encoded_from_borrowed_commands_reads_back_in_place() {
    let commands: Vec<Vec<u8>> = [append(0, 3, 1, None), append(3, 2, 9, Some(("p", 4)))]
        .iter()
        .map(|c| encode(c).unwrap())
        .collect();
    let borrowed = SequenceRef(&commands);
    let bytes = ricochet_replication::encode_sized(&borrowed, borrowed.size_hint()).unwrap();
    let owned = PartitionCommand::Sequence(
        commands
            .iter()
            .map(|c| serde_bytes::ByteBuf::from(c.clone()))
            .collect(),
    );
    assert_eq!(bytes, encode(&owned).unwrap());
    let read = append_view::sequence(&bytes).expect("a sequence");
    assert_eq!(read, commands.iter().map(Vec::as_slice).collect::<Vec<_>>());
    match decode::<PartitionCommand>(&bytes).unwrap() {
        PartitionCommand::Sequence(c) => assert_eq!(c.len(), 2),
        other => panic!("decoded as {other:?}"),
    }
    for cut in 0..bytes.len() {
        assert!(
            append_view::sequence(&bytes[..cut]).is_none(),
            "cut at {cut}"
        );
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(append_view::sequence(&longer).is_none());
    assert!(append_view::sequence(&commands[0]).is_none());
}

/// One coalesced entry applied on one replica leaves the store and
/// answers each command as the same commands applied as entries of their
/// own on another: stored, other bytes at taken ids refused (that command
/// alone: the next one applies), a producer's sequence kept. A `Publish`
/// or a nested sequence inside is refused alone. A restart applies the
/// whole entry again: the same answers, the store unchanged.
#[test]
fn a_sequence_applies_each_command_in_order_with_its_own_reply_as_separate_entries_would() {
    let inner = [
        append(0, 3, 1, None),
        append(0, 2, 200, None),
        append(3, 2, 50, Some(("p", 7))),
        append(5, 1, 90, Some(("p", 8))),
    ];
    let bytes: Vec<Vec<u8>> = inner.iter().map(|c| encode(c).unwrap()).collect();
    let nested = encode(&SequenceRef(&bytes[..1])).unwrap();
    let mut with_refused = bytes.clone();
    with_refused.insert(2, encode(&publish()).unwrap());
    with_refused.push(nested);
    let entry = encode(&SequenceRef(&with_refused)).unwrap();

    let coalesced: Arc<dyn Storage> = Arc::new(MemoryStorage::new());
    let separate: Arc<dyn Storage> = Arc::new(MemoryStorage::new());
    let (a, b) = (
        StorageApplier::for_partition(coalesced.clone(), T),
        StorageApplier::for_partition(separate.clone(), T),
    );
    let create = encode(&PartitionCommand::CreateTopic(record())).unwrap();
    a.apply(1, &create).unwrap();
    b.apply(1, &create).unwrap();

    let got = replies(&a.apply(2, &entry).unwrap());
    let mut want: Vec<PartitionReply> = bytes
        .iter()
        .enumerate()
        .map(|(i, c)| decode(&b.apply(2 + i as u64, c).unwrap()).unwrap())
        .collect();
    assert_eq!(
        want.iter().map(refused).collect::<Vec<_>>(),
        [false, true, false, false]
    );
    let refusal = |r: &PartitionReply| match r {
        PartitionReply::Refused(why) => why.clone(),
        other => panic!("not refused: {other:?}"),
    };
    assert!(refusal(&want[1]).contains("taken"), "{want:?}");
    assert_eq!(got.len(), 6);
    assert!(refusal(&got[2]).contains("never proposed inside a sequence"));
    assert!(refusal(&got[5]).contains("never proposed inside a sequence"));
    assert_eq!(
        [&got[0], &got[1], &got[3], &got[4]]
            .map(|r| r.clone())
            .to_vec(),
        want
    );
    let applied = state(&coalesced);
    assert_eq!(applied, state(&separate));
    assert_eq!(
        applied.0.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        (0..6).collect::<Vec<_>>()
    );
    assert_eq!(applied.1, [("p".to_owned(), 8)]);

    // A restart: the applied mark was before the entry; a new applier on
    // the same store applies it again whole.
    drop(a);
    let again = StorageApplier::for_partition(coalesced.clone(), T);
    let second = replies(&again.apply(2, &entry).unwrap());
    assert_eq!(
        second.iter().map(refused).collect::<Vec<_>>(),
        got.iter().map(refused).collect::<Vec<_>>()
    );
    assert_eq!(state(&coalesced), applied);
    // The decoded form (what a non-canonical encoding falls back to)
    // answers the same.
    want.clear();
    let decoded = PartitionCommand::Sequence(
        with_refused
            .iter()
            .map(|c| serde_bytes::ByteBuf::from(c.clone()))
            .collect(),
    );
    let third = replies(
        &again
            .apply_one(2, &encode(&decoded).unwrap(), false)
            .unwrap(),
    );
    assert_eq!(third, second);
}
