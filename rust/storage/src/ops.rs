//! Row-operation batches: the Arrow record batch (and its IPC bytes, which are also the WAL
//! payload) that carries a tablet's writes, and its validation against the table schema.
//!
//! Decoding never trusts its input: the IPC bytes, the column set, the types, the op codes and
//! nulls are all checked before anything is applied, and every problem is `InvalidArgument`.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    new_null_array, Array, ArrayRef, AsArray, RecordBatch, StringArray, UInt8Array,
};
use arrow::buffer::Buffer;
use arrow::compute::{cast_with_options, CastOptions};
use arrow::datatypes::{
    DataType as ArrowType, Decimal128Type, DecimalType, Field, Schema as ArrowSchema, SchemaRef,
    TimeUnit,
};
use arrow::error::ArrowError;
use arrow::ipc::reader::StreamDecoder;
use arrow::ipc::writer::StreamWriter;

use crate::error::{Result, StorageError};
use crate::key::{encode_keys, EncodedKeys};
use crate::schema::{DataType, Schema};

/// Name of the op-type column in an op batch.
pub const OP_COLUMN: &str = "__op";
/// Most rows one op batch may carry.
pub const OP_BATCH_ROWS_MAX: usize = 1 << 20;
/// Largest IPC payload accepted for one op batch, in bytes (the RPC message limit).
pub const OP_BATCH_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Largest string or binary value of one cell, in bytes (Kudu's `max_cell_size_bytes`).
pub const CELL_BYTES_MAX: usize = 64 * 1024;
/// Largest row, in bytes: its fixed-width cells' widths plus its string and binary values.
/// Any valid row then fits in one write request, so a client can always cut a batch into
/// requests before sending it (Kudu advises rows of at most a few hundred KB and enforces no
/// limit; one row that overruns the RPC message limit would refuse its whole request).
pub const ROW_BYTES_MAX: usize = 1024 * 1024;

/// The kind of one row operation (the values of the `__op` column, a non-null `uint8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum OpType {
    /// Adds a row; `ALREADY_PRESENT` if the key exists.
    Insert = 1,
    /// Adds a row; an existing key is left alone and reported `OK`.
    InsertIgnore = 2,
    /// Adds the row or replaces the existing one.
    Upsert = 3,
    /// Replaces an existing row; `NOT_FOUND` if the key is absent.
    Update = 4,
    /// Replaces an existing row; an absent key is reported `OK`.
    UpdateIgnore = 5,
    /// Removes a row; `NOT_FOUND` if the key is absent. Needs only the key columns.
    Delete = 6,
    /// Removes a row; an absent key is reported `OK`.
    DeleteIgnore = 7,
}

impl OpType {
    /// Parses an op code.
    pub fn from_code(code: u8) -> Option<OpType> {
        Some(match code {
            1 => OpType::Insert,
            2 => OpType::InsertIgnore,
            3 => OpType::Upsert,
            4 => OpType::Update,
            5 => OpType::UpdateIgnore,
            6 => OpType::Delete,
            7 => OpType::DeleteIgnore,
            _ => return None,
        })
    }

    /// True for the two delete kinds, which need only key columns.
    pub const fn is_delete(self) -> bool {
        matches!(self, OpType::Delete | OpType::DeleteIgnore)
    }
}

/// The outcome of one row of an op batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RowStatus {
    Ok = 0,
    /// An `INSERT` of a key that is live.
    AlreadyPresent = 1,
    /// An `UPDATE` or `DELETE` of a key that is not live.
    NotFound = 2,
    /// A NOT NULL column (or a key column) holds null; the row was not applied.
    NullInNotNull = 3,
    /// A cell is over `CELL_BYTES_MAX` or the row over `ROW_BYTES_MAX`; the row was not applied.
    TooLarge = 4,
    /// A value does not fit its column's type (a decimal with more digits than its precision);
    /// the row was not applied.
    OutOfRange = 5,
}

