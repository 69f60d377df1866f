//! Connection strings and environment, as libpq (and so psql) reads them:
//!
//! - `postgres://user:pass@host1:5432,host2:5432/db?sslmode=verify-full&target_session_attrs=read-write`
//! - `host=db port=5432 user=app dbname=app sslmode=require` (key=value,
//!   values quoted with `'…'` where they contain spaces)
//! - Unix sockets: a host that is a directory, `host=/var/run/postgresql`
//!   or `postgres://%2Fvar%2Frun%2Fpostgresql/db`
//! - anything the string leaves out comes from `PGHOST`, `PGPORT`, `PGUSER`,
//!   `PGPASSWORD` (else the password file, `PGPASSFILE` or `~/.pgpass`),
//!   `PGDATABASE`, `PGAPPNAME`, `PGCONNECT_TIMEOUT`,
//!   `PGTARGETSESSIONATTRS`, `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT`,
//!   `PGSSLKEY`; then libpq's defaults (the local socket directory, the OS
//!   user, a database named like the user).
//!
//! tokio-postgres parses the rest; it does not know `verify-ca`,
//! `verify-full` or the certificate settings, so they are taken out here and
//! become [`TlsSettings`].

use std::path::PathBuf;

use crate::db::tls::{RootCert, SslMode, TlsSettings};
use crate::error::{Error, Result};

/// The TLS keys pgwake handles itself.
const TLS_KEYS: &[&str] = &["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// Environment variables that say where the database is; with none of them
/// and no URL, pgwake refuses to guess.
pub(crate) const LOCATION_VARS: &[&str] =
    &["PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER"];

/// A parsed connection string: what tokio-postgres understands, the TLS
/// settings, and which keys the string set (environment fills the others).
pub(crate) struct Parsed {
    /// The driver's configuration.
    pub pg: tokio_postgres::Config,
    /// TLS settings, before environment defaults.
    pub tls: Vec<(String, String)>,
    /// Whether the string set `target_session_attrs`.
    pub has_target_session_attrs: bool,
}

const FORMAT_HINT: &str = "expected postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE or key=value pairs like `host=H dbname=D`";

/// Parse a URL or key=value string. Errors name the problem, never the
/// string (it may hold a password).
pub(crate) fn parse(input: &str) -> Result<Parsed> {
    let input = input.trim();
    let (rest, pairs_taken) =
        if input.starts_with("postgres://") || input.starts_with("postgresql://") {
            split_url(input)?
        } else {
            split_key_values(input)?
        };
    let mut tls = Vec::new();
    let mut has_tsa = false;
    for (k, v) in pairs_taken {
        if k == "target_session_attrs" {
            has_tsa = true;
        } else {
            tls.push((k, v));
        }
    }
    let pg: tokio_postgres::Config = if rest.is_empty() {
        tokio_postgres::Config::new()
    } else {
        rest.parse().map_err(|e: tokio_postgres::Error| {
            // The driver's parse errors name the offending key, not its value.
            Error::DatabaseUrl(format!("{e}; {FORMAT_HINT}"))
        })?
    };
    Ok(Parsed {
        pg,
        tls,
        has_target_session_attrs: has_tsa,
    })
}

/// Take the TLS keys out of a URL's query string (noting whether
/// `target_session_attrs` is there); returns the URL left for the driver.
fn split_url(url: &str) -> Result<(String, Vec<(String, String)>)> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_string(), Vec::new()));
    };
    let mut keep = Vec::new();
    let mut taken = Vec::new();
    for part in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        let key = decode(k)?;
        if TLS_KEYS.contains(&key.as_str()) {
            taken.push((key, decode(v)?));
        } else {
            if key == "target_session_attrs" {
                taken.push((key, String::new()));
            }
            keep.push(part);
        }
    }
    let rest = if keep.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", keep.join("&"))
    };
    Ok((rest, taken))
}

fn decode(s: &str) -> Result<String> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| {
            Error::DatabaseUrl(format!("a URL parameter is not valid UTF-8; {FORMAT_HINT}"))
        })
}

