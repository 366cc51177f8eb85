//! Reading the kernel's replies: dumps across datagrams, acknowledgements and refusals, replies
//! to other requests, and datagrams that lie about their lengths.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::ipvs::interface::{ListedAddress, decode_address};
use crate::ipvs::message::{CommandAttribute, IpvsMessage};
use netlink_packet_core::{NLMSG_DONE, NLMSG_ERROR};
use netlink_packet_generic::GenlMessage;
use netlink_packet_route::RouteNetlinkMessage;

/// An `nlattr` header: length, then type, in host byte order.
pub(crate) fn nla(len: u16, kind: u16) -> Vec<u8> {
    [len.to_ne_bytes(), kind.to_ne_bytes()].concat()
}

/// A whole message of type `kind` around `body` (the protocol's fixed header and attributes).
pub(crate) fn message(kind: u16, flags: u16, seq: u32, body: &[u8]) -> Vec<u8> {
    let len = u32::try_from(16 + body.len()).unwrap();
    [
        &len.to_ne_bytes()[..],
        &kind.to_ne_bytes(),
        &flags.to_ne_bytes(),
        &seq.to_ne_bytes(),
        &0u32.to_ne_bytes(),
        body,
    ]
    .concat()
}

/// An IPVS family id.
const FAMILY: u16 = 0x24;

/// A dump part for request `seq`: an IPVS message holding `IPVS_CMD_ATTR_TIMEOUT_TCP` `value`.
fn dump_part(seq: u32, value: u32) -> Vec<u8> {
    let attribute = [nla(8, 4), value.to_ne_bytes().to_vec()].concat();
    message(
        FAMILY,
        NLM_F_MULTIPART,
        seq,
        &[&[4, 1, 0, 0][..], &attribute].concat(),
    )
}

/// The timeouts in an IPVS message.
fn timeout(reply: GenlMessage<IpvsMessage>) -> Result<u32, DecodeError> {
    reply
        .payload
        .attributes
        .iter()
        .find_map(|attribute| match attribute {
            CommandAttribute::TimeoutTcp(seconds) => Some(*seconds),
            _ => None,
        })
        .ok_or(DecodeError::Missing { name: "timeout" })
}

fn collect_values(datagrams: &[Vec<u8>], seq: u32) -> (Vec<u32>, Vec<Progress>) {
    let mut values = Vec::new();
    let progress = datagrams
        .iter()
        .map(|datagram| collect(datagram, seq, &mut timeout, &mut values).unwrap())
        .collect();
    (values, progress)
}

#[test]
fn a_dump_is_collected_across_datagrams_until_done() {
    let done = message(NLMSG_DONE, NLM_F_MULTIPART, 7, &0i32.to_ne_bytes());
    let datagrams = [
        [dump_part(7, 1), dump_part(7, 2)].concat(),
        [dump_part(7, 3), done].concat(),
    ];
    let (values, progress) = collect_values(&datagrams, 7);
    assert_eq!(values, [1, 2, 3]);
    assert_eq!(progress, [Progress::Pending, Progress::Finished]);
}

#[test]
fn replies_to_an_earlier_request_are_skipped_unread() {
    let stale_ack = message(NLMSG_ERROR, 0, 6, &0i32.to_ne_bytes());
    let stale_garbage = message(FAMILY, 0, 6, &[0xff; 3]);
    let datagrams = [
        [dump_part(6, 9), stale_ack, stale_garbage].concat(),
        dump_part(7, 1),
    ];
    let (values, progress) = collect_values(&datagrams, 7);
    assert_eq!(values, [1]);
    assert_eq!(progress, [Progress::Pending, Progress::Pending]);
}

#[test]
fn acks_finish_and_errors_refuse_with_the_positive_errno() {
    let ack = message(NLMSG_ERROR, 0, 7, &0i32.to_ne_bytes());
    let refusal = message(NLMSG_ERROR, 0, 7, &(-3i32).to_ne_bytes());
    let failed_dump = message(NLMSG_DONE, NLM_F_MULTIPART, 7, &(-22i32).to_ne_bytes());
    let (_, progress) = collect_values(&[ack, refusal, failed_dump], 7);
    assert_eq!(
        progress,
        [
            Progress::Finished,
            Progress::Refused(3),
            Progress::Refused(22)
        ]
    );
}