impl RowStatus {
    /// The status whose code (`as u8`) is `code`, if there is one.
    pub fn from_code(code: u8) -> Option<RowStatus> {
        Some(match code {
            0 => RowStatus::Ok,
            1 => RowStatus::AlreadyPresent,
            2 => RowStatus::NotFound,
            3 => RowStatus::NullInNotNull,
            4 => RowStatus::TooLarge,
            5 => RowStatus::OutOfRange,
            _ => return None,
        })
    }
}

/// A row of an op batch that breaks a rule of the schema (`check_rows`): it is refused on its
/// own with `status`, and every other row of the batch is applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowProblem {
    /// Position of the row in the batch.
    pub row: usize,
    /// `NullInNotNull` or `TooLarge`.
    pub status: RowStatus,
    /// Which column and which limit, for people.
    pub message: String,
}

/// A validated op batch, normalised to the table's column order.
#[derive(Debug)]
pub struct OpBatch {
    /// The table's columns in schema order, typed as `Schema::arrow_schema` but with every
    /// non-key field nullable (delete rows carry no values).
    pub(crate) rows: RecordBatch,
    /// One op code per row, all valid `OpType`s.
    pub(crate) ops: Vec<OpType>,
    pub(crate) keys: EncodedKeys,
    /// Rows refused by `check_rows`, by position (`Ok` for the others); None when none was.
    /// Refused rows stay in `rows` but are never applied.
    pub(crate) refused: Option<Vec<RowStatus>>,
    /// The schema version the batch was validated against.
    pub(crate) schema_version: u32,
    /// Memory the batch keeps alive, in bytes (columns decoded from IPC share one buffer,
    /// which per-array accounting would count once per column).
    pub(crate) held_bytes: usize,
}

impl OpBatch {
    /// The number of row operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True if the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Decodes Arrow IPC stream bytes (one schema message and exactly one record batch)
    /// without copying column data, then validates it like `from_record_batch`.
    pub fn decode_ipc(data: Buffer, schema: &Schema) -> Result<OpBatch> {
        if data.len() > OP_BATCH_BYTES_MAX {
            return Err(StorageError::invalid(format!(
                "op batch is {} bytes, more than {OP_BATCH_BYTES_MAX}",
                data.len()
            )));
        }
        // `check_framing` refuses the damage we know arrow's decoder panics on (buffer ranges
        // past the body); the bytes come from the network, so any other panic in the decoder
        // is contained here too. Nothing but the decoder's own state lives through the unwind.
        let data_len = data.len();
        let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decode_one(data)))
            .unwrap_or_else(|_| {
            Err(StorageError::invalid(
                "malformed Arrow IPC op batch (buffer ranges outside the message)",
            ))
        })?;
        let mut batch = OpBatch::from_record_batch(&decoded, schema)?;
        // The columns are slices of the one IPC buffer (casts aside, which are rare).
        batch.held_bytes = data_len;
        Ok(batch)
    }

    /// Validates a record batch of row operations against `schema`.
    ///
    /// Problems of the batch as a whole (its columns, types, op codes) are `InvalidArgument`.
    /// Problems of single rows (`check_rows`) refuse only those rows (`refused`). A column
    /// the batch lacks takes its default (or null) when no row is an update: updates replace
    /// whole rows, so they must carry every column (Kudu's write default, DESIGN.md §3).
    pub fn from_record_batch(batch: &RecordBatch, schema: &Schema) -> Result<OpBatch> {
        if batch.num_rows() > OP_BATCH_ROWS_MAX {
            return Err(StorageError::invalid(format!(
                "op batch has {} rows, more than {OP_BATCH_ROWS_MAX}",
                batch.num_rows()
            )));
        }
        let ops = op_codes(batch)?;
        let columns = schema_columns(batch, schema)?;
        let only_deletes = ops.iter().all(|op| op.is_delete());
        let has_updates = ops
            .iter()
            .any(|op| matches!(op, OpType::Update | OpType::UpdateIgnore));
        let mut filled = Vec::with_capacity(columns.len());
        for (index, (column, spec)) in columns.into_iter().zip(schema.columns()).enumerate() {
            let is_key = index < schema.key_count();
            let column = match column {
                Some(column) => column,
                None if is_key => {
                    return Err(StorageError::invalid(format!(
                        "op batch lacks key column {:?}",
                        spec.name
                    )))
                }
                None if only_deletes => new_null_array(&spec.data_type.arrow(), batch.num_rows()),
                None if !has_updates && (spec.nullable || spec.default.is_some()) => {
                    spec.fill(batch.num_rows())?
                }
                None => {
                    return Err(StorageError::invalid(format!(
                        "op batch lacks column {:?} (updates replace whole rows, and a NOT NULL \
                         column without a default must be given)",
                        spec.name
                    )))
                }
            };
            filled.push(column);
        }
        let present: Vec<Option<&ArrayRef>> = filled.iter().map(Some).collect();
        let problems = check_rows(schema, &present, &ops);
        let refused = (!problems.is_empty()).then(|| {
            let mut statuses = vec![RowStatus::Ok; ops.len()];
            for problem in &problems {
                statuses[problem.row] = problem.status;
            }
            statuses
        });
        if refused.is_some() {
            // A refused row may hold a null key; it is never applied, so any bytes will do
            // (and the stored batch's key fields stay non-nullable).
            for column in &mut filled[..schema.key_count()] {
                *column = without_nulls(column)?;
            }
        }
        let keys = encode_keys(&filled[..schema.key_count()])?;
        let rows = RecordBatch::try_new(storage_arrow_schema(schema), filled)
            .map_err(|e| StorageError::invalid(format!("op batch columns do not fit: {e}")))?;
        Ok(OpBatch {
            held_bytes: rows.get_array_memory_size(),
            rows,
            ops,
            keys,
            refused,
            schema_version: schema.version(),
        })
    }
}

