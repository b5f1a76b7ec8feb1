//! The lock kinds. Each file is one kind: its protocol (what to send to one node, what a
//! reply means) and its guard; the engine does the rest.

pub(crate) mod multi;
pub(crate) mod plain;
pub(crate) mod reentrant;
pub(crate) mod rwlock;
pub(crate) mod semaphore;
