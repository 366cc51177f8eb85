//! Expected bytes are spelled out from `include/uapi/linux/rtnetlink.h`, `if_link.h` and
//! `if_addr.h`: message types, header layouts and attribute numbers, all in host byte order.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::ipvs::connection::tests::{message, nla};
use crate::ipvs::connection::{Progress, collect, serialize};
use netlink_packet_core::{NLM_F_MULTIPART as NLM_F_MULTI, NLM_F_REQUEST};
use std::net::Ipv6Addr;

/// An `ifaddrmsg` for a host address of `family` on link `index`.
fn ifaddrmsg(family: u8, prefix: u8, flags: u8, index: u32) -> Vec<u8> {
    [&[family, prefix, flags, 0][..], &index.to_ne_bytes()].concat()
}

#[test]
fn the_link_lookup_names_the_interface() {
    let body = [vec![0; 16], nla(15, 3), b"kube-ipvs0\0\0".to_vec()].concat();
    assert_eq!(
        serialize(link_request("kube-ipvs0"), 4),
        message(18, NLM_F_REQUEST, 4, &body)
    );
}

#[test]
fn creating_the_dummy_asks_for_a_new_link_of_kind_dummy() {
    let body = [
        vec![0; 16],
        nla(15, 3),
        b"kube-ipvs0\0\0".to_vec(),
        // The nest spans its padded contents, as `nla_nest_end` sizes it. netlink-packet-route
        // leaves `NLA_F_NESTED` off `IFLA_LINKINFO`, which the kernel does not require there.
        nla(4 + 12, 18),
        nla(10, 1),
        b"dummy\0\0\0".to_vec(),
    ]
    .concat();
    let create_exclusive_ack = 0x400 | 0x200 | 0x4;
    assert_eq!(
        serialize(create_dummy_request("kube-ipvs0"), 5),
        message(16, NLM_F_REQUEST | create_exclusive_ack, 5, &body)
    );
}

#[test]
fn an_ipv4_address_is_bound_as_a_host_address() {
    let body = [
        ifaddrmsg(2, 32, 0, 7),
        nla(8, 2),
        vec![10, 96, 0, 10],
        nla(8, 1),
        vec![10, 96, 0, 10],
    ]
    .concat();
    assert_eq!(
        serialize(
            address_request(AddressChange::Add, 7, "10.96.0.10".parse().unwrap()),
            9
        ),
        message(20, NLM_F_REQUEST | 0x400 | 0x200 | 0x4, 9, &body)
    );
}

#[test]
fn an_ipv6_address_is_bound_without_duplicate_address_detection_and_unbound() {
    let octets: Ipv6Addr = "fd00::10".parse().unwrap();
    let body = [
        ifaddrmsg(10, 128, 0x02, 7),
        nla(20, 2),
        octets.octets().to_vec(),
        nla(20, 1),
        octets.octets().to_vec(),
    ]
    .concat();
    assert_eq!(
        serialize(address_request(AddressChange::Add, 7, octets.into()), 3),
        message(20, NLM_F_REQUEST | 0x400 | 0x200 | 0x4, 3, &body)
    );
    assert_eq!(
        serialize(address_request(AddressChange::Delete, 7, octets.into()), 4),
        message(21, NLM_F_REQUEST | 0x4, 4, &body)
    );
}

#[test]
fn the_address_dump_asks_for_both_families() {
    assert_eq!(
        serialize(list_addresses_request(), 2),
        message(22, NLM_F_REQUEST | 0x300, 2, &[0; 8])
    );
}

/// Decodes the only message of `datagram` (a dump part for request 1) with [`decode_address`].
fn decode_only(datagram: &[u8]) -> Result<Option<(u32, IpAddr)>, DecodeError> {
    let mut decoded = Vec::new();
    let progress = collect(datagram, 1, &mut decode_address, &mut decoded)?;
    assert_eq!(progress, Progress::Pending);
    assert_eq!(decoded.len(), 1, "expected one message");
    Ok(decoded[0])
}

#[test]
fn listed_addresses_are_read_with_their_link() {
    // An IPv4 point-to-point address: IFA_ADDRESS is the peer, IFA_LOCAL the own one.
    let v4 = [
        ifaddrmsg(2, 32, 0x80, 7),
        nla(8, 1),
        vec![192, 0, 2, 1],
        nla(8, 2),
        vec![10, 96, 0, 10],
        nla(15, 3),
        b"kube-ipvs0\0\0".to_vec(),
    ]
    .concat();
    assert_eq!(
        decode_only(&message(20, NLM_F_MULTI, 1, &v4)).unwrap(),
        Some((7, "10.96.0.10".parse().unwrap()))
    );
    let v6_address: Ipv6Addr = "fd00::10".parse().unwrap();
    let v6 = [
        ifaddrmsg(10, 128, 0x80, 3),
        nla(20, 1),
        v6_address.octets().to_vec(),
    ]
    .concat();
    assert_eq!(
        decode_only(&message(20, NLM_F_MULTI, 1, &v6)).unwrap(),
        Some((3, v6_address.into()))
    );
}

#[test]
fn addresses_of_other_families_are_skipped_and_malformed_ones_refused() {
    let other_family = [ifaddrmsg(17, 0, 0, 1), nla(10, 1), vec![0; 8]].concat();
    assert_eq!(
        decode_only(&message(20, NLM_F_MULTI, 1, &other_family)).unwrap(),
        None
    );
    let short_address = [ifaddrmsg(2, 32, 0, 1), nla(7, 2), vec![10, 96, 0, 0]].concat();
    let refused = decode_only(&message(20, NLM_F_MULTI, 1, &short_address)).unwrap_err();
    assert!(
        matches!(&refused, DecodeError::Framing(text) if text.contains("IFA_LOCAL")),
        "{refused:?}"
    );
    let without_address = ifaddrmsg(10, 128, 0, 1);
    assert_eq!(
        decode_only(&message(20, NLM_F_MULTI, 1, &without_address)),
        Err(DecodeError::Missing {
            name: "IFA_ADDRESS"
        })
    );
}

#[test]
fn the_link_index_comes_from_the_ifinfomsg() {
    let mut ifinfomsg = vec![0; 16];
    ifinfomsg[4..8].copy_from_slice(&42u32.to_ne_bytes());
    let reply = [ifinfomsg.clone(), nla(15, 3), b"kube-ipvs0\0\0".to_vec()].concat();
    let mut indexes = Vec::new();
    let progress = collect(
        &message(16, 0, 4, &reply),
        4,
        &mut decode_link_index,
        &mut indexes,
    )
    .unwrap();
    assert_eq!((progress, indexes), (Progress::Finished, vec![42]));
    let mut indexes = Vec::new();
    let truncated = message(16, 0, 4, &ifinfomsg[..8]);
    assert!(collect(&truncated, 4, &mut decode_link_index, &mut indexes).is_err());
}
