use std::sync::Mutex;

use proptest::prelude::*;

use super::*;
use crate::conformance;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    }
}

#[test]
fn conformance_for_one_to_five_ranks() {
    for p in 1..=5 {
        for (rank, outcome) in LocalComm::run(p, |c| conformance::run_all(&c))
            .into_iter()
            .enumerate()
        {
            if let Err(e) = outcome {
                panic!("P = {p}, rank {rank}: {e}");
            }
        }
    }
}

#[test]
fn handles_are_send() {
    fn is_send<T: Send>() {}
    is_send::<LocalComm>();
}

/// Random finite floats of mixed magnitude, so association order changes the rounding.
fn mixed_f32() -> impl Strategy<Value = f32> {
    (-1.0f32..1.0, -8i32..8).prop_map(|(m, e)| m * 10f32.powi(e))
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn all_reduce_sum_is_the_serial_rank_order_sum(
        p in 1usize..=5,
        data in prop::collection::vec(prop::collection::vec(mixed_f32(), 0..24), 5),
    ) {
        let len = data.iter().map(Vec::len).min().unwrap_or(0);
        let rows: Vec<&[f32]> = data.iter().take(p).map(|v| &v[..len]).collect();
        let mut serial = vec![0.0f32; len];
        for (i, s) in serial.iter_mut().enumerate() {
            *s = rows[0][i];
            for row in &rows[1..] {
                *s += row[i];
            }
        }
        let results = LocalComm::run(p, |c| {
            let mut buf = rows[c.rank()].to_vec();
            c.all_reduce_sum(&mut buf).map(|()| buf)
        });
        for (rank, r) in results.into_iter().enumerate() {
            let got = r.map_err(|e| TestCaseError::fail(format!("rank {rank}: {e}")))?;
            let got_bits: Vec<u32> = got.iter().map(|x| x.to_bits()).collect();
            let want_bits: Vec<u32> = serial.iter().map(|x| x.to_bits()).collect();
            prop_assert_eq!(got_bits, want_bits, "rank {}", rank);
        }
    }

    #[test]
    fn broadcast_and_all_gather_random_lengths(
        p in 1usize..=5,
        len in 0usize..40,
        root_seed in 0usize..5,
        seed in any::<u64>(),
    ) {
        let root = root_seed % p;
        let value = |r: usize, k: usize| seed.wrapping_mul(r as u64 + 1).wrapping_add(k as u64);
        let results = LocalComm::run(p, |c| -> Result<(Vec<u64>, Vec<u64>), CommError> {
            let me = c.rank();
            let mut buf: Vec<u64> = if me == root {
                (0..len).map(|k| value(root, k)).collect()
            } else {
                vec![0; len]
            };
            c.broadcast(&mut buf, root)?;
            let mine: Vec<u64> = (0..len).map(|k| value(me, k)).collect();
            let gathered = c.all_gather_vec(&mine)?;
            Ok((buf, gathered))
        });
        let want_bcast: Vec<u64> = (0..len).map(|k| value(root, k)).collect();
        let want_gather: Vec<u64> = (0..p).flat_map(|r| (0..len).map(move |k| value(r, k))).collect();
        for r in results {
            let (b, g) = r.map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(&b, &want_bcast);
            prop_assert_eq!(&g, &want_gather);
        }
    }

    #[test]
    fn all_to_all_v_random_counts(
        p in 1usize..=5,
        counts in prop::collection::vec(0usize..6, 25),
    ) {
        let count = |from: usize, to: usize| counts[from * 5 + to];
        let elem = |from: usize, to: usize, k: usize| (from * 1000 + to * 100 + k) as f32;
        let results = LocalComm::run(p, |c| {
            let me = c.rank();
            let send_layout = BlockLayout::packed((0..p).map(|q| count(me, q)).collect::<Vec<_>>());
            let send: Vec<f32> = (0..p)
                .flat_map(|q| (0..count(me, q)).map(move |k| elem(me, q, k)))
                .collect();
            let recv_layout = BlockLayout::packed((0..p).map(|r| count(r, me)).collect::<Vec<_>>());
            let mut recv = vec![-1.0; recv_layout.total()];
            c.all_to_all_v(&send, &send_layout, &mut recv, &recv_layout).map(|()| recv)
        });
        for (me, r) in results.into_iter().enumerate() {
            let got = r.map_err(|e| TestCaseError::fail(e.to_string()))?;
            let want: Vec<f32> = (0..p)
                .flat_map(|from| (0..count(from, me)).map(move |k| elem(from, me, k)))
                .collect();
            prop_assert_eq!(got, want);
        }
    }
}

