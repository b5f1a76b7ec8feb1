//! Design notes for users: how each lock kind is laid out on the nodes and why two
//! holders cannot coexist, how fencing tokens are ordered, and when to turn on restart
//! quarantine. Nothing here is code; every promise made here has a test (see the README's
//! guarantees table).

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
