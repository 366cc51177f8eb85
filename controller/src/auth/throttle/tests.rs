use super::*;

#[test]
fn a_bucket_gives_its_burst_then_its_rate() {
    let rate = Rate {
        per_second: 2.0,
        burst: 3.0,
    };
    let start = Instant::now();
    let mut bucket = Bucket::full(rate, start);
    let taken = (0..5).filter(|_| bucket.take(rate, start)).count();
    assert_eq!(taken, 3);
    assert!(bucket.take(rate, start + Duration::from_millis(500)));
    assert!(!bucket.take(rate, start + Duration::from_millis(500)));
}

#[tokio::test]
async fn one_address_gets_its_burst_of_reviews_and_others_are_not_held_up_by_it() {
    let throttle = Throttle::default();
    let flooding: IpAddr = "10.244.9.9".parse().expect("ip");
    let mut granted = 0;
    for _ in 0..50 {
        if throttle.permit(Some(flooding)).await.is_ok() {
            granted += 1;
        }
    }
    assert!(
        (5..=6).contains(&granted),
        "one address was granted {granted} reviews"
    );
    let other: IpAddr = "198.18.0.12".parse().expect("ip");
    assert!(throttle.permit(Some(other)).await.is_ok());
}

#[test]
fn a_refused_credential_is_remembered_for_a_while() {
    let throttle = Throttle::default();
    let key = [7u8; 32];
    assert_eq!(throttle.refused_recently(&key), None);
    throttle.remember_refusal(key, "token expired");
    assert_eq!(
        throttle.refused_recently(&key).as_deref(),
        Some("token expired")
    );
    assert_eq!(throttle.refused_recently(&[8u8; 32]), None);
}