fn post_sends<'a>(
    ex: &mut LocalExchange<'a, f32>,
    outbox: &'a [Vec<f32>],
    me: usize,
) -> Result<(), CommError> {
    for (q, m) in outbox.iter().enumerate().filter(|(q, _)| *q != me) {
        ex.isend(q, 1, m)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    /// The halo pattern: receives posted, sends posted (in a random order on each rank), local
    /// work, remote blocks consumed as they arrive; random message sizes including empty ones.
    #[test]
    fn halo_exchange_random_sizes(
        p in 1usize..=5,
        lens in prop::collection::vec(0usize..9, 25),
        sends_first in prop::collection::vec(any::<bool>(), 5),
    ) {
        let len = |from: usize, to: usize| lens[from * 5 + to];
        let elem = |from: usize, to: usize, k: usize| (from * 100 + to * 10 + k) as f32;
        let results = LocalComm::run(p, |c| -> Result<Vec<Vec<f32>>, CommError> {
            let me = c.rank();
            let outbox: Vec<Vec<f32>> =
                (0..p).map(|q| (0..len(me, q)).map(|k| elem(me, q, k)).collect()).collect();
            let mut inbox: Vec<Vec<f32>> = (0..p).map(|r| vec![-1.0; len(r, me)]).collect();
            let mut arrived = 0;
            c.exchange(|ex| {
                if sends_first[me] {
                    post_sends(ex, &outbox, me)?;
                }
                for (r, buf) in inbox.iter_mut().enumerate().filter(|(r, _)| *r != me) {
                    ex.irecv(r, 1, buf)?;
                }
                if !sends_first[me] {
                    post_sends(ex, &outbox, me)?;
                }
                while let Some(done) = ex.wait_any()? {
                    if let Completion::Received { .. } = done {
                        arrived += 1;
                    }
                }
                Ok(())
            })?;
            assert_eq!(arrived, p - 1);
            Ok(inbox)
        });
        for (me, r) in results.into_iter().enumerate() {
            let inbox = r.map_err(|e| TestCaseError::fail(e.to_string()))?;
            for (from, got) in inbox.iter().enumerate().filter(|(from, _)| *from != me) {
                let want: Vec<f32> = (0..len(from, me)).map(|k| elem(from, me, k)).collect();
                prop_assert_eq!(got, &want, "from {} to {}", from, me);
            }
        }
    }
}

#[test]
fn mismatched_collectives_give_every_rank_the_same_error() {
    let results = LocalComm::run(3, |c| {
        let mut buf = [1.0f32; 4];
        let root = usize::from(c.rank() == 1);
        c.broadcast(&mut buf, root)
    });
    let first = results[0].clone().expect_err("roots disagree");
    assert!(matches!(first, CommError::Mismatch(_)), "{first}");
    assert!(results.iter().all(|r| r.as_ref().err() == Some(&first)));

    let results = LocalComm::run(3, |c| {
        let mut buf = [1.0f32; 4];
        if c.rank() == 2 {
            c.all_reduce_sum(&mut buf)
        } else {
            c.broadcast(&mut buf, 0)
        }
    });
    let msg = results[1]
        .clone()
        .expect_err("collectives differ")
        .to_string();
    assert!(msg.contains("rank 2 called all_reduce"), "{msg}");

    // The group stays usable after a mismatch that every rank saw.
    let results = LocalComm::run(2, |c| {
        let mut buf = vec![0u64; 1 + c.rank()];
        let first = c.all_reduce_sum(&mut buf);
        (first, c.barrier())
    });
    for (first, then) in results {
        assert!(matches!(first, Err(CommError::Mismatch(_))));
        assert_eq!(then, Ok(()));
    }
}

#[test]
fn all_to_all_v_counts_must_match_between_pairs() {
    let results = LocalComm::run(2, |c| {
        let send_layout = BlockLayout::packed(vec![1, 1]);
        // Rank 1 expects two elements from rank 0, which sends one.
        let recv_layout = BlockLayout::packed(vec![1 + c.rank(), 1]);
        let mut recv = vec![0u8; recv_layout.total()];
        c.all_to_all_v(&[1u8, 2], &send_layout, &mut recv, &recv_layout)
    });
    for r in results {
        let msg = r.expect_err("counts disagree").to_string();
        assert!(
            msg.contains("rank 0 sends 1 elements to rank 1, which expects 2"),
            "{msg}"
        );
    }
}

#[test]
fn a_panicking_rank_fails_the_others_instead_of_hanging() {
    let seen = Mutex::new(Vec::new());
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        LocalComm::run(3, |c| {
            if c.rank() == 1 {
                panic!("rank one gives up");
            }
            let first = c.barrier();
            let later = c.all_reduce_sum(&mut [1.0f64]);
            seen.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((c.rank(), first, later));
        })
    }));
    let payload = outcome.expect_err("the panic propagates out of run");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"rank one gives up"));
    let seen = seen.into_inner().unwrap_or_else(PoisonError::into_inner);
    assert_eq!(seen.len(), 2);
    for (_, first, later) in seen {
        for r in [first, later] {
            assert!(
                matches!(&r, Err(CommError::PeerFailed { rank: 1, reason }) if reason.contains("panicked")),
                "{r:?}"
            );
        }
    }
}

