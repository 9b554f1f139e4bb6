//! The replica's index of applied client requests and their outcomes (exactly once,
//! DESIGN.md §4; Kudu's `ResultTracker`), and its persisted form.
//!
//! Every replica builds the same index from the same log: a WRITE entry with a request id is
//! applied only if the index admits it, and its outcome (op index, timestamp, per-row
//! statuses, or the refusal) is recorded, so a retry is answered with the first outcome. Each
//! client's requests below its first incomplete sequence number (the watermark it sends) are
//! forgotten: the client declared them complete, and a retry of one is refused as stale.
//!
//! The engine owns the index and persists it with every flush, in the rowset manifest
//! (`Manifest::request_outcomes`): the image taken when the MemRowSet is frozen describes
//! exactly the requests applied at or below the frozen `flush_index`, so after a restart the
//! index and the storage agree and WAL replay above `last_flushed_index` rebuilds the rest.
//! Layout in docs/storage-format.md.

use std::collections::{BTreeMap, HashMap};

use nyala_common::OpIndex;

use crate::error::{Result, StorageError};
use crate::manifest::Reader;
use crate::ops::RowStatus;
use crate::write_entry::RequestId;

/// Version of the encoded index (the first field of its image).
const REQUESTS_FORMAT_VERSION: u16 = 1;
/// A client none of whose requests was recorded for this long (in the entries' hybrid time)
/// is forgotten with its outcomes, as Kudu's `remember_clients_ttl_ms` (1 hour): a client
/// that wrote once and went away would otherwise keep its last outcome forever. A constant,
/// not a server setting: every replica must forget at the same entry, or one would apply a
/// retry that another skips.
pub const REMEMBER_CLIENTS_TTL_MS: u64 = 60 * 60 * 1000;
/// Expired clients are looked for when an entry's timestamp passes the last search by this
/// much (so a search over every client runs at most once per interval of log time).
pub const CLIENT_EXPIRY_INTERVAL_MS: u64 = 60 * 1000;
/// Logical bits below the physical microseconds of a hybrid timestamp
/// (`nyala.common.clock.HYBRID_LOGICAL_BITS`, Kudu's layout).
const HYBRID_LOGICAL_BITS: u32 = 12;

/// `ms` as a span of hybrid time.
const fn hybrid_ms(ms: u64) -> u64 {
    (ms * 1000) << HYBRID_LOGICAL_BITS
}
/// Longest client id accepted in an image, in bytes (ids are UUID-like; a bigger length is
/// damage).
const CLIENT_ID_BYTES_MAX: usize = 1024;

/// Whether a request may be applied (`RequestIndex::admit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Not applied before: apply it.
    New,
    /// Already applied: its first outcome is the answer.
    Duplicate,
    /// Below the client's first incomplete sequence number and no longer remembered: the
    /// client declared it complete, so it must not be applied again.
    Stale,
}

/// What a recorded request did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestResult {
    /// Its op batch was applied: `rows` rows, of which those in `failures` (row, status) did
    /// not end `Ok` (kept sparse: most batches have none).
    Rows {
        rows: u32,
        failures: Vec<(u32, RowStatus)>,
    },
    /// Its op batch was refused whole as malformed; nothing changed.
    Refused(String),
}

impl RequestResult {
    /// The result of an applied batch with these per-row `statuses`.
    pub fn from_statuses(statuses: &[RowStatus]) -> RequestResult {
        let failures = statuses
            .iter()
            .enumerate()
            .filter(|(_, s)| **s != RowStatus::Ok)
            .map(|(row, s)| (row as u32, *s))
            .collect();
        RequestResult::Rows {
            rows: statuses.len() as u32,
            failures,
        }
    }

    /// One status per row (None for a refused batch).
    pub fn statuses(&self) -> Option<Vec<RowStatus>> {
        match self {
            RequestResult::Rows { rows, failures } => {
                let mut statuses = vec![RowStatus::Ok; *rows as usize];
                for (row, status) in failures {
                    statuses[*row as usize] = *status;
                }
                Some(statuses)
            }
            RequestResult::Refused(_) => None,
        }
    }
}

