//! Table schemas: column types, nullability, the primary key, versions and schema changes.
//!
//! Columns carry a stable id that never changes or gets reused, so a rename or a drop does not
//! rewrite any rowset: Parquet files name their columns by id in the field metadata and readers
//! resolve columns by id (docs/storage-format.md).

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::{new_null_array, ArrayRef};
use arrow::datatypes::{DataType as ArrowType, Field, Schema as ArrowSchema, SchemaRef, TimeUnit};

use crate::error::{Result, StorageError};

/// Field-metadata key holding a column's id in Arrow and Parquet schemas.
pub const COLUMN_ID_KEY: &str = "nyala.column_id";
/// Longest column name accepted, in bytes.
pub const COLUMN_NAME_BYTES_MAX: usize = 256;
/// Most columns a table may have.
pub const COLUMNS_MAX: usize = 1024;

/// Most digits a decimal column may hold (Arrow's decimal128, Kudu's decimal128).
pub const DECIMAL_PRECISION_MAX: u8 = 38;
/// Most characters a `varchar(n)` column may declare (as in Kudu).
pub const VARCHAR_CHARS_MAX: u16 = 65_535;

/// The column types nyala stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    Int8,
    Int16,
    Int32,
    Int64,
    Float,
    Double,
    Bool,
    String,
    Binary,
    /// Microseconds since the Unix epoch, UTC (the storage form carries no zone; clients label
    /// scans `UTC`).
    Timestamp,
    /// An exact decimal of `precision` digits, `scale` of them after the point (Arrow
    /// decimal128: the unscaled value as an `i128`).
    Decimal {
        precision: u8,
        scale: i8,
    },
    /// Days since the Unix epoch (Arrow date32).
    Date,
    /// UTF-8 text of at most `n` characters; longer values are truncated on write, as in Kudu.
    Varchar(u16),
}

impl DataType {
    /// The types without parameters, in wire-code order.
    pub const SIMPLE: [DataType; 11] = [
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::Float,
        DataType::Double,
        DataType::Bool,
        DataType::String,
        DataType::Binary,
        DataType::Timestamp,
        DataType::Date,
    ];

    /// A checked `decimal(precision, scale)`: 1 <= precision <= 38, 0 <= scale <= precision.
    pub fn decimal(precision: u8, scale: i8) -> Result<Self> {
        if !(1..=DECIMAL_PRECISION_MAX).contains(&precision) || scale < 0 || scale as u8 > precision
        {
            return Err(StorageError::invalid(format!(
                "decimal({precision},{scale}): precision must be 1..={DECIMAL_PRECISION_MAX} \
                 and scale 0..=precision"
            )));
        }
        Ok(DataType::Decimal { precision, scale })
    }

    /// A checked `varchar(n)`: 1 <= n <= 65,535 characters.
    pub fn varchar(chars: u32) -> Result<Self> {
        if !(1..=u32::from(VARCHAR_CHARS_MAX)).contains(&chars) {
            return Err(StorageError::invalid(format!(
                "varchar({chars}): the length must be 1..={VARCHAR_CHARS_MAX} characters"
            )));
        }
        Ok(DataType::Varchar(chars as u16))
    }

    /// The name used by the CLI and the Python API (`int64`, `decimal(10,2)`, `varchar(32)`).
    pub fn name(self) -> String {
        match self {
            DataType::Int8 => "int8".into(),
            DataType::Int16 => "int16".into(),
            DataType::Int32 => "int32".into(),
            DataType::Int64 => "int64".into(),
            DataType::Float => "float".into(),
            DataType::Double => "double".into(),
            DataType::Bool => "bool".into(),
            DataType::String => "string".into(),
            DataType::Binary => "binary".into(),
            DataType::Timestamp => "timestamp".into(),
            DataType::Decimal { precision, scale } => format!("decimal({precision},{scale})"),
            DataType::Date => "date".into(),
            DataType::Varchar(n) => format!("varchar({n})"),
        }
    }

