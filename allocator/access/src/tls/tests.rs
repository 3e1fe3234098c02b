//! Handshakes in memory between the configurations built here, with certificates from
//! [`testkit::TestPki`]: mutual TLS accepted and refused, and reloads.

use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, ServerConfig, ServerConnection};
use testkit::TestPki;

use super::*;

const CERT: &str = "--tls-cert (T_CERT)";
const KEY: &str = "--tls-key (T_KEY)";
const CA: &str = "--tls-client-ca (T_CA)";

fn server(pki: &TestPki, client_ca: bool) -> ServerTls {
    ServerTls::load(ServerTlsSettings {
        cert: PemFile::new(CERT, &pki.server_cert),
        key: PemFile::new(KEY, &pki.server_key),
        client_ca: client_ca.then(|| PemFile::new(CA, &pki.ca_cert)),
    })
    .unwrap()
}

fn client(ca: &Path, identity: Option<(&Path, &Path)>) -> ClientTls {
    ClientTls::load(ClientTlsSettings {
        ca: PemFile::new("--upstream-ca", ca),
        identity: identity.map(|(cert, key)| {
            (
                PemFile::new("--upstream-client-cert", cert),
                PemFile::new("--upstream-client-key", key),
            )
        }),
    })
    .unwrap()
}

/// Run a handshake to completion; the server's certificate as the client saw it.
fn handshake(client: ClientConfig, server: ServerConfig) -> Result<Vec<u8>, rustls::Error> {
    let name = ServerName::try_from("localhost").unwrap();
    let mut client = ClientConnection::new(Arc::new(client), name)?;
    let mut server = ServerConnection::new(Arc::new(server))?;
    for _ in 0..20 {
        let mut buffer = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut buffer).unwrap();
        }
        let mut slice = &buffer[..];
        while !slice.is_empty() {
            server.read_tls(&mut slice).unwrap();
        }
        server.process_new_packets()?;
        let mut buffer = Vec::new();
        while server.wants_write() {
            server.write_tls(&mut buffer).unwrap();
        }
        let mut slice = &buffer[..];
        while !slice.is_empty() {
            client.read_tls(&mut slice).unwrap();
        }
        client.process_new_packets()?;
        if !client.is_handshaking() && !server.is_handshaking() {
            let peer = client.peer_certificates().expect("server certificate");
            return Ok(peer[0].to_vec());
        }
    }
    panic!("handshake did not finish");
}

fn der(pem: &Path) -> Vec<u8> {
    PemFile::new("f", pem).certificates().unwrap()[0].to_vec()
}

#[test]
fn mutual_tls_accepts_the_ca_s_clients_only() {
    let pki = TestPki::generate().unwrap();
    let listener = server(&pki, true);
    assert!(listener.requires_client_certificates());
    let config = || listener.server_config().unwrap();
    let identity = Some((pki.client_cert.as_path(), pki.client_key.as_path()));
    let router = client(&pki.ca_cert, identity);
    let seen = handshake(router.client_config().unwrap(), config()).unwrap();
    assert_eq!(seen, der(&pki.server_cert));
    // No client certificate, or one another CA signed: refused.
    let anonymous = client(&pki.ca_cert, None);
    assert!(handshake(anonymous.client_config().unwrap(), config()).is_err());
    let stranger = client(
        &pki.ca_cert,
        Some((pki.stranger_cert.as_path(), pki.stranger_key.as_path())),
    );
    assert!(handshake(stranger.client_config().unwrap(), config()).is_err());
    // Without a client CA the listener asks for nothing.
    let open = server(&pki, false);
    handshake(
        anonymous.client_config().unwrap(),
        open.server_config().unwrap(),
    )
    .unwrap();
}

#[test]
fn a_client_refuses_a_server_its_ca_did_not_sign() {
    let pki = TestPki::generate().unwrap();
    let listener = ServerTls::load(ServerTlsSettings {
        cert: PemFile::new(CERT, &pki.stranger_cert),
        key: PemFile::new(KEY, &pki.stranger_key),
        client_ca: None,
    })
    .unwrap();
    let router = client(&pki.ca_cert, None);
    let error = handshake(
        router.client_config().unwrap(),
        listener.server_config().unwrap(),
    )
    .unwrap_err();
    assert!(
        matches!(error, rustls::Error::InvalidCertificate(_)),
        "{error}"
    );
}

