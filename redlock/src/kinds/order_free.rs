//! The order-free invariant of every kind, on a real `redis-server`: once an undo of a
//! token has run on a node, nothing of that token exists there or can be created there
//! while its tombstone lives, whatever order the token's creates, renewals and undos reach
//! the node in, each any number of times, in time or past their deadline.

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;
    use redis::Value;

    use crate::command::{self, Command};
    use crate::config::{Ttl, config};
    use crate::engine::protocol::{Args, Keep, Op, Protocol};
    use crate::retry::Retry;

    use crate::kinds::multi::{Multi, Set};
    use crate::kinds::plain::Plain;
    use crate::kinds::reentrant::Reentrant;
    use crate::kinds::rwlock::{Intent, Mode, Share};
    use crate::kinds::semaphore::Permits;

    /// One request of the token, as the node may see it.
    #[derive(Clone, Copy, Debug)]
    enum Step {
        /// An acquisition, in time or reaching the node past its deadline.
        Acquire {
            late: bool,
        },
        Extend {
            late: bool,
        },
        Release,
        CleanUp,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            any::<bool>().prop_map(|late| Step::Acquire { late }),
            any::<bool>().prop_map(|late| Step::Extend { late }),
            Just(Step::Release),
            Just(Step::CleanUp),
        ]
    }

    /// The kinds, each a fresh hold on the key `k` (or `k`, `k2`), with what of it a node has.
    fn kinds() -> Vec<(Box<dyn Protocol>, Holding)> {
        let config = config("");
        let permits = Permits::new(&config, "k", 2).unwrap();
        let intent = Intent::new(&config, &Retry::new());
        vec![
            (Box::new(Plain::new("k".into(), None)), Holding::Value(vec!["k".into()])),
            (
                Box::new(Reentrant::new("k".into(), "owner".into(), Some("label"))),
                Holding::Field("k".into()),
            ),
            (Box::new(Share::new("k".into(), Mode::Read, None, None)), Holding::Field("k".into())),
            (
                Box::new(Share::new("k".into(), Mode::Write, Some(intent), None)),
                Holding::Field("k".into()),
            ),
            (
                Box::new(Multi::new(Set::new(&config, &["{k}1", "{k}2"]).unwrap(), None)),
                Holding::Value(vec!["{k}1".into(), "{k}2".into()]),
            ),
            (
                Box::new(permits.hold(1, None)),
                Holding::Value(vec![permits.slot_key(1).to_string()]),
            ),
        ]
    }

    /// Where a hold of the kind shows on a node.
    enum Holding {
        /// Keys whose value is the token.
        Value(Vec<String>),
        /// A hash with a field that contains the token.
        Field(String),
    }

    impl Holding {
        fn present(&self, con: &mut redis::Connection, token: &str) -> bool {
            match self {
                Self::Value(keys) => keys.iter().any(|key| {
                    let value: Option<String> = redis::cmd("GET").arg(key).query(con).unwrap();
                    value.as_deref() == Some(token)
                }),
                Self::Field(key) => {
                    let fields: Vec<String> = redis::cmd("HKEYS").arg(key).query(con).unwrap();
                    fields.iter().any(|field| field.contains(token))
                }
            }
        }
    }

    /// Runs `command` on the node, with `deadline` appended if it is bounded.
    fn run(con: &mut redis::Connection, command: &Command, deadline: u64) -> Value {
        let mut cmd = command.first().clone();
        if command.is_bounded() {
            cmd.arg(deadline);
        }
        cmd.query(con).unwrap_or_else(|err| Value::SimpleString(err.to_string()))
    }

    fn node_ms(con: &mut redis::Connection) -> u64 {
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query(con).unwrap();
        secs * 1000 + micros / 1000
    }

    /// A fresh `redis-server` with every script of the library loaded, and a connection.
    fn node_with_scripts() -> (redlock_testkit::RedisNode, redis::Connection) {
        let node = redlock_testkit::RedisNode::start().unwrap();
        let mut con = node.connection().unwrap();
        for script in command::all_scripts() {
            let _: String = script.load().query(&mut con).unwrap();
        }
        (node, con)
    }

    #[test]
    fn once_undone_on_a_node_a_token_has_nothing_there_whatever_the_order() {
        let (_node, con) = node_with_scripts();
        let con = std::cell::RefCell::new(con);
        let ttl = Ttl::new(Duration::from_secs(10), 0.01).unwrap();
        let keep = Keep::new(Duration::from_secs(10));
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases: 96,
            ..ProptestConfig::default()
        });
        let steps = proptest::collection::vec(step(), 1..12);
        runner
            .run(&(0..6usize, steps), |(kind, steps)| {
                let con = &mut *con.borrow_mut();
                let _: () = redis::cmd("FLUSHALL").query(con).unwrap();
                let (proto, holding) = kinds().swap_remove(kind);
                let token = proto.token().to_owned();
                let mut undone = false;
                for step in &steps {
                    let now = node_ms(con);
                    let (op, deadline) = match *step {
                        Step::Acquire { late } => {
                            (Op::Acquire, if late { now - 1 } else { now + 5_000 })
                        }
                        Step::Extend { late } => {
                            (Op::Extend, if late { now - 1 } else { now + 5_000 })
                        }
                        Step::Release => (Op::Release, 0),
                        Step::CleanUp => (Op::CleanUp, 0),
                    };
                    let command =
                        proto.command(op, &Args { ttl, keep, abandoned: &[], quiet: false });
                    let reply = run(con, &command, deadline);
                    if let Value::SimpleString(err) = &reply {
                        prop_assert!(
                            err.contains("LATE") || err.contains("UNDONE"),
                            "{op:?}: {err}"
                        );
                    }
                    undone |= op.is_undo();
                    if undone {
                        prop_assert!(
                            !holding.present(con, &token),
                            "{} after {steps:?}: the token is on the node again",
                            proto.kind()
                        );
                    }
                }
                Ok(())
            })
            .unwrap();
    }

    #[test]
    fn a_resent_release_answers_what_the_first_send_did() {
        let (_node, mut con) = node_with_scripts();
        let ttl = Ttl::new(Duration::from_secs(10), 0.01).unwrap();
        let keep = Keep::new(Duration::from_secs(10));
        for (proto, _) in kinds() {
            let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
            let far = node_ms(&mut con) + 5_000;
            let args = Args { ttl, keep, abandoned: &[], quiet: false };
            let acquire = proto.command(Op::Acquire, &args);
            let granted = run(&mut con, &acquire, far);
            let reply = |value| crate::engine::protocol::testing::reply(value);
            assert_eq!(proto.answer(Op::Acquire, &reply(granted)).outcome, crate::NodeOutcome::Ok);
            let release = proto.command(Op::Release, &args);
            for send in 0..3 {
                let answer = proto.answer(Op::Release, &reply(run(&mut con, &release, 0)));
                assert_eq!(answer.outcome, crate::NodeOutcome::Ok, "{} send {send}", proto.kind());
            }
            // A hold that was gone before its release: absent, however often it is sent.
            let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
            for send in 0..3 {
                let answer = proto.answer(Op::Release, &reply(run(&mut con, &release, 0)));
                assert_eq!(
                    answer.outcome,
                    crate::NodeOutcome::Absent,
                    "{} send {send}",
                    proto.kind()
                );
            }
        }
    }

    #[test]
    fn a_hold_of_an_abandoned_token_counts_as_free_and_its_release_still_answers_ok() {
        let (_node, mut con) = node_with_scripts();
        let ttl = Ttl::new(Duration::from_secs(10), 0.01).unwrap();
        let config = config("");
        let permits = Permits::new(&config, "k", 2).unwrap();
        let writer =
            || Box::new(Share::new("k".into(), Mode::Write, None, None)) as Box<dyn Protocol>;
        // Pairs of holds of one client that exclude each other on the node.
        let pairs: Vec<(Box<dyn Protocol>, Box<dyn Protocol>)> = vec![
            (Box::new(Plain::new("k".into(), None)), Box::new(Plain::new("k".into(), None))),
            (
                Box::new(Reentrant::new("k".into(), "a".into(), None)),
                Box::new(Reentrant::new("k".into(), "b".into(), None)),
            ),
            (writer(), writer()),
            (Box::new(Share::new("k".into(), Mode::Read, None, None)), writer()),
            (
                Box::new(Multi::new(Set::new(&config, &["{k}1", "{k}2"]).unwrap(), None)),
                Box::new(Multi::new(Set::new(&config, &["{k}2"]).unwrap(), None)),
            ),
            (Box::new(permits.hold(1, None)), Box::new(permits.hold(1, None))),
        ];
        let reply = |value| crate::engine::protocol::testing::reply(value);
        for (first, next) in pairs {
            let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
            let far = node_ms(&mut con) + 5_000;
            let lease = Args::lease(ttl);
            let granted = run(&mut con, &first.command(Op::Acquire, &lease), far);
            assert_eq!(first.answer(Op::Acquire, &reply(granted)).outcome, crate::NodeOutcome::Ok);
            let refused = run(&mut con, &next.command(Op::Acquire, &lease), far);
            let outcome = next.answer(Op::Acquire, &reply(refused)).outcome;
            assert_ne!(outcome, crate::NodeOutcome::Ok, "{} then {}", first.kind(), next.kind());
            // Another token named as abandoned frees nothing.
            let other = [crate::engine::Abandoned {
                token: "0".repeat(40).into(),
                tombstone: "k:undone:{k}:other".into(),
            }];
            let args = Args { ttl, keep: Keep::NONE, abandoned: &other, quiet: false };
            let refused = run(&mut con, &next.command(Op::Acquire, &args), far);
            assert_ne!(next.answer(Op::Acquire, &reply(refused)).outcome, crate::NodeOutcome::Ok);
            let abandoned = [crate::engine::Abandoned {
                token: first.token().into(),
                tombstone: (*first.identity().tombstone).into(),
            }];
            let args = Args { ttl, keep: Keep::NONE, abandoned: &abandoned, quiet: false };
            let taken = run(&mut con, &next.command(Op::Acquire, &args), far);
            let outcome = next.answer(Op::Acquire, &reply(taken)).outcome;
            assert_eq!(outcome, crate::NodeOutcome::Ok, "{} then {}", first.kind(), next.kind());
            // The abandoned hold's release, arriving after its place was taken, says it is
            // done: its tombstone was marked, and the new hold stays.
            let keep = Args {
                ttl,
                keep: Keep::new(Duration::from_secs(10)),
                abandoned: &[],
                quiet: false,
            };
            let released = run(&mut con, &first.command(Op::Release, &keep), 0);
            let outcome = first.answer(Op::Release, &reply(released)).outcome;
            assert_eq!(
                outcome,
                crate::NodeOutcome::Ok,
                "{} released after {}",
                first.kind(),
                next.kind()
            );
            let check = run(&mut con, &next.command(Op::Check, &lease), 0);
            assert_eq!(next.answer(Op::Check, &reply(check)).outcome, crate::NodeOutcome::Ok);
        }
    }
}
