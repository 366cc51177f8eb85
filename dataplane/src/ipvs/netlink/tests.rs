//! The framing: alignment, nesting, and replies that lie about their lengths.

#![allow(clippy::unwrap_used)]

use super::*;

/// An `nlattr` header: length, then type, in host byte order.
pub(crate) fn header(len: u16, kind: u16) -> Vec<u8> {
    [len.to_ne_bytes(), kind.to_ne_bytes()].concat()
}

/// A whole message of type `kind` around `body` (the protocol's fixed header and attributes).
pub(crate) fn message(kind: u16, flags: u16, seq: u32, body: &[u8]) -> Vec<u8> {
    let len = u32::try_from(NLMSG_HDRLEN + body.len()).unwrap();
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

#[test]
fn request_pads_attributes_to_four_bytes_and_sizes_nested_ones() {
    let mut request = Request::new(0x1c, NLM_F_ACK, 7, 5, 1);
    request.begin_nested(1).put_str(6, "rr").put_u16(1, 2);
    request.end_nested().put_u32(9, 0xdead_beef);
    let bytes = request.finish();

    let body = [
        vec![5, 1, 0, 0],
        header(4 + 8 + 8, 1 | NLA_F_NESTED),
        header(7, 6),
        b"rr\0\0".to_vec(),
        header(6, 1),
        vec![2, 0, 0, 0],
        header(8, 9),
        0xdead_beef_u32.to_ne_bytes().to_vec(),
    ]
    .concat();
    assert_eq!(bytes, message(0x1c, NLM_F_REQUEST | NLM_F_ACK, 7, &body));
}

#[test]
fn replies_reads_acks_errors_dump_parts_and_done() {
    let part = message(0x1c, NLM_F_MULTI, 3, &[4, 1, 0, 0, 8, 0, 2, 0, 9, 0, 0, 0]);
    let error = message(NLMSG_ERROR, 0, 4, &(-3i32).to_ne_bytes());
    let done = message(NLMSG_DONE, NLM_F_MULTI, 3, &0i32.to_ne_bytes());
    let datagram = [part, error, done].concat();

    let replies = replies(&datagram, GENL_HDRLEN).unwrap();
    assert_eq!(replies.len(), 3);
    let Reply::Message {
        flags,
        seq: 3,
        header,
        attributes,
    } = replies[0]
    else {
        panic!("not the dump part: {:?}", replies[0]);
    };
    assert_eq!(flags, NLM_F_MULTI);
    assert_eq!(header, [4, 1, 0, 0], "the genlmsghdr: command 4, version 1");
    assert_eq!(
        attributes.all().unwrap(),
        vec![(2, &9u32.to_ne_bytes()[..])]
    );
    assert_eq!(replies[1], Reply::Error { seq: 4, code: -3 });
    assert_eq!(replies[2], Reply::Done { seq: 3, code: 0 });
}

#[test]
fn message_longer_than_the_datagram_is_an_error() {
    let mut datagram = message(0x1c, 0, 1, &[4, 1, 0, 0]);
    datagram.truncate(datagram.len() - 1);
    assert_eq!(
        replies(&datagram, GENL_HDRLEN).unwrap_err(),
        DecodeError::BadLength {
            what: "message",
            offset: 0,
            claimed: 20,
            available: 19
        }
    );
}

#[test]
fn message_shorter_than_its_headers_is_an_error() {
    let too_short = message(0x1c, 0, 1, &[4, 1]);
    assert!(matches!(
        replies(&too_short, GENL_HDRLEN),
        Err(DecodeError::BadLength {
            what: "message",
            ..
        })
    ));
    let error_without_code = message(NLMSG_ERROR, 0, 1, &[]);
    assert!(replies(&error_without_code, GENL_HDRLEN).is_err());
    let claims_less_than_a_header = [&3u32.to_ne_bytes()[..], &[0; 12]].concat();
    assert!(replies(&claims_less_than_a_header, GENL_HDRLEN).is_err());
}

#[test]
fn attribute_running_past_its_message_is_an_error() {
    let body = [header(12, 1), vec![0; 4]].concat();
    assert_eq!(
        Attributes::new(&body).all().unwrap_err(),
        DecodeError::BadLength {
            what: "attribute",
            offset: 0,
            claimed: 12,
            available: 8
        }
    );
    let zero_length = header(0, 1);
    assert!(Attributes::new(&zero_length).all().is_err());
}

#[test]
fn nested_flag_is_not_part_of_the_attribute_type() {
    let body = [header(8, 2 | NLA_F_NESTED), header(4, 1)].concat();
    assert_eq!(
        Attributes::new(&body).find(2).unwrap(),
        Some(&header(4, 1)[..])
    );
}

#[test]
fn fixed_size_payloads_of_the_wrong_size_are_errors_naming_the_attribute() {
    let err = read_u32(&[1, 2], "IPVS_SVC_ATTR_TIMEOUT").unwrap_err();
    assert_eq!(
        err.to_string(),
        "attribute IPVS_SVC_ATTR_TIMEOUT is invalid: 2 bytes, expected 4"
    );
    assert!(read_str(&[0xff, 0], "IPVS_SVC_ATTR_SCHED_NAME").is_err());
    assert_eq!(read_str(b"wlc\0", "IPVS_SVC_ATTR_SCHED_NAME"), Ok("wlc"));
}

#[test]
fn random_garbage_never_panics() {
    // A fixed xorshift stream: reproducible, and varied enough to hit every length check.
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    for round in 0..2000 {
        let len = round % 97;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state.to_le_bytes()[0]
            })
            .collect();
        let _ = replies(&bytes, GENL_HDRLEN);
        let _ = Attributes::new(&bytes).all();
    }
}

