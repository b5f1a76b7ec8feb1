//! Why a request to a node did not produce a reply, and what that means for its round:
//! what the connections, the native commands and the refusals' explanations all report.

use std::sync::Arc;

use crate::error::NodeOutcome;

/// Why a request to a node did not produce a reply.
#[derive(Clone, Debug)]
pub(crate) enum Failure {
    /// No connection could be used, or it dropped before the reply.
    Unreachable(Arc<str>),
    /// The node refused the connection: no process listens there, and what it had not
    /// run is gone with it.
    Refused(Arc<str>),
    /// Opening a connection took longer than the connect timeout: like a request that
    /// timed out, the node may be hung with something sent to it before still to run.
    ConnectTimedOut,
    /// The node answered with an error reply.
    Server { code: Arc<str>, message: Arc<str> },
    /// The node refused this client itself: its login, its certificate, or a command its
    /// ACL user may not run. Nothing was run; no retry helps until something is changed.
    Denied(Arc<str>),
}

/// The error replies with which a node says it ran nothing, for now: it is loading its
/// data after a restart (`LOADING`), a script or module command is running past the busy
/// threshold (`BUSY`), or it is a replica cut off from its master (`MASTERDOWN`). Such a
/// node, restarted with the key on disk, keeps it for its lease unless the undo comes again.
const PUT_OFF: [&str; 3] = ["LOADING", "BUSY", "MASTERDOWN"];

/// Whether `message`, a [`Failure::Server`]'s (as [`Failure::outcome`] passes it on: the
/// code first, as a node writes it), is one of [`PUT_OFF`].
pub(crate) fn is_put_off(message: &str) -> bool {
    message.split(' ').next().is_some_and(|code| PUT_OFF.contains(&code))
}

impl Failure {
    pub(crate) fn is_wrong_type(&self) -> bool {
        match self {
            Self::Server { code, message } => {
                &**code == "WRONGTYPE" || message.contains("WRONGTYPE")
            }
            Self::Unreachable(_) | Self::Refused(_) | Self::ConnectTimedOut | Self::Denied(_) => {
                false
            }
        }
    }

    /// A create or extension not sent: an undo of its hold was issued first.
    pub(crate) fn withheld() -> Self {
        let message = "WITHHELD an undo of the hold was issued first: not sent";
        Self::Server { code: "WITHHELD".into(), message: message.into() }
    }

    pub(crate) fn is_noscript(&self) -> bool {
        matches!(self, Self::Server { code, .. } if &**code == "NOSCRIPT")
    }

    /// What the failure means for the round.
    pub(crate) fn outcome(&self) -> NodeOutcome {
        match self {
            _ if self.is_wrong_type() => NodeOutcome::WrongType,
            // The client did not send it: past its time to go out (`LATE`), or behind its
            // undo (`WITHHELD`).
            Self::Server { code, .. } if matches!(&**code, "LATE" | "WITHHELD") => {
                NodeOutcome::TimedOut
            }
            Self::Unreachable(why) | Self::Refused(why) => NodeOutcome::Unreachable(why.clone()),
            Self::ConnectTimedOut => NodeOutcome::TimedOut,
            Self::Denied(why) => NodeOutcome::Denied(why.clone()),
            Self::Server { message, .. } => NodeOutcome::Failed(message.clone()),
        }
    }
}