    /// Parses a type name (`name`'s form; spaces inside the parentheses allowed); an unknown
    /// or out-of-range one is `InvalidArgument`.
    pub fn from_name(name: &str) -> Result<Self> {
        let unknown = || StorageError::invalid(format!("unknown column type {name:?}"));
        if let Some(simple) = DataType::SIMPLE.into_iter().find(|t| t.name() == name) {
            return Ok(simple);
        }
        let (base, rest) = name.split_once('(').ok_or_else(unknown)?;
        let params: Vec<&str> = rest
            .strip_suffix(')')
            .ok_or_else(unknown)?
            .split(',')
            .map(str::trim)
            .collect();
        match (base.trim(), params.as_slice()) {
            ("decimal", [p, s]) => DataType::decimal(
                p.parse().map_err(|_| unknown())?,
                s.parse().map_err(|_| unknown())?,
            ),
            ("varchar", [n]) => DataType::varchar(n.parse().map_err(|_| unknown())?),
            _ => Err(unknown()),
        }
    }

    /// The code stored in the manifest (a parameterised type's parameters follow it:
    /// `manifest.rs`).
    pub const fn code(self) -> u8 {
        match self {
            DataType::Int8 => 1,
            DataType::Int16 => 2,
            DataType::Int32 => 3,
            DataType::Int64 => 4,
            DataType::Float => 5,
            DataType::Double => 6,
            DataType::Bool => 7,
            DataType::String => 8,
            DataType::Binary => 9,
            DataType::Timestamp => 10,
            DataType::Decimal { .. } => 11,
            DataType::Date => 12,
            DataType::Varchar(_) => 13,
        }
    }

    /// Inverse of `code` for the types without parameters.
    pub fn from_code(code: u8) -> Option<Self> {
        DataType::SIMPLE.into_iter().find(|t| t.code() == code)
    }

    /// The Arrow type batches carry for this column.
    pub fn arrow(self) -> ArrowType {
        match self {
            DataType::Int8 => ArrowType::Int8,
            DataType::Int16 => ArrowType::Int16,
            DataType::Int32 => ArrowType::Int32,
            DataType::Int64 => ArrowType::Int64,
            DataType::Float => ArrowType::Float32,
            DataType::Double => ArrowType::Float64,
            DataType::Bool => ArrowType::Boolean,
            DataType::String | DataType::Varchar(_) => ArrowType::Utf8,
            DataType::Binary => ArrowType::Binary,
            DataType::Timestamp => ArrowType::Timestamp(TimeUnit::Microsecond, None),
            DataType::Decimal { precision, scale } => ArrowType::Decimal128(precision, scale),
            DataType::Date => ArrowType::Date32,
        }
    }

    /// Whether the type may be part of a primary key (floats and bools may not, as in Kudu:
    /// NaN and two-valued keys make poor row identities).
    pub const fn can_be_key(self) -> bool {
        !matches!(self, DataType::Float | DataType::Double | DataType::Bool)
    }

    /// True for the UTF-8 text types (`string`, `varchar(n)`).
    pub const fn is_text(self) -> bool {
        matches!(self, DataType::String | DataType::Varchar(_))
    }
}

/// A default value for a column added after rows exist.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int(i64),
    /// A decimal's unscaled value (`Int` is accepted for decimals too).
    Decimal(i128),
    Float(f64),
    Bool(bool),
    Bytes(Vec<u8>),
}