/// The rows of an op batch (the client's form: columns by name, any of the table's columns
/// left out) that break a rule of `schema`, in row order, one problem per row: a null in a NOT
/// NULL or key column, a cell over `CELL_BYTES_MAX`, a row over `ROW_BYTES_MAX`. The same
/// rules `OpBatch::from_record_batch` applies on every replica, so a client can refuse those
/// rows before sending them and get the answer the tablet would give.
pub fn check_op_batch(batch: &RecordBatch, schema: &Schema) -> Result<Vec<RowProblem>> {
    let ops = op_codes(batch)?;
    let columns = schema_columns(batch, schema)?;
    let present: Vec<Option<&ArrayRef>> = columns.iter().map(Option::as_ref).collect();
    Ok(check_rows(schema, &present, &ops))
}

/// The batch's columns in schema order (None: absent), conformed to the schema's types.
fn schema_columns(batch: &RecordBatch, schema: &Schema) -> Result<Vec<Option<ArrayRef>>> {
    let mut columns: Vec<Option<ArrayRef>> = vec![None; schema.columns().len()];
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        if field.name() == OP_COLUMN {
            continue;
        }
        let index = schema.index_of(field.name()).ok_or_else(|| {
            StorageError::invalid(format!("op batch has unknown column {:?}", field.name()))
        })?;
        if columns[index].is_some() {
            return Err(StorageError::invalid(format!(
                "op batch has column {:?} twice",
                field.name()
            )));
        }
        let wanted = schema.columns()[index].data_type;
        columns[index] = Some(conform(column, wanted, field.name())?);
    }
    Ok(columns)
}

/// The rows that break a rule of `schema` (see `check_op_batch`); `columns` in schema order,
/// None for a column the batch lacks. One pass per column, and none at all over the rows of a
/// column that cannot break a rule (no nulls, values too short in total).
fn check_rows(schema: &Schema, columns: &[Option<&ArrayRef>], ops: &[OpType]) -> Vec<RowProblem> {
    let mut problems = Vec::new();
    for (index, (column, spec)) in columns.iter().zip(schema.columns()).enumerate() {
        let Some(column) = column else { continue };
        let is_key = index < schema.key_count();
        if column.null_count() == 0 || (spec.nullable && !is_key) {
            continue;
        }
        let nulls = column
            .logical_nulls()
            .expect("null_count > 0 implies a null buffer");
        for row in (0..ops.len()).filter(|r| nulls.is_null(*r)) {
            // Deletes carry only their key: their other cells are null by design.
            if is_key || !ops[row].is_delete() {
                problems.push(RowProblem {
                    row,
                    status: RowStatus::NullInNotNull,
                    message: format!("column {:?} is NOT NULL but the row holds null", spec.name),
                });
            }
        }
    }
    check_decimals(schema, columns, &mut problems);
    check_sizes(schema, columns, ops.len(), &mut problems);
    // The first problem found for a row is the one reported (nulls before sizes).
    problems.sort_by_key(|p| p.row);
    problems.dedup_by_key(|p| p.row);
    problems
}

