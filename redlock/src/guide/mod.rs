//! Design notes and setup pages for users: how each lock kind is laid out on the nodes and
//! why two holders cannot coexist, how fencing tokens are ordered, when to turn on restart
//! quarantine, how to configure a client, TLS and ACL users, and what operating one takes
//! (shutdown, metrics, supported servers). Nothing here is code; every promise made here
//! has a test (`TESTING.md` in the repository lists them).

#[doc = include_str!("kinds.md")]
pub mod kinds {}

#[doc = include_str!("fencing.md")]
pub mod fencing {}

#[doc = include_str!("quarantine.md")]
pub mod quarantine {}

#[doc = include_str!("semaphore.md")]
pub mod semaphore {}

#[doc = include_str!("order.md")]
pub mod order {}

#[doc = include_str!("engine.md")]
pub mod engine {}

#[doc = include_str!("configuration.md")]
pub mod configuration {}

#[doc = include_str!("security.md")]
pub mod security {}

#[doc = include_str!("operations.md")]
pub mod operations {}
