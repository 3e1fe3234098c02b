//! A service's HTTPS listener: its certificate (the one in force, swapped on reload) and, with a
//! client CA, the verifier that requires every caller to present a certificate that CA signed
//! (swapped likewise).

use std::path::PathBuf;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DistinguishedName, ServerConfig};

use super::{certified_key, provider, replace_optional, Current, PemFile, Reload, TlsError};

/// The files of a listener's TLS, from the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsSettings {
    pub cert: PemFile,
    pub key: PemFile,
    /// Require client certificates signed by this CA (mutual TLS).
    pub client_ca: Option<PemFile>,
}

/// The certificate in force, read on every handshake.
impl ResolvesServerCert for Current<CertifiedKey> {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }
}

/// The client verifier in force. It sends no CA names in its certificate request (they would
/// have to outlive a reload); clients present the one certificate they have.
impl ClientCertVerifier for Current<dyn ClientCertVerifier> {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.get()
            .verify_client_cert(end_entity, intermediates, now)
    }

    delegate_signature_checks!();
}

fn client_verifier(
    ca: &PemFile,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    WebPkiClientVerifier::builder_with_provider(ca.roots()?, provider.clone())
        .build()
        .map_err(|e| ca.error(e))
}

/// A listener's TLS material, reloadable.
#[derive(Debug)]
pub struct ServerTls {
    settings: ServerTlsSettings,
    provider: Arc<CryptoProvider>,
    cert: Arc<Current<CertifiedKey>>,
    clients: Option<Arc<Current<dyn ClientCertVerifier>>>,
}

impl ServerTls {
    /// Read the certificate, key and client CA; refuses what does not parse or match.
    pub fn load(settings: ServerTlsSettings) -> Result<ServerTls, TlsError> {
        let provider = provider();
        let cert = certified_key(&settings.cert, &settings.key, &provider)?;
        let clients = match &settings.client_ca {
            Some(ca) => Some(client_verifier(ca, &provider)?),
            None => None,
        };
        Ok(ServerTls {
            cert: Current::new(cert),
            clients: clients.map(Current::new),
            provider,
            settings,
        })
    }

    /// The configuration to serve with; it keeps reading this material after reloads.
    pub fn server_config(&self) -> Result<ServerConfig, TlsError> {
        let builder = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| self.settings.cert.error(e))?;
        let builder = match &self.clients {
            Some(verifier) => builder.with_client_cert_verifier(verifier.clone()),
            None => builder.with_no_client_auth(),
        };
        Ok(builder.with_cert_resolver(self.cert.clone()))
    }

    /// Whether callers must present a client certificate.
    pub fn requires_client_certificates(&self) -> bool {
        self.clients.is_some()
    }

    pub fn files(&self) -> Vec<PathBuf> {
        let mut files = vec![
            self.settings.cert.path.clone(),
            self.settings.key.path.clone(),
        ];
        files.extend(self.settings.client_ca.iter().map(|f| f.path.clone()));
        files
    }
}

impl Reload for ServerTls {
    fn what(&self) -> &'static str {
        "listener TLS"
    }

    fn reload(&self) -> Result<(), TlsError> {
        // Everything is read before anything is swapped: all or nothing.
        let cert = certified_key(&self.settings.cert, &self.settings.key, &self.provider)?;
        let verifier = match (&self.settings.client_ca, &self.clients) {
            (Some(ca), Some(_)) => Some(client_verifier(ca, &self.provider)?),
            _ => None,
        };
        self.cert.replace(cert);
        replace_optional(&self.clients, verifier);
        Ok(())
    }
}
