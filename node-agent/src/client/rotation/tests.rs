use super::*;

const BACKOFF: Duration = Duration::from_millis(500);
const ASKED: Duration = Duration::from_secs(2);

fn pass(controllers: &[&str]) -> Vec<String> {
    controllers.iter().map(|c| (*c).to_owned()).collect()
}

/// Tries the whole pass, each controller ending as `end` says; returns the order tried.
fn try_all(rotation: &mut Rotation, end: impl Fn(&str) -> (bool, bool)) -> Vec<String> {
    let mut tried = Vec::new();
    while let Some(controller) = rotation.next_controller() {
        let (asked_to_wait, come_back) = end(&controller);
        rotation.ended(&controller, asked_to_wait, come_back);
        tried.push(controller);
    }
    tried
}

#[test]
fn controllers_are_tried_in_the_order_listed() {
    let mut rotation = Rotation::default();
    assert!(rotation.pass_done(), "nothing listed yet");
    rotation.start_pass(pass(&["a", "b", "c"]));
    assert_eq!(try_all(&mut rotation, |_| (false, false)), ["a", "b", "c"]);
    assert!(rotation.pass_done());
    assert_eq!(rotation.take_pass(), ["a", "b", "c"]);
}

#[test]
fn a_controller_that_sent_the_agent_away_is_tried_last_in_the_next_pass() {
    let mut rotation = Rotation::default();
    rotation.start_pass(pass(&["a", "b", "c"]));
    let tried = try_all(&mut rotation, |c| (c == "a", false));
    assert_eq!(tried, ["a", "b", "c"]);
    rotation.start_pass(pass(&["a", "b", "c"]));
    assert_eq!(try_all(&mut rotation, |_| (false, false)), ["b", "c", "a"]);
    // Only the next pass: a controller that did not send the agent away again keeps its place.
    rotation.start_pass(pass(&["a", "b", "c"]));
    assert_eq!(try_all(&mut rotation, |_| (false, false)), ["a", "b", "c"]);
}

#[test]
fn a_controller_that_sent_the_agent_away_and_is_no_longer_listed_changes_nothing() {
    let mut rotation = Rotation::default();
    rotation.start_pass(pass(&["a", "b"]));
    try_all(&mut rotation, |c| (c == "a", false));
    rotation.start_pass(pass(&["b", "c"]));
    assert_eq!(try_all(&mut rotation, |_| (false, false)), ["b", "c"]);
}

#[test]
fn the_wait_asked_applies_only_before_that_controller_again() {
    let mut rotation = Rotation::default();
    rotation.start_pass(pass(&["a", "b"]));
    let first = rotation.next_controller().expect("a is listed");
    rotation.ended(&first, true, false);
    assert_eq!(
        rotation.delay(Some(ASKED), BACKOFF),
        Duration::ZERO,
        "b is still to be tried"
    );
    let second = rotation.next_controller().expect("b is listed");
    rotation.ended(&second, true, false);
    assert_eq!(
        rotation.delay(Some(ASKED), BACKOFF),
        ASKED,
        "the pass is over: the next try may be a controller that asked to wait"
    );
}

#[test]
fn a_failure_without_a_wait_asked_backs_off() {
    let mut rotation = Rotation::default();
    rotation.start_pass(pass(&["a", "b"]));
    let first = rotation.next_controller().expect("a is listed");
    rotation.ended(&first, false, false);
    assert_eq!(rotation.delay(None, BACKOFF), BACKOFF);
}

#[test]
fn a_stream_ended_for_a_rotated_credential_comes_back_to_the_same_controller() {
    let mut rotation = Rotation::default();
    rotation.start_pass(pass(&["a", "b"]));
    let first = rotation.next_controller().expect("a is listed");
    rotation.ended(&first, false, true);
    assert_eq!(rotation.next_controller().as_deref(), Some("a"));
}
