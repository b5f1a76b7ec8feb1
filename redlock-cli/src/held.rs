//! What `redlock run` holds: a plain lock, or one permit of a counting lock (`--permits`).

use std::time::Duration;

use redlock::{AutoLock, Lease, Lock, Permit, Redlock, Result, Retry};

/// The lock `redlock run` took.
pub(crate) enum Held {
    Lock(Lock),
    Permit(Permit),
}

/// Takes `resource`: a plain lock, or with `permits` one of that many permits; `wait`
/// `None` for a single attempt.
pub(crate) async fn acquire(
    rl: &Redlock,
    resource: &str,
    permits: Option<u32>,
    ttl: Duration,
    fenced: bool,
    wait: Option<Retry>,
) -> Result<Held> {
    macro_rules! with_options {
        ($request:expr) => {{
            let mut request = $request.ttl(ttl);
            if fenced {
                request = request.fenced();
            }
            match wait {
                None => request.once(),
                Some(retry) => request.retry(retry),
            }
        }};
    }
    match permits {
        None => with_options!(rl.lock(resource)).await.map(Held::Lock),
        Some(permits) => with_options!(rl.semaphore(resource, permits)).await.map(Held::Permit),
    }
}

impl Held {
    pub(crate) fn token(&self) -> &str {
        match self {
            Self::Lock(lock) => lock.token(),
            Self::Permit(permit) => permit.token(),
        }
    }

    pub(crate) fn fencing_token(&self) -> Option<u64> {
        match self {
            Self::Lock(lock) => lock.fencing_token(),
            Self::Permit(permit) => permit.fencing_token(),
        }
    }

    /// The permit's slot, for a counting lock.
    pub(crate) fn slot(&self) -> Option<u32> {
        match self {
            Self::Lock(_) => None,
            Self::Permit(permit) => Some(permit.slot()),
        }
    }

    pub(crate) async fn release(self) -> Result<()> {
        match self {
            Self::Lock(lock) => lock.release().await,
            Self::Permit(permit) => permit.release().await,
        }
    }

    pub(crate) fn auto_extend(self) -> AutoHeld {
        match self {
            Self::Lock(lock) => AutoHeld::Lock(lock.auto_extend()),
            Self::Permit(permit) => AutoHeld::Permit(permit.auto_extend()),
        }
    }

    pub(crate) fn auto_extend_capped(self, max_hold: Duration) -> AutoHeld {
        match self {
            Self::Lock(lock) => AutoHeld::Lock(lock.auto_extend_capped(max_hold)),
            Self::Permit(permit) => AutoHeld::Permit(permit.auto_extend_capped(max_hold)),
        }
    }
}

/// [`Held`], kept alive in the background.
pub(crate) enum AutoHeld {
    Lock(AutoLock<Lock>),
    Permit(AutoLock<Permit>),
}

#[allow(dead_code)]
impl AutoHeld {
    pub(crate) fn lease(&self) -> Lease {
        match self {
            Self::Lock(auto) => auto.lease(),
            Self::Permit(auto) => auto.lease(),
        }
    }

    pub(crate) fn validity(&self) -> Duration {
        match self {
            Self::Lock(auto) => auto.validity(),
            Self::Permit(auto) => auto.validity(),
        }
    }

    pub(crate) async fn lost(&self) -> redlock::Error {
        match self {
            Self::Lock(auto) => auto.lost().await,
            Self::Permit(auto) => auto.lost().await,
        }
    }

    pub(crate) async fn release(self) -> Result<()> {
        match self {
            Self::Lock(auto) => auto.release().await,
            Self::Permit(auto) => auto.release().await,
        }
    }

    pub(crate) async fn keep_for(self, hold: Duration) -> Result<()> {
        match self {
            Self::Lock(auto) => auto.keep_for(hold).await,
            Self::Permit(auto) => auto.keep_for(hold).await,
        }
    }
}