#[test]
fn a_plain_reply_finishes_at_its_only_message() {
    let reply = message(
        FAMILY,
        0,
        7,
        &[
            [1, 1, 0, 0].to_vec(),
            nla(8, 4),
            5u32.to_ne_bytes().to_vec(),
        ]
        .concat(),
    );
    let (values, progress) = collect_values(&[reply], 7);
    assert_eq!(values, [5]);
    assert_eq!(progress, [Progress::Finished]);
}

#[test]
fn messages_and_attributes_that_lie_about_their_lengths_are_errors() {
    let mut values = Vec::new();
    let mut read = |datagram: &[u8]| collect(datagram, 1, &mut timeout, &mut values);
    // A message longer than the datagram.
    let mut truncated = dump_part(1, 5);
    truncated.truncate(truncated.len() - 1);
    assert!(matches!(read(&truncated), Err(DecodeError::Framing(_))));
    // A message claiming less than its own header, an error without its code, a message shorter
    // than its `genlmsghdr`.
    let claims_less_than_a_header = [&3u32.to_ne_bytes()[..], &[0; 12]].concat();
    assert!(read(&claims_less_than_a_header).is_err());
    assert!(read(&message(NLMSG_ERROR, 0, 1, &[])).is_err());
    assert!(read(&message(FAMILY, 0, 1, &[4, 1])).is_err());
    // An attribute running past its message, and one shorter than its header.
    let past = message(
        FAMILY,
        0,
        1,
        &[&[4, 1, 0, 0][..], &nla(12, 4), &[0; 4]].concat(),
    );
    assert!(matches!(read(&past), Err(DecodeError::Framing(_))));
    let zero_length = message(FAMILY, 0, 1, &[&[4, 1, 0, 0][..], &nla(0, 4)].concat());
    assert!(read(&zero_length).is_err());
    assert!(values.is_empty());
}

#[test]
fn random_garbage_never_panics() {
    // A fixed xorshift stream: reproducible, and varied enough to hit every length check. Each
    // datagram is read for the sequence number it holds, so its messages are parsed.
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    for round in 0..4000 {
        let len = round % 97;
        let mut bytes: Vec<u8> = (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state.to_le_bytes()[0]
            })
            .collect();
        // Mostly a plausible length and type, so the parsers below the header run too.
        if bytes.len() >= 16 && round % 4 != 0 {
            let len = u32::try_from(bytes.len() - usize::from(bytes[0] % 8)).unwrap();
            bytes[..4].copy_from_slice(&len.max(16).to_ne_bytes());
            let kind: u16 = [FAMILY, 0x10, 16, 20, NLMSG_ERROR, NLMSG_DONE][round % 6];
            bytes[4..6].copy_from_slice(&kind.to_ne_bytes());
        }
        let seq = bytes
            .get(8..12)
            .map_or(0, |s| u32::from_ne_bytes(s.try_into().unwrap()));
        let mut ignore = |_| Ok(());
        let _ = collect::<GenlMessage<IpvsMessage>, ()>(&bytes, seq, &mut ignore, &mut Vec::new());
        let _ = collect::<RouteNetlinkMessage, ()>(&bytes, seq, &mut |_| Ok(()), &mut Vec::new());
        let _ = collect::<ListedAddress, _>(&bytes, seq, &mut decode_address, &mut Vec::new());
        let _ = collect::<GenlMessage<netlink_packet_generic::ctrl::GenlCtrl>, ()>(
            &bytes,
            seq,
            &mut |_| Ok(()),
            &mut Vec::new(),
        );
    }
}

#[test]
fn requests_carry_the_request_flag_their_sequence_number_and_length() {
    let bytes = serialize(crate::ipvs::message::list_services_request(FAMILY), 9);
    assert_eq!(
        bytes,
        message(FAMILY, NLM_F_REQUEST | 0x300, 9, &[4, 1, 0, 0])
    );
}

#[test]
fn errnos_show_their_name_and_number() {
    assert_eq!(Errno::ESRCH.to_string(), "ESRCH, errno 3");
    assert_eq!(Errno(4095).to_string(), "errno 4095");
    assert_eq!(Errno(22).text(), "Invalid argument");
    // Every errno Linux defines has its name, not only those IPVS is known to return.
    assert_eq!(Errno(110).to_string(), "ETIMEDOUT, errno 110");
    assert_eq!(Errno(105).to_string(), "ENOBUFS, errno 105");
}
