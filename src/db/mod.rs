//! The database side of every connection: the connection string and libpq
//! environment ([`conninfo`]), TLS ([`tls`]), connecting and pooling
//! ([`connect`]), and the catalogue of every statement the library sends
//! ([`sql`], with its text in `src/db/sql/`).

pub mod connect;
pub(crate) mod conninfo;
pub mod sql;
pub(crate) mod tls;
