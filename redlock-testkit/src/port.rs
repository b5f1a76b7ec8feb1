//! Picking a free loopback port.

use std::net::{Ipv4Addr, TcpListener};

use crate::error::{Error, Result};

/// A port that was free a moment ago. Racy by nature (someone may take it
/// before redis binds it): callers retry when redis reports the address in use.
pub(crate) fn free_port() -> Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| Error::spawn("could not bind a free loopback port", e))?;
    let port =
        listener.local_addr().map_err(|e| Error::spawn("could not read the free port", e))?.port();
    Ok(port)
}
