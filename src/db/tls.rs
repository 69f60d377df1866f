//! TLS for every connection pgwake opens (claim pool, listener, migrate,
//! CLI commands), with rustls and the `ring` provider, following libpq's
//! `sslmode` semantics, which tokio-postgres alone does not implement:
//!
//! | sslmode | encrypted | server certificate checked |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (default) | if the server offers TLS | no |
//! | `require` | always | no; with a root certificate: as `verify-ca` (libpq does the same) |
//! | `verify-ca` | always | signed by `sslrootcert` |
//! | `verify-full` | always | signed by `sslrootcert` and valid for the host name |
//!
//! `sslrootcert` is a PEM file of CA certificates, or `system` for the
//! operating system's store. `sslcert`/`sslkey` are the client certificate
//! and its key (PEM) for `cert` authentication. Defaults as in libpq:
//! `~/.postgresql/root.crt`, `~/.postgresql/postgresql.crt` and
//! `~/.postgresql/postgresql.key` when those files exist.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::{Error, Result};

/// libpq's `sslmode`.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Plain connections only.
    Disable,
    /// TLS when the server offers it, unverified; plain otherwise.
    #[default]
    Prefer,
    /// TLS or fail; the certificate is not checked (unless a root
    /// certificate is configured: then as `VerifyCa`).
    Require,
    /// TLS, certificate signed by a trusted CA; any host name.
    VerifyCa,
    /// TLS, certificate signed by a trusted CA and valid for the host name.
    VerifyFull,
}

impl SslMode {
    /// Parse libpq's spelling; the error names the setting and the values.
    pub fn parse(value: &str) -> Result<SslMode> {
        Ok(match value {
            "disable" => SslMode::Disable,
            // libpq's `allow` (plain first, TLS if the server insists) is
            // closest to prefer for a client that never needs plain.
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(Error::DatabaseUrl(format!(
                    "sslmode={other} is not one of disable, prefer, require, verify-ca, verify-full"
                )))
            }
        })
    }

    /// Whether the connection must be encrypted.
    pub fn requires_tls(self) -> bool {
        !matches!(self, SslMode::Disable | SslMode::Prefer)
    }
}

/// Where trusted CA certificates come from.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCert {
    /// A PEM file.
    File(PathBuf),
    /// The operating system's certificate store (`sslrootcert=system`).
    System,
}

/// The TLS settings of a connection string (plus `PGSSL*` and libpq's
/// default files).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsSettings {
    /// `sslmode`.
    pub mode: SslMode,
    /// `sslrootcert`.
    pub root_cert: Option<RootCert>,
    /// `sslcert`: client certificate chain (PEM).
    pub cert: Option<PathBuf>,
    /// `sslkey`: the client certificate's private key (PEM).
    pub key: Option<PathBuf>,
}

fn home_file(name: &str) -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let p = Path::new(&home).join(".postgresql").join(name);
    p.is_file().then_some(p)
}

impl TlsSettings {
    /// Fill what is unset from libpq's default files, as libpq does.
    pub fn with_default_files(mut self) -> TlsSettings {
        if self.mode == SslMode::Disable {
            return self;
        }
        if self.root_cert.is_none() {
            self.root_cert = home_file("root.crt").map(RootCert::File);
        }
        if self.cert.is_none() && self.key.is_none() {
            if let (Some(c), Some(k)) = (home_file("postgresql.crt"), home_file("postgresql.key")) {
                self.cert = Some(c);
                self.key = Some(k);
            }
        }
        self
    }

    /// The mode in force: `require` with a root certificate verifies the
    /// chain, like libpq.
    pub fn effective_mode(&self) -> SslMode {
        match (self.mode, &self.root_cert) {
            (SslMode::Require, Some(_)) => SslMode::VerifyCa,
            (m, _) => m,
        }
    }

    /// tokio-postgres' own (coarser) mode: whether to ask for TLS and
    /// whether plain is acceptable.
    pub fn driver_mode(&self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as D;
        match self.mode {
            SslMode::Disable => D::Disable,
            SslMode::Prefer => D::Prefer,
            _ => D::Require,
        }
    }

