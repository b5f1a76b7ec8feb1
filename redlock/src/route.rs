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
//!
//! A route also keeps the hold's extensions that set the lease outright (`SET ... IFEQ
//! ... PX`, where the node refuses scripts) until the node answers them: one may still
//! land after any later extension and set the key to its own lease from then on (from
//! after that extension ran, so after its round began). So each extension notes, as it is
//! queued, the shortest lease among those, and its round counts no longer than that from
//! its start on the node (see [`Route::bound`]). Not even one on the same connection is
//! left out: a connection's requests go out in the order they were queued only while its
//! driver has room for them.

use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Poll;
use std::time::{Duration, Instant};

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

/// One node's route and the hold's unanswered outright extensions there.
struct Entry<H> {
    state: State<H>,
    outright: Outright,
}

impl<H> Default for Entry<H> {
    fn default() -> Self {
        Self { state: State::Unsent, outright: Outright::default() }
    }
}

/// The hold's extensions on one node that set the lease outright and were not answered.
#[derive(Default)]
struct Outright {
    /// The id the next one gets; the extensions queued before an id's have smaller ones.
    next: u64,
    unanswered: smallvec::SmallVec<[Pending; 2]>,
    /// The newest extension round queued here: its start and its bound (see
    /// [`Route::bound`]).
    newest: Option<(Instant, Option<Duration>)>,
}

/// An outright extension not answered.
#[derive(Clone, Copy)]
struct Pending {
    id: u64,
    /// Its lease less its drift allowance: where it lands, the key lives at least that long
    /// from then on.
    lasts: Duration,
}

impl Outright {
    /// Queues an extension of the round that started `at`, registered if it
    /// sets the lease outright for `lasts`: its id (the next one's, if not). `None`
    /// when a newer round was queued here already: sent now, it could land after that
    /// round's requests, which did not count it.
    fn queue(&mut self, at: Instant, lasts: Option<Duration>) -> Option<u64> {
        if self.newest.is_some_and(|(newest, _)| newest > at) {
            return None;
        }
        let bound = self.unanswered.iter().map(|pending| pending.lasts).min();
        self.newest = match self.newest {
            // The same round sent again (a new connection): both count.
            Some((newest, earlier)) if newest == at => Some((at, min_of(earlier, bound))),
            _ => Some((at, bound)),
        };
        let id = self.next;
        self.next += 1;
        if let Some(lasts) = lasts {
            self.unanswered.push(Pending { id, lasts });
        }
        Some(id)
    }

    /// What became of the extension `id`: answered (it ran) or refused unwritten (a closed
    /// connection: it never runs), it bounds nothing any more.
    fn settled(&mut self, id: u64, fate: Fate) {
        if fate != Fate::Unknown {
            self.unanswered.retain(|pending| pending.id != id);
        }
    }
}

/// What became of a request, as far as its node running it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    /// The node answered it: it ran.
    Ran,
    /// It was refused before anything was written: it never runs.
    Unsent,
    /// It may have run, or may still.
    Unknown,
}

fn min_of(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// An extension, as its route sees it: the start of its round and, if it sets the lease
/// outright, its lease less its drift allowance.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Extension {
    pub(crate) at: Instant,
    pub(crate) outright: Option<Duration>,
}

/// A hold's routes, one per node, in one allocation.
pub(crate) struct Routes<H>(Arc<[Mutex<Entry<H>>]>);

impl<H> Clone for Routes<H> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

/// Where an undo goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Undo<H> {
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
pub(crate) struct Route<H> {
    routes: Routes<H>,
    node: usize,
}

impl<H> Clone for Route<H> {
    fn clone(&self) -> Self {
        Self { routes: self.routes.clone(), node: self.node }
    }
}

