//! A leader's AppendEntries in wire form, encoded here rather than through protobuf's Python
//! objects: the head of a serialized `ConsensusRequestPB` (every field but the entries'
//! bytes, which follow it from where they lie) and the peer channel's frame of a
//! `ConsensusBatchRequestPB` (proto/nyala/consensus.proto). The bytes are what protobuf
//! would serialize for the same fields (proto3: fields at their default are left out, in
//! field-number order), so a receiver cannot tell the two apart; the Python tests parse them
//! back with protobuf.

use nyala_common::proto::{
    put_bytes, put_fixed64, put_len_head, put_op_id, put_packed, put_tag, put_uint, varint_len,
    VARINT,
};
use nyala_common::OpId;

/// Field numbers of ConsensusRequestPB (proto/nyala/consensus.proto), for its writer here and
/// its reader in the extension (a follower's native receive).
pub mod request_fields {
    pub const DEST_UUID: u64 = 1;
    pub const TABLET_ID: u64 = 2;
    pub const CALLER_UUID: u64 = 3;
    pub const CALLER_TERM: u64 = 4;
    pub const PRECEDING_ID: u64 = 5;
    pub const COMMITTED_INDEX: u64 = 6;
    pub const LAST_IDX_APPENDED_TO_LEADER: u64 = 8;
    pub const ENTRIES: u64 = 9;
    pub const ENTRY_COUNT: u64 = 10;
    pub const FIRST_ENTRY_ID: u64 = 11;
    pub const LAST_ENTRY_ID: u64 = 12;
    pub const ENTRIES_ALIGNMENT: u64 = 13;
    pub const QUIESCE: u64 = 14;
    pub const LEADER_TIMESTAMP: u64 = 15;
    pub const SAFE_TIMESTAMP: u64 = 16;
}
use request_fields::*;

// Field numbers of ConsensusBatchRequestPB.
const BATCH_DEST_UUID: u64 = 1;
const BATCH_CALLER_UUID: u64 = 2;
const BATCH_REQUESTS: u64 = 3;
const BATCH_CALL_IDS: u64 = 4; // packed
const BATCH_VOTES: u64 = 5;
const BATCH_VOTE_CALL_IDS: u64 = 6; // packed

/// Where the entries start in a serialized request is made a multiple of this
/// (`entries_alignment` in consensus.proto), so a follower keeps aligned Arrow buffers.
pub const ENTRIES_ALIGNMENT: usize = 8;

/// What an AppendEntries' head says of its entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntriesHead {
    pub count: u32,
    pub first: OpId,
    pub last: OpId,
    /// Bytes of the batch's encoding (the `entries` field's length).
    pub size: usize,
}

/// The fields of an AppendEntries other than its entries' bytes.
#[derive(Clone, Debug)]
pub struct AppendHead<'a> {
    pub dest_uuid: &'a str,
    pub tablet_id: &'a str,
    pub caller_uuid: &'a str,
    pub term: u64,
    pub preceding: OpId,
    pub committed_index: u64,
    pub last_appended_index: u64,
    pub quiesce: bool,
    pub entries: Option<EntriesHead>,
    pub leader_timestamp: u64,
    pub safe_timestamp: u64,
}

