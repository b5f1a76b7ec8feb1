//! Certificates for TLS nodes, generated once per process.
//!
//! [`Certificates::get`] generates a CA, a server certificate for `127.0.0.1` and
//! `localhost` signed by it, a client certificate signed by it (for mutual TLS), and an
//! unrelated CA with a client certificate of its own (for "wrong CA" tests). The PEM
//! files are written to a temp dir kept for the life of the process, as `redis-server`
//! reads them from files; the dirs of processes that are gone are removed the next time
//! a process generates its own.
//!
//! # Connecting to a TLS node with redis-rs
//! A TLS node's [`url`](crate::RedisNode::url) is `rediss://127.0.0.1:PORT`. The
//! certificate is not from a public CA, so a client must be given the testkit's CA
//! (and, when the node requires one, the client certificate), for example with
//! `redis::Client::build_with_tls(url, certificates.redis_tls())`; no `#insecure` is
//! needed, as the server certificate names `127.0.0.1` and `localhost`. With rustls,
//! a crypto provider must be installed first: [`install_crypto_provider`].
//! [`RedisNode::client`](crate::RedisNode::client) does both.
//!
//! ```no_run
//! use redlock_testkit::{NodeConfig, RedisNode, tls::{Certificates, ClientCerts}};
//!
//! let node = RedisNode::start_with(NodeConfig::new().tls(ClientCerts::Required))?;
//! let certificates = Certificates::get()?;
//! redlock_testkit::tls::install_crypto_provider();
//! let client = redis::Client::build_with_tls(node.url(), certificates.redis_tls())?;
//! let pong: String = redis::cmd("PING").query(&mut client.get_connection()?)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::{
    fmt, fs,
    path::{Path, PathBuf},
    sync::{Mutex, OnceLock, PoisonError},
};

use nix::{errno::Errno, sys::signal, unistd::Pid};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::error::{Error, Result};

/// Whether a TLS node asks clients for a certificate (`--tls-auth-clients`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClientCerts {
    /// `no`: no client certificate is asked for.
    NotAsked,
    /// `optional`: a client may present one (it must then be valid), or none.
    Optional,
    /// `yes`: mutual TLS, a client without a certificate from the CA is refused.
    Required,
}

impl ClientCerts {
    /// The value of `--tls-auth-clients`.
    pub(crate) fn redis_arg(self) -> &'static str {
        match self {
            ClientCerts::NotAsked => "no",
            ClientCerts::Optional => "optional",
            ClientCerts::Required => "yes",
        }
    }
}

/// One PEM file: its contents and where it is written.
#[derive(Clone)]
pub struct PemFile {
    path: PathBuf,
    pem: Vec<u8>,
}

impl PemFile {
    /// Where the file is (kept for the life of the process).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its PEM contents.
    pub fn pem(&self) -> &[u8] {
        &self.pem
    }
}

impl fmt::Debug for PemFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The path says which file; the contents (keys among them) stay out of logs.
        f.debug_struct("PemFile").field("path", &self.path).finish_non_exhaustive()
    }
}

/// The CA, server and client certificates of this process's TLS nodes; see the
/// [module docs](self).
#[derive(Debug)]
pub struct Certificates {
    dir: PathBuf,
    ca: PemFile,
    server_cert: PemFile,
    server_key: PemFile,
    client_cert: PemFile,
    client_key: PemFile,
    unrelated_ca: PemFile,
    unrelated_client_cert: PemFile,
    unrelated_client_key: PemFile,
}

static CERTIFICATES: OnceLock<Certificates> = OnceLock::new();
/// Held while generating, so that two threads never write the one dir at once.
static GENERATING: Mutex<()> = Mutex::new(());

impl Certificates {
    /// This process's certificates, generated and written on the first call.
    ///
    /// # Errors
    /// When generating or writing them fails.
    pub fn get() -> Result<&'static Certificates> {
        if let Some(certificates) = CERTIFICATES.get() {
            return Ok(certificates);
        }
        let _generating = GENERATING.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(certificates) = CERTIFICATES.get() {
            return Ok(certificates);
        }
        let generated = generate()?;
        Ok(CERTIFICATES.get_or_init(|| generated))
    }

    /// The dir the PEM files are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA that signed the server and client certificates: what clients must trust.
    pub fn ca(&self) -> &PemFile {
        &self.ca
    }

    /// The server certificate (for `127.0.0.1` and `localhost`), signed by [`ca`](Self::ca).
    pub fn server_cert(&self) -> &PemFile {
        &self.server_cert
    }

    /// The server certificate's private key.
    pub fn server_key(&self) -> &PemFile {
        &self.server_key
    }

    /// A client certificate signed by [`ca`](Self::ca), for mutual TLS.
    pub fn client_cert(&self) -> &PemFile {
        &self.client_cert
    }

    /// The client certificate's private key.
    pub fn client_key(&self) -> &PemFile {
        &self.client_key
    }

    /// Another CA, unrelated to the nodes': trusting it instead of [`ca`](Self::ca)
    /// must fail the handshake.
    pub fn unrelated_ca(&self) -> &PemFile {
        &self.unrelated_ca
    }

    /// A client certificate signed by [`unrelated_ca`](Self::unrelated_ca): a node that
    /// asks for client certificates must refuse it.
    pub fn unrelated_client_cert(&self) -> &PemFile {
        &self.unrelated_client_cert
    }

    /// The key of [`unrelated_client_cert`](Self::unrelated_client_cert).
    pub fn unrelated_client_key(&self) -> &PemFile {
        &self.unrelated_client_key
    }

    /// What redis-rs needs to connect to a TLS node: [`ca`](Self::ca) as the root, and
    /// the client certificate and key, for `redis::Client::build_with_tls`.
    pub fn redis_tls(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: self.client_cert.pem.clone(),
                client_key: self.client_key.pem.clone(),
            }),
            root_cert: Some(self.ca.pem.clone()),
        }
    }
}

