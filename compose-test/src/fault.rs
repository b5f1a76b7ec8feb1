//! The container faults, as values: what injecting and healing each one does.

use crate::docker::Container;

/// A fault one container can suffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `docker pause`, healed by `docker unpause`: a frozen master that accepts
    /// connections and answers nothing.
    Pause,
    /// `docker kill`, healed by `docker start`: a crash, and a restart on the same volume.
    Crash,
    /// `docker network disconnect`, healed by `docker network connect`: a partition; the
    /// published port goes away with the network, so new connections are refused and open
    /// ones are closed.
    Disconnect,
}

impl Fault {
    /// How the table names it.
    pub fn label(self) -> &'static str {
        match self {
            Fault::Pause => "docker pause",
            Fault::Crash => "docker kill + start",
            Fault::Disconnect => "network disconnect",
        }
    }

    /// Injects the fault into `container`.
    pub async fn inject(self, container: &Container) -> Result<(), String> {
        match self {
            Fault::Pause => container.pause().await,
            Fault::Crash => container.kill().await,
            Fault::Disconnect => container.disconnect().await,
        }
    }

    /// Undoes it; the master may need a moment before it serves again.
    pub async fn heal(self, container: &Container) -> Result<(), String> {
        match self {
            Fault::Pause => container.unpause().await,
            Fault::Crash => container.start().await,
            Fault::Disconnect => container.connect().await,
        }
    }
}
