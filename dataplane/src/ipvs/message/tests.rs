//! Expected bytes are spelled out from `include/uapi/linux/ip_vs.h`: attribute numbers, payload
//! sizes and byte orders (ports big-endian, the rest host order).

#![allow(clippy::unwrap_used)]

use super::*;
use crate::ipvs::connection::tests::nla;
use crate::ipvs::connection::{collect, serialize};
use netlink_packet_core::{NLM_F_MULTIPART, NLM_F_REQUEST};

const FAMILY: u16 = 0x24;

/// A message's `nlmsghdr` and `genlmsghdr`.
fn headers(len: u32, flags: u16, seq: u32, command: u8) -> Vec<u8> {
    [
        &len.to_ne_bytes()[..],
        &FAMILY.to_ne_bytes(),
        &flags.to_ne_bytes(),
        &seq.to_ne_bytes(),
        &0u32.to_ne_bytes(),
        &[command, 1, 0, 0],
    ]
    .concat()
}

fn vip() -> ServiceId {
    ServiceId {
        protocol: Protocol::Tcp,
        address: "10.96.0.10".parse().unwrap(),
        port: 80,
    }
}

fn persistent_service() -> VirtualServer {
    VirtualServer {
        id: vip(),
        scheduler: "rr".into(),
        flags: service_flags::PERSISTENT,
        timeout: 10800,
    }
}

/// The IPVS message `request` is, as the kernel would read it back.
fn sent(request: Request) -> IpvsMessage {
    let bytes = serialize(request, 1);
    let mut messages = Vec::new();
    collect(
        &bytes,
        1,
        &mut |m: GenlMessage<IpvsMessage>| Ok(m.payload),
        &mut messages,
    )
    .unwrap();
    assert_eq!(messages.len(), 1);
    messages.remove(0)
}

/// A listing's message (a dump part) holding `attributes`, as the kernel would send it.
fn listed(attributes: Vec<CommandAttribute>) -> IpvsMessage {
    sent(request(
        FAMILY,
        NLM_F_MULTIPART,
        Command::NewService,
        attributes,
    ))
}

/// `IPVS_SVC_ATTR_AF`, `PROTOCOL`, `ADDR` and `PORT` of `vip()`.
fn vip_attributes() -> Vec<u8> {
    [
        nla(6, 1),
        2u16.to_ne_bytes().to_vec(), // AF_INET
        vec![0, 0],
        nla(6, 2),
        6u16.to_ne_bytes().to_vec(), // IPPROTO_TCP
        vec![0, 0],
        nla(20, 3),
        vec![10, 96, 0, 10],
        vec![0; 12],
        nla(6, 4),
        vec![0, 80, 0, 0], // network byte order
    ]
    .concat()
}

#[test]
fn new_service_is_laid_out_as_ip_vs_h_says() {
    let bytes = serialize(
        service_request(FAMILY, Command::NewService, &persistent_service()),
        9,
    );

    let expected = [
        headers(104, NLM_F_REQUEST | NLM_F_ACK, 9, 1),
        nla(84, 1 | NLA_F_NESTED), // IPVS_CMD_ATTR_SERVICE
        vip_attributes(),
        nla(7, 6), // IPVS_SVC_ATTR_SCHED_NAME
        b"rr\0\0".to_vec(),
        nla(12, 7), // IPVS_SVC_ATTR_FLAGS: { flags, mask }
        1u32.to_ne_bytes().to_vec(),
        u32::MAX.to_ne_bytes().to_vec(),
        nla(8, 8), // IPVS_SVC_ATTR_TIMEOUT
        10800u32.to_ne_bytes().to_vec(),
        nla(8, 9), // IPVS_SVC_ATTR_NETMASK
        u32::MAX.to_ne_bytes().to_vec(),
    ]
    .concat();
    assert_eq!(bytes, expected);
}

#[test]
fn new_real_server_is_laid_out_as_ip_vs_h_says() {
    let server = RealServer {
        address: "10.244.1.20".parse().unwrap(),
        port: 8080,
        weight: 1,
    };
    let bytes = serialize(
        real_server_request(FAMILY, Command::NewDest, vip(), server),
        3,
    );

    let u32_attribute = |kind: u16, value: u32| [nla(8, kind), value.to_ne_bytes().to_vec()];
    let expected = [
        headers(140, NLM_F_REQUEST | NLM_F_ACK, 3, 5),
        nla(48, 1 | NLA_F_NESTED), // IPVS_CMD_ATTR_SERVICE, identity only
        vip_attributes(),
        nla(72, 2 | NLA_F_NESTED), // IPVS_CMD_ATTR_DEST
        nla(20, 1),                // IPVS_DEST_ATTR_ADDR
        vec![10, 244, 1, 20],
        vec![0; 12],
        nla(6, 2), // IPVS_DEST_ATTR_PORT, network byte order
        vec![0x1f, 0x90, 0, 0],
        u32_attribute(3, 0).concat(), // FWD_METHOD: IP_VS_CONN_F_MASQ
        u32_attribute(4, 1).concat(), // WEIGHT
        u32_attribute(5, 0).concat(), // U_THRESH
        u32_attribute(6, 0).concat(), // L_THRESH
        nla(6, 11),                   // ADDR_FAMILY
        2u16.to_ne_bytes().to_vec(),
        vec![0, 0],
    ]
    .concat();
    assert_eq!(bytes, expected);
}

