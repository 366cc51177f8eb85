//! Expected bytes are spelled out from `include/uapi/linux/ip_vs.h`: attribute numbers, payload
//! sizes and byte orders (ports big-endian, the rest host order).

#![allow(clippy::unwrap_used)]

use super::*;
use crate::ipvs::connection::{collect, serialize};
use crate::ipvs::netlink::{GENL_HDRLEN, NLA_F_NESTED, NLM_F_MULTI, NLM_F_REQUEST, Reply, replies};

const FAMILY: u16 = 0x24;

/// An `nlattr` header: length, then type.
fn nla(len: u16, kind: u16) -> Vec<u8> {
    [len.to_ne_bytes(), kind.to_ne_bytes()].concat()
}

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

/// The attributes of the only message in `bytes`.
fn only_message(bytes: &[u8]) -> Attributes<'_> {
    match replies(bytes, GENL_HDRLEN).unwrap().as_slice() {
        [Reply::Message { attributes, .. }] => *attributes,
        other => panic!("expected one message, got {other:?}"),
    }
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
    let bytes = service_request(FAMILY, 9, Command::NewService, &persistent_service());

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
    let bytes = real_server_request(FAMILY, 3, Command::NewDest, vip(), server);

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
    let bytes = service_request(FAMILY, 1, Command::SetService, &server);
    let service = Attributes::new(only_message(&bytes).find(1).unwrap().unwrap());
    assert_eq!(service.find(1).unwrap(), Some(&10u16.to_ne_bytes()[..]));
    assert_eq!(
        service.find(3).unwrap(),
        Some(&"fd00:96::10".parse::<Ipv6Addr>().unwrap().octets()[..])
    );
    assert_eq!(service.find(9).unwrap(), Some(&128u32.to_ne_bytes()[..]));
}

#[test]
fn a_service_decodes_back_to_what_was_encoded() {
    for address in ["10.96.0.10", "fd00:96::10"] {
        let mut server = persistent_service();
        server.id.address = address.parse().unwrap();
        server.id.protocol = Protocol::Sctp;
        let bytes = service_request(FAMILY, 1, Command::NewService, &server);
        assert_eq!(decode_service(only_message(&bytes)), Ok(Some(server)));
    }
}

#[test]
fn listed_flags_leave_out_the_hashed_flag_the_kernel_adds() {
    let mut request = Request::new(FAMILY, NLM_F_MULTI, 1, 1, 1);
    request.begin_nested(CMD_ATTR_SERVICE);
    put_service_id(&mut request, vip());
    let mut flags = [0; 8];
    flags[..4].copy_from_slice(&(service_flags::HASHED | service_flags::PERSISTENT).to_ne_bytes());
    request
        .put_str(SVC_SCHED_NAME, "wlc")
        .put(SVC_FLAGS, &flags)
        .put_u32(SVC_TIMEOUT, 60)
        .put_u32(SVC_NETMASK, u32::MAX);
    let bytes = request.finish();
    let listed = decode_service(only_message(&bytes)).unwrap().unwrap();
    assert_eq!(listed.flags, service_flags::PERSISTENT);
    assert_eq!(listed.scheduler, "wlc");
}

#[test]
fn a_listed_real_server_decodes_with_its_connections() {
    // What the kernel sends in a GET_DEST dump: the request's attributes plus counters.
    let mut request = Request::new(FAMILY, NLM_F_MULTI, 1, 5, 1);
    request.begin_nested(CMD_ATTR_DEST);
    put_destination(&mut request, "fd00:244::20".parse().unwrap(), 8080);
    request
        .put_u32(DEST_FWD_METHOD, FWD_MASQ)
        .put_u32(DEST_WEIGHT, 0)
        .put_u32(DEST_ACTIVE_CONNS, 3)
        .put_u32(DEST_INACT_CONNS, 2)
        .put_u16(DEST_ADDR_FAMILY, AF_INET6);
    let bytes = request.finish();

    let listed = decode_real_server(only_message(&bytes), vip()).unwrap();
    assert_eq!(
        listed,
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
    let bytes = real_server_request(FAMILY, 3, Command::SetDest, vip(), server);
    assert_eq!(
        decode_real_server(only_message(&bytes), vip())
            .unwrap_err()
            .to_string(),
        "attribute IPVS_DEST_ATTR_ACTIVE_CONNS is missing"
    );
}

#[test]
fn a_service_with_garbled_attributes_is_a_clear_error() {
    let mut request = Request::new(FAMILY, NLM_F_MULTI, 1, 1, 1);
    request.begin_nested(CMD_ATTR_SERVICE);
    request
        .put_u16(SVC_AF, AF_INET)
        .put_u16(SVC_PROTOCOL, 99)
        .put(SVC_ADDR, &[10, 96])
        .put(SVC_PORT, &[0, 80]);
    let bytes = request.finish();
    assert_eq!(
        decode_service(only_message(&bytes))
            .unwrap_err()
            .to_string(),
        "attribute IPVS_SVC_ATTR_FLAGS is missing"
    );

    let empty = Request::new(FAMILY, NLM_F_MULTI, 1, 1, 1).finish();
    assert_eq!(
        decode_service(only_message(&empty))
            .unwrap_err()
            .to_string(),
        "attribute IPVS_CMD_ATTR_SERVICE is missing"
    );
}

#[test]
fn firewall_mark_services_are_skipped() {
    let mut request = Request::new(FAMILY, NLM_F_MULTI, 1, 1, 1);
    request.begin_nested(CMD_ATTR_SERVICE);
    request.put_u16(SVC_AF, AF_INET).put_u32(SVC_FWMARK, 7);
    let bytes = request.finish();
    assert_eq!(decode_service(only_message(&bytes)), Ok(None));
}

#[test]
fn every_truncation_of_a_listing_is_an_error_or_a_shorter_listing_never_a_panic() {
    let bytes = service_request(FAMILY, 1, Command::NewService, &persistent_service());
    for len in 0..bytes.len() {
        let Ok(replies) = replies(&bytes[..len], GENL_HDRLEN) else {
            continue;
        };
        for reply in replies {
            if let Reply::Message { attributes, .. } = reply {
                let _ = decode_service(attributes);
            }
        }
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
    assert_eq!(timeouts_request(FAMILY, 3, &timeouts), expected);
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