/// The first outcome of one applied request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestOutcome {
    /// The op index of the entry that applied it.
    pub index: OpIndex,
    /// That entry's hybrid timestamp.
    pub timestamp: u64,
    pub result: RequestResult,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct ClientRequests {
    /// The highest first-incomplete sequence number the client sent.
    watermark: i64,
    /// The latest timestamp of an entry that recorded one of its requests (for expiry).
    last_timestamp: u64,
    /// Outcomes of the applied sequence numbers at or above `watermark` (invariant: no key
    /// is below it).
    applied: BTreeMap<i64, RequestOutcome>,
}

/// The request ids a replica has applied, per client, from each client's first incomplete
/// sequence number up, with their first outcomes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestIndex {
    clients: HashMap<String, ClientRequests>,
    /// The entry timestamp at which expired clients were last looked for (0: never).
    expiry_checked_at: u64,
}

impl RequestIndex {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `request` may be applied.
    pub fn admit(&self, request: &RequestId) -> Admission {
        self.admit_seq(&request.client_id, request.seq_no)
    }

    /// `admit` by client id and sequence number.
    pub fn admit_seq(&self, client_id: &str, seq_no: i64) -> Admission {
        match self.clients.get(client_id) {
            None => Admission::New,
            Some(c) if c.applied.contains_key(&seq_no) => Admission::Duplicate,
            Some(c) if seq_no < c.watermark => Admission::Stale,
            Some(_) => Admission::New,
        }
    }

    /// The first outcome of an applied request, if it is remembered.
    pub fn outcome(&self, client_id: &str, seq_no: i64) -> Option<&RequestOutcome> {
        self.clients.get(client_id)?.applied.get(&seq_no)
    }

    /// Records `request` as applied with `outcome` and forgets the client's requests below
    /// its first incomplete sequence number; returns that watermark. Clients idle for
    /// `REMEMBER_CLIENTS_TTL_MS` before the outcome's timestamp are forgotten
    /// (`expire_clients`). Deterministic: the same entries give the same index everywhere.
    pub fn record(&mut self, request: &RequestId, outcome: RequestOutcome) -> i64 {
        let now = outcome.timestamp;
        if now
            >= self
                .expiry_checked_at
                .saturating_add(hybrid_ms(CLIENT_EXPIRY_INTERVAL_MS))
        {
            self.expire_clients(now);
        }
        let client = self
            .clients
            .entry(request.client_id.clone())
            .or_insert_with(|| ClientRequests {
                watermark: i64::MIN,
                last_timestamp: 0,
                applied: BTreeMap::new(),
            });
        client.last_timestamp = client.last_timestamp.max(now);
        client.applied.insert(request.seq_no, outcome);
        if request.first_incomplete_seq_no > client.watermark {
            client.watermark = request.first_incomplete_seq_no;
            client.applied = client.applied.split_off(&client.watermark);
        }
        client.watermark
    }

    /// Forgets every client whose last recorded request is more than
    /// `REMEMBER_CLIENTS_TTL_MS` older than `now` (an entry's timestamp).
    fn expire_clients(&mut self, now: u64) {
        self.expiry_checked_at = now;
        let oldest = now.saturating_sub(hybrid_ms(REMEMBER_CLIENTS_TTL_MS));
        self.clients.retain(|_, c| c.last_timestamp >= oldest);
    }

    /// Number of remembered clients.
    pub fn clients(&self) -> usize {
        self.clients.len()
    }

    /// Number of remembered request ids (all clients).
    pub fn len(&self) -> usize {
        self.clients.values().map(|c| c.applied.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The persisted image: every client (in id order) with its watermark and outcomes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&REQUESTS_FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&self.expiry_checked_at.to_le_bytes());
        let mut ids: Vec<&String> = self.clients.keys().collect();
        ids.sort();
        out.extend_from_slice(&(ids.len() as u32).to_le_bytes());
        for id in ids {
            let client = &self.clients[id];
            out.extend_from_slice(&(id.len() as u16).to_le_bytes());
            out.extend_from_slice(id.as_bytes());
            out.extend_from_slice(&client.watermark.to_le_bytes());
            out.extend_from_slice(&client.last_timestamp.to_le_bytes());
            out.extend_from_slice(&(client.applied.len() as u32).to_le_bytes());
            for (seq_no, outcome) in &client.applied {
                encode_outcome(&mut out, *seq_no, outcome);
            }
        }
        out
    }