#[test]
fn ipv6_service_carries_the_whole_address_and_a_prefix_length_netmask() {
    let mut server = persistent_service();
    server.id.address = "fd00:96::10".parse().unwrap();
    let message = sent(service_request(FAMILY, Command::SetService, &server));
    assert_eq!(message.command, Command::SetService);
    let [CommandAttribute::Service(service)] = message.attributes.as_slice() else {
        panic!("expected one service attribute: {message:?}");
    };
    assert!(service.contains(&ServiceAttribute::Family(10)));
    let octets = "fd00:96::10".parse::<Ipv6Addr>().unwrap().octets();
    assert!(service.contains(&ServiceAttribute::Address(octets.to_vec())));
    assert!(service.contains(&ServiceAttribute::Netmask(128)));
}

#[test]
fn a_service_decodes_back_to_what_was_encoded() {
    for address in ["10.96.0.10", "fd00:96::10"] {
        let mut server = persistent_service();
        server.id.address = address.parse().unwrap();
        server.id.protocol = Protocol::Sctp;
        let message = sent(service_request(FAMILY, Command::NewService, &server));
        assert_eq!(decode_service(message), Ok(Some(server)));
    }
}

#[test]
fn listed_flags_leave_out_the_hashed_flag_the_kernel_adds() {
    let mut service = service_id(vip());
    service.extend([
        ServiceAttribute::Scheduler("wlc".into()),
        ServiceAttribute::Flags {
            flags: service_flags::HASHED | service_flags::PERSISTENT,
            mask: 0,
        },
        ServiceAttribute::Timeout(60),
        ServiceAttribute::Netmask(u32::MAX),
    ]);
    let listed = decode_service(listed(vec![CommandAttribute::Service(service)]))
        .unwrap()
        .unwrap();
    assert_eq!(listed.flags, service_flags::PERSISTENT);
    assert_eq!(listed.scheduler, "wlc");
}

#[test]
fn a_listed_real_server_decodes_with_its_connections() {
    // What the kernel sends in a GET_DEST dump: the request's attributes plus counters.
    let mut destination = destination("fd00:244::20".parse().unwrap(), 8080);
    destination.extend([
        DestinationAttribute::ForwardMethod(FWD_MASQ),
        DestinationAttribute::Weight(0),
        DestinationAttribute::ActiveConnections(3),
        DestinationAttribute::InactiveConnections(2),
        DestinationAttribute::Family(AF_INET6),
        // Statistics, which the client leaves unread.
        DestinationAttribute::Other(DefaultNla::new(10 | NLA_F_NESTED, vec![4, 0, 1, 0])),
    ]);
    let message = listed(vec![CommandAttribute::Destination(destination)]);
    assert_eq!(
        decode_real_server(message, vip()).unwrap(),
        ListedRealServer {
            server: RealServer {
                address: "fd00:244::20".parse().unwrap(),
                port: 8080,
                weight: 0,
            },
            active_connections: 3,
            inactive_connections: 2,
        }
    );
}

#[test]
fn a_real_server_without_counters_is_a_clear_error() {
    let server = RealServer {
        address: "10.244.1.20".parse().unwrap(),
        port: 8080,
        weight: 1,
    };
    let message = sent(real_server_request(FAMILY, Command::SetDest, vip(), server));
    assert_eq!(
        decode_real_server(message, vip()).unwrap_err().to_string(),
        "attribute IPVS_DEST_ATTR_ACTIVE_CONNS is missing"
    );
}

#[test]
fn a_service_with_garbled_attributes_is_a_clear_error() {
    let garbled = vec![
        ServiceAttribute::Family(AF_INET),
        ServiceAttribute::Protocol(99),
        ServiceAttribute::Address(vec![10, 96]),
        ServiceAttribute::Port(80),
    ];
    assert_eq!(
        decode_service(listed(vec![CommandAttribute::Service(garbled)]))
            .unwrap_err()
            .to_string(),
        "attribute IPVS_SVC_ATTR_FLAGS is missing"
    );
    assert_eq!(
        decode_service(listed(Vec::new())).unwrap_err().to_string(),
        "attribute IPVS_CMD_ATTR_SERVICE is missing"
    );
}

