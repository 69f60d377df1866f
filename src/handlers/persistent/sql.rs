//! SQL a persistent handler sends for a tx-mode job: parameters bound as
//! text (the server infers their types, as for a `psql` variable), rows
//! returned as JSON objects.

use std::error::Error as StdError;

use bytes::BytesMut;
use tokio_postgres::types::{to_sql_checked, Format, FromSql, IsNull, Kind, ToSql, Type};
use tokio_postgres::Client;

/// Most parameters one statement may carry (PostgreSQL's own limit).
pub const PARAMS_MAX: usize = 65_535;

/// Most rows returned to a process for one statement.
pub const ROWS_MAX: usize = 10_000;

/// A parameter sent in PostgreSQL's text format, whatever its type.
#[derive(Debug)]
pub(super) struct TextParam(Option<String>);

impl TextParam {
    /// JSON strings as they are, numbers as their digits, `true`/`false`,
    /// `null` as NULL, arrays and objects as JSON text.
    pub(super) fn from_json(v: &serde_json::Value) -> TextParam {
        TextParam(match v {
            serde_json::Value::Null => None,
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Bool(b) => Some(b.to_string()),
            serde_json::Value::Number(n) => Some(n.to_string()),
            other => Some(other.to_string()),
        })
    }
}

impl ToSql for TextParam {
    fn to_sql(
        &self,
        _ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        match &self.0 {
            None => Ok(IsNull::Yes),
            Some(s) => {
                out.extend_from_slice(s.as_bytes());
                Ok(IsNull::No)
            }
        }
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }

    fn encode_format(&self, _ty: &Type) -> Format {
        Format::Text
    }

    to_sql_checked!();
}

/// One column's value as JSON.
struct Cell(serde_json::Value);

impl<'a> FromSql<'a> for Cell {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn StdError + Sync + Send>> {
        use serde_json::Value as V;
        let v = match *ty {
            Type::BOOL => V::Bool(bool::from_sql(ty, raw)?),
            Type::INT2 => V::from(i16::from_sql(ty, raw)?),
            Type::INT4 => V::from(i32::from_sql(ty, raw)?),
            Type::INT8 => V::from(i64::from_sql(ty, raw)?),
            Type::OID => V::from(u32::from_sql(ty, raw)?),
            Type::FLOAT4 => float(f64::from(f32::from_sql(ty, raw)?)),
            Type::FLOAT8 => float(f64::from_sql(ty, raw)?),
            Type::NUMERIC => {
                let text = numeric_text(raw)?;
                match serde_json::from_str::<serde_json::Number>(&text) {
                    Ok(n) => V::Number(n),
                    Err(_) => V::String(text),
                }
            }
            Type::JSON | Type::JSONB => serde_json::Value::from_sql(ty, raw)?,
            Type::UUID => {
                let b: [u8; 16] = raw.try_into().map_err(|_| "uuid of the wrong length")?;
                let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
                V::String(format!(
                    "{}-{}-{}-{}-{}",
                    &h[0..8],
                    &h[8..12],
                    &h[12..16],
                    &h[16..20],
                    &h[20..]
                ))
            }
            Type::TIMESTAMPTZ => V::String(
                chrono::DateTime::<chrono::Utc>::from_sql(ty, raw)?
                    .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
            ),
            Type::TIMESTAMP => V::String(
                chrono::NaiveDateTime::from_sql(ty, raw)?
                    .format("%Y-%m-%dT%H:%M:%S%.f")
                    .to_string(),
            ),
            Type::DATE => V::String(chrono::NaiveDate::from_sql(ty, raw)?.to_string()),
            Type::BYTEA => V::String(format!(
                "\\x{}",
                raw.iter().map(|b| format!("{b:02x}")).collect::<String>()
            )),
            Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                V::String(std::str::from_utf8(raw)?.to_owned())
            }
            _ if matches!(ty.kind(), Kind::Enum(_)) => {
                V::String(std::str::from_utf8(raw)?.to_owned())
            }
            _ => {
                return Err(format!(
                    "type {} is not carried by the protocol; cast the column (::text, or ::jsonb for arrays and records)",
                    ty.name()
                )
                .into())
            }
        };
        Ok(Cell(v))
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }

    fn from_sql_null(_ty: &Type) -> Result<Self, Box<dyn StdError + Sync + Send>> {
        Ok(Cell(serde_json::Value::Null))
    }
}

fn float(f: f64) -> serde_json::Value {
    match serde_json::Number::from_f64(f) {
        Some(n) => serde_json::Value::Number(n),
        None => serde_json::Value::String(f.to_string()),
    }
}