impl<H: Clone> Route<H> {
    fn lock(&self) -> Option<MutexGuard<'_, Entry<H>>> {
        let state = self.routes.0.get(self.node)?;
        Some(state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Issues an undo of the hold on the node (the first call decides where it goes; a
    /// later one, a release after a lost hold's, goes the same way): no create or
    /// extension of the hold is queued there from now on.
    pub(crate) fn undo(&self) -> Undo<H> {
        let Some(mut entry) = self.lock() else { return Undo::Anywhere };
        let state = &mut entry.state;
        let undo = match std::mem::take(state) {
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
        self.lock().is_none_or(|entry| matches!(entry.state, State::Undone(_)))
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
        self.enqueue(Queue::Create(handle), send, answered).await
    }

    /// Runs `send`, an extension, unless an undo of the hold was issued or a newer round's
    /// extension was queued on the node (`None` then), and records nothing of it for the
    /// undo: an extension sets nothing where the key is gone, so whichever of it and an undo
    /// runs first on a node, no key is left (and recorded, one on another connection would
    /// move the undo away from a create not answered yet). One that sets the lease outright
    /// is kept until `fate` says it ran or never will (see [`Route::bound`]).
    pub(crate) async fn gate<F>(
        &self,
        send: F,
        extension: Extension,
        fate: fn(&F::Output) -> Fate,
    ) -> Option<F::Output>
    where
        H: Send + Sync,
        F: Future + Send,
        F::Output: Send,
    {
        let mut id = None;
        let result = self.enqueue(Queue::Extension(extension, &mut id), send, |_| false).await?;
        if let Some(id) = id
            && let Some(mut entry) = self.lock()
        {
            entry.outright.settled(id, fate(&result));
        }
        Some(result)
    }

    /// The most the extension round that started `at` counts on the node, from its start:
    /// the shortest lease (less its drift allowance) among the hold's outright extensions
    /// not answered when its request was queued there (one may land
    /// after it ran, so after the round began, and set the key to its own lease from then
    /// on); `None` for no bound (or no request of the round queued there).
    pub(crate) fn bound(&self, at: Instant) -> Option<Duration> {
        let entry = self.lock()?;
        entry.outright.newest.filter(|&(newest, _)| newest == at).and_then(|(_, bound)| bound)
    }

    async fn enqueue<F>(
        &self,
        mut queue: Queue<'_, H>,
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
            let Some(mut entry) = self.lock() else { return Poll::Ready(None) };
            let in_flight = match &entry.state {
                State::Undone(_) => return Poll::Ready(None),
                State::Unsent => 0,
                State::Sent { in_flight, .. } => *in_flight,
            };
            match &mut queue {
                Queue::Create(handle) => {
                    let handle = (*handle).clone();
                    entry.state = State::Sent { handle, in_flight: in_flight + 1 };
                }
                Queue::Extension(extension, id) => {
                    let Extension { at, outright } = *extension;
                    match entry.outright.queue(at, outright) {
                        Some(queued) => **id = Some(queued),
                        None => return Poll::Ready(None),
                    }
                }
            }
            queued = true;
            send.as_mut().poll(cx).map(Some)
        })
        .await?;
        if matches!(queue, Queue::Create(_))
            && answered(&result)
            && let Some(mut entry) = self.lock()
            && let State::Sent { in_flight, .. } = &mut entry.state
        {
            *in_flight = in_flight.saturating_sub(1);
        }
        Some(result)
    }
}

/// What queueing a request records on its route.
enum Queue<'a, H> {
    /// A create, on this connection.
    Create(&'a H),
    /// An extension; the id it was queued with.
    Extension(Extension, &'a mut Option<u64>),
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
        let scripted = scripted(crate::clock::now());
        assert_eq!(route.gate(async { Answer::Ok(1) }, scripted, ran).await, Some(Ok(1)));
        let lost = route.gate(std::future::pending::<Answer>(), scripted, ran);
        assert!(futures::FutureExt::now_or_never(lost).is_none());
        assert_eq!(route.undo(), Undo::Behind(7));
        assert_eq!(route.gate(async { Answer::Ok(1) }, scripted, ran).await, None);
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

    /// An extension of the round that started `at`.
    fn scripted(at: Instant) -> Extension {
        Extension { at, outright: None }
    }

    fn outright(at: Instant, lasts: Duration) -> Extension {
        Extension { at, outright: Some(lasts) }
    }

    fn ran(answer: &Answer) -> Fate {
        if answer.is_ok() { Fate::Ran } else { Fate::Unknown }
    }

    #[tokio::test]
    async fn an_unanswered_outright_extension_bounds_later_rounds_until_it_answers() {
        let route = Routes::<u64>::new(1).get(0);
        let t0 = crate::clock::now();
        let (t1, t2, t3) = (t0 + ms(1), t0 + ms(2), t0 + ms(3));
        // Sent at t0 for 5 s; its reply is lost.
        let lost = route.gate(async { Answer::Err(()) }, outright(t0, ms(5_000)), ran);
        assert_eq!(lost.await, Some(Err(())));
        // A longer extension at t1, scripted or not: bounded by it, from t1; and so are the
        // later ones, answered or not (a connection's requests may go out out of order).
        let longer = route.gate(async { Answer::Ok(1) }, scripted(t1), ran);
        assert_eq!(longer.await, Some(Ok(1)));
        assert_eq!(route.bound(t1), Some(ms(5_000)));
        route.gate(async { Answer::Ok(1) }, scripted(t2), ran).await;
        assert_eq!(route.bound(t2), Some(ms(5_000)));
        // Only the newest round's bound is read.
        assert_eq!(route.bound(t3), None);
        // One answered bounds nothing later.
        let route = Routes::<u64>::new(1).get(0);
        let answered = route.gate(async { Answer::Ok(1) }, outright(t0, ms(5_000)), ran);
        assert_eq!(answered.await, Some(Ok(1)));
        route.gate(async { Answer::Ok(1) }, scripted(t1), ran).await;
        assert_eq!(route.bound(t1), None);
        // Nor one refused unwritten (its connection was closed): it never runs.
        let route = Routes::<u64>::new(1).get(0);
        let unsent = |_: &Answer| Fate::Unsent;
        route.gate(async { Answer::Err(()) }, outright(t0, ms(800)), unsent).await;
        route.gate(async { Answer::Ok(1) }, scripted(t1), ran).await;
        assert_eq!(route.bound(t1), None);
    }

    #[tokio::test]
    async fn an_extension_of_an_earlier_round_is_not_sent_after_a_newer_rounds() {
        let route = Routes::<u64>::new(1).get(0);
        let t0 = crate::clock::now();
        let (t1, t2) = (t0 + ms(1), t0 + ms(2));
        let held = route.gate(std::future::pending::<Answer>(), outright(t0, ms(900)), ran);
        assert!(futures::FutureExt::now_or_never(held).is_none());
        route.gate(async { Answer::Ok(1) }, scripted(t2), ran).await;
        assert_eq!(route.bound(t2), Some(ms(900)));
        // Round t1's request, to be queued only now (its connect was slow): not sent, since
        // round t2 did not count it.
        let late = route.gate(async { Answer::Ok(1) }, outright(t1, ms(50)), ran);
        assert_eq!(late.await, None);
        assert_eq!(route.bound(t2), Some(ms(900)));
        // The same round sent again on a new connection: the shortest of both.
        let again = route.gate(async { Answer::Err(()) }, outright(t2, ms(800)), ran);
        assert!(again.await.is_some());
        route.gate(async { Answer::Ok(1) }, scripted(t2), ran).await;
        assert_eq!(route.bound(t2), Some(ms(800)));
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }
}