/// The serialized `ConsensusRequestPB` of `head` without its entries' bytes: with entries,
/// every other field, then an `entries_alignment` field that puts the entries' first byte
/// at a multiple of `ENTRIES_ALIGNMENT` from the request's start, then the `entries` tag
/// and length. The batch's own bytes, appended, complete the request (protobuf parses a
/// message followed by one more field as the message with that field). Without entries,
/// the whole request.
pub fn append_request_head(head: &AppendHead<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        160 + head.dest_uuid.len() + head.tablet_id.len() + head.caller_uuid.len(),
    );
    put_bytes(&mut out, DEST_UUID, head.dest_uuid.as_bytes());
    put_bytes(&mut out, TABLET_ID, head.tablet_id.as_bytes());
    put_bytes(&mut out, CALLER_UUID, head.caller_uuid.as_bytes());
    put_uint(&mut out, CALLER_TERM, head.term);
    put_op_id(&mut out, PRECEDING_ID, head.preceding);
    put_uint(&mut out, COMMITTED_INDEX, head.committed_index);
    put_uint(
        &mut out,
        LAST_IDX_APPENDED_TO_LEADER,
        head.last_appended_index,
    );
    if let Some(entries) = head.entries {
        put_uint(&mut out, ENTRY_COUNT, u64::from(entries.count));
        put_op_id(&mut out, FIRST_ENTRY_ID, entries.first);
        put_op_id(&mut out, LAST_ENTRY_ID, entries.last);
    }
    if head.quiesce {
        put_tag(&mut out, QUIESCE, VARINT);
        out.push(1);
    }
    put_fixed64(&mut out, LEADER_TIMESTAMP, head.leader_timestamp);
    put_fixed64(&mut out, SAFE_TIMESTAMP, head.safe_timestamp);
    let Some(entries) = head.entries else {
        return out;
    };
    // The entries' tag and length follow the padding field; both are small.
    let entries_head_len = 1 + varint_len(entries.size as u64);
    let pad = (ENTRIES_ALIGNMENT - (out.len() + entries_head_len) % ENTRIES_ALIGNMENT)
        % ENTRIES_ALIGNMENT;
    if pad != 0 {
        // A field of n zeros takes 2 + n bytes (n < 128): the fewest that make `pad`.
        let zeros = if pad >= 3 {
            pad - 2
        } else {
            pad + ENTRIES_ALIGNMENT - 2
        };
        put_len_head(&mut out, request_fields::ENTRIES_ALIGNMENT, zeros);
        out.resize(out.len() + zeros, 0);
    }
    put_len_head(&mut out, ENTRIES, entries.size);
    out
}

/// One request of a batch frame: its head, then its body (a batch's bytes, possibly empty),
/// which together are the serialized request.
pub struct FrameRequest<'a> {
    pub head: &'a [u8],
    pub body: &'a [u8],
}

/// A piece of a frame, written in order: bytes built here, or the body of request `i`,
/// written from where it lies.
#[derive(Debug, PartialEq, Eq)]
pub enum FramePiece {
    Built(Vec<u8>),
    Body(usize),
}

