//! Waiting until a freshly spawned redis-server answers.
//!
//! Through redis-rs, as the node's clients connect (TLS, password), so that a node is
//! ready only when a client of the testkit can really use it.

use std::time::Duration;

/// What one probe found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Probe {
    /// Our process answers PING and has finished loading.
    Ready,
    /// Nothing (yet), still loading, or another process holds the port.
    NotYet,
}

const IO_TIMEOUT: Duration = Duration::from_millis(250);

/// One readiness probe with `client`, expecting the server's pid to be `pid`, so
/// that a different server that grabbed the port is not mistaken for ours.
pub(crate) fn probe(client: &redis::Client, pid: u32) -> Probe {
    match try_probe(client) {
        Ok(info) if is_process(&info, pid) => Probe::Ready,
        _ => Probe::NotYet,
    }
}

/// `INFO server` once `PING` answers: PING is refused with `-LOADING` while the
/// AOF loads, INFO is not, so PING comes first.
fn try_probe(client: &redis::Client) -> redis::RedisResult<String> {
    let mut con = client.get_connection_with_timeout(IO_TIMEOUT)?;
    con.set_read_timeout(Some(IO_TIMEOUT))?;
    con.set_write_timeout(Some(IO_TIMEOUT))?;
    redis::cmd("PING").query::<()>(&mut con)?;
    redis::cmd("INFO").arg("server").query(&mut con)
}

/// Whether an `INFO server` reply is that of process `pid`.
fn is_process(info: &str, pid: u32) -> bool {
    let wanted = format!("process_id:{pid}");
    info.lines().any(|line| line.trim_end() == wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pid_must_match_a_whole_line() {
        let info = "# Server\r\nredis_version:7.0.15\r\nprocess_id:1234\r\ntcp_port:7000\r\n";
        assert!(is_process(info, 1234));
        assert!(!is_process(info, 123));
        assert!(!is_process(info, 12345));
    }
}