/// Split libpq key=value pairs (`'…'` quotes, `\` escapes), take the TLS
/// keys out, and re-quote the rest for the driver.
fn split_key_values(s: &str) -> Result<(String, Vec<(String, String)>)> {
    let mut keep = Vec::new();
    let mut taken = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') {
            return Err(Error::DatabaseUrl(format!(
                "`{key}` has no `=value`; {FORMAT_HINT}"
            )));
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            loop {
                match chars.next() {
                    None => {
                        return Err(Error::DatabaseUrl(format!(
                            "unterminated quote in the value of `{key}`"
                        )))
                    }
                    Some('\'') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                chars.next();
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        if TLS_KEYS.contains(&key.as_str()) {
            taken.push((key, value));
        } else {
            if key == "target_session_attrs" {
                taken.push((key.clone(), String::new()));
            }
            let quoted = value.replace('\\', "\\\\").replace('\'', "\\'");
            keep.push(format!("{key}='{quoted}'"));
        }
    }
    Ok((keep.join(" "), taken))
}

/// Fill what the string left out from the environment (`env` looks a
/// variable up) and libpq's defaults; returns the driver configuration and
/// the TLS settings.
pub(crate) fn apply_env(
    parsed: Parsed,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(tokio_postgres::Config, TlsSettings)> {
    let Parsed {
        mut pg,
        tls,
        has_target_session_attrs,
    } = parsed;
    let env = |k: &str| env(k).filter(|v| !v.is_empty());
    if pg.get_hosts().is_empty() && pg.get_hostaddrs().is_empty() {
        match env("PGHOST") {
            Some(hosts) => {
                for h in hosts.split(',') {
                    if h.starts_with('/') {
                        pg.host_path(h);
                    } else {
                        pg.host(h);
                    }
                }
            }
            None => match default_socket_dir() {
                Some(dir) => {
                    pg.host_path(dir);
                }
                None => {
                    pg.host("localhost");
                }
            },
        }
    }
    if pg.get_ports().is_empty() {
        if let Some(ports) = env("PGPORT") {
            for p in ports.split(',') {
                let port = p.trim().parse().map_err(|_| {
                    Error::DatabaseUrl(format!("PGPORT={p:?} is not a port number"))
                })?;
                pg.port(port);
            }
        }
    }
    if pg.get_user().is_none() {
        let user = env("PGUSER")
            .or_else(|| env("USER"))
            .or_else(|| env("LOGNAME"))
            .unwrap_or_else(|| "postgres".into());
        pg.user(user);
    }
    if pg.get_dbname().is_none() {
        if let Some(d) = env("PGDATABASE") {
            pg.dbname(d);
        }
    }
    if pg.get_password().is_none() {
        if let Some(p) = env("PGPASSWORD") {
            pg.password(p);
        } else if let Some(p) = password_from_file(&pg, &env) {
            pg.password(p);
        }
    }
    if pg.get_application_name().is_none() {
        if let Some(a) = env("PGAPPNAME") {
            pg.application_name(a);
        }
    }
    if pg.get_connect_timeout().is_none() {
        if let Some(t) = env("PGCONNECT_TIMEOUT") {
            let secs: u64 = t.parse().map_err(|_| {
                Error::DatabaseUrl(format!(
                    "PGCONNECT_TIMEOUT={t:?} is not a number of seconds"
                ))
            })?;
            if secs > 0 {
                pg.connect_timeout(std::time::Duration::from_secs(secs));
            }
        }
    }
    if !has_target_session_attrs {
        if let Some(t) = env("PGTARGETSESSIONATTRS") {
            let attrs = match t.as_str() {
                "any" => tokio_postgres::config::TargetSessionAttrs::Any,
                "read-write" => tokio_postgres::config::TargetSessionAttrs::ReadWrite,
                "read-only" => tokio_postgres::config::TargetSessionAttrs::ReadOnly,
                _ => {
                    return Err(Error::DatabaseUrl(format!(
                        "PGTARGETSESSIONATTRS={t:?} is not one of any, read-write, read-only"
                    )))
                }
            };
            pg.target_session_attrs(attrs);
        }
    }
    let get = |key: &str, var: &str| {
        tls.iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .or_else(|| env(var))
    };
    let settings = TlsSettings {
        mode: match get("sslmode", "PGSSLMODE") {
            Some(m) => SslMode::parse(&m)?,
            None => SslMode::default(),
        },
        root_cert: get("sslrootcert", "PGSSLROOTCERT").map(|v| match v.as_str() {
            "system" => RootCert::System,
            path => RootCert::File(PathBuf::from(path)),
        }),
        cert: get("sslcert", "PGSSLCERT").map(PathBuf::from),
        key: get("sslkey", "PGSSLKEY").map(PathBuf::from),
    }
    .with_default_files();
    pg.ssl_mode(settings.driver_mode());
    Ok((pg, settings))
}

/// The password file's entry for the first host of `pg` (libpq looks up
/// the host it connects to; pgwake sends one password to every host, so
/// give several hosts the same password or put it in the URL).
fn password_from_file(
    pg: &tokio_postgres::Config,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<String> {
    let host = match pg.get_hosts().first()? {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        // libpq matches a socket host as `localhost`.
        tokio_postgres::config::Host::Unix(_) => "localhost".to_string(),
    };
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    let user = pg.get_user()?;
    let dbname = pg.get_dbname().unwrap_or(user);
    pgpass_lookup(env, &host, port, dbname, user)
}

/// The password for `host:port:dbname:user` from a libpq password file
/// (`PGPASSFILE`, else `~/.pgpass`), as libpq reads it: the first line
/// whose fields match (`*` matches anything; `\:` and `\\` escape), and
/// only from a file that group and others cannot read.
fn pgpass_lookup(
    env: &dyn Fn(&str) -> Option<String>,
    host: &str,
    port: u16,
    dbname: &str,
    user: &str,
) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let path = match env("PGPASSFILE") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env("HOME")?).join(".pgpass"),
    };
    let meta = std::fs::metadata(&path).ok()?;
    if !meta.is_file() {
        return None;
    }
    if meta.permissions().mode() & 0o077 != 0 {
        // As libpq: ignored, and said so.
        tracing::warn!(
            "password file {} has group or world access; permissions should be u=rw (0600) or less: not using it (chmod 600 it)",
            path.display()
        );
        return None;
    }
    let text = std::fs::read_to_string(&path).ok()?;
    let port = port.to_string();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = split_pgpass_line(line);
        if fields.len() != 5 {
            continue;
        }
        let matches = |field: &str, value: &str| field == "*" || field == value;
        if matches(&fields[0], host)
            && matches(&fields[1], &port)
            && matches(&fields[2], dbname)
            && matches(&fields[3], user)
        {
            return Some(fields[4].clone());
        }
    }
    None
}