/// The peer channel's frame of a `ConsensusBatchRequestPB` (a 4-byte big-endian length,
/// then the message) holding `requests` with their `call_ids`, and `votes` (call id,
/// serialized `VoteRequestPB`), as pieces to write in order: every body shorter than
/// `in_place_min` is copied into the built bytes around it, a longer one stays in place.
pub fn batch_request_frame(
    dest_uuid: &str,
    caller_uuid: &str,
    call_ids: &[u64],
    requests: &[FrameRequest<'_>],
    votes: &[(u64, &[u8])],
    in_place_min: usize,
) -> Vec<FramePiece> {
    let mut pieces = Vec::new();
    let mut built = Vec::with_capacity(256);
    built.extend_from_slice(&[0; 4]); // the length, filled in last
    put_bytes(&mut built, BATCH_DEST_UUID, dest_uuid.as_bytes());
    put_bytes(&mut built, BATCH_CALLER_UUID, caller_uuid.as_bytes());
    for (i, request) in requests.iter().enumerate() {
        // A repeated bytes field: every element is written, empty ones too.
        put_len_head(
            &mut built,
            BATCH_REQUESTS,
            request.head.len() + request.body.len(),
        );
        built.extend_from_slice(request.head);
        if request.body.len() < in_place_min {
            built.extend_from_slice(request.body);
            continue;
        }
        pieces.push(FramePiece::Built(std::mem::take(&mut built)));
        pieces.push(FramePiece::Body(i));
    }
    put_packed(&mut built, BATCH_CALL_IDS, call_ids.iter().copied());
    for (_, vote) in votes {
        put_len_head(&mut built, BATCH_VOTES, vote.len());
        built.extend_from_slice(vote);
    }
    put_packed(
        &mut built,
        BATCH_VOTE_CALL_IDS,
        votes.iter().map(|(id, _)| *id),
    );
    pieces.push(FramePiece::Built(built));
    let total: usize = pieces
        .iter()
        .map(|piece| match piece {
            FramePiece::Built(bytes) => bytes.len(),
            FramePiece::Body(i) => requests[*i].body.len(),
        })
        .sum();
    let FramePiece::Built(first) = &mut pieces[0] else {
        unreachable!("a frame starts with its built head");
    };
    // The length counts the message, not the 4 bytes that hold it.
    let length = u32::try_from(total - 4).expect("a peer channel frame is under 4 GiB");
    first[..4].copy_from_slice(&length.to_be_bytes());
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(entries: Option<EntriesHead>, tablet_id: &str) -> AppendHead<'_> {
        AppendHead {
            dest_uuid: "follower",
            tablet_id,
            caller_uuid: "leader",
            term: 3,
            preceding: OpId::new(3, 99),
            committed_index: 98,
            last_appended_index: 0,
            quiesce: false,
            entries,
            leader_timestamp: 1 << 40,
            safe_timestamp: (1 << 40) - 5,
        }
    }

    #[test]
    fn the_entries_start_aligned_for_every_header_length() {
        for size in [1, 127, 128, 300, 70_000] {
            let entries = EntriesHead {
                count: 2,
                first: OpId::new(3, 100),
                last: OpId::new(3, 101),
                size,
            };
            for length in 0..24 {
                let tablet_id = "t".repeat(length);
                let bytes = append_request_head(&head(Some(entries), &tablet_id));
                assert_eq!(bytes.len() % ENTRIES_ALIGNMENT, 0, "tablet id of {length}");
                let mut tail = Vec::new();
                put_len_head(&mut tail, ENTRIES, size);
                assert!(bytes.ends_with(&tail));
            }
        }
    }

    #[test]
    fn a_heartbeat_is_the_whole_request() {
        let bytes = append_request_head(&head(None, "tablet"));
        let mut expected = Vec::new();
        put_bytes(&mut expected, DEST_UUID, b"follower");
        put_bytes(&mut expected, TABLET_ID, b"tablet");
        put_bytes(&mut expected, CALLER_UUID, b"leader");
        expected.extend_from_slice(&[4 << 3, 3, (5 << 3) | 2, 4, 1 << 3, 3, 2 << 3, 99]);
        expected.extend_from_slice(&[6 << 3, 98]);
        expected.push(15 << 3 | 1);
        expected.extend_from_slice(&(1u64 << 40).to_le_bytes());
        expected.extend_from_slice(&[(16 << 3 | 1) as u8 | 0x80, 1]);
        expected.extend_from_slice(&((1u64 << 40) - 5).to_le_bytes());
        assert_eq!(bytes, expected);
    }

    #[test]
    fn a_frame_keeps_large_bodies_in_place_and_counts_them() {
        let small = vec![7u8; 10];
        let large = vec![9u8; 100];
        let requests = [
            FrameRequest {
                head: b"h1",
                body: &small,
            },
            FrameRequest {
                head: b"h2",
                body: &large,
            },
            FrameRequest {
                head: b"h3",
                body: b"",
            },
        ];
        let pieces = batch_request_frame("d", "c", &[1, 300, 2], &requests, &[(5, b"v")], 50);
        assert_eq!(pieces.len(), 3);
        assert_eq!(pieces[1], FramePiece::Body(1));
        let (FramePiece::Built(first), FramePiece::Built(last)) = (&pieces[0], &pieces[2]) else {
            panic!("built pieces around the body: {pieces:?}");
        };
        let length = u32::from_be_bytes(first[..4].try_into().unwrap()) as usize;
        assert_eq!(length, first.len() - 4 + large.len() + last.len());
        assert!(first.ends_with(b"h2"));
        assert!(last.starts_with(b"\x1a\x02h3"));
        // call ids 1, 300, 2 packed; the vote; its call id.
        assert!(last.ends_with(b"\x22\x04\x01\xac\x02\x02\x2a\x01v\x32\x01\x05"));
    }
}
