//! Raw RESP over TCP: unlike a redis client, connecting sends nothing, so a
//! test controls exactly which bytes cross a faulty proxy, and when.

use std::{
    io::{self, Read, Write},
    net::TcpStream,
    time::Duration,
};

/// How long a PING may take before it counts as unanswered.
pub const TIMEOUT: Duration = Duration::from_millis(200);

/// A connection to `127.0.0.1:port` with a [`TIMEOUT`] read timeout.
pub fn connect(port: u16) -> io::Result<TcpStream> {
    let stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// `PING`, expecting `+PONG`: an error if the connection ended or timed out.
pub fn ping(stream: &mut TcpStream) -> io::Result<()> {
    stream.write_all(b"PING\r\n")?;
    let mut reply = Vec::new();
    let mut buf = [0; 64];
    while !reply.ends_with(b"\r\n") {
        match stream.read(&mut buf)? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => reply.extend_from_slice(&buf[..n]),
        }
    }
    if reply == b"+PONG\r\n" {
        Ok(())
    } else {
        Err(io::Error::other(format!("unexpected reply {:?}", String::from_utf8_lossy(&reply))))
    }
}

/// Connect then PING.
pub fn connect_and_ping(port: u16) -> io::Result<()> {
    ping(&mut connect(port)?)
}

/// Whether the error is a read timeout (the platform says WouldBlock or TimedOut).
pub fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}
