//! Scan predicates (`=, !=, <, <=, >, >=, IN, IS NULL, IS NOT NULL`): evaluation over Arrow arrays
//! and row-group pruning over Parquet statistics.

use arrow::array::{Array, ArrayRef, BooleanArray, Scalar, UInt64Array};
use arrow::compute::kernels::{boolean, cmp};
use arrow::compute::{is_not_null, is_null};
use arrow::datatypes::DataType as ArrowType;

use crate::error::{Result, StorageError};
use crate::schema::Schema;

/// A comparison of one column against constant values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PredicateOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    In,
    IsNull,
    IsNotNull,
}

impl PredicateOp {
    /// Parses `=`, `==`, `!=`, `<>`, `<`, `<=`, `>`, `>=`, `in`, `is null`, `is not null`
    /// (case-insensitive).
    pub fn parse(text: &str) -> Result<Self> {
        Ok(match text.trim().to_ascii_lowercase().as_str() {
            "=" | "==" => PredicateOp::Eq,
            "!=" | "<>" => PredicateOp::Ne,
            "<" => PredicateOp::Lt,
            "<=" => PredicateOp::Le,
            ">" => PredicateOp::Gt,
            ">=" => PredicateOp::Ge,
            "in" => PredicateOp::In,
            "is null" | "is_null" => PredicateOp::IsNull,
            "is not null" | "is_not_null" => PredicateOp::IsNotNull,
            other => {
                return Err(StorageError::invalid(format!(
                    "unknown predicate operator {other:?}"
                )))
            }
        })
    }
}

/// `column op values`: `values` holds one value for comparisons, any number (at most
/// `IN_VALUES_MAX`) for `IN`, and is absent for the null tests.
#[derive(Clone, Debug)]
pub struct Predicate {
    pub column: String,
    pub op: PredicateOp,
    pub values: Option<ArrayRef>,
}

/// Most values an `IN` list may hold.
pub const IN_VALUES_MAX: usize = 65_536;

impl Predicate {
    /// Checks the predicate against the schema: the column exists, the values have its type
    /// and the right count, and no value is null.
    pub fn validate(&self, schema: &Schema) -> Result<()> {
        let column = schema.column(&self.column)?;
        let needs_values = !matches!(self.op, PredicateOp::IsNull | PredicateOp::IsNotNull);
        match (&self.values, needs_values) {
            (None, false) => return Ok(()),
            (Some(_), false) => {
                return Err(StorageError::invalid(format!(
                    "{:?} takes no values",
                    self.op
                )))
            }
            (None, true) => {
                return Err(StorageError::invalid(format!(
                    "{:?} needs a value",
                    self.op
                )))
            }
            (Some(_), true) => {}
        }
        let values = self.values.as_ref().expect("checked above");
        let target = column.data_type.arrow();
        if *values.data_type() != target {
            return Err(StorageError::invalid(format!(
                "predicate on {:?} compares {} with {}",
                self.column,
                column.data_type.name(),
                values.data_type()
            )));
        }
        let count_ok = match self.op {
            PredicateOp::In => values.len() <= IN_VALUES_MAX,
            _ => values.len() == 1,
        };
        if !count_ok || values.null_count() > 0 {
            return Err(StorageError::invalid(format!(
                "predicate on {:?}: wrong number of values or a null value",
                self.column
            )));
        }
        Ok(())
    }

    /// Which rows of `array` (this predicate's column) match; nulls never match comparisons.
    pub fn evaluate(&self, array: &dyn Array) -> Result<BooleanArray> {
        let fail = |e| StorageError::arrow_internal("predicate", e);
        let scalar = |i: usize| Scalar::new(self.values.as_ref().expect("validated").slice(i, 1));
        let result = match self.op {
            PredicateOp::IsNull => is_null(array).map_err(fail)?,
            PredicateOp::IsNotNull => is_not_null(array).map_err(fail)?,
            PredicateOp::Eq => cmp::eq(&array, &scalar(0)).map_err(fail)?,
            PredicateOp::Ne => cmp::neq(&array, &scalar(0)).map_err(fail)?,
            PredicateOp::Lt => cmp::lt(&array, &scalar(0)).map_err(fail)?,
            PredicateOp::Le => cmp::lt_eq(&array, &scalar(0)).map_err(fail)?,
            PredicateOp::Gt => cmp::gt(&array, &scalar(0)).map_err(fail)?,
            PredicateOp::Ge => cmp::gt_eq(&array, &scalar(0)).map_err(fail)?,
            PredicateOp::In => {
                let count = self.values.as_ref().expect("validated").len();
                let mut any = BooleanArray::from(vec![false; array.len()]);
                for i in 0..count {
                    let hit = cmp::eq(&array, &scalar(i)).map_err(fail)?;
                    any = boolean::or_kleene(&any, &hit).map_err(fail)?;
                }
                any
            }
        };
        Ok(strip_nulls(result))
    }