#[test]
fn reload_swaps_the_certificate_and_keeps_it_when_the_new_one_is_broken() {
    let pki = TestPki::generate().unwrap();
    let listener = server(&pki, true);
    let identity = Some((pki.client_cert.as_path(), pki.client_key.as_path()));
    let router = client(&pki.ca_cert, identity);
    // The listener's configuration, built before the reload, serves the new material. (Each
    // handshake gets a client configuration of its own: a shared one would resume the first
    // session, and a resumed session shows no certificate again.)
    let server_config = listener.server_config().unwrap();
    let fresh = || router.client_config().unwrap();
    let first = der(&pki.server_cert);
    pki.renew_server().unwrap();
    let second = der(&pki.server_cert);
    assert_ne!(first, second);
    assert_eq!(
        handshake(fresh(), server_config.clone()).unwrap(),
        first,
        "nothing changes before the reload"
    );
    listener.reload().unwrap();
    router.reload().unwrap();
    assert_eq!(handshake(fresh(), server_config.clone()).unwrap(), second);
    // A key that does not match the certificate, or a file that is not PEM: refused, kept.
    std::fs::copy(&pki.client_key, &pki.server_key).unwrap();
    let error = listener.reload().unwrap_err().to_string();
    assert!(
        error.starts_with(KEY) && error.contains("does not match"),
        "{error}"
    );
    std::fs::write(&pki.server_cert, "not a certificate\n").unwrap();
    let error = listener.reload().unwrap_err().to_string();
    assert!(error.starts_with(CERT), "{error}");
    assert_eq!(handshake(fresh(), server_config).unwrap(), second);
}

#[test]
fn loading_names_the_flag_and_file() {
    let pki = TestPki::generate().unwrap();
    let missing = ServerTls::load(ServerTlsSettings {
        cert: PemFile::new(CERT, pki.dir().join("absent.pem")),
        key: PemFile::new(KEY, &pki.server_key),
        client_ca: None,
    })
    .unwrap_err()
    .to_string();
    assert!(
        missing.starts_with(CERT) && missing.contains("absent.pem"),
        "{missing}"
    );
    // A key file in the place of a CA file holds no certificate.
    let error = ClientTls::load(ClientTlsSettings {
        ca: PemFile::new("--upstream-ca (U)", &pki.client_key),
        identity: None,
    })
    .unwrap_err()
    .to_string();
    assert!(error.starts_with("--upstream-ca (U)"), "{error}");
    assert_eq!(
        both_or_neither(("--a", Some(Path::new("x"))), ("--b", None)),
        Err("--a needs --b".into())
    );
    assert!(both_or_neither(("--a", None), ("--b", None)).is_ok());
}

#[test]
fn flags_come_in_working_sets() {
    let some = |p: &str| Some(PathBuf::from(p));
    let listener =
        |cert, key, ca| listener_settings(("--cert", cert), ("--key", key), ("--ca", ca));
    assert_eq!(listener(None, None, None), Ok(None));
    assert_eq!(
        listener(some("c"), None, None),
        Err("--cert needs --key".into())
    );
    assert_eq!(
        listener(None, some("k"), None),
        Err("--key needs --cert".into())
    );
    assert_eq!(
        listener(None, None, some("a")),
        Err("--ca needs --cert".into())
    );
    let full = listener(some("c"), some("k"), some("a")).unwrap().unwrap();
    assert_eq!(full.client_ca.unwrap().flag, "--ca");
    let upstream =
        |ca, cert, key| upstream_settings(("--ca", ca), ("--cert", cert), ("--key", key));
    assert_eq!(upstream(None, None, None), Ok(None));
    assert_eq!(
        upstream(None, some("c"), some("k")),
        Err("--cert needs --ca".into())
    );
    assert_eq!(
        upstream(some("a"), some("c"), None),
        Err("--cert needs --key".into())
    );
    assert!(upstream(some("a"), None, None)
        .unwrap()
        .unwrap()
        .identity
        .is_none());
    assert!(upstream(some("a"), some("c"), some("k"))
        .unwrap()
        .unwrap()
        .identity
        .is_some());
}
