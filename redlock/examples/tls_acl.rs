//! A lock over TLS nodes as an ACL user that has only the rules locking needs.
//!
//! Every setting comes from the environment, as a service would take it:
//!
//! ```text
//! # every node: redis-server --tls-port 6380 --port 0 --tls-cert-file ... --tls-key-file ...
//! #   --tls-ca-cert-file ... --tls-auth-clients no; then, on each, the README's locking line:
//! # ACL SETUSER locker on >password ~app:* resetchannels &redlock:released:app:* +get ...
//! REDLOCK_NODES=rediss://locker:password@10.0.0.1:6380,rediss://locker:password@10.0.0.2:6380,...
//! REDLOCK_TLS_CA=/etc/redlock/ca.pem          # the nodes' private CA (PEM)
//! REDLOCK_KEY_PREFIX=app:                     # what the user's key and channel patterns allow
//! cargo run -p redlock-quorum --features tls-rustls --example tls_acl
//! ```
//!
//! With mutual TLS, `REDLOCK_TLS_CERT` and `REDLOCK_TLS_KEY` add the client's certificate.
//! `redlock-cluster --tls --acl '...'` (in `redlock-testkit`) starts such nodes locally and
//! prints these variables; CI runs this example against them.

use std::time::Duration;

use redlock::{ErrorKind, RedlockBuilder};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // NODES, TLS_CA (and TLS_CERT / TLS_KEY), KEY_PREFIX, TTL, ...: see `from_env`'s table.
    let rl = RedlockBuilder::from_env("REDLOCK_")?.ttl(Duration::from_secs(10)).build()?;

    // Optional: open every node's connection up front (TLS handshake, AUTH as the ACL user,
    // the script preload) and see each node's outcome; a refused certificate or password
    // is named here rather than at the first lock.
    for node in rl.connect().await? {
        println!("{}: {}", node.node(), node.outcome());
    }

    let mut lock = rl.lock("orders:42").await?;
    println!("holding {} (key {}) for {:?}", lock.resource(), lock.key(), lock.validity());

    // Another client of the same user is refused while the lock is held.
    let other = RedlockBuilder::from_env("REDLOCK_")?.build()?;
    match other.try_lock("orders:42").await {
        Err(err) if err.kind() == ErrorKind::NotAcquired => println!("second client: {err}"),
        Err(err) => return Err(err.into()),
        Ok(_) => return Err("two holders at once".into()),
    }

    lock.extend(Duration::from_secs(10)).await?;
    lock.release().await?;
    println!("released");

    other.shutdown(Duration::from_secs(2)).await?;
    rl.shutdown(Duration::from_secs(2)).await?;
    Ok(())
}