#[test]
fn attributes_of_the_wrong_size_are_errors_naming_them() {
    // IPVS_SVC_ATTR_TIMEOUT in 2 bytes, in a dump part for request 1.
    let body = [
        vec![1, 1, 0, 0],
        nla(4 + 8, 1 | NLA_F_NESTED),
        nla(6, 8),
        vec![1, 2, 0, 0],
    ]
    .concat();
    let bytes = crate::ipvs::connection::tests::message(FAMILY, NLM_F_MULTIPART, 1, &body);
    let mut ignore = |_: GenlMessage<IpvsMessage>| Ok(());
    let err = collect(&bytes, 1, &mut ignore, &mut Vec::new()).unwrap_err();
    assert!(
        err.to_string()
            .contains("attribute IPVS_SVC_ATTR_TIMEOUT is invalid: 2 bytes, expected 4"),
        "{err}"
    );
}

#[test]
fn scheduler_names_are_read_up_to_their_nul_and_must_be_utf8() {
    let scheduler = |value: &[u8]| {
        let bytes = [
            nla(u16::try_from(4 + value.len()).unwrap(), 6),
            value.to_vec(),
        ]
        .concat();
        ServiceAttribute::parse(&NlaBuffer::new_checked(&bytes[..]).unwrap())
    };
    assert_eq!(
        scheduler(b"wlc\0").unwrap(),
        ServiceAttribute::Scheduler("wlc".into())
    );
    assert!(scheduler(&[0xff, 0]).is_err());
}

#[test]
fn firewall_mark_services_are_skipped() {
    let service = vec![
        ServiceAttribute::Family(AF_INET),
        ServiceAttribute::FirewallMark(7),
    ];
    assert_eq!(
        decode_service(listed(vec![CommandAttribute::Service(service)])),
        Ok(None)
    );
}

#[test]
fn every_truncation_of_a_listing_is_an_error_or_a_shorter_listing_never_a_panic() {
    let bytes = serialize(
        service_request(FAMILY, Command::NewService, &persistent_service()),
        1,
    );
    for len in 0..bytes.len() {
        let mut decode = |m: GenlMessage<IpvsMessage>| decode_service(m.payload);
        let _ = collect(&bytes[..len], 1, &mut decode, &mut Vec::new());
    }
}

#[test]
fn timeouts_carry_only_those_set_in_seconds() {
    let timeouts = Timeouts {
        tcp: Some(600),
        tcp_fin: None,
        udp: Some(90),
    };
    let expected = [
        headers(36, NLM_F_REQUEST | NLM_F_ACK, 3, 12),
        nla(8, 4),
        600u32.to_ne_bytes().to_vec(),
        nla(8, 6),
        90u32.to_ne_bytes().to_vec(),
    ]
    .concat();
    assert_eq!(serialize(timeouts_request(FAMILY, &timeouts), 3), expected);
}

#[test]
fn family_lookup_asks_nlctrl_for_ipvs_by_name() {
    let bytes = serialize(family_request(), 5);
    let expected = [
        &32u32.to_ne_bytes()[..],
        &0x10u16.to_ne_bytes(), // GENL_ID_CTRL
        &NLM_F_REQUEST.to_ne_bytes(),
        &5u32.to_ne_bytes(),
        &0u32.to_ne_bytes(),
        &[3, 1, 0, 0], // CTRL_CMD_GETFAMILY
        &nla(9, 2),    // CTRL_ATTR_FAMILY_NAME
        b"IPVS\0\0\0\0",
    ]
    .concat();
    assert_eq!(bytes, expected);
}

#[test]
fn the_family_id_is_read_from_nlctrls_answer() {
    let name = [&nla(9, 2)[..], b"IPVS\0\0\0\0"].concat();
    let id = [&nla(6, 1)[..], &0x24u16.to_ne_bytes(), &[0, 0]].concat();
    let answer = |attributes: &[u8]| {
        // CTRL_CMD_NEWFAMILY from GENL_ID_CTRL, answering request 5.
        let len = u32::try_from(20 + attributes.len()).unwrap();
        [
            &len.to_ne_bytes()[..],
            &0x10u16.to_ne_bytes(),
            &0u16.to_ne_bytes(),
            &5u32.to_ne_bytes(),
            &0u32.to_ne_bytes(),
            &[1, 2, 0, 0],
            attributes,
        ]
        .concat()
    };
    let mut ids = Vec::new();
    let full = answer(&[name.clone(), id].concat());
    collect(&full, 5, &mut decode_family_id, &mut ids).unwrap();
    assert_eq!(ids, [0x24]);
    let without_id = answer(&name);
    assert_eq!(
        collect(&without_id, 5, &mut decode_family_id, &mut ids).unwrap_err(),
        DecodeError::Missing {
            name: "CTRL_ATTR_FAMILY_ID"
        }
    );
}
