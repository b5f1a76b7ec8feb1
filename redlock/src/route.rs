//! Where a hold's requests went out on each node, so that its undos follow them.
//!
//! A node runs the requests of one connection in the order they were queued, and nothing
//! orders two connections. So an undo (a release, a clean-up, a writer's withdrawal) goes
//! out on the connection its hold's last create was queued on, behind it, while that is
//! not answered (an extension sets nothing where the key is gone: it needs no order);
//! and once an undo is issued, no create or extension of the hold is queued any more,
//! wherever its future is polled (a straggler of the acquisition round, an extension in
//! the background, a create left in a runtime that sat idle). Queueing a create and
//! issuing an undo take the same lock, so nothing slips in between.
//!
//! What this cannot order: a create written on a connection that then broke, which the
//! node reads only later. Its undo goes out on another connection and may run first; the
//! create's key then stays until its lease ends, holding a token no other client counts
//! as its own (as a crashed holder's would).

use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Poll;

use crate::node::Handle;

/// One node's route of one hold; `H` is a connection (a plain number in the unit tests).
#[derive(Default)]
enum State<H> {
    /// Nothing of the hold was queued to the node.
    #[default]
    Unsent,
    /// Its last create was queued on this connection; `in_flight` of its creates
    /// are not answered yet (or never will be: dropped unanswered, or lost with their
    /// connection).
    Sent { handle: H, in_flight: u32 },
    /// An undo was issued, to go as this says.
    Undone(Undo<H>),
}

/// A hold's routes, one per node, in one allocation.
pub(crate) struct Routes<H = Handle>(Arc<[Mutex<State<H>>]>);

impl<H> Clone for Routes<H> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

/// Where an undo goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Undo<H = Handle> {
    /// Nothing of the hold was ever queued to the node, and nothing will be: nothing to
    /// undo there.
    Nothing,
    /// Behind the hold's last create, on its connection: it is not answered
    /// yet.
    Behind(H),
    /// Anywhere: everything of the hold queued there was answered, so it ran. The caller's
    /// own connection then serves (a connection driven by a runtime whose workers are all
    /// blocked would hold it back).
    Anywhere,
}

impl<H: Clone> Routes<H> {
    pub(crate) fn new(nodes: usize) -> Self {
        Self((0..nodes).map(|_| Mutex::default()).collect())
    }

    /// Node `node`'s.
    pub(crate) fn get(&self, node: usize) -> Route<H> {
        Route { routes: self.clone(), node }
    }

    /// Issues an undo on every node: from now on no create or extension of the hold is
    /// queued anywhere.
    pub(crate) fn close(&self) {
        for node in 0..self.0.len() {
            self.get(node).undo();
        }
    }
}

/// One node's route of one hold.
pub(crate) struct Route<H = Handle> {
    routes: Routes<H>,
    node: usize,
}

impl<H> Clone for Route<H> {
    fn clone(&self) -> Self {
        Self { routes: self.routes.clone(), node: self.node }
    }
}

