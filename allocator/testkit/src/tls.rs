//! Certificates for tests, generated with `rcgen`: a CA, a server certificate it signed (for
//! `localhost` and `127.0.0.1`), a client certificate it signed, and a second CA that signed
//! nothing the services trust, all written as PEM files into a private directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};

/// The files of one test PKI; removed when dropped.
pub struct TestPki {
    dir: tempfile::TempDir,
    ca: CertifiedIssuer<'static, KeyPair>,
    /// The CA's certificate.
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// The server certificate as first written (DER), to tell it from a renewed one.
    pub server_der: Vec<u8>,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A certificate and key for `localhost` signed by another CA.
    pub stranger_cert: PathBuf,
    pub stranger_key: PathBuf,
}

fn issuer(name: &str) -> anyhow::Result<CertifiedIssuer<'static, KeyPair>> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    Ok(CertifiedIssuer::self_signed(params, KeyPair::generate()?)?)
}

fn leaf(
    ca: &CertifiedIssuer<'static, KeyPair>,
    names: &[&str],
    usage: ExtendedKeyUsagePurpose,
    cert: &Path,
    key: &Path,
) -> anyhow::Result<Vec<u8>> {
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
    params.distinguished_name.push(DnType::CommonName, names[0]);
    params.extended_key_usages = vec![usage];
    let pair = KeyPair::generate()?;
    let signed = params.signed_by(&pair, ca)?;
    std::fs::write(cert, signed.pem())?;
    std::fs::write(key, pair.serialize_pem())?;
    Ok(signed.der().to_vec())
}

impl TestPki {
    pub fn generate() -> anyhow::Result<TestPki> {
        let dir = tempfile::tempdir()?;
        let path = |name: &str| dir.path().join(name);
        let ca = issuer("allocator test CA")?;
        let mut pki = TestPki {
            server_der: Vec::new(),
            ca_cert: path("ca.pem"),
            server_cert: path("server.pem"),
            server_key: path("server-key.pem"),
            client_cert: path("client.pem"),
            client_key: path("client-key.pem"),
            stranger_cert: path("stranger.pem"),
            stranger_key: path("stranger-key.pem"),
            ca,
            dir,
        };
        std::fs::write(&pki.ca_cert, pki.ca.pem())?;
        pki.server_der = pki.renew_server()?;
        leaf(
            &pki.ca,
            &["router-1"],
            ExtendedKeyUsagePurpose::ClientAuth,
            &pki.client_cert,
            &pki.client_key,
        )?;
        // The stranger is a client and a server alike.
        let stranger = issuer("some other CA")?;
        leaf(
            &stranger,
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::Any,
            &pki.stranger_cert,
            &pki.stranger_key,
        )?;
        Ok(pki)
    }

    /// Write a new server certificate and key (same names, same CA), as a rotation would;
    /// returns the new certificate (DER).
    pub fn renew_server(&self) -> anyhow::Result<Vec<u8>> {
        leaf(
            &self.ca,
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
            &self.server_cert,
            &self.server_key,
        )
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA certificate as PEM text.
    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }
}