/// Adds an `OutOfRange` problem for every row whose decimal has more digits than its column's
/// precision (Arrow does not check that when a batch is built).
fn check_decimals(schema: &Schema, columns: &[Option<&ArrayRef>], problems: &mut Vec<RowProblem>) {
    for (column, spec) in columns.iter().zip(schema.columns()) {
        let (Some(column), DataType::Decimal { precision, scale }) = (column, spec.data_type)
        else {
            continue;
        };
        let values = column.as_primitive::<Decimal128Type>();
        if values.validate_decimal_precision(precision).is_ok() {
            continue;
        }
        for (row, value) in values.iter().enumerate() {
            let Some(value) = value else { continue };
            if !Decimal128Type::is_valid_decimal_precision(value, precision) {
                problems.push(RowProblem {
                    row,
                    status: RowStatus::OutOfRange,
                    message: format!(
                        "column {:?}: {} does not fit {}",
                        spec.name,
                        Decimal128Type::format_decimal(value, precision, scale),
                        spec.data_type.name()
                    ),
                });
            }
        }
    }
}

/// Adds a `TooLarge` problem for every row with a cell over `CELL_BYTES_MAX` or a total over
/// `ROW_BYTES_MAX`. Nothing is allocated per row unless some row could break the row limit
/// (a column's longest value is found in one pass over its offsets, and only a column whose
/// values total more than a cell's limit needs that pass).
fn check_sizes(
    schema: &Schema,
    columns: &[Option<&ArrayRef>],
    rows: usize,
    problems: &mut Vec<RowProblem>,
) {
    let mut fixed = 0usize;
    let mut variable: Vec<&ArrayRef> = Vec::new();
    let mut longest = 0usize; // a bound on the variable bytes of any one row
    for (column, spec) in columns.iter().zip(schema.columns()) {
        let Some(column) = column else { continue };
        let Some(offsets) = value_offsets(column) else {
            fixed += spec.data_type.arrow().primitive_width().unwrap_or(1);
            continue;
        };
        variable.push(column);
        let total = (offsets[offsets.len() - 1] - offsets[0]) as usize;
        if total <= CELL_BYTES_MAX {
            longest += total; // no cell can be longer than all of them together
            continue;
        }
        let mut column_longest = 0usize;
        for (row, w) in offsets.windows(2).enumerate() {
            let length = (w[1] - w[0]) as usize;
            if length > CELL_BYTES_MAX && column.is_valid(row) {
                problems.push(RowProblem {
                    row,
                    status: RowStatus::TooLarge,
                    message: format!(
                        "column {:?} holds a {length}-byte value; a cell holds at most \
                         {CELL_BYTES_MAX} bytes",
                        spec.name
                    ),
                });
            }
            column_longest = column_longest.max(length);
        }
        longest += column_longest;
    }
    if fixed + longest <= ROW_BYTES_MAX {
        return;
    }
    let mut sizes = vec![fixed; rows];
    for column in variable {
        for (size, length) in sizes.iter_mut().zip(value_lengths(column)) {
            *size += length;
        }
    }
    for (row, size) in sizes.into_iter().enumerate() {
        if size > ROW_BYTES_MAX {
            problems.push(RowProblem {
                row,
                status: RowStatus::TooLarge,
                message: format!("the row is {size} bytes; a row holds at most {ROW_BYTES_MAX}"),
            });
        }
    }
}

/// The offsets of a string or binary column; None for other types.
fn value_offsets(column: &ArrayRef) -> Option<&[i32]> {
    match column.data_type() {
        ArrowType::Utf8 => Some(column.as_string::<i32>().value_offsets()),
        ArrowType::Binary => Some(column.as_binary::<i32>().value_offsets()),
        _ => None,
    }
}

