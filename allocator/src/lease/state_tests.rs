use super::*;
use crate::clock::{Clock, ManualClock};

fn timing() -> LeaseTiming {
    test_timing()
}

#[test]
fn safe_deadline_counts_from_request_send_time() {
    let clock = ManualClock::new();
    let t0 = clock.now();
    // The reply arrives 800 ms later; the deadline must still be measured from t0.
    clock.advance(Duration::from_millis(800));
    let state = LeaseState::on_acquired(&timing(), t0, 7);
    assert_eq!(
        state,
        LeaseState::Active {
            epoch: 7,
            safe_until: t0 + Duration::from_secs(4)
        }
    );
    assert!(matches!(
        state.authority(clock.now()),
        Authority::Granted { epoch: 7, .. }
    ));
    clock.advance(Duration::from_millis(3200)); // t0 + 4.0 s exactly
    assert_eq!(state.authority(clock.now()), Authority::Uncertain);
    assert_eq!(
        state.tick(clock.now()),
        (LeaseState::NotHeld, Some(LossCause::Deadline))
    );
}

#[test]
fn ambiguous_renewal_stops_admission_until_confirmed() {
    let clock = ManualClock::new();
    let t = timing();
    let state = LeaseState::on_acquired(&t, clock.now(), 3);
    clock.advance(Duration::from_millis(1500));
    let state = state.on_renew_failed();
    assert_eq!(state.authority(clock.now()), Authority::Uncertain);
    assert_eq!(
        state.tick(clock.now()).1,
        None,
        "not lost before the deadline"
    );
    // A later renewal that the database confirms restores authority with a new deadline.
    clock.advance(Duration::from_millis(500));
    let t0 = clock.now();
    let state = state.on_renewed(&t, t0, clock.now());
    assert_eq!(
        state.authority(clock.now()),
        Authority::Granted {
            epoch: 3,
            safe_until: t0 + Duration::from_secs(4)
        }
    );
}

#[test]
fn failed_renewals_lose_the_lease_at_the_safe_deadline() {
    let clock = ManualClock::new();
    let t = timing();
    let mut state = LeaseState::on_acquired(&t, clock.now(), 9);
    for _ in 0..2 {
        clock.advance(t.renew_interval);
        state = state.on_renew_failed();
        assert_eq!(state.tick(clock.now()).1, None);
    }
    clock.advance(Duration::from_millis(1000)); // 4.0 s after t0
    assert_eq!(state.tick(clock.now()).1, Some(LossCause::Deadline));
}

/// allocator/README.md's promise: two consecutive renewal attempts can fail or time out and the
/// third still lands before the safe deadline, for the default timings and the shorter ones
/// the tests and the chaos run use.
#[test]
fn two_timed_out_renewals_leave_a_third_attempt_before_the_safe_deadline() {
    let ms = Duration::from_millis;
    for (ttl, margin, interval) in [
        (5000, 1000, 1666), // the defaults
        (2000, 500, 500),   // tests and the chaos run
        (8000, 2000, 2000),
        (1500, 400, 300),
    ] {
        let t = LeaseTiming::new(ms(ttl), ms(margin), ms(interval)).unwrap();
        let clock = ManualClock::new();
        let t0 = clock.now();
        let mut state = LeaseState::on_acquired(&t, t0, 1);
        // The regular renewal after a confirmed one.
        let mut started = t.next_renewal(t0, t0, true);
        for attempt in 1..=2 {
            // Black-holed: given up when its time is up.
            let ended = started + t.renew_attempt_timeout();
            clock.advance(ended.saturating_duration_since(clock.now()));
            assert_eq!(
                state.tick(clock.now()).1,
                None,
                "{ttl}/{margin}/{interval}: lost before attempt {attempt} was given up"
            );
            state = state.on_renew_failed();
            started = t.next_renewal(started, ended, false);
        }
        // The third is answered just inside its own time limit.
        let answered = started + t.renew_attempt_timeout() - ms(1);
        clock.advance(answered.saturating_duration_since(clock.now()));
        assert_eq!(
            state.tick(clock.now()).1,
            None,
            "{ttl}/{margin}/{interval}: lost before the third attempt was answered"
        );
        let state = state.on_renewed(&t, started, clock.now());
        assert!(
            matches!(state.authority(clock.now()), Authority::Granted { .. }),
            "{ttl}/{margin}/{interval}: the third renewal restores authority"
        );
    }
}

#[test]
fn late_confirmation_does_not_revive_a_lapsed_lease() {
    let clock = ManualClock::new();
    let t = timing();
    let state = LeaseState::on_acquired(&t, clock.now(), 4);
    let t0 = clock.now() + Duration::from_millis(1500);
    clock.advance(Duration::from_secs(6));
    assert_eq!(state.on_renewed(&t, t0, clock.now()), LeaseState::NotHeld);
}

#[test]
fn slow_old_renewal_never_shortens_or_extends_past_its_own_t0() {
    let clock = ManualClock::new();
    let t = timing();
    let start = clock.now();
    let state = LeaseState::on_acquired(&t, start, 1);
    clock.advance(Duration::from_millis(1000));
    // A confirmation for a request sent *before* the acquire must not move the deadline back.
    let state = state.on_renewed(&t, start - Duration::from_millis(500), clock.now());
    assert_eq!(
        state.authority(clock.now()),
        Authority::Granted {
            epoch: 1,
            safe_until: start + Duration::from_secs(4)
        }
    );
}

#[test]
fn pause_longer_than_margin_is_detected() {
    let clock = ManualClock::new();
    let mut dog = StallWatchdog::new(
        Duration::from_millis(100),
        Duration::from_secs(1),
        clock.now(),
    );
    clock.advance(Duration::from_millis(100));
    assert_eq!(dog.observe(clock.now()), None);
    clock.advance(Duration::from_millis(1050));
    assert_eq!(dog.observe(clock.now()), None, "within period + margin");
    clock.advance(Duration::from_millis(2500));
    assert_eq!(dog.observe(clock.now()), Some(Duration::from_millis(2500)));
}

#[test]
fn reacquire_is_a_new_state_with_the_new_epoch() {
    let clock = ManualClock::new();
    let t = timing();
    let state = LeaseState::on_acquired(&t, clock.now(), 5);
    clock.advance(Duration::from_secs(10));
    let (state, cause) = state.tick(clock.now());
    assert_eq!(
        (state, cause),
        (LeaseState::NotHeld, Some(LossCause::Deadline))
    );
    let state = LeaseState::on_acquired(&t, clock.now(), 6);
    assert_eq!(state.epoch(), Some(6));
}

#[test]
fn timing_rejects_unsafe_configuration() {
    assert!(LeaseTiming::new(
        Duration::from_secs(1),
        Duration::from_secs(1),
        Duration::from_millis(100)
    )
    .is_err());
    assert!(LeaseTiming::new(
        Duration::from_secs(5),
        Duration::from_secs(1),
        Duration::from_secs(4)
    )
    .is_err());
}
