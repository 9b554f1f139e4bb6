//! The rowset manifest: the live rowsets, `last_flushed_index` and the schema they were written
//! under, replaced atomically (temp file, fsync, rename, fsync dir) so that a crash leaves the
//! old set or the new one, never a mix.
//!
//! The file uses the metadata container of `python/nyala/common/metafile.py` (kind
//! `ROWSET_MANIFEST = 5`), so one reader covers every metadata file; the payload layout is in
//! docs/storage-format.md.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nyala_common::OpIndex;

use crate::error::{Result, StorageError};
use crate::schema::{ColumnSchema, DataType, Schema, Value};

/// The manifest's file name inside a tablet's data directory.
pub const MANIFEST_FILE: &str = "rowset-manifest";
const MAGIC: &[u8; 4] = b"NYMF";
const CONTAINER_VERSION: u16 = 1;
/// `MetaKind.ROWSET_MANIFEST` in metafile.py.
const KIND_ROWSET_MANIFEST: u16 = 5;
const HEADER_BYTES: usize = 24;
/// Version 3 adds `request_outcomes`; version 2 (without them, read as none) adds
/// `history_gc_mark`; version 1 (without it) is still read, as mark 0.
const PAYLOAD_VERSION: u16 = 3;
const PAYLOAD_VERSION_NO_OUTCOMES: u16 = 2;
const PAYLOAD_VERSION_NO_GC_MARK: u16 = 1;
/// Largest payload accepted, in bytes (metadata is small; a bigger length is damage).
pub const PAYLOAD_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// One live rowset as the manifest records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowSetEntry {
    pub id: u64,
    pub rows: u64,
    pub tombstones: u64,
}

/// The durable state of a tablet's data.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    /// Every op with index <= this is in the rowsets below (or was a no-op for storage).
    pub last_flushed_index: OpIndex,
    /// Ids below this were used; a new rowset takes this one.
    pub next_rowset_id: u64,
    /// The highest ancient history mark a compaction of these rowsets collected at.
    pub history_gc_mark: u64,
    pub schema: Schema,
    /// Oldest first: a later rowset's version of a key shadows an earlier one's.
    pub rowsets: Vec<RowSetEntry>,
    /// The image (`RequestIndex::encode`) of the request index as it was when every op
    /// <= `last_flushed_index` had been applied, and no later one: exactly-once across
    /// restarts. Empty for none.
    pub request_outcomes: Arc<[u8]>,
}

/// The manifest path in `dir`.
pub fn manifest_path(dir: &Path) -> PathBuf {
    dir.join(MANIFEST_FILE)
}