fn split_pgpass_line(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => fields.last_mut().unwrap().extend(chars.next()),
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut().unwrap().push(c),
        }
    }
    fields
}

/// libpq's default Unix-socket directory, where it exists.
fn default_socket_dir() -> Option<&'static str> {
    ["/var/run/postgresql", "/run/postgresql", "/tmp"]
        .into_iter()
        .find(|d| std::path::Path::new(d).join(".s.PGSQL.5432").exists())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn url_tls_keys_are_taken_out_and_the_rest_reaches_the_driver() {
        let p = parse("postgres://u:p@db.example.com:6432/app?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&application_name=x").unwrap();
        let (pg, tls) = apply_env(p, &no_env).unwrap();
        assert_eq!(tls.mode, SslMode::VerifyFull);
        assert_eq!(tls.root_cert, Some(RootCert::File("/etc/ca.pem".into())));
        assert_eq!(pg.get_application_name(), Some("x"));
        assert_eq!(pg.get_ports(), &[6432]);
        assert_eq!(pg.get_ssl_mode(), tokio_postgres::config::SslMode::Require);
    }

    #[test]
    fn key_value_strings_with_quotes_and_unix_socket_hosts() {
        let p = parse("host=/tmp/sock dbname='my db' user=o\\'neil sslmode=disable").unwrap();
        let (pg, tls) = apply_env(p, &no_env).unwrap();
        assert_eq!(pg.get_dbname(), Some("my db"));
        assert_eq!(pg.get_user(), Some("o'neil"));
        assert!(matches!(
            &pg.get_hosts()[0],
            tokio_postgres::config::Host::Unix(p) if p == std::path::Path::new("/tmp/sock")
        ));
        assert_eq!(tls.mode, SslMode::Disable);
    }

    #[test]
    fn environment_fills_what_the_string_leaves_out_but_never_overrides_it() {
        let env = |k: &str| {
            Some(
                match k {
                    "PGHOST" => "h1,h2",
                    "PGPORT" => "5433",
                    "PGUSER" => "envuser",
                    "PGPASSWORD" => "envpw",
                    "PGDATABASE" => "envdb",
                    "PGAPPNAME" => "envapp",
                    "PGSSLMODE" => "require",
                    "PGTARGETSESSIONATTRS" => "read-write",
                    _ => return None,
                }
                .to_string(),
            )
        };
        let (pg, tls) = apply_env(parse("").unwrap(), &env).unwrap();
        assert_eq!(pg.get_hosts().len(), 2);
        assert_eq!(pg.get_ports(), &[5433]);
        assert_eq!(pg.get_user(), Some("envuser"));
        assert_eq!(pg.get_password(), Some(&b"envpw"[..]));
        assert_eq!(pg.get_dbname(), Some("envdb"));
        assert_eq!(pg.get_application_name(), Some("envapp"));
        assert_eq!(tls.mode, SslMode::Require);
        assert_eq!(
            pg.get_target_session_attrs(),
            tokio_postgres::config::TargetSessionAttrs::ReadWrite
        );
        let (pg, tls) = apply_env(
            parse("postgres://u@h/d?sslmode=disable&target_session_attrs=any").unwrap(),
            &env,
        )
        .unwrap();
        assert_eq!(pg.get_user(), Some("u"));
        assert_eq!(pg.get_dbname(), Some("d"));
        assert_eq!(pg.get_password(), Some(&b"envpw"[..]));
        assert_eq!(tls.mode, SslMode::Disable);
        assert_eq!(
            pg.get_target_session_attrs(),
            tokio_postgres::config::TargetSessionAttrs::Any
        );
    }

    #[test]
    fn the_password_file_is_read_like_libpq_and_only_when_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pgpass");
        std::fs::write(
            &file,
            "# comment\nother:5432:*:app:wrong\ndb.example.com:6432:app:app:s3cr\\:et\n*:*:*:*:fallback\n",
        )
        .unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let path = file.display().to_string();
        let env = |k: &str| (k == "PGPASSFILE").then(|| path.clone());
        let (pg, _) = apply_env(
            parse("postgres://app@db.example.com:6432/app").unwrap(),
            &env,
        )
        .unwrap();
        assert_eq!(pg.get_password(), Some(&b"s3cr:et"[..]));
        let (pg, _) = apply_env(parse("postgres://x@elsewhere/y").unwrap(), &env).unwrap();
        assert_eq!(pg.get_password(), Some(&b"fallback"[..]));
        // A URL password wins.
        let (pg, _) = apply_env(
            parse("postgres://app:url@db.example.com:6432/app").unwrap(),
            &env,
        )
        .unwrap();
        assert_eq!(pg.get_password(), Some(&b"url"[..]));
        // A file others can read is ignored, as libpq does.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let (pg, _) = apply_env(parse("postgres://x@elsewhere/y").unwrap(), &env).unwrap();
        assert_eq!(pg.get_password(), None);
    }

    #[test]
    fn parse_errors_never_echo_the_string() {
        let e = parse("postgres://u:hunter2@h/d?bogus=1")
            .err()
            .unwrap()
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
        let e = parse("host=h password=hunter2 dbname")
            .err()
            .unwrap()
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
        let e = apply_env(parse("sslmode=verify_full").unwrap(), &no_env)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("sslmode"), "{e}");
    }
}
