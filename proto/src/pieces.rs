//! One Service's endpoints in pieces (protocol rule 14): the controller splits a set too big for
//! one message, the agent puts the pieces back together. Both live here so the two ends cannot
//! drift apart: the set assembled is the set split, byte for byte, and so is its digest.

use crate::v1alpha1::{PortEndpoints, ServiceEndpoints};
use prost::Message;

/// What one repeated entry costs besides its body: its tag and a length prefix of at most five
/// bytes (a length below 2³²).
const ENTRY_OVERHEAD: usize = 1 + 5;

/// `set` in pieces of at most `max` encoded bytes each (an endpoint bigger than that alone goes in
/// a piece of its own): the first carries the key and everything else the set has besides its
/// ports, each later one the key and the ports it continues. A set within `max` is one piece.
#[must_use]
pub fn split(set: &ServiceEndpoints, max: usize) -> Vec<ServiceEndpoints> {
    if set.encoded_len() <= max {
        return vec![set.clone()];
    }
    let continuation = ServiceEndpoints {
        key: set.key.clone(),
        ..Default::default()
    };
    let mut pieces = vec![ServiceEndpoints {
        ports: Vec::new(),
        ..set.clone()
    }];
    // The encoded size of the last piece, counting each port's entry overhead at its largest.
    let mut size = pieces[0].encoded_len();
    for port in &set.ports {
        let empty_port = PortEndpoints {
            endpoints: Vec::new(),
            ..port.clone()
        };
        let port_cost = ENTRY_OVERHEAD + empty_port.encoded_len();
        // Whether the last piece's last port is this one.
        let mut open = false;
        if port.endpoints.is_empty() {
            push_port(&mut pieces, &empty_port, &mut size, port_cost);
            continue;
        }
        for endpoint in &port.endpoints {
            let cost = ENTRY_OVERHEAD + endpoint.encoded_len() + if open { 0 } else { port_cost };
            let piece_has_endpoints = pieces
                .last()
                .is_some_and(|piece| piece.ports.iter().any(|p| !p.endpoints.is_empty()));
            if size + cost > max && piece_has_endpoints {
                pieces.push(continuation.clone());
                size = continuation.encoded_len();
                open = false;
            }
            if !open {
                push_port(&mut pieces, &empty_port, &mut size, port_cost);
                open = true;
            }
            if let Some(filled) = pieces.last_mut().and_then(|piece| piece.ports.last_mut()) {
                filled.endpoints.push(endpoint.clone());
            }
            size += ENTRY_OVERHEAD + endpoint.encoded_len();
        }
    }
    pieces
}

/// Starts `port` (without endpoints) in the last piece.
fn push_port(pieces: &mut [ServiceEndpoints], port: &PortEndpoints, size: &mut usize, cost: usize) {
    if let Some(piece) = pieces.last_mut() {
        piece.ports.push(port.clone());
        *size += cost;
    }
}

/// Appends `piece`, a later piece of `set` (same key), to `set`: its first port continues the
/// set's last port when both are the same port (name and protocol), the others follow.
pub fn append(set: &mut ServiceEndpoints, piece: &ServiceEndpoints) {
    let mut ports = piece.ports.iter();
    if let (Some(last), Some(first)) = (set.ports.last_mut(), piece.ports.first())
        && last.port_name == first.port_name
        && last.protocol == first.protocol
    {
        last.endpoints.extend(first.endpoints.iter().cloned());
        ports.next();
    }
    set.ports.extend(ports.cloned());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1alpha1::{Endpoint, EndpointConditions, ObjectKey, Protocol};

    fn set(ports: usize, endpoints: usize, ipv6: bool) -> ServiceEndpoints {
        ServiceEndpoints {
            key: Some(ObjectKey {
                namespace: "demo".into(),
                name: "big".into(),
            }),
            ports: (0..ports)
                .map(|p| PortEndpoints {
                    port_name: format!("p{p}"),
                    protocol: Protocol::Tcp as i32,
                    endpoints: (0..endpoints)
                        .map(|e| Endpoint {
                            address: if ipv6 {
                                format!("fd00:1234:5678:9abc:def0:1234:{:x}:{:x}", e / 256, e % 256)
                            } else {
                                format!("10.{}.{}.{}", e / 65536, (e / 256) % 256, e % 256)
                            },
                            port: 8080,
                            conditions: Some(EndpointConditions {
                                ready: e % 7 == 0,
                                serving: true,
                                terminating: e % 7 != 0,
                            }),
                            node_name: format!("node-{}", e % 5000),
                            for_zones: vec![format!("zone-{}", e % 3)],
                            ..Endpoint::default()
                        })
                        .collect(),
                })
                .collect(),
            last_change_trigger_time: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 5,
            }),
            cluster_form: true,
        }
    }

    fn assembled(pieces: &[ServiceEndpoints]) -> ServiceEndpoints {
        let (first, rest) = pieces.split_first().expect("at least one piece");
        let mut whole = first.clone();
        for piece in rest {
            append(&mut whole, piece);
        }
        whole
    }

    #[test]
    fn a_full_ipv6_slice_behind_100_ports_comes_back_whole_from_pieces_within_the_limit() {
        let whole = set(100, 1000, true);
        assert!(
            whole.encoded_len() > 4 << 20,
            "{} bytes",
            whole.encoded_len()
        );
        let max = 32 * 1024;
        let pieces = split(&whole, max);
        assert!(pieces.len() > 100, "{} pieces", pieces.len());
        for (i, piece) in pieces.iter().enumerate() {
            assert!(
                piece.encoded_len() <= max,
                "piece {i}: {}",
                piece.encoded_len()
            );
            assert_eq!(piece.key, whole.key);
            assert_eq!(piece.last_change_trigger_time.is_some(), i == 0);
        }
        let back = assembled(&pieces);
        assert_eq!(back, whole);
        assert_eq!(crate::digest(&back), crate::digest(&whole));
    }

    #[test]
    fn pieces_break_inside_ports_and_between_them_alike() {
        let whole = set(7, 50, false);
        for max in [60, 200, 700, 1500, 5000] {
            let pieces = split(&whole, max);
            assert_eq!(assembled(&pieces), whole, "max {max}");
        }
    }

    #[test]
    fn a_set_within_the_limit_is_one_piece_and_an_oversized_endpoint_goes_alone() {
        let whole = set(2, 3, false);
        assert_eq!(split(&whole, 1 << 20), vec![whole.clone()]);
        let pieces = split(&whole, 1);
        assert_eq!(pieces.len(), 6, "one endpoint per piece: {pieces:?}");
        assert_eq!(assembled(&pieces), whole);
    }

    #[test]
    fn ports_without_endpoints_keep_their_place() {
        let mut whole = set(3, 4, false);
        whole.ports[1].endpoints.clear();
        for max in [40, 120, 400] {
            assert_eq!(assembled(&split(&whole, max)), whole, "max {max}");
        }
    }
}