impl Manifest {
    /// The payload bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_u16(&mut out, PAYLOAD_VERSION);
        put_u64(&mut out, self.last_flushed_index);
        put_u64(&mut out, self.next_rowset_id);
        put_u64(&mut out, self.history_gc_mark);
        encode_schema(&mut out, &self.schema);
        put_u32(&mut out, self.rowsets.len() as u32);
        for rowset in &self.rowsets {
            put_u64(&mut out, rowset.id);
            put_u64(&mut out, rowset.rows);
            put_u64(&mut out, rowset.tombstones);
        }
        put_bytes(&mut out, &self.request_outcomes);
        out
    }

    /// Parses a payload; anything malformed is `Corruption`.
    pub fn decode(payload: &[u8]) -> Result<Manifest> {
        let mut r = Reader::new(payload, "rowset manifest");
        let version = r.u16()?;
        if !(PAYLOAD_VERSION_NO_GC_MARK..=PAYLOAD_VERSION).contains(&version) {
            return Err(StorageError::NotSupported(format!(
                "rowset manifest payload version {version}"
            )));
        }
        let last_flushed_index = r.u64()?;
        let next_rowset_id = r.u64()?;
        let history_gc_mark = if version >= PAYLOAD_VERSION_NO_OUTCOMES {
            r.u64()?
        } else {
            0
        };
        let schema = decode_schema(&mut r)?;
        let count = r.u32()? as usize;
        let mut rowsets = Vec::with_capacity(count.min(1 << 16));
        for _ in 0..count {
            let entry = RowSetEntry {
                id: r.u64()?,
                rows: r.u64()?,
                tombstones: r.u64()?,
            };
            if entry.id >= next_rowset_id {
                return Err(StorageError::corruption(
                    "manifest rowset id beyond next id",
                ));
            }
            rowsets.push(entry);
        }
        let request_outcomes: Arc<[u8]> = if version == PAYLOAD_VERSION {
            Arc::from(r.bytes()?)
        } else {
            Arc::from(&[][..])
        };
        if r.at != payload.len() {
            return Err(StorageError::corruption(
                "trailing bytes in rowset manifest",
            ));
        }
        Ok(Manifest {
            last_flushed_index,
            next_rowset_id,
            history_gc_mark,
            schema,
            rowsets,
            request_outcomes,
        })
    }

    /// Replaces the manifest in `dir` atomically. A payload over `PAYLOAD_BYTES_MAX` is
    /// refused here (`IllegalState`), as the reader would refuse it.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let path = manifest_path(dir);
        let temp = dir.join(format!(".{MANIFEST_FILE}.tmp"));
        let payload = self.encode();
        if payload.len() as u64 > PAYLOAD_BYTES_MAX {
            return Err(StorageError::IllegalState(format!(
                "{}: rowset manifest of {} bytes is over {PAYLOAD_BYTES_MAX} bytes \
                 ({} bytes of request outcomes)",
                path.display(),
                payload.len(),
                self.request_outcomes.len()
            )));
        }
        let image = container(&payload);
        let mut file = File::create(&temp).map_err(|e| StorageError::io(&temp, e))?;
        file.write_all(&image)
            .map_err(|e| StorageError::io(&temp, e))?;
        file.sync_all().map_err(|e| StorageError::io(&temp, e))?;
        drop(file);
        std::fs::rename(&temp, &path).map_err(|e| StorageError::io(&path, e))?;
        fsync_dir(dir)
    }

    /// Reads the manifest in `dir`; `NotFound` if there is none.
    pub fn read(dir: &Path) -> Result<Manifest> {
        let path = manifest_path(dir);
        let image = match std::fs::read(&path) {
            Ok(image) => image,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StorageError::NotFound(format!(
                    "{}: no rowset manifest",
                    path.display()
                )))
            }
            Err(e) => return Err(StorageError::io(&path, e)),
        };
        let payload = open_container(&image)
            .map_err(|e| StorageError::corruption(format!("{}: {e}", path.display())))?;
        Manifest::decode(payload)
    }
}

/// Wraps a payload in the metafile container (see metafile.py for the layout).
pub fn container(payload: &[u8]) -> Vec<u8> {
    let mut head = Vec::with_capacity(HEADER_BYTES + payload.len());
    head.extend_from_slice(MAGIC);
    put_u16(&mut head, CONTAINER_VERSION);
    put_u16(&mut head, KIND_ROWSET_MANIFEST);
    put_u64(&mut head, payload.len() as u64);
    put_u32(&mut head, crc32c::crc32c(payload));
    let header_crc = crc32c::crc32c(&head);
    put_u32(&mut head, header_crc);
    head.extend_from_slice(payload);
    head
}

