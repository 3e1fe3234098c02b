//! A router's TLS towards allocators: their certificates verified against a CA file (the
//! verifier in force, swapped on reload) and, for mutual TLS, the client certificate the router
//! presents (swapped likewise).

use std::sync::Arc;

use rustls::client::danger::{ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, SignatureScheme};

use super::{certified_key, provider, replace_optional, Current, PemFile, Reload, TlsError};

/// The files of a router's upstream TLS, from the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTlsSettings {
    /// The CA that signed the allocators' certificates.
    pub ca: PemFile,
    /// The router's own certificate and key, for allocators that require one.
    pub identity: Option<(PemFile, PemFile)>,
}

impl ServerCertVerifier for Current<WebPkiServerVerifier> {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.get()
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    delegate_signature_checks!();
}

/// The client certificate in force, presented to every allocator that asks for one.
impl ResolvesClientCert for Current<CertifiedKey> {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

fn server_verifier(
    ca: &PemFile,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, TlsError> {
    WebPkiServerVerifier::builder_with_provider(ca.roots()?, provider.clone())
        .build()
        .map_err(|e| ca.error(e))
}

/// The router's certificate and key, when it has one.
fn identity(
    settings: &ClientTlsSettings,
    provider: &CryptoProvider,
) -> Result<Option<Arc<CertifiedKey>>, TlsError> {
    settings
        .identity
        .as_ref()
        .map(|(cert, key)| certified_key(cert, key, provider))
        .transpose()
}

/// A router's upstream TLS material, reloadable.
#[derive(Debug)]
pub struct ClientTls {
    settings: ClientTlsSettings,
    provider: Arc<CryptoProvider>,
    verifier: Arc<Current<WebPkiServerVerifier>>,
    identity: Option<Arc<Current<CertifiedKey>>>,
}

impl ClientTls {
    pub fn load(settings: ClientTlsSettings) -> Result<ClientTls, TlsError> {
        let provider = provider();
        let verifier = server_verifier(&settings.ca, &provider)?;
        let identity = identity(&settings, &provider)?;
        Ok(ClientTls {
            verifier: Current::new(verifier),
            identity: identity.map(Current::new),
            provider,
            settings,
        })
    }

    /// The configuration to connect with (hand it to reqwest's `tls_backend_preconfigured`);
    /// it keeps reading this material after reloads.
    pub fn client_config(&self) -> Result<ClientConfig, TlsError> {
        let builder = ClientConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| self.settings.ca.error(e))?
            .dangerous()
            .with_custom_certificate_verifier(self.verifier.clone());
        Ok(match &self.identity {
            Some(identity) => builder.with_client_cert_resolver(identity.clone()),
            None => builder.with_no_client_auth(),
        })
    }
}

impl Reload for ClientTls {
    fn what(&self) -> &'static str {
        "upstream TLS"
    }

    fn reload(&self) -> Result<(), TlsError> {
        let verifier = server_verifier(&self.settings.ca, &self.provider)?;
        let identity = identity(&self.settings, &self.provider)?;
        self.verifier.replace(verifier);
        replace_optional(&self.identity, identity);
        Ok(())
    }
}