impl Value {
    /// An array of `len` copies of this value typed as `data_type`, or `InvalidArgument` if the
    /// value does not fit the type.
    pub fn repeat(&self, data_type: DataType, len: usize) -> Result<ArrayRef> {
        use arrow::array::*;
        let bad = || {
            StorageError::invalid(format!(
                "default {self:?} does not fit type {}",
                data_type.name()
            ))
        };
        let int = |min: i64, max: i64| match self {
            Value::Int(v) if (min..=max).contains(v) => Ok(*v),
            _ => Err(bad()),
        };
        Ok(match data_type {
            DataType::Int8 => Arc::new(Int8Array::from(vec![int(-128, 127)? as i8; len])),
            DataType::Int16 => Arc::new(Int16Array::from(vec![int(-32768, 32767)? as i16; len])),
            DataType::Int32 => Arc::new(Int32Array::from(vec![
                int(i32::MIN.into(), i32::MAX.into())?
                    as i32;
                len
            ])),
            DataType::Int64 => Arc::new(Int64Array::from(vec![int(i64::MIN, i64::MAX)?; len])),
            DataType::Date => Arc::new(Date32Array::from(vec![
                int(i32::MIN.into(), i32::MAX.into())?
                    as i32;
                len
            ])),
            DataType::Decimal { precision, scale } => {
                let unscaled = match self {
                    Value::Decimal(v) => *v,
                    Value::Int(v) => i128::from(*v),
                    _ => return Err(bad()),
                };
                let array = Decimal128Array::from(vec![unscaled; len])
                    .with_precision_and_scale(precision, scale)
                    .map_err(|_| bad())?;
                array
                    .validate_decimal_precision(precision)
                    .map_err(|_| bad())?;
                Arc::new(array)
            }
            DataType::Timestamp => Arc::new(TimestampMicrosecondArray::from(vec![
                int(
                    i64::MIN,
                    i64::MAX
                )?;
                len
            ])),
            DataType::Float | DataType::Double => {
                let v = match self {
                    Value::Float(v) => *v,
                    Value::Int(v) => *v as f64,
                    _ => return Err(bad()),
                };
                if data_type == DataType::Float {
                    Arc::new(Float32Array::from(vec![v as f32; len]))
                } else {
                    Arc::new(Float64Array::from(vec![v; len]))
                }
            }
            DataType::Bool => match self {
                Value::Bool(v) => Arc::new(BooleanArray::from(vec![*v; len])),
                _ => return Err(bad()),
            },
            DataType::String | DataType::Varchar(_) => match self {
                Value::Bytes(b) => {
                    let s = std::str::from_utf8(b).map_err(|_| bad())?;
                    if let DataType::Varchar(n) = data_type {
                        if s.chars().count() > usize::from(n) {
                            return Err(bad());
                        }
                    }
                    Arc::new(StringArray::from_iter_values(std::iter::repeat_n(s, len)))
                }
                _ => return Err(bad()),
            },
            DataType::Binary => match self {
                Value::Bytes(b) => Arc::new(BinaryArray::from_iter_values(std::iter::repeat_n(
                    b.as_slice(),
                    len,
                ))),
                _ => return Err(bad()),
            },
        })
    }
}

/// One column of a table.
#[derive(Clone, Debug, PartialEq)]
pub struct ColumnSchema {
    /// Stable identity; never reused within a table, survives renames.
    pub id: u32,
    pub name: String,
    pub data_type: DataType,
    pub nullable: bool,
    /// Value that rows written before the column existed read as (None: null).
    pub default: Option<Value>,
}

impl ColumnSchema {
    /// A column without a default.
    pub fn new(id: u32, name: impl Into<String>, data_type: DataType, nullable: bool) -> Self {
        ColumnSchema {
            id,
            name: name.into(),
            data_type,
            nullable,
            default: None,
        }
    }

    /// The column's values for `len` rows written before it existed.
    pub fn fill(&self, len: usize) -> Result<ArrayRef> {
        match &self.default {
            Some(value) => value.repeat(self.data_type, len),
            None => Ok(new_null_array(&self.data_type.arrow(), len)),
        }
    }
}

/// A validated table schema: columns, a primary key that is a non-null prefix of the columns,
/// and a version that grows by one with every schema change.
#[derive(Clone, Debug, PartialEq)]
pub struct Schema {
    columns: Vec<ColumnSchema>,
    key_count: usize,
    version: u32,
    /// Invariant: greater than every column id ever used by this table.
    next_column_id: u32,
}