fn open_container(image: &[u8]) -> std::result::Result<&[u8], String> {
    if image.len() < HEADER_BYTES {
        return Err(format!("{} bytes, shorter than a header", image.len()));
    }
    let mut r = Reader {
        data: &image[..HEADER_BYTES],
        at: 4,
        what: "rowset manifest header",
    };
    if &image[..4] != MAGIC {
        return Err("bad magic".into());
    }
    let (version, kind, length, payload_crc) = (
        r.u16().map_err(|e| e.to_string())?,
        r.u16().map_err(|e| e.to_string())?,
        r.u64().map_err(|e| e.to_string())?,
        r.u32().map_err(|e| e.to_string())?,
    );
    let header_crc = r.u32().map_err(|e| e.to_string())?;
    if crc32c::crc32c(&image[..HEADER_BYTES - 4]) != header_crc {
        return Err("header checksum mismatch".into());
    }
    if version > CONTAINER_VERSION || kind != KIND_ROWSET_MANIFEST {
        return Err(format!(
            "container version {version} kind {kind} unexpected"
        ));
    }
    if length > PAYLOAD_BYTES_MAX || HEADER_BYTES as u64 + length != image.len() as u64 {
        return Err(format!("payload length {length} does not match the file"));
    }
    let payload = &image[HEADER_BYTES..];
    if crc32c::crc32c(payload) != payload_crc {
        return Err("payload checksum mismatch".into());
    }
    Ok(payload)
}

/// Makes a rename or unlink in `dir` durable.
pub fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StorageError::io(dir, e))
}

