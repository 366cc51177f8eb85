use super::*;

const SECOND: Duration = Duration::from_secs(1);

fn periods(sync: u64, min: u64) -> SyncPeriods {
    SyncPeriods::new(Duration::from_secs(sync), Duration::from_secs(min)).expect("valid periods")
}

#[test]
fn defaults_are_kube_proxys() {
    let periods = SyncPeriods::default();
    assert_eq!(periods.sync_period(), Duration::from_secs(30));
    assert_eq!(periods.min_sync_period(), SECOND);
    assert_eq!(periods.health_timeout(), Duration::from_secs(60));
}

#[test]
fn health_timeout_is_twice_the_sync_period() {
    assert_eq!(periods(45, 1).health_timeout(), Duration::from_secs(90));
}

#[test]
fn a_zero_sync_period_is_refused() {
    assert_eq!(
        SyncPeriods::new(Duration::ZERO, Duration::ZERO),
        Err(InvalidPeriods::ZeroSyncPeriod)
    );
}

#[test]
fn a_min_sync_period_above_the_sync_period_is_refused_and_equal_is_taken() {
    assert_eq!(
        SyncPeriods::new(Duration::from_secs(10), Duration::from_secs(11)),
        Err(InvalidPeriods::MinAboveSync {
            sync: Duration::from_secs(10),
            min: Duration::from_secs(11)
        })
    );
    assert!(SyncPeriods::new(Duration::from_secs(10), Duration::from_secs(10)).is_ok());
    assert!(SyncPeriods::new(Duration::from_secs(10), Duration::ZERO).is_ok());
}

#[test]
fn the_first_sync_may_start_at_once_and_no_resync_is_due_before_it() {
    let timer = SyncTimer::new(periods(30, 1));
    assert_eq!(timer.next_sync_allowed(), None);
    assert_eq!(timer.resync_due(), None);
}

#[test]
fn the_next_sync_waits_one_min_sync_period_from_the_last_start() {
    let mut timer = SyncTimer::new(periods(30, 1));
    let started = Instant::now();
    let finished = started + Duration::from_millis(300);
    timer.succeeded(started, finished);
    assert_eq!(timer.next_sync_allowed(), Some(started + SECOND));
}

#[test]
fn a_resync_is_due_one_sync_period_after_a_successful_sync() {
    let mut timer = SyncTimer::new(periods(30, 1));
    let started = Instant::now();
    let finished = started + Duration::from_millis(300);
    timer.succeeded(started, finished);
    assert_eq!(timer.resync_due(), Some(finished + Duration::from_secs(30)));

    // A later sync (a new revision) pushes the resync back.
    let again = started + Duration::from_secs(10);
    timer.succeeded(again, again);
    assert_eq!(timer.resync_due(), Some(again + Duration::from_secs(30)));
}

#[test]
fn a_failed_sync_is_retried_after_min_sync_period() {
    let mut timer = SyncTimer::new(periods(30, 2));
    let started = Instant::now();
    let finished = started + Duration::from_millis(100);
    timer.failed(started, finished);
    assert_eq!(timer.resync_due(), Some(finished + Duration::from_secs(2)));
    assert_eq!(
        timer.next_sync_allowed(),
        Some(started + Duration::from_secs(2))
    );
}

#[test]
fn failures_in_a_row_back_off_to_the_sync_period_and_a_success_starts_over() {
    let mut timer = SyncTimer::new(periods(30, 2));
    let now = Instant::now();
    let mut delays = Vec::new();
    for _ in 0..6 {
        timer.failed(now, now);
        delays.push(timer.resync_due().map(|due| (due - now).as_secs()));
    }
    assert_eq!(delays, [2, 4, 8, 16, 30, 30].map(Some));
    timer.succeeded(now, now);
    timer.failed(now, now);
    assert_eq!(timer.resync_due(), Some(now + Duration::from_secs(2)));
}

#[test]
fn retries_wait_at_least_a_second_and_at_most_a_sync_period() {
    assert_eq!(periods(30, 0).retry_delay(), MIN_RETRY_DELAY);
    assert_eq!(periods(30, 5).retry_delay(), Duration::from_secs(5));
    let short = SyncPeriods::new(Duration::from_millis(500), Duration::ZERO).expect("valid");
    assert_eq!(short.retry_delay(), Duration::from_millis(500));
}

#[test]
fn cancelling_drops_the_due_resync() {
    let mut timer = SyncTimer::new(periods(30, 1));
    let now = Instant::now();
    timer.succeeded(now, now);
    timer.cancel_resync();
    assert_eq!(timer.resync_due(), None);
}