/// A `numeric` in PostgreSQL's binary format as decimal text.
fn numeric_text(raw: &[u8]) -> Result<String, Box<dyn StdError + Sync + Send>> {
    let word = |i: usize| -> Result<u16, Box<dyn StdError + Sync + Send>> {
        raw.get(i..i + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
            .ok_or_else(|| "numeric too short".into())
    };
    let ndigits = word(0)? as usize;
    let weight = word(2)? as i16 as i32;
    let sign = word(4)?;
    let dscale = word(6)? as usize;
    match sign {
        0xC000 => return Ok("NaN".into()),
        0xD000 => return Ok("Infinity".into()),
        0xF000 => return Ok("-Infinity".into()),
        _ => {}
    }
    let digits: Vec<u16> = (0..ndigits)
        .map(|i| word(8 + 2 * i))
        .collect::<Result<_, _>>()?;
    let digit = |pos: i32| -> u16 {
        // `pos` counts base-10000 digits from the first one (weight).
        if pos < 0 || pos as usize >= digits.len() {
            0
        } else {
            digits[pos as usize]
        }
    };
    let mut out = String::new();
    if sign == 0x4000 {
        out.push('-');
    }
    if weight < 0 {
        out.push('0');
    } else {
        for w in 0..=weight {
            let d = digit(w);
            if w == 0 {
                out.push_str(&d.to_string());
            } else {
                out.push_str(&format!("{d:04}"));
            }
        }
    }
    if dscale > 0 {
        out.push('.');
        let mut frac = String::new();
        let mut pos = weight + 1;
        while frac.len() < dscale {
            frac.push_str(&format!("{:04}", digit(pos)));
            pos += 1;
        }
        frac.truncate(dscale);
        out.push_str(&frac);
    }
    Ok(out)
}

/// What a statement returned.
pub(super) enum SqlResult {
    /// Its rows (as JSON objects) and the rows it affected.
    Rows(Vec<serde_json::Value>, u64),
    /// Its error: message and SQLSTATE.
    Error(String, Option<String>),
}

/// Run `sql` with `params` on `client` (the claim transaction).
pub(super) async fn run(client: &Client, sql: &str, params: &[serde_json::Value]) -> SqlResult {
    if params.len() > PARAMS_MAX {
        return SqlResult::Error(
            format!("{} parameters; at most {PARAMS_MAX}", params.len()),
            None,
        );
    }
    let params: Vec<TextParam> = params.iter().map(TextParam::from_json).collect();
    let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as _).collect();
    let stmt = match client.prepare(sql).await {
        Ok(s) => s,
        Err(e) => return db_error(&e),
    };
    if stmt.columns().is_empty() {
        return match client.execute(&stmt, &refs).await {
            Ok(n) => SqlResult::Rows(Vec::new(), n),
            Err(e) => db_error(&e),
        };
    }
    let rows = match client.query(&stmt, &refs).await {
        Ok(r) => r,
        Err(e) => return db_error(&e),
    };
    if rows.len() > ROWS_MAX {
        return SqlResult::Error(
            format!(
                "the statement returned {} rows; at most {ROWS_MAX} go back to a handler (add a LIMIT, or aggregate with json_agg)",
                rows.len()
            ),
            None,
        );
    }
    let affected = rows.len() as u64;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        let mut obj = serde_json::Map::new();
        for (i, col) in row.columns().iter().enumerate() {
            match row.try_get::<_, Cell>(i) {
                Ok(Cell(v)) => {
                    obj.insert(col.name().to_owned(), v);
                }
                Err(e) => {
                    let why = e
                        .source()
                        .map(|s| s.to_string())
                        .unwrap_or_else(|| e.to_string());
                    return SqlResult::Error(format!("column {:?}: {why}", col.name()), None);
                }
            }
        }
        out.push(serde_json::Value::Object(obj));
    }
    SqlResult::Rows(out, affected)
}

fn db_error(e: &tokio_postgres::Error) -> SqlResult {
    match e.as_db_error() {
        Some(db) => SqlResult::Error(db.message().to_owned(), Some(db.code().code().to_owned())),
        None => SqlResult::Error(e.to_string(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numeric(ndigits: u16, weight: i16, sign: u16, dscale: u16, digits: &[u16]) -> Vec<u8> {
        let mut v = Vec::new();
        for w in [ndigits, weight as u16, sign, dscale] {
            v.extend_from_slice(&w.to_be_bytes());
        }
        for d in digits {
            v.extend_from_slice(&d.to_be_bytes());
        }
        v
    }

    #[test]
    fn numerics_keep_every_digit() {
        // 12345678.9 = [1234, 5678, 9000] weight 1, dscale 1
        assert_eq!(
            numeric_text(&numeric(3, 1, 0, 1, &[1234, 5678, 9000])).unwrap(),
            "12345678.9"
        );
        // -0.0012 = [12] weight -1, dscale 4
        assert_eq!(
            numeric_text(&numeric(1, -1, 0x4000, 4, &[12])).unwrap(),
            "-0.0012"
        );
        // 10000 = [1] weight 1, dscale 0
        assert_eq!(numeric_text(&numeric(1, 1, 0, 0, &[1])).unwrap(), "10000");
        assert_eq!(numeric_text(&numeric(0, 0, 0xC000, 0, &[])).unwrap(), "NaN");
        assert_eq!(numeric_text(&numeric(0, 0, 0, 2, &[])).unwrap(), "0.00");
    }
}