    /// Which row groups may hold a match, given their statistics (`mins`, `maxes` typed like the
    /// column, null where unknown). Unknown statistics keep the group.
    pub fn row_groups_may_match(&self, stats: &ColumnStats) -> Result<Vec<bool>> {
        let groups = stats.row_counts.len();
        let keep_all = vec![true; groups];
        let fail = |e| StorageError::arrow_internal("statistics pruning", e);
        match self.op {
            PredicateOp::IsNull => {
                return Ok((0..groups)
                    .map(|g| stats.null_counts.is_null(g) || stats.null_counts.value(g) > 0)
                    .collect())
            }
            PredicateOp::IsNotNull => {
                return Ok((0..groups)
                    .map(|g| {
                        stats.null_counts.is_null(g)
                            || stats.null_counts.value(g) < stats.row_counts.value(g)
                    })
                    .collect())
            }
            _ => {}
        }
        // NaN sorts above every number in Arrow's comparison but is absent from Parquet
        // statistics, so float ranges cannot prove a comparison false.
        if matches!(
            stats.mins.data_type(),
            ArrowType::Float32 | ArrowType::Float64
        ) || stats.mins.len() != groups
            || stats.maxes.len() != groups
        {
            return Ok(keep_all);
        }
        let values = self.values.as_ref().expect("validated");
        let mut keep = vec![self.op != PredicateOp::In; groups];
        let value_count = if self.op == PredicateOp::In {
            values.len()
        } else {
            1
        };
        for i in 0..value_count {
            let v = Scalar::new(values.slice(i, 1));
            // `excluded[g]` true: statistics prove no row of group g matches value i.
            let excluded = match self.op {
                PredicateOp::Eq | PredicateOp::In => boolean::or(
                    &cmp::lt(&stats.maxes, &v).map_err(fail)?,
                    &cmp::gt(&stats.mins, &v).map_err(fail)?,
                )
                .map_err(fail)?,
                // Every row of the group equals the value: min = max = value.
                PredicateOp::Ne => boolean::and(
                    &cmp::eq(&stats.mins, &v).map_err(fail)?,
                    &cmp::eq(&stats.maxes, &v).map_err(fail)?,
                )
                .map_err(fail)?,
                PredicateOp::Lt => cmp::gt_eq(&stats.mins, &v).map_err(fail)?,
                PredicateOp::Le => cmp::gt(&stats.mins, &v).map_err(fail)?,
                PredicateOp::Gt => cmp::lt_eq(&stats.maxes, &v).map_err(fail)?,
                PredicateOp::Ge => cmp::lt(&stats.maxes, &v).map_err(fail)?,
                PredicateOp::IsNull | PredicateOp::IsNotNull => unreachable!("handled above"),
            };
            for (g, slot) in keep.iter_mut().enumerate() {
                let proven_out = excluded.is_valid(g) && excluded.value(g);
                if self.op == PredicateOp::In {
                    *slot |= !proven_out;
                } else {
                    *slot &= !proven_out;
                }
            }
        }
        Ok(keep)
    }
}

/// Per-row-group statistics of one column.
pub struct ColumnStats {
    pub mins: ArrayRef,
    pub maxes: ArrayRef,
    pub null_counts: UInt64Array,
    pub row_counts: UInt64Array,
}

/// Turns null results into false (a filter keeps only definite matches).
pub fn strip_nulls(mask: BooleanArray) -> BooleanArray {
    if mask.null_count() == 0 {
        return mask;
    }
    boolean::is_not_null(&mask)
        .and_then(|valid| boolean::and(&mask, &valid))
        .map(|m| BooleanArray::new(m.values().clone(), None))
        .expect("same lengths")
}

/// ANDs the masks of several predicates over one batch.
pub fn and_all(masks: Vec<BooleanArray>, rows: usize) -> BooleanArray {
    masks
        .into_iter()
        .reduce(|a, b| boolean::and(&a, &b).expect("same lengths"))
        .unwrap_or_else(|| BooleanArray::from(vec![true; rows]))
}