#[test]
fn a_rank_that_returns_early_fails_the_collective() {
    let results = LocalComm::run(3, |c| {
        if c.rank() == 2 {
            return Err(CommError::Mismatch("rank 2 found bad input".into()));
        }
        c.barrier()
    });
    for r in &results[..2] {
        assert!(
            matches!(r, Err(CommError::PeerFailed { rank: 2, .. })),
            "{r:?}"
        );
    }
}

#[test]
fn messages_sent_before_leaving_are_delivered_then_receives_fail() {
    let results = LocalComm::run(2, |c| {
        if c.rank() == 1 {
            return c
                .exchange(|ex| ex.isend(0, 2, &[7.0f32, 8.0]).map(drop))
                .map(|()| Vec::new());
        }
        let mut first = [0.0f32; 2];
        let mut second = [0.0f32; 2];
        let r = c.exchange(|ex| {
            let a = ex.irecv(1, 2, &mut first)?;
            let b = ex.irecv(1, 2, &mut second)?;
            ex.wait(a)?;
            ex.wait(b).map(drop)
        });
        assert!(
            matches!(r, Err(CommError::PeerFailed { rank: 1, .. })),
            "{r:?}"
        );
        Ok(first.to_vec())
    });
    assert_eq!(results[0], Ok(vec![7.0, 8.0]));
}

#[test]
fn receive_length_and_type_must_match() {
    let results = LocalComm::run(2, |c| -> Result<(), CommError> {
        if c.rank() == 0 {
            c.exchange(|ex| ex.isend(1, 0, &[1.0f32, 2.0, 3.0]).map(drop))?;
            c.exchange(|ex| ex.isend(1, 0, &[1u8, 2, 3, 4]).map(drop))?;
            return Ok(());
        }
        let mut four = [0.0f32; 4];
        let e = c.exchange(|ex| ex.irecv(0, 0, &mut four).map(drop));
        assert!(
            matches!(
                e,
                Err(CommError::MessageLength {
                    peer: 0,
                    expected: 4,
                    actual: 3,
                    ..
                })
            ),
            "{e:?}"
        );
        let e = c.exchange(|ex| ex.irecv(0, 0, &mut four).map(drop));
        assert!(
            matches!(
                e,
                Err(CommError::MessageType {
                    expected: ElementKind::F32,
                    actual: ElementKind::U8,
                    ..
                })
            ),
            "{e:?}"
        );
        Ok(())
    });
    assert!(results.iter().all(Result::is_ok), "{results:?}");
}

#[test]
fn test_reports_in_flight_receives_as_none() {
    let results = LocalComm::run(2, |c| {
        let mut buf = [0i32; 2];
        c.exchange(|ex| {
            if c.rank() == 1 {
                let id = ex.irecv(0, 6, &mut buf)?;
                let early = ex.test(id)?.is_none();
                c.barrier()?;
                let done = ex.wait(id)?;
                let ok = matches!(
                    done,
                    Completion::Received {
                        data: &mut [5, 6],
                        ..
                    }
                );
                Ok(early && ok && ex.pending() == 0)
            } else {
                c.barrier()?;
                ex.isend(1, 6, &[5i32, 6])?;
                Ok(true)
            }
        })
    });
    assert_eq!(results, vec![Ok(true), Ok(true)]);
}

#[test]
fn pending_receives_complete_when_the_scope_ends() {
    let results = LocalComm::run(2, |c| {
        let peer = 1 - c.rank();
        let mut got = [0u64; 3];
        let mine = [c.rank() as u64; 3];
        c.exchange(|ex| {
            ex.irecv(peer, 0, &mut got)?;
            ex.isend(peer, 0, &mine).map(drop)
        })
        .map(|()| got)
    });
    assert_eq!(results, vec![Ok([1; 3]), Ok([0; 3])]);
}

#[test]
fn a_refused_thread_is_an_error_and_the_started_ranks_are_released() {
    // Rank 2 of 4 cannot start: ranks 0 and 1 are already in a barrier and must leave it.
    let err = LocalComm::try_run_refusing(4, |comm| comm.barrier(), Some(2)).unwrap_err();
    match &err {
        CommError::Spawn { rank, size, .. } => assert_eq!((*rank, *size), (2, 4)),
        other => panic!("expected Spawn, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("local rank 2 of 4") && text.contains("--local-ranks"),
        "{text}"
    );
    // Refusing rank 0 starts nothing.
    assert!(matches!(
        LocalComm::try_run_refusing(3, |comm| comm.barrier(), Some(0)),
        Err(CommError::Spawn { rank: 0, .. })
    ));
    let all = LocalComm::try_run(3, |comm| comm.barrier()).unwrap();
    assert!(all.iter().all(Result::is_ok));
}