impl Schema {
    /// Validates and builds a schema whose key is the first `key_count` columns.
    pub fn new(columns: Vec<ColumnSchema>, key_count: usize, version: u32) -> Result<Self> {
        let next_column_id = columns.iter().map(|c| c.id + 1).max().unwrap_or(0);
        Self::with_next_id(columns, key_count, version, next_column_id)
    }

    /// Like `new`, with an explicit next column id (as persisted in the manifest).
    pub fn with_next_id(
        columns: Vec<ColumnSchema>,
        key_count: usize,
        version: u32,
        next_column_id: u32,
    ) -> Result<Self> {
        let schema = Schema {
            columns,
            key_count,
            version,
            next_column_id,
        };
        schema.validate()?;
        Ok(schema)
    }

    /// Builds version 0 of a schema, numbering columns 0.. and taking the key by name.
    pub fn build(columns: Vec<(String, DataType, bool)>, key: &[&str]) -> Result<Self> {
        let cols: Vec<ColumnSchema> = columns
            .into_iter()
            .enumerate()
            .map(|(i, (name, t, nullable))| ColumnSchema::new(i as u32, name, t, nullable))
            .collect();
        for (i, name) in key.iter().enumerate() {
            if cols.get(i).map(|c| c.name.as_str()) != Some(*name) {
                return Err(StorageError::invalid(format!(
                    "key column {name:?} must be column {i}: the key is a prefix of the columns"
                )));
            }
        }
        Schema::new(cols, key.len(), 0)
    }

    fn validate(&self) -> Result<()> {
        if self.columns.is_empty() || self.columns.len() > COLUMNS_MAX {
            return Err(StorageError::invalid(format!(
                "a schema has 1..={COLUMNS_MAX} columns, got {}",
                self.columns.len()
            )));
        }
        if self.key_count == 0 || self.key_count > self.columns.len() {
            return Err(StorageError::invalid(
                "the primary key needs at least one column, all of them in the schema",
            ));
        }
        let mut names = HashSet::new();
        let mut ids = HashSet::new();
        for (i, column) in self.columns.iter().enumerate() {
            if column.name.is_empty()
                || column.name.len() > COLUMN_NAME_BYTES_MAX
                || column.name.starts_with("__")
            {
                return Err(StorageError::invalid(format!(
                    "column name {:?} must be 1..={COLUMN_NAME_BYTES_MAX} bytes and not start \
                     with '__' (reserved)",
                    column.name
                )));
            }
            if !names.insert(column.name.as_str()) {
                return Err(StorageError::invalid(format!(
                    "duplicate column name {:?}",
                    column.name
                )));
            }
            if !ids.insert(column.id) || column.id >= self.next_column_id {
                return Err(StorageError::invalid(format!(
                    "column id {} of {:?} is duplicate or not below the next id {}",
                    column.id, column.name, self.next_column_id
                )));
            }
            if i < self.key_count {
                if column.nullable {
                    return Err(StorageError::invalid(format!(
                        "key column {:?} must not be nullable",
                        column.name
                    )));
                }
                if !column.data_type.can_be_key() {
                    return Err(StorageError::invalid(format!(
                        "key column {:?} has type {}, which cannot be a key",
                        column.name,
                        column.data_type.name()
                    )));
                }
            }
            if let Some(default) = &column.default {
                default.repeat(column.data_type, 0)?;
            }
        }
        Ok(())
    }

    /// The columns in table order; the key columns come first.
    pub fn columns(&self) -> &[ColumnSchema] {
        &self.columns
    }

    /// The key columns.
    pub fn key_columns(&self) -> &[ColumnSchema] {
        &self.columns[..self.key_count]
    }

