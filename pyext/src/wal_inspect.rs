//! Binding for read-only segment inspection (`nyala_wal::inspect`), used by
//! `nyala local-replica wal dump`; the typed API is `nyala.wal.dump_segment`.

use std::path::PathBuf;

use nyala_wal::format::BatchKind;
use nyala_wal::inspect::dump_segment;
use pyo3::prelude::*;

use crate::errors::to_py;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(wal_dump_segment, m)?)?;
    Ok(())
}

/// `(term, index, entry type, payload length)`.
type EntryOut = (u64, u64, u8, u32);
/// `(offset, "entries" | "truncate", entries, last kept (term, index))`.
type BatchOut = (u64, &'static str, Vec<EntryOut>, Option<(u64, u64)>);
/// `(tablet id, sequence, file length, valid end, footer (count, min, max), batches)`.
type SegmentOut = (
    Option<String>,
    u64,
    u64,
    u64,
    Option<(u64, u64, u64)>,
    Vec<BatchOut>,
);

/// Reads and verifies one segment file without modifying it (GIL released while reading).
#[pyfunction]
fn wal_dump_segment(py: Python<'_>, path: PathBuf) -> PyResult<SegmentOut> {
    let dump = py.detach(|| dump_segment(&path)).map_err(to_py)?;
    let batches = dump
        .batches
        .into_iter()
        .map(|b| {
            let kind = match b.kind {
                BatchKind::Entries => "entries",
                BatchKind::Truncate => "truncate",
            };
            let entries = b
                .entries
                .iter()
                .map(|e| (e.term, e.index, e.entry_type as u8, e.payload_len))
                .collect();
            (
                b.offset,
                kind,
                entries,
                b.last_kept.map(|o| (o.term, o.index)),
            )
        })
        .collect();
    let footer = dump
        .footer
        .map(|f| (f.entry_count, f.min_index, f.max_index));
    Ok((
        dump.tablet_id,
        dump.sequence,
        dump.file_len,
        dump.valid_end,
        footer,
        batches,
    ))
}