fn encode_schema(out: &mut Vec<u8>, schema: &Schema) {
    put_u32(out, schema.version());
    put_u32(out, schema.next_column_id());
    put_u16(out, schema.key_count() as u16);
    put_u16(out, schema.columns().len() as u16);
    for column in schema.columns() {
        put_u32(out, column.id);
        put_bytes(out, column.name.as_bytes());
        out.push(column.data_type.code());
        match column.data_type {
            DataType::Decimal { precision, scale } => {
                out.push(precision);
                out.push(scale as u8);
            }
            DataType::Varchar(n) => put_u16(out, n),
            _ => {}
        }
        out.push(column.nullable as u8);
        match &column.default {
            None => out.push(0),
            Some(Value::Int(v)) => {
                out.push(1);
                put_u64(out, *v as u64);
            }
            Some(Value::Float(v)) => {
                out.push(2);
                put_u64(out, v.to_bits());
            }
            Some(Value::Bool(v)) => {
                out.push(3);
                out.push(*v as u8);
            }
            Some(Value::Bytes(v)) => {
                out.push(4);
                put_bytes(out, v);
            }
            Some(Value::Decimal(v)) => {
                out.push(5);
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
}

fn decode_schema(r: &mut Reader<'_>) -> Result<Schema> {
    let version = r.u32()?;
    let next_column_id = r.u32()?;
    let key_count = r.u16()? as usize;
    let count = r.u16()? as usize;
    let mut columns = Vec::with_capacity(count);
    for _ in 0..count {
        let id = r.u32()?;
        let name = String::from_utf8(r.bytes()?.to_vec())
            .map_err(|_| StorageError::corruption("manifest column name is not UTF-8"))?;
        let unknown = |_| StorageError::corruption("manifest has an unknown column type");
        let data_type = match r.u8()? {
            11 => DataType::decimal(r.u8()?, r.u8()? as i8).map_err(unknown)?,
            13 => DataType::varchar(r.u16()?.into()).map_err(unknown)?,
            code => DataType::from_code(code)
                .ok_or_else(|| StorageError::corruption("manifest has an unknown column type"))?,
        };
        let nullable = r.u8()? != 0;
        let default = match r.u8()? {
            0 => None,
            1 => Some(Value::Int(r.u64()? as i64)),
            2 => Some(Value::Float(f64::from_bits(r.u64()?))),
            3 => Some(Value::Bool(r.u8()? != 0)),
            4 => Some(Value::Bytes(r.bytes()?.to_vec())),
            5 => Some(Value::Decimal(i128::from_le_bytes(
                r.take(16)?.try_into().expect("16 bytes"),
            ))),
            _ => return Err(StorageError::corruption("manifest has a bad default tag")),
        };
        columns.push(ColumnSchema {
            id,
            name,
            data_type,
            nullable,
            default,
        });
    }
    Schema::with_next_id(columns, key_count, version, next_column_id)
        .map_err(|e| StorageError::corruption(format!("manifest schema is invalid: {e}")))
}

fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_bytes(out: &mut Vec<u8>, v: &[u8]) {
    put_u32(out, v.len() as u32);
    out.extend_from_slice(v);
}

/// Reads the little-endian fields of a metadata payload; running past its end is
/// `Corruption` naming `what`.
pub(crate) struct Reader<'a> {
    pub(crate) data: &'a [u8],
    pub(crate) at: usize,
    pub(crate) what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(data: &'a [u8], what: &'static str) -> Self {
        Reader { data, at: 0, what }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.data.len() - self.at
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.data.len())
            .ok_or_else(|| StorageError::corruption(format!("{} is truncated", self.what)))?;
        let slice = &self.data[self.at..end];
        self.at = end;
        Ok(slice)
    }
    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let schema = Schema::build(
            vec![
                ("id".into(), DataType::Int64, false),
                ("s".into(), DataType::String, true),
                ("v".into(), DataType::varchar(32).unwrap(), true),
                ("day".into(), DataType::Date, true),
            ],
            &["id"],
        )
        .unwrap();
        let mut price = ColumnSchema::new(0, "price", DataType::decimal(38, 4).unwrap(), false);
        price.default = Some(Value::Decimal(-(10i128.pow(37))));
        let schema = schema.add_column(price).unwrap();
        let mut with_default = ColumnSchema::new(0, "d", DataType::String, false);
        with_default.default = Some(Value::Bytes(b"x".to_vec()));
        let schema = schema.add_column(with_default).unwrap();
        let manifest = Manifest {
            last_flushed_index: 42,
            next_rowset_id: 9,
            history_gc_mark: 1 << 50,
            schema,
            rowsets: vec![RowSetEntry {
                id: 3,
                rows: 10,
                tombstones: 1,
            }],
            request_outcomes: Arc::from(&b"outcomes"[..]),
        };
        let dir = tempfile::tempdir().unwrap();
        manifest.write(dir.path()).unwrap();
        assert_eq!(Manifest::read(dir.path()).unwrap(), manifest);
        // A version 1 payload (before history GC) reads with mark 0.
        let mut v1 = manifest.encode();
        v1[0..2].copy_from_slice(&1u16.to_le_bytes());
        v1.drain(18..26);
        v1.truncate(v1.len() - 4 - manifest.request_outcomes.len());
        let old = Manifest::decode(&v1).unwrap();
        assert_eq!(old.history_gc_mark, 0);
        assert_eq!(old.rowsets, manifest.rowsets);
        assert!(old.request_outcomes.is_empty());
        // A version 2 payload (before request outcomes) reads with none.
        let mut v2 = manifest.encode();
        v2[0..2].copy_from_slice(&2u16.to_le_bytes());
        v2.truncate(v2.len() - 4 - manifest.request_outcomes.len());
        let old = Manifest::decode(&v2).unwrap();
        assert_eq!(old.history_gc_mark, manifest.history_gc_mark);
        assert!(old.request_outcomes.is_empty());
        // Request outcomes longer than the rest of the payload are damage.
        let mut overrun = manifest.encode();
        let at = overrun.len() - 4 - manifest.request_outcomes.len();
        overrun[at..at + 4].copy_from_slice(&1000u32.to_le_bytes());
        assert!(matches!(
            Manifest::decode(&overrun),
            Err(StorageError::Corruption(_))
        ));
        let path = manifest_path(dir.path());
        let mut image = std::fs::read(&path).unwrap();
        let last = image.len() - 1;
        image[last] ^= 0x40;
        std::fs::write(&path, &image).unwrap();
        assert!(matches!(
            Manifest::read(dir.path()),
            Err(StorageError::Corruption(_))
        ));
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            Manifest::read(dir.path()),
            Err(StorageError::NotFound(_))
        ));
    }
}