    /// Parses an image written by `encode`; an empty image is an empty index (manifests
    /// written before outcomes were persisted). Anything malformed is `Corruption`.
    pub fn decode(image: &[u8]) -> Result<RequestIndex> {
        let mut index = RequestIndex::new();
        if image.is_empty() {
            return Ok(index);
        }
        let mut r = Reader::new(image, "request outcomes");
        let version = r.u16()?;
        if version != REQUESTS_FORMAT_VERSION {
            return Err(StorageError::NotSupported(format!(
                "request outcomes format version {version}"
            )));
        }
        index.expiry_checked_at = r.u64()?;
        let clients = r.u32()?;
        for _ in 0..clients {
            let id_len = usize::from(r.u16()?);
            if id_len > CLIENT_ID_BYTES_MAX {
                return Err(corrupt("client id longer than its limit"));
            }
            let id = std::str::from_utf8(r.take(id_len)?)
                .map_err(|e| corrupt(&format!("client id: {e}")))?
                .to_owned();
            let watermark = r.u64()? as i64;
            let last_timestamp = r.u64()?;
            let count = r.u32()?;
            let mut applied = BTreeMap::new();
            for _ in 0..count {
                let (seq_no, outcome) = decode_outcome(&mut r)?;
                if seq_no < watermark {
                    return Err(corrupt("an outcome below its client's watermark"));
                }
                if applied.insert(seq_no, outcome).is_some() {
                    return Err(corrupt("a request recorded twice"));
                }
            }
            let client = ClientRequests {
                watermark,
                last_timestamp,
                applied,
            };
            if index.clients.insert(id, client).is_some() {
                return Err(corrupt("a client recorded twice"));
            }
        }
        if r.at != image.len() {
            return Err(corrupt("trailing bytes"));
        }
        Ok(index)
    }
}

fn encode_outcome(out: &mut Vec<u8>, seq_no: i64, outcome: &RequestOutcome) {
    out.extend_from_slice(&seq_no.to_le_bytes());
    out.extend_from_slice(&outcome.index.to_le_bytes());
    out.extend_from_slice(&outcome.timestamp.to_le_bytes());
    match &outcome.result {
        RequestResult::Rows { rows, failures } => {
            out.push(0);
            out.extend_from_slice(&rows.to_le_bytes());
            out.extend_from_slice(&(failures.len() as u32).to_le_bytes());
            for (row, status) in failures {
                out.extend_from_slice(&row.to_le_bytes());
                out.push(*status as u8);
            }
        }
        RequestResult::Refused(message) => {
            out.push(1);
            out.extend_from_slice(&(message.len() as u32).to_le_bytes());
            out.extend_from_slice(message.as_bytes());
        }
    }
}

fn decode_outcome(r: &mut Reader<'_>) -> Result<(i64, RequestOutcome)> {
    let seq_no = r.u64()? as i64;
    let index = r.u64()?;
    let timestamp = r.u64()?;
    let result = match r.u8()? {
        0 => {
            let rows = r.u32()?;
            let count = r.u32()?;
            let mut failures = Vec::with_capacity((count as usize).min(r.remaining() / 5));
            for _ in 0..count {
                let row = r.u32()?;
                if row >= rows {
                    return Err(corrupt("a failed row beyond its batch"));
                }
                let code = r.u8()?;
                let status = RowStatus::from_code(code)
                    .ok_or_else(|| corrupt(&format!("row status {code}")))?;
                failures.push((row, status));
            }
            RequestResult::Rows { rows, failures }
        }
        1 => {
            let len = r.u32()? as usize;
            let message = std::str::from_utf8(r.take(len)?)
                .map_err(|e| corrupt(&format!("refusal message: {e}")))?;
            RequestResult::Refused(message.to_owned())
        }
        other => return Err(corrupt(&format!("outcome kind {other}"))),
    };
    let outcome = RequestOutcome {
        index,
        timestamp,
        result,
    };
    Ok((seq_no, outcome))
}

