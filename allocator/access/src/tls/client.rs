//! A router's TLS towards allocators: their certificates verified against a CA file (swapped on
//! reload by [`CurrentServerVerifier`]) and, for mutual TLS, the client certificate the router
//! presents (swapped by [`CurrentIdentity`]).

use std::sync::{Arc, RwLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};

use super::{certified_key, provider, read, replace, PemFile, Reload, TlsError};

/// The files of a router's upstream TLS, from the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTlsSettings {
    /// The CA that signed the allocators' certificates.
    pub ca: PemFile,
    /// The router's own certificate and key, for allocators that require one.
    pub identity: Option<(PemFile, PemFile)>,
}

#[derive(Debug)]
struct CurrentServerVerifier(RwLock<Arc<WebPkiServerVerifier>>);

impl ServerCertVerifier for CurrentServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        read(&self.0).verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        read(&self.0).verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        read(&self.0).verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        read(&self.0).supported_verify_schemes()
    }
}

#[derive(Debug)]
struct CurrentIdentity(RwLock<Arc<CertifiedKey>>);

impl ResolvesClientCert for CurrentIdentity {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(read(&self.0))
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

/// A router's upstream TLS material, reloadable.
#[derive(Debug)]
pub struct ClientTls {
    settings: ClientTlsSettings,
    provider: Arc<CryptoProvider>,
    verifier: Arc<CurrentServerVerifier>,
    identity: Option<Arc<CurrentIdentity>>,
}

impl ClientTls {
    pub fn load(settings: ClientTlsSettings) -> Result<ClientTls, TlsError> {
        let provider = provider();
        let verifier = server_verifier(&settings.ca, &provider)?;
        let identity = match &settings.identity {
            Some((cert, key)) => Some(Arc::new(CurrentIdentity(RwLock::new(certified_key(
                cert, key, &provider,
            )?)))),
            None => None,
        };
        Ok(ClientTls {
            verifier: Arc::new(CurrentServerVerifier(RwLock::new(verifier))),
            identity,
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
        let identity = match &self.settings.identity {
            Some((cert, key)) => Some(certified_key(cert, key, &self.provider)?),
            None => None,
        };
        replace(&self.verifier.0, verifier);
        if let (Some(identity), Some(current)) = (identity, &self.identity) {
            replace(&current.0, identity);
        }
        Ok(())
    }
}
