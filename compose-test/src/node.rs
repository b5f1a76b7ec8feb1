//! Plain Redis commands to one master (or to the counter's store), each bounded in time:
//! readiness, the markers that show a crash kept its data, leftover lock keys.

use std::time::{Duration, Instant};

use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;

/// Connect and response timeout of every connection opened here.
const TIMEOUT: Duration = Duration::from_secs(1);

/// A connection to `url` whose every request times out after [`TIMEOUT`].
pub async fn connect(url: &str) -> Result<MultiplexedConnection, String> {
    let client = redis::Client::open(url).map_err(|err| format!("{url}: {err}"))?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(TIMEOUT))
        .set_response_timeout(Some(TIMEOUT));
    // The outer bound also covers what the config does not (the handshake's own steps).
    tokio::time::timeout(TIMEOUT * 2, client.get_multiplexed_async_connection_with_config(&config))
        .await
        .map_err(|_| format!("{url}: no connection within {:?}", TIMEOUT * 2))?
        .map_err(|err| format!("{url}: {err}"))
}

/// Runs one command on a fresh connection to `url`.
pub async fn query<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> Result<T, String> {
    let mut con = connect(url).await?;
    cmd.query_async(&mut con).await.map_err(|err| format!("{url}: {err}"))
}

/// Waits until `url` answers PING with PONG (not LOADING, not refused), for at most `within`.
pub async fn wait_ready(url: &str, within: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    loop {
        let answer = query::<String>(url, &redis::cmd("PING")).await;
        match answer {
            Ok(pong) if pong == "PONG" => return Ok(started.elapsed()),
            _ if started.elapsed() >= within => {
                return Err(format!("{url} not ready after {within:?}: {answer:?}"));
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}
