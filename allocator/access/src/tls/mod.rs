//! TLS for both services, with rustls: a service's own HTTPS listener ([`ServerTls`], optionally
//! requiring client certificates signed by a CA) and a router's connections to allocators
//! ([`ClientTls`]: allocators verified against a CA file, optionally presenting a client
//! certificate for mutual TLS).
//!
//! Certificates, keys and CA files are PEM files, re-read on SIGHUP with the auth file
//! ([`crate::reload`]): the listener and the client keep their configuration and only the
//! material behind it is swapped, through a certificate resolver and a verifier that read the
//! current material on every handshake. A file that cannot be read or does not parse is refused
//! at start with the flag that named it; on reload it is logged and counted, and the material in
//! force stays (a half-copied certificate must not take a service off the network).
//!
//! Without certificate flags nothing here is built and the services speak plain HTTP, as the
//! local demo does. The crypto provider is rustls' default (aws-lc-rs), the one reqwest builds
//! with; no OpenSSL is linked.

/// The signature checks that rustls' server-side and client-side verifier traits both declare,
/// delegated to the verifier in force (a [`Current`] one): written once for both traits.
macro_rules! delegate_signature_checks {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &rustls::pki_types::CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            self.get().verify_tls12_signature(message, cert, dss)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &rustls::pki_types::CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            self.get().verify_tls13_signature(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.get().supported_verify_schemes()
        }
    };
}

mod client;
mod server;

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;

pub use client::{ClientTls, ClientTlsSettings};
pub use server::{ServerTls, ServerTlsSettings};

/// Why TLS material was refused; the message names the flag and file.
#[derive(Debug, thiserror::Error)]
#[error("{flag}: {path}: {reason}")]
pub struct TlsError {
    pub flag: &'static str,
    pub path: String,
    pub reason: String,
}

/// A PEM file and the flag (with its environment variable) that named it, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PemFile {
    pub flag: &'static str,
    pub path: PathBuf,
}

impl PemFile {
    pub fn new(flag: &'static str, path: impl Into<PathBuf>) -> PemFile {
        PemFile {
            flag,
            path: path.into(),
        }
    }

    fn error(&self, reason: impl std::fmt::Display) -> TlsError {
        TlsError {
            flag: self.flag,
            path: self.path.display().to_string(),
            reason: reason.to_string(),
        }
    }

    /// Every certificate in the file, in order (a chain starts with the leaf).
    fn certificates(&self) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        let certs = CertificateDer::pem_file_iter(&self.path)
            .map_err(|e| self.error(e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.error(e))?;
        if certs.is_empty() {
            return Err(self.error("holds no PEM certificate"));
        }
        Ok(certs)
    }

    fn private_key(&self) -> Result<PrivateKeyDer<'static>, TlsError> {
        PrivateKeyDer::from_pem_file(&self.path).map_err(|e| self.error(e))
    }

    /// The certificates of a CA file as trust anchors.
    fn roots(&self) -> Result<Arc<RootCertStore>, TlsError> {
        let mut roots = RootCertStore::empty();
        for cert in self.certificates()? {
            roots.add(cert).map_err(|e| self.error(e))?;
        }
        Ok(Arc::new(roots))
    }
}

/// The provider every configuration here is built with.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A certificate chain and its private key, checked to belong together.
fn certified_key(
    cert: &PemFile,
    key: &PemFile,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = cert.certificates()?;
    let private = key.private_key()?;
    let certified = CertifiedKey::from_der(chain, private, provider).map_err(|e| {
        key.error(format!(
            "does not match the certificate {} ({e})",
            cert.path.display()
        ))
    })?;
    Ok(Arc::new(certified))
}

/// Material in force behind a configuration that outlives reloads (a certificate, a verifier):
/// read on every handshake, swapped whole on reload. A poisoned lock still holds whole material,
/// since it is only ever swapped, so it is used as it is.
#[derive(Debug)]
struct Current<T: ?Sized>(RwLock<Arc<T>>);

impl<T: ?Sized> Current<T> {
    fn new(material: Arc<T>) -> Arc<Current<T>> {
        Arc::new(Current(RwLock::new(material)))
    }

    /// The material in force.
    fn get(&self) -> Arc<T> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn replace(&self, material: Arc<T>) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = material;
    }
}

/// Swap in the material a reload read, where the configuration has a place for it (material a
/// service started without is not added by a reload).
fn replace_optional<T: ?Sized>(current: &Option<Arc<Current<T>>>, material: Option<Arc<T>>) {
    if let (Some(current), Some(material)) = (current, material) {
        current.replace(material);
    }
}

/// A path flag as given on the command line: its name (with the environment variable) and value.
pub type PathFlag = (&'static str, Option<PathBuf>);

/// Whether both or neither of two optional paths are set (a certificate without its key).
pub fn both_or_neither(a: (&str, Option<&Path>), b: (&str, Option<&Path>)) -> Result<(), String> {
    match (a.1, b.1) {
        (Some(_), None) => Err(format!("{} needs {}", a.0, b.0)),
        (None, Some(_)) => Err(format!("{} needs {}", b.0, a.0)),
        _ => Ok(()),
    }
}

/// A listener's TLS settings from its flags: none without a certificate; a certificate needs
/// its key and the other way round; a client CA needs a certificate (mutual TLS is TLS first).
pub fn listener_settings(
    cert: PathFlag,
    key: PathFlag,
    client_ca: PathFlag,
) -> Result<Option<ServerTlsSettings>, String> {
    both_or_neither((cert.0, cert.1.as_deref()), (key.0, key.1.as_deref()))?;
    both_or_neither(
        (client_ca.0, client_ca.1.as_deref()),
        (cert.0, cert.1.as_deref()),
    )
    .or_else(|e| {
        if client_ca.1.is_none() {
            Ok(())
        } else {
            Err(e)
        }
    })?;
    let (Some(cert_path), Some(key_path)) = (cert.1, key.1) else {
        return Ok(None);
    };
    Ok(Some(ServerTlsSettings {
        cert: PemFile::new(cert.0, cert_path),
        key: PemFile::new(key.0, key_path),
        client_ca: client_ca.1.map(|path| PemFile::new(client_ca.0, path)),
    }))
}

/// A router's upstream TLS settings from its flags: none without a CA file (allocators served
/// over HTTPS are then verified against the system's roots); a client certificate needs its key
/// and a CA file.
pub fn upstream_settings(
    ca: PathFlag,
    cert: PathFlag,
    key: PathFlag,
) -> Result<Option<ClientTlsSettings>, String> {
    both_or_neither((cert.0, cert.1.as_deref()), (key.0, key.1.as_deref()))?;
    let Some(ca_path) = ca.1 else {
        return match cert.1 {
            Some(_) => Err(format!("{} needs {}", cert.0, ca.0)),
            None => Ok(None),
        };
    };
    Ok(Some(ClientTlsSettings {
        ca: PemFile::new(ca.0, ca_path),
        identity: cert
            .1
            .zip(key.1)
            .map(|(c, k)| (PemFile::new(cert.0, c), PemFile::new(key.0, k))),
    }))
}

/// Material that SIGHUP re-reads ([`crate::spawn_sighup_reloader`]).
pub trait Reload: Send + Sync {
    /// What it is, for logs (`listener certificate`, `upstream TLS`).
    fn what(&self) -> &'static str;
    /// Re-read; on error the material in force stays.
    fn reload(&self) -> Result<(), TlsError>;
}

#[cfg(test)]
mod tests;