/// Each row's value length in a string or binary column (0 for null).
fn value_lengths(column: &ArrayRef) -> Vec<usize> {
    let offsets = value_offsets(column).expect("a string or binary column");
    let nulls = column.logical_nulls();
    offsets
        .windows(2)
        .enumerate()
        .map(|(row, w)| {
            if nulls.as_ref().is_some_and(|n| n.is_null(row)) {
                0
            } else {
                (w[1] - w[0]) as usize
            }
        })
        .collect()
}

/// `column` with its null buffer dropped (null slots read as whatever their bytes hold).
fn without_nulls(column: &ArrayRef) -> Result<ArrayRef> {
    if column.null_count() == 0 {
        return Ok(column.clone());
    }
    let data = column
        .to_data()
        .into_builder()
        .nulls(None)
        .build()
        .map_err(|e| StorageError::invalid(format!("cannot read key column: {e}")))?;
    Ok(arrow::array::make_array(data))
}

/// One message of an IPC stream: its header, and where its body lies.
struct IpcMessage<'a> {
    header: IpcHeader<'a>,
    meta: std::ops::Range<usize>,
    body: std::ops::Range<usize>,
}

enum IpcHeader<'a> {
    /// A schema message whose bytes were converted before (`IPC_SCHEMAS`).
    KnownSchema(SchemaRef),
    /// Any other message, its flatbuffer verified.
    Verified(arrow::ipc::Message<'a>),
}

/// Schemas already converted from their IPC message, by the message's bytes, with its body
/// length. A client sends the same few schemas over and over (one per table and set of
/// columns), and every write entry carries its schema: verifying its flatbuffer (twice, with
/// the stream decoder's) and converting it was most of the decoding of a one-row entry.
/// Emptied when full; a schema message over `IPC_SCHEMA_BYTES_MAX` (a large custom metadata,
/// say) is not kept, so the cache holds at most 16 MiB of keys.
type SchemaCache = HashMap<Vec<u8>, (SchemaRef, u64)>;
static IPC_SCHEMAS: std::sync::LazyLock<parking_lot::Mutex<SchemaCache>> =
    std::sync::LazyLock::new(Default::default);
const IPC_SCHEMAS_MAX: usize = 256;
const IPC_SCHEMA_BYTES_MAX: usize = 64 * 1024;