/// Installs rustls's `ring` provider as the process default, which redis-rs's rustls
/// needs before its first TLS connection; does nothing if one is installed already.
pub fn install_crypto_provider() {
    // An error only means that a provider is installed already: that one is used.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

const DIR_PREFIX: &str = "redlock-testkit-tls-";

fn generate() -> Result<Certificates> {
    let base = std::env::temp_dir();
    remove_dirs_of_gone_processes(&base);
    let dir = base.join(format!("{DIR_PREFIX}{}", std::process::id()));
    // A dir with our pid is from a gone process whose pid was reused: start afresh.
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).map_err(|e| Error::spawn("could not create the TLS dir", e))?;

    let (ca, ca_pem) = authority("redlock-testkit CA")?;
    let (server_cert, server_key) = leaf(&ca, Leaf::Server)?;
    let (client_cert, client_key) = leaf(&ca, Leaf::Client)?;
    let (unrelated, unrelated_pem) = authority("redlock-testkit unrelated CA")?;
    let (unrelated_client_cert, unrelated_client_key) = leaf(&unrelated, Leaf::Client)?;

    let write = |name: &str, pem: String| -> Result<PemFile> {
        let path = dir.join(name);
        fs::write(&path, &pem)
            .map_err(|e| Error::spawn(format!("could not write {}", path.display()), e))?;
        Ok(PemFile { path, pem: pem.into_bytes() })
    };
    Ok(Certificates {
        ca: write("ca.pem", ca_pem)?,
        server_cert: write("server.crt", server_cert)?,
        server_key: write("server.key", server_key)?,
        client_cert: write("client.crt", client_cert)?,
        client_key: write("client.key", client_key)?,
        unrelated_ca: write("unrelated-ca.pem", unrelated_pem)?,
        unrelated_client_cert: write("unrelated-client.crt", unrelated_client_cert)?,
        unrelated_client_key: write("unrelated-client.key", unrelated_client_key)?,
        dir,
    })
}

/// A self-signed CA: the issuer, and its certificate's PEM.
fn authority(name: &str) -> Result<(Issuer<'static, KeyPair>, String)> {
    let key = KeyPair::generate().map_err(cert_error)?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(cert_error)?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let cert = params.self_signed(&key).map_err(cert_error)?;
    Ok((Issuer::new(params, key), cert.pem()))
}

#[derive(Clone, Copy)]
enum Leaf {
    Server,
    Client,
}

/// A certificate signed by `issuer`: its PEM and its key's PEM.
fn leaf(issuer: &Issuer<'_, KeyPair>, kind: Leaf) -> Result<(String, String)> {
    let key = KeyPair::generate().map_err(cert_error)?;
    let (names, name, usage) = match kind {
        Leaf::Server => (
            vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
            "redlock-testkit server",
            ExtendedKeyUsagePurpose::ServerAuth,
        ),
        Leaf::Client => (Vec::new(), "redlock-testkit client", ExtendedKeyUsagePurpose::ClientAuth),
    };
    let mut params = CertificateParams::new(names).map_err(cert_error)?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = vec![usage];
    let cert = params.signed_by(&key, issuer).map_err(cert_error)?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn cert_error(e: rcgen::Error) -> Error {
    Error::Certificates(e.to_string())
}

/// Best effort: the dirs of processes that no longer exist (their keys are test keys,
/// but /tmp should not fill up with them).
fn remove_dirs_of_gone_processes(base: &Path) {
    let Ok(entries) = fs::read_dir(base) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(DIR_PREFIX)) else {
            continue;
        };
        let Ok(pid) = pid.parse::<i32>() else { continue };
        if signal::kill(Pid::from_raw(pid), None) == Err(Errno::ESRCH) {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}