    /// The encoded key length when every key has the same one (integer and timestamp key
    /// columns only), else None.
    pub fn fixed_key_width(&self) -> Option<usize> {
        self.key_columns()
            .iter()
            .map(|c| match c.data_type {
                DataType::Int8 => Some(1),
                DataType::Int16 => Some(2),
                DataType::Int32 | DataType::Date => Some(4),
                DataType::Int64 | DataType::Timestamp => Some(8),
                DataType::Decimal { .. } => Some(16),
                _ => None,
            })
            .sum()
    }

    /// How many leading columns form the primary key.
    pub fn key_count(&self) -> usize {
        self.key_count
    }

    /// Grows by one with each schema change.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The id the next added column gets.
    pub fn next_column_id(&self) -> u32 {
        self.next_column_id
    }

    /// The position of the column called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    /// The column called `name`, or `InvalidArgument`.
    pub fn column(&self, name: &str) -> Result<&ColumnSchema> {
        self.index_of(name)
            .map(|i| &self.columns[i])
            .ok_or_else(|| StorageError::invalid(format!("no column named {name:?}")))
    }

    /// The Arrow schema of the table's rows (fields carry the column ids).
    pub fn arrow_schema(&self) -> SchemaRef {
        let fields: Vec<Field> = self.columns.iter().map(arrow_field).collect();
        Arc::new(ArrowSchema::new(fields))
    }

    /// The next version with `column` appended. The column must be nullable or have a default
    /// (rows already written need a value); its id is assigned here.
    pub fn add_column(&self, mut column: ColumnSchema) -> Result<Schema> {
        if !column.nullable && column.default.is_none() {
            return Err(StorageError::invalid(format!(
                "added column {:?} must be nullable or have a default",
                column.name
            )));
        }
        column.id = self.next_column_id;
        let mut columns = self.columns.clone();
        columns.push(column);
        Schema::with_next_id(
            columns,
            self.key_count,
            self.version + 1,
            self.next_column_id + 1,
        )
    }

    /// The next version without the non-key column `name`.
    pub fn drop_column(&self, name: &str) -> Result<Schema> {
        let index = self.index_of(name).ok_or_else(|| {
            StorageError::invalid(format!("cannot drop {name:?}: no such column"))
        })?;
        if index < self.key_count {
            return Err(StorageError::invalid(format!(
                "cannot drop key column {name:?}"
            )));
        }
        let mut columns = self.columns.clone();
        columns.remove(index);
        Schema::with_next_id(
            columns,
            self.key_count,
            self.version + 1,
            self.next_column_id,
        )
    }

    /// The next version with column `old` called `new`.
    pub fn rename_column(&self, old: &str, new: &str) -> Result<Schema> {
        let index = self.index_of(old).ok_or_else(|| {
            StorageError::invalid(format!("cannot rename {old:?}: no such column"))
        })?;
        let mut columns = self.columns.clone();
        columns[index].name = new.to_string();
        Schema::with_next_id(
            columns,
            self.key_count,
            self.version + 1,
            self.next_column_id,
        )
    }

    /// Checks that `next` can follow this schema: a higher version, the same key, and every
    /// surviving column id keeps its type.
    pub fn check_successor(&self, next: &Schema) -> Result<()> {
        if next.version <= self.version {
            return Err(StorageError::invalid(format!(
                "schema version {} does not follow {}",
                next.version, self.version
            )));
        }
        let same_key = self.key_count == next.key_count
            && self
                .key_columns()
                .iter()
                .zip(next.key_columns())
                .all(|(a, b)| a.id == b.id && a.data_type == b.data_type);
        if !same_key {
            return Err(StorageError::invalid(
                "a schema change cannot alter the key",
            ));
        }
        for column in &next.columns {
            if let Some(old) = self.columns.iter().find(|c| c.id == column.id) {
                if old.data_type != column.data_type {
                    return Err(StorageError::invalid(format!(
                        "column {:?} cannot change type",
                        column.name
                    )));
                }
            } else if column.id < self.next_column_id {
                return Err(StorageError::invalid(format!(
                    "column id {} was used before and cannot come back",
                    column.id
                )));
            } else if !column.nullable && column.default.is_none() {
                return Err(StorageError::invalid(format!(
                    "added column {:?} must be nullable or have a default",
                    column.name
                )));
            }
        }
        Ok(())
    }
}