/// Walks the IPC stream's framing and checks that every message fits the bytes and every
/// buffer of a record or dictionary batch lies inside its message body, before arrow's decoder
/// (which assumes as much) sees them. Returns the messages, and whether they (with the
/// end-of-stream marker, if any) take up all of `data`.
fn check_framing(data: &[u8]) -> Result<(Vec<IpcMessage<'_>>, bool)> {
    let bad = |what: String| StorageError::invalid(format!("malformed Arrow IPC op batch: {what}"));
    let mut messages = Vec::with_capacity(2);
    let mut at = 0usize;
    loop {
        let word = |at: usize| -> Result<u32> {
            data.get(at..at + 4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
                .ok_or_else(|| bad(format!("truncated at byte {at}")))
        };
        let mut meta_len = word(at)?;
        at += 4;
        if meta_len == u32::MAX {
            meta_len = word(at)?;
            at += 4;
        }
        if meta_len == 0 {
            return Ok((messages, at == data.len())); // end-of-stream marker
        }
        let meta_end = at
            .checked_add(meta_len as usize)
            .filter(|end| *end <= data.len())
            .ok_or_else(|| bad(format!("message at byte {at} runs past the end")))?;
        let known = if messages.is_empty() {
            IPC_SCHEMAS.lock().get(&data[at..meta_end]).cloned()
        } else {
            None
        };
        let (header, body_len) = match known {
            Some((schema, body_len)) => (IpcHeader::KnownSchema(schema), body_len),
            None => {
                let message = arrow::ipc::root_as_message(&data[at..meta_end])
                    .map_err(|e| bad(format!("message at byte {at}: {e}")))?;
                let body_len = u64::try_from(message.bodyLength())
                    .map_err(|_| bad("negative body length".into()))?;
                (IpcHeader::Verified(message), body_len)
            }
        };
        let body_end = (meta_end as u64)
            .checked_add(body_len)
            .filter(|end| *end <= data.len() as u64)
            .ok_or_else(|| {
                bad(format!(
                    "body of the message at byte {at} runs past the end"
                ))
            })?;
        if let IpcHeader::Verified(message) = &header {
            let batch = message
                .header_as_record_batch()
                .or_else(|| message.header_as_dictionary_batch().and_then(|d| d.data()));
            if let Some(buffers) = batch.and_then(|b| b.buffers()) {
                for buffer in buffers.iter() {
                    // The format pads every buffer to 8 bytes; arrow asserts it when typing data.
                    let aligned = buffer.offset() % 8 == 0;
                    let fits = aligned
                        && u64::try_from(buffer.offset())
                            .ok()
                            .zip(u64::try_from(buffer.length()).ok())
                            .and_then(|(offset, length)| offset.checked_add(length))
                            .is_some_and(|end| end <= body_len);
                    if !fits {
                        return Err(bad(format!(
                            "a buffer lies outside the message at byte {at}"
                        )));
                    }
                }
            }
        }
        messages.push(IpcMessage {
            header,
            meta: at..meta_end,
            body: meta_end..body_end as usize,
        });
        at = body_end as usize;
        if at == data.len() {
            return Ok((messages, true)); // a stream may end without the marker
        }
    }
}

fn decode_one(data: Buffer) -> Result<RecordBatch> {
    let (messages, whole) = check_framing(data.as_slice())?;
    if whole {
        if let Some(batch) = decode_schema_and_batch(&data, &messages)? {
            return Ok(batch);
        }
    }
    drop(messages);
    let mut decoder = StreamDecoder::new();
    let mut buffer = data;
    let mut batch = None;
    while !buffer.is_empty() {
        let decoded = decoder
            .decode(&mut buffer)
            .map_err(|e| StorageError::invalid(format!("malformed Arrow IPC op batch: {e}")))?;
        if let Some(decoded) = decoded {
            if batch.replace(decoded).is_some() {
                return Err(StorageError::invalid(
                    "an op batch must hold exactly one record batch",
                ));
            }
        }
    }
    decoder
        .finish()
        .map_err(|e| StorageError::invalid(format!("truncated Arrow IPC op batch: {e}")))?;
    batch.ok_or_else(|| StorageError::invalid("Arrow IPC op batch holds no record batch"))
}

/// The common stream, a schema and one record batch, decoded as the stream decoder would,
/// with the schema converted once for all the entries that carry it. `None` for any other
/// stream (dictionaries, more messages), which the stream decoder takes, with its errors.
fn decode_schema_and_batch(
    data: &Buffer,
    messages: &[IpcMessage<'_>],
) -> Result<Option<RecordBatch>> {
    let [first, second] = messages else {
        return Ok(None);
    };
    let IpcHeader::Verified(batch_message) = &second.header else {
        return Ok(None);
    };
    let Some(batch) = batch_message.header_as_record_batch() else {
        return Ok(None);
    };
    let bad = |e: ArrowError| StorageError::invalid(format!("malformed Arrow IPC op batch: {e}"));
    let schema = match &first.header {
        IpcHeader::KnownSchema(schema) => Arc::clone(schema),
        IpcHeader::Verified(message) => {
            let Some(fb) = message.header_as_schema() else {
                return Ok(None);
            };
            let schema = Arc::new(arrow::ipc::convert::try_fb_to_schema(fb).map_err(bad)?);
            if first.meta.len() <= IPC_SCHEMA_BYTES_MAX {
                let body_len = first.body.len() as u64;
                let key = data.as_slice()[first.meta.clone()].to_vec();
                let mut schemas = IPC_SCHEMAS.lock();
                if schemas.len() >= IPC_SCHEMAS_MAX {
                    schemas.clear();
                }
                schemas.insert(key, (Arc::clone(&schema), body_len));
            }
            schema
        }
    };
    let body = data.slice_with_length(second.body.start, second.body.len());
    let version = batch_message.version();
    arrow::ipc::reader::read_record_batch(&body, batch, schema, &HashMap::new(), None, &version)
        .map(Some)
        .map_err(bad)
}

/// The Arrow schema of stored rows: the table's fields, with non-key fields nullable because
/// tombstones carry only a key.
pub fn storage_arrow_schema(schema: &Schema) -> SchemaRef {
    let table = schema.arrow_schema();
    let fields: Vec<Field> = table
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| f.as_ref().clone().with_nullable(i >= schema.key_count()))
        .collect();
    Arc::new(ArrowSchema::new(fields))
}

fn op_codes(batch: &RecordBatch) -> Result<Vec<OpType>> {
    let column = batch
        .column_by_name(OP_COLUMN)
        .ok_or_else(|| StorageError::invalid(format!("op batch lacks the {OP_COLUMN:?} column")))?;
    let codes: &UInt8Array = column.as_primitive_opt().ok_or_else(|| {
        StorageError::invalid(format!(
            "{OP_COLUMN:?} must be uint8, got {}",
            column.data_type()
        ))
    })?;
    if codes.null_count() > 0 {
        return Err(StorageError::invalid(format!("{OP_COLUMN:?} holds nulls")));
    }
    codes
        .values()
        .iter()
        .enumerate()
        .map(|(row, code)| {
            OpType::from_code(*code)
                .ok_or_else(|| StorageError::invalid(format!("row {row}: unknown op code {code}")))
        })
        .collect()
}

/// Checks that `column` has the Arrow type of `wanted`, accepting the layouts pyarrow and pandas
/// commonly produce for the same values (large/view strings, zoned timestamps, decimals of a
/// smaller scale, which rescale exactly) by casting them. A `varchar(n)` column's values are
/// truncated to `n` characters here, on every replica, as Kudu's tablet servers do.
fn conform(column: &ArrayRef, wanted: DataType, name: &str) -> Result<ArrayRef> {
    let target = wanted.arrow();
    let found = column.data_type();
    let conformed = if *found == target {
        column.clone()
    } else {
        let castable = match (wanted, found) {
            (
                DataType::String | DataType::Varchar(_),
                ArrowType::LargeUtf8 | ArrowType::Utf8View,
            )
            | (DataType::Binary, ArrowType::LargeBinary | ArrowType::BinaryView)
            | (DataType::Timestamp, ArrowType::Timestamp(TimeUnit::Microsecond, Some(_))) => true,
            // Rescaling up is exact; down could round, which a write must never do silently.
            (DataType::Decimal { scale, .. }, ArrowType::Decimal128(_, from_scale)) => {
                *from_scale <= scale
            }
            _ => false,
        };
        if !castable {
            return Err(StorageError::invalid(format!(
                "column {name:?} must be {} ({target}), got {found}",
                wanted.name()
            )));
        }
        let options = CastOptions {
            safe: false,
            ..Default::default()
        };
        cast_with_options(column, &target, &options)
            .map_err(|e| StorageError::invalid(format!("column {name:?}: {e}")))?
    };
    match wanted {
        DataType::Varchar(chars) => Ok(truncate_chars(&conformed, usize::from(chars))),
        _ => Ok(conformed),
    }
}

/// `column` (UTF-8) with every value cut to at most `chars` characters; the same array when no
/// value can be longer (a value of at most `chars` bytes has at most `chars` characters, so
/// only longer ones are counted).
pub fn truncate_chars(column: &ArrayRef, chars: usize) -> ArrayRef {
    let strings = column.as_string::<i32>();
    let long = strings
        .value_offsets()
        .windows(2)
        .any(|w| (w[1] - w[0]) as usize > chars);
    if !long {
        return column.clone();
    }
    let cut = strings.iter().map(|value| {
        value.map(|v| match v.char_indices().nth(chars) {
            Some((at, _)) if v.len() > chars => &v[..at],
            _ => v,
        })
    });
    Arc::new(StringArray::from_iter(cut))
}

/// Encodes a record batch as Arrow IPC stream bytes (the op-batch wire and WAL form).
pub fn encode_ipc(batch: &RecordBatch) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut writer = StreamWriter::try_new(&mut out, &batch.schema())
        .map_err(|e| StorageError::invalid(format!("cannot encode batch: {e}")))?;
    writer
        .write(batch)
        .map_err(|e| StorageError::invalid(format!("cannot encode batch: {e}")))?;
    writer
        .finish()
        .map_err(|e| StorageError::invalid(format!("cannot encode batch: {e}")))?;
    drop(writer);
    Ok(out)
}