/// A dump part for request `seq` holding one `u32` attribute 1.
fn dump_part(seq: u32, value: u32) -> Vec<u8> {
    let attribute = [header(8, 1), value.to_ne_bytes().to_vec()].concat();
    message(
        0x1c,
        NLM_F_MULTI,
        seq,
        &[&[4, 1, 0, 0][..], &attribute].concat(),
    )
}

fn collect_values(datagrams: &[Vec<u8>], seq: u32) -> (Vec<u32>, Vec<Progress>) {
    let mut decode =
        |_: &[u8], attributes: Attributes<'_>| read_u32(attributes.require(1, "value")?, "value");
    let mut values = Vec::new();
    let progress = datagrams
        .iter()
        .map(|datagram| collect(datagram, seq, GENL_HDRLEN, &mut decode, &mut values).unwrap())
        .collect();
    (values, progress)
}

#[test]
fn a_dump_is_collected_across_datagrams_until_done() {
    let done = message(NLMSG_DONE, NLM_F_MULTI, 7, &0i32.to_ne_bytes());
    let datagrams = [
        [dump_part(7, 1), dump_part(7, 2)].concat(),
        [dump_part(7, 3), done].concat(),
    ];
    let (values, progress) = collect_values(&datagrams, 7);
    assert_eq!(values, [1, 2, 3]);
    assert_eq!(progress, [Progress::Pending, Progress::Finished]);
}

#[test]
fn replies_to_an_earlier_request_are_skipped() {
    let stale_ack = message(NLMSG_ERROR, 0, 6, &0i32.to_ne_bytes());
    let datagrams = [[dump_part(6, 9), stale_ack].concat(), dump_part(7, 1)];
    let (values, progress) = collect_values(&datagrams, 7);
    assert_eq!(values, [1]);
    assert_eq!(progress, [Progress::Pending, Progress::Pending]);
}

#[test]
fn acks_finish_and_errors_refuse_with_the_positive_errno() {
    let ack = message(NLMSG_ERROR, 0, 7, &0i32.to_ne_bytes());
    let refusal = message(NLMSG_ERROR, 0, 7, &(-3i32).to_ne_bytes());
    let failed_dump = message(NLMSG_DONE, NLM_F_MULTI, 7, &(-22i32).to_ne_bytes());
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
        0x10,
        0,
        7,
        &[
            [1, 1, 0, 0].to_vec(),
            header(8, 1),
            5u32.to_ne_bytes().to_vec(),
        ]
        .concat(),
    );
    let (values, progress) = collect_values(&[reply], 7);
    assert_eq!(values, [5]);
    assert_eq!(progress, [Progress::Finished]);
}