/// The Arrow field for a column (its id in the metadata).
pub fn arrow_field(column: &ColumnSchema) -> Field {
    Field::new(&column.name, column.data_type.arrow(), column.nullable).with_metadata(
        [(COLUMN_ID_KEY.to_string(), column.id.to_string())]
            .into_iter()
            .collect::<std::collections::HashMap<String, String>>(),
    )
}

/// The column id recorded on an Arrow field, if any.
pub fn field_column_id(field: &Field) -> Option<u32> {
    field.metadata().get(COLUMN_ID_KEY)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Schema {
        Schema::build(
            vec![
                ("id".into(), DataType::Int64, false),
                ("name".into(), DataType::String, true),
            ],
            &["id"],
        )
        .unwrap()
    }

    #[test]
    fn rejects_bad_schemas() {
        let dup = Schema::build(
            vec![
                ("id".into(), DataType::Int64, false),
                ("id".into(), DataType::String, true),
            ],
            &["id"],
        );
        assert!(matches!(dup, Err(StorageError::InvalidArgument(_))));
        let nullable_key = Schema::build(vec![("id".into(), DataType::Int64, true)], &["id"]);
        assert!(matches!(
            nullable_key,
            Err(StorageError::InvalidArgument(_))
        ));
        let float_key = Schema::build(vec![("id".into(), DataType::Double, false)], &["id"]);
        assert!(float_key.is_err());
        assert!(DataType::from_name("decimal").is_err());
        assert!(DataType::from_name("decimal(39,2)").is_err());
        assert!(DataType::from_name("decimal(5,6)").is_err());
        assert!(DataType::from_name("varchar(0)").is_err());
        assert!(DataType::from_name("varchar(65536)").is_err());
        for name in [
            "decimal(10,2)",
            "decimal(38,38)",
            "date",
            "varchar(32)",
            "timestamp",
        ] {
            assert_eq!(DataType::from_name(name).unwrap().name(), name);
        }
        assert_eq!(
            DataType::from_name("decimal(10, 2)").unwrap(),
            DataType::Decimal {
                precision: 10,
                scale: 2
            }
        );
        let not_prefix = Schema::build(
            vec![
                ("a".into(), DataType::Int64, false),
                ("b".into(), DataType::Int64, false),
            ],
            &["b"],
        );
        assert!(not_prefix.is_err());
    }

    #[test]
    fn schema_changes_keep_ids() {
        let s0 = base();
        let s1 = s0
            .add_column(ColumnSchema::new(0, "v", DataType::Double, true))
            .unwrap();
        assert_eq!(s1.column("v").unwrap().id, 2);
        assert_eq!(s1.version(), 1);
        let s2 = s1.rename_column("name", "label").unwrap();
        assert_eq!(s2.column("label").unwrap().id, 1);
        let s3 = s2.drop_column("label").unwrap();
        assert!(s3.drop_column("id").is_err());
        let s4 = s3
            .add_column(ColumnSchema::new(0, "w", DataType::Int8, true))
            .unwrap();
        assert_eq!(s4.column("w").unwrap().id, 3, "ids are never reused");
        s0.check_successor(&s4).unwrap();
        assert!(s4.check_successor(&s0).is_err());
        let not_null = s0.add_column(ColumnSchema::new(0, "x", DataType::Int8, false));
        assert!(not_null.is_err());
        let mut with_default = ColumnSchema::new(0, "x", DataType::Int8, false);
        with_default.default = Some(Value::Int(7));
        assert!(s0.add_column(with_default).is_ok());
    }
}