    /// Build the rustls connector: reads and checks the certificate files
    /// now, so a wrong path stops the process at start-up with one line (a
    /// configuration error: exit 2).
    pub fn connector(&self) -> Result<MakeRustlsConnect> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Config(format!("cannot set up TLS: {e}")))?;
        let mode = self.effective_mode();
        let verifier: Arc<dyn ServerCertVerifier> = match mode {
            SslMode::Disable | SslMode::Prefer | SslMode::Require => {
                Arc::new(Unverified(provider.clone()))
            }
            SslMode::VerifyCa | SslMode::VerifyFull => {
                let roots = self.roots()?;
                let webpki =
                    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                        .build()
                        .map_err(|e| Error::Config(format!("sslrootcert: {e}")))?;
                if mode == SslMode::VerifyCa {
                    Arc::new(AnyName(webpki))
                } else {
                    webpki
                }
            }
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let chain = read_certs(cert, "sslcert")?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    Error::Config(format!(
                        "sslkey {}: {e}; point sslkey (PGSSLKEY) at the client certificate's PEM private key",
                        key.display()
                    ))
                })?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| Error::Config(format!("sslcert/sslkey do not match: {e}")))?
            }
            (Some(_), None) | (None, Some(_)) => {
                return Err(Error::Config(
                    "sslcert and sslkey go together: set both (or PGSSLCERT and PGSSLKEY)".into(),
                ))
            }
            (None, None) => builder.with_no_client_auth(),
        };
        Ok(MakeRustlsConnect::new(config))
    }

    fn roots(&self) -> Result<RootCertStore> {
        let mut roots = RootCertStore::empty();
        match &self.root_cert {
            None => {
                return Err(Error::Config(format!(
                    "sslmode={} needs the CA certificate that signed the server's: set sslrootcert=/path/ca.pem (or PGSSLROOTCERT), or sslrootcert=system",
                    if self.mode == SslMode::VerifyFull { "verify-full" } else { "verify-ca" }
                )))
            }
            Some(RootCert::File(path)) => {
                for cert in read_certs(path, "sslrootcert")? {
                    roots.add(cert).map_err(|e| {
                        Error::Config(format!("sslrootcert {}: {e}", path.display()))
                    })?;
                }
            }
            Some(RootCert::System) => {
                let found = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(found.certs);
                if roots.is_empty() {
                    return Err(Error::Config(
                        "sslrootcert=system: the operating system's certificate store is empty; install ca-certificates or name a file".into(),
                    ));
                }
            }
        }
        Ok(roots)
    }
}

fn read_certs(path: &Path, setting: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| Error::Config(format!("{setting} {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(Error::Config(format!(
            "{setting} {}: no PEM certificate in the file",
            path.display()
        )));
    }
    Ok(certs)
}

/// `prefer`/`require`: encrypt, but accept any certificate (libpq does the
/// same; it protects against passive eavesdropping only). Handshake
/// signatures are still checked, so the session key belongs to the
/// certificate presented.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted CA; the name is not
/// checked. rustls checks the chain before the name, so a name error means
/// the chain was good.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// If `e` failed because of TLS, one line saying what and how to fix it
/// (`hosts` names the server). `None` for any other error.
pub(crate) fn explain(e: &tokio_postgres::Error, hosts: &str) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut text = Vec::new();
    while let Some(s) = source {
        if let Some(r) = s.downcast_ref::<rustls::Error>() {
            return Some(explain_rustls(r, hosts));
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            if let Some(r) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                return Some(explain_rustls(r, hosts));
            }
        }
        text.push(s.to_string());
        source = s.source();
    }
    let all = text.join(": ");
    if all.contains("server does not support TLS") {
        return Some(format!(
            "TLS: the server at {hosts} does not accept TLS connections; fix: enable ssl on the server, or connect with sslmode=prefer or disable"
        ));
    }
    None
}

fn explain_rustls(e: &rustls::Error, hosts: &str) -> String {
    use rustls::Error as R;
    let (what, fix) = match e {
        R::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => (
            "the server certificate is not valid for this host name".to_string(),
            "connect with a host name the certificate names, or use sslmode=verify-ca",
        ),
        R::InvalidCertificate(CertificateError::UnknownIssuer) => (
            "the server certificate is not signed by a CA in sslrootcert".to_string(),
            "set sslrootcert (PGSSLROOTCERT) to the CA certificate that signed the server's",
        ),
        R::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        ) => (
            "the server certificate has expired".to_string(),
            "renew the server certificate",
        ),
        R::InvalidCertificate(c) => (
            format!("the server certificate was refused ({c:?})"),
            "check the server certificate and sslrootcert",
        ),
        R::AlertReceived(a) => (
            format!("the server refused the handshake ({a:?})"),
            "check the client certificate (sslcert/sslkey) and that the server trusts its CA",
        ),
        other => (
            format!("handshake failed ({other})"),
            "check sslmode and the certificates",
        ),
    };
    format!("TLS: {what} (server {hosts}); fix: {fix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_parses_libpq_spellings_and_names_the_setting_on_error() {
        assert_eq!(SslMode::parse("verify-full").unwrap(), SslMode::VerifyFull);
        assert_eq!(SslMode::parse("disable").unwrap(), SslMode::Disable);
        let e = SslMode::parse("verify_full").unwrap_err().to_string();
        assert!(e.contains("sslmode=verify_full"), "{e}");
    }

    #[test]
    fn require_with_a_root_certificate_verifies_the_chain_like_libpq() {
        let s = TlsSettings {
            mode: SslMode::Require,
            root_cert: Some(RootCert::File("/x".into())),
            ..TlsSettings::default()
        };
        assert_eq!(s.effective_mode(), SslMode::VerifyCa);
    }

    #[test]
    fn verify_full_without_a_root_certificate_is_refused_with_the_fix() {
        let s = TlsSettings {
            mode: SslMode::VerifyFull,
            ..TlsSettings::default()
        };
        let e = s.connector().err().unwrap().to_string();
        assert!(e.contains("sslrootcert"), "{e}");
    }
}
