//! Waiting until a freshly spawned redis-server answers.
//!
//! Raw RESP over TCP rather than the redis client: it is a handful of bytes,
//! and it lets us tell `-LOADING` (AOF still loading: not ready) from `+PONG`.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    time::Duration,
};

/// What one probe found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Probe {
    /// Our process answers PING and has finished loading.
    Ready,
    /// Nothing (yet), still loading, or another process holds the port.
    NotYet,
}

const IO_TIMEOUT: Duration = Duration::from_millis(250);

/// One readiness probe against `port`, expecting the server's pid to be `pid`,
/// so that a different server that grabbed the port is not mistaken for ours.
pub(crate) fn probe(port: u16, pid: u32) -> Probe {
    match try_probe(port, pid) {
        Ok(true) => Probe::Ready,
        _ => Probe::NotYet,
    }
}

fn try_probe(port: u16, pid: u32) -> std::io::Result<bool> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    (&stream).write_all(b"PING\r\nINFO server\r\n")?;
    let mut reader = BufReader::new(&stream);

    let mut line = String::new();
    reader.read_line(&mut line)?;
    if line.trim_end() != "+PONG" {
        // Typically "-LOADING Redis is loading the dataset in memory".
        return Ok(false);
    }

    line.clear();
    reader.read_line(&mut line)?;
    let Some(len) = line.trim_end().strip_prefix('$').and_then(|n| n.parse::<usize>().ok()) else {
        return Ok(false);
    };
    let mut body = vec![0; len + 2];
    reader.read_exact(&mut body)?;
    let body = String::from_utf8_lossy(&body);
    let wanted = format!("process_id:{pid}");
    Ok(body.lines().any(|l| l.trim_end() == wanted))
}