/// Builds the op column for `rows` rows of one op type (a convenience for callers and tests).
pub fn op_column(op: OpType, rows: usize) -> ArrayRef {
    Arc::new(UInt8Array::from(vec![op as u8; rows]))
}

/// Appends the op column to a batch of table columns.
pub fn with_op_column(batch: &RecordBatch, op: OpType) -> Result<RecordBatch> {
    let mut fields: Vec<Field> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(OP_COLUMN, ArrowType::UInt8, false));
    let mut columns = batch.columns().to_vec();
    columns.push(op_column(op, batch.num_rows()));
    RecordBatch::try_new(Arc::new(ArrowSchema::new(fields)), columns)
        .map_err(|e| StorageError::invalid(format!("cannot add op column: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Decimal128Array, StringArray};

    #[test]
    fn varchar_values_are_cut_to_characters_not_bytes() {
        let column: ArrayRef = Arc::new(StringArray::from(vec![
            Some("abc"),
            Some("日本語テキスト"),
            None,
            Some("😀x😀y😀"),
        ]));
        let cut = conform(&column, DataType::varchar(4).unwrap(), "v").unwrap();
        let cut = cut.as_string::<i32>();
        let values: Vec<Option<&str>> = cut.iter().collect();
        assert_eq!(
            values,
            vec![Some("abc"), Some("日本語テ"), None, Some("😀x😀y")]
        );
        // Nothing longer than n bytes: the very same array, no copy.
        let short: ArrayRef = Arc::new(StringArray::from(vec!["ab", "c"]));
        let same = conform(&short, DataType::varchar(4).unwrap(), "v").unwrap();
        assert!(Arc::ptr_eq(&same, &short));
    }

    #[test]
    fn decimals_rescale_only_upwards_and_precision_is_checked_per_row() {
        let wanted = DataType::decimal(6, 3).unwrap();
        let finer: ArrayRef = Arc::new(
            Decimal128Array::from(vec![15])
                .with_precision_and_scale(10, 4)
                .unwrap(),
        );
        assert!(
            conform(&finer, wanted, "p").is_err(),
            "scale down could round"
        );
        let coarser: ArrayRef = Arc::new(
            Decimal128Array::from(vec![15, 999_999])
                .with_precision_and_scale(10, 1)
                .unwrap(),
        );
        assert!(
            conform(&coarser, wanted, "p").is_err(),
            "99999.9 overflows decimal(6,3)"
        );
        let fits: ArrayRef = Arc::new(
            Decimal128Array::from(vec![15, -999])
                .with_precision_and_scale(10, 1)
                .unwrap(),
        );
        let rescaled = conform(&fits, wanted, "p").unwrap();
        let values = rescaled.as_primitive::<Decimal128Type>();
        assert_eq!(values.values().to_vec(), vec![1500, -99_900]);
        let schema = Schema::build(
            vec![
                ("id".into(), DataType::Int64, false),
                ("p".into(), wanted, true),
            ],
            &["id"],
        )
        .unwrap();
        let over: ArrayRef = Arc::new(
            Decimal128Array::from(vec![1, 1_000_000, -999_999])
                .with_precision_and_scale(6, 3)
                .unwrap(),
        );
        let ids: ArrayRef = Arc::new(arrow::array::Int64Array::from(vec![1, 2, 3]));
        let problems = check_rows(
            &schema,
            &[Some(&ids), Some(&over)],
            &[OpType::Insert, OpType::Insert, OpType::Insert],
        );
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].row, 1);
        assert_eq!(problems[0].status, RowStatus::OutOfRange);
        assert!(problems[0]
            .message
            .contains("1000.000 does not fit decimal(6,3)"));
    }
}
