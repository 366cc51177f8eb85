use super::*;
use IpFamily::{V4, V6};

#[test]
fn families_are_each_once_ipv4_first_and_never_none() {
    assert_eq!(*Families::new([V6, V4, V6]), [V4, V6]);
    assert_eq!(*Families::new([V6]), [V6]);
    assert_eq!(*Families::new([]), [V4]);
    assert_eq!(*Families::default(), [V4]);
}
