//! TLS nodes (`rediss://`, with the `tls-rustls` feature). A binary of its own: its nodes
//! need a `redis-server` built with TLS, which the Valkey and Redis 6.2 runs of CI lack.

#[path = "../common/mod.rs"]
mod common;

mod tls;