impl<H: Clone> Route<H> {
    fn lock(&self) -> Option<MutexGuard<'_, State<H>>> {
        let state = self.routes.0.get(self.node)?;
        Some(state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Issues an undo of the hold on the node (the first call decides where it goes; a
    /// later one, a release after a lost hold's, goes the same way): no create or
    /// extension of the hold is queued there from now on.
    pub(crate) fn undo(&self) -> Undo<H> {
        let Some(mut state) = self.lock() else { return Undo::Anywhere };
        let undo = match std::mem::take(&mut *state) {
            State::Unsent => Undo::Nothing,
            State::Sent { in_flight: 0, .. } => Undo::Anywhere,
            State::Sent { handle, .. } => Undo::Behind(handle),
            State::Undone(undo) => undo,
        };
        *state = State::Undone(undo.clone());
        undo
    }

    /// Whether an undo of the hold was issued on the node.
    pub(crate) fn is_undone(&self) -> bool {
        self.lock().is_none_or(|state| matches!(*state, State::Undone(_)))
    }

    /// Runs `send`, a create on `handle`'s connection, unless an undo of the hold was
    /// issued (`None` then: it was not sent). Its first poll, which queues it on the
    /// connection (or in the connection's first-come queue for room), runs under the
    /// route's lock, and so does the record of where it went; an answer (what `answered`
    /// says is one) is recorded too.
    pub(crate) async fn queue<F>(
        &self,
        handle: &H,
        send: F,
        answered: fn(&F::Output) -> bool,
    ) -> Option<F::Output>
    where
        H: Send + Sync,
        F: Future + Send,
        F::Output: Send,
    {
        self.enqueue(Some(handle), send, answered).await
    }

    /// Runs `send`, an extension, unless an undo of the hold was issued (`None` then), and
    /// records nothing: an extension sets nothing where the key is gone, so whichever of
    /// it and an undo runs first on a node, no key is left (and recorded, one on another
    /// connection would move the undo away from a create not answered yet).
    pub(crate) async fn gate<F>(&self, send: F) -> Option<F::Output>
    where
        H: Send + Sync,
        F: Future + Send,
        F::Output: Send,
    {
        self.enqueue(None, send, |_| false).await
    }

    async fn enqueue<F>(
        &self,
        record: Option<&H>,
        send: F,
        answered: fn(&F::Output) -> bool,
    ) -> Option<F::Output>
    where
        H: Send + Sync,
        F: Future + Send,
        F::Output: Send,
    {
        let mut send = pin!(send);
        let mut queued = false;
        let result = std::future::poll_fn(|cx| {
            if queued {
                return send.as_mut().poll(cx).map(Some);
            }
            let Some(mut state) = self.lock() else { return Poll::Ready(None) };
            let in_flight = match &*state {
                State::Undone(_) => return Poll::Ready(None),
                State::Unsent => 0,
                State::Sent { in_flight, .. } => *in_flight,
            };
            let polled = send.as_mut().poll(cx);
            if let Some(handle) = record {
                *state = State::Sent { handle: handle.clone(), in_flight: in_flight + 1 };
            }
            queued = true;
            polled.map(Some)
        })
        .await?;
        if record.is_some()
            && answered(&result)
            && let Some(mut state) = self.lock()
            && let State::Sent { in_flight, .. } = &mut *state
        {
            *in_flight = in_flight.saturating_sub(1);
        }
        Some(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Answer = Result<u8, ()>;

    #[test]
    fn an_undo_issued_before_anything_was_queued_has_nothing_to_undo() {
        let routes = Routes::<u64>::new(2);
        assert_eq!(routes.get(1).undo(), Undo::Nothing);
    }

    #[tokio::test]
    async fn nothing_is_queued_once_an_undo_was_issued() {
        let routes = Routes::<u64>::new(1);
        routes.close();
        let sent = routes.get(0).queue(&7, async { Answer::Ok(1) }, Result::is_ok).await;
        assert_eq!(sent, None);
    }

    #[tokio::test]
    async fn an_undo_goes_behind_an_unanswered_create_on_its_connection_else_anywhere() {
        let routes = Routes::<u64>::new(2);
        assert_eq!(
            routes.get(0).queue(&7, async { Answer::Ok(1) }, Result::is_ok).await,
            Some(Ok(1))
        );
        // Lost with its connection: it may still run there.
        assert_eq!(
            routes.get(1).queue(&8, async { Answer::Err(()) }, Result::is_ok).await,
            Some(Err(()))
        );
        assert_eq!(routes.get(0).undo(), Undo::Anywhere);
        assert_eq!(routes.get(1).undo(), Undo::Behind(8));
        // A second undo (a release after a lost hold's) goes the same way.
        assert_eq!(routes.get(1).undo(), Undo::Behind(8));
    }

    #[tokio::test]
    async fn an_extension_is_refused_once_undone_and_never_moves_the_undo() {
        let routes = Routes::<u64>::new(1);
        let route = routes.get(0);
        let create = route.queue(&7, std::future::pending::<Answer>(), Result::is_ok);
        assert!(futures::FutureExt::now_or_never(create).is_none());
        // Answered on another connection: the undo still goes behind the create.
        assert_eq!(route.gate(async { Answer::Ok(1) }).await, Some(Ok(1)));
        let lost = route.gate(std::future::pending::<Answer>());
        assert!(futures::FutureExt::now_or_never(lost).is_none());
        assert_eq!(route.undo(), Undo::Behind(7));
        assert_eq!(route.gate(async { Answer::Ok(1) }).await, None);
    }

    #[tokio::test]
    async fn a_create_dropped_before_its_answer_keeps_its_undo_behind_it() {
        let routes = Routes::<u64>::new(1);
        let route = routes.get(0);
        let queued = route.queue(&7, std::future::pending::<Answer>(), Result::is_ok);
        let polled = futures::FutureExt::now_or_never(queued);
        assert!(polled.is_none());
        assert_eq!(routes.get(0).undo(), Undo::Behind(7));
    }
}