fn corrupt(what: &str) -> StorageError {
    StorageError::corruption(format!("request outcomes: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(client: &str, seq: i64, first: i64) -> RequestId {
        RequestId {
            client_id: client.into(),
            seq_no: seq,
            first_incomplete_seq_no: first,
        }
    }

    fn applied(index: OpIndex, statuses: &[RowStatus]) -> RequestOutcome {
        RequestOutcome {
            index,
            timestamp: index * 10,
            result: RequestResult::from_statuses(statuses),
        }
    }

    #[test]
    fn request_index_dedupes_and_trims_below_the_watermark() {
        let mut index = RequestIndex::new();
        assert_eq!(index.admit(&req("c", 0, 0)), Admission::New);
        assert_eq!(index.record(&req("c", 0, 0), applied(1, &[])), 0);
        assert_eq!(index.record(&req("c", 1, 0), applied(2, &[])), 0);
        assert_eq!(index.admit(&req("c", 0, 0)), Admission::Duplicate);
        assert_eq!(index.record(&req("c", 2, 1), applied(3, &[])), 1);
        // Seq 0 is below the watermark and forgotten: a retry of it is stale.
        assert_eq!(index.admit(&req("c", 0, 0)), Admission::Stale);
        assert!(index.outcome("c", 0).is_none());
        assert_eq!(index.admit(&req("c", 1, 0)), Admission::Duplicate);
        assert_eq!(index.outcome("c", 1).map(|o| o.index), Some(2));
        assert_eq!(index.len(), 2);
        assert_eq!(index.admit_seq("other", 0), Admission::New);
    }

    #[test]
    fn the_image_round_trips_every_outcome_and_watermark() {
        let mut index = RequestIndex::new();
        let mixed = [RowStatus::Ok, RowStatus::AlreadyPresent, RowStatus::Ok];
        index.record(&req("a", 4, 3), applied(7, &mixed));
        index.record(&req("a", 5, 3), applied(8, &[RowStatus::Ok; 2]));
        let refused = RequestOutcome {
            index: 9,
            timestamp: 90,
            result: RequestResult::Refused("not arrow".into()),
        };
        index.record(&req("b", 0, 0), refused);
        let back = RequestIndex::decode(&index.encode()).unwrap();
        assert_eq!(back, index);
        assert_eq!(
            back.outcome("a", 4).unwrap().result.statuses().unwrap(),
            mixed
        );
        assert_eq!(back.admit_seq("a", 2), Admission::Stale);
        assert_eq!(RequestIndex::decode(&[]).unwrap(), RequestIndex::new());
    }

    #[test]
    fn idle_clients_are_forgotten_after_their_ttl_and_the_image_keeps_the_clock() {
        let at = |ms: u64, index| RequestOutcome {
            index,
            timestamp: hybrid_ms(ms),
            result: RequestResult::from_statuses(&[]),
        };
        let mut index = RequestIndex::new();
        index.record(&req("idle", 1, 1), at(1_000, 1));
        index.record(&req("busy", 1, 1), at(2_000, 2));
        let later = 1_000 + REMEMBER_CLIENTS_TTL_MS;
        index.record(&req("busy", 2, 1), at(later, 3));
        assert_eq!(index.clients(), 2, "idle is exactly at its TTL: kept");
        // Restored from its image, the index forgets at the same entry as one that ran on.
        let mut restored = RequestIndex::decode(&index.encode()).unwrap();
        let next = later + CLIENT_EXPIRY_INTERVAL_MS + 1;
        index.record(&req("busy", 3, 1), at(next, 4));
        restored.record(&req("busy", 3, 1), at(next, 4));
        assert_eq!(restored, index);
        assert_eq!(index.clients(), 1);
        assert_eq!(index.admit_seq("idle", 1), Admission::New);
        assert_eq!(index.admit_seq("busy", 1), Admission::Duplicate);
    }

    #[test]
    fn a_damaged_image_is_corruption_never_an_empty_index() {
        let mut index = RequestIndex::new();
        index.record(&req("a", 4, 3), applied(7, &[RowStatus::NotFound]));
        let image = index.encode();
        for cut in 1..image.len() {
            let err = RequestIndex::decode(&image[..cut]).unwrap_err();
            assert!(matches!(err, StorageError::Corruption(_)), "{cut}: {err}");
        }
        let mut long = image.clone();
        long.push(0);
        assert!(matches!(
            RequestIndex::decode(&long),
            Err(StorageError::Corruption(_))
        ));
        let mut version = image.clone();
        version[0] = 9;
        assert!(matches!(
            RequestIndex::decode(&version),
            Err(StorageError::NotSupported(_))
        ));
    }
}
