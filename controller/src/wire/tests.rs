use super::*;
use prost_types::FileDescriptorSet;

fn service(name: &str) -> pb::Service {
    pb::Service {
        key: Some(pb::ObjectKey {
            namespace: "demo".into(),
            name: name.into(),
        }),
        cluster_ips: vec!["10.96.0.10".into()],
        ..Default::default()
    }
}

fn endpoints(name: &str) -> pb::ServiceEndpoints {
    pb::ServiceEndpoints {
        key: Some(pb::ObjectKey {
            namespace: "demo".into(),
            name: name.into(),
        }),
        ..Default::default()
    }
}

/// A response with every field set.
fn everything() -> pb::SyncResponse {
    let key = |name: &str| pb::ObjectKey {
        namespace: "demo".into(),
        name: name.into(),
    };
    pb::SyncResponse {
        controller_epoch: "epoch".into(),
        revision: 7,
        reset: true,
        complete: true,
        upserted_services: vec![service("web"), service("db")],
        removed_services: vec![key("old")],
        upserted_endpoints: vec![endpoints("web")],
        removed_endpoints: vec![key("db")],
        trace_context: Some(pb::TraceContext {
            traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
            tracestate: String::new(),
        }),
        node_status: Some(pb::NodeStatus {
            eligible: true,
            ..Default::default()
        }),
        replaced_buckets: Some(pb::ReplacedBuckets {
            bucket_count: 16,
            buckets: vec![3],
        }),
        base_revision: 6,
        appended_endpoints: vec![endpoints("web")],
    }
}

#[test]
fn the_wire_form_carries_every_field_of_the_generated_message() {
    let descriptors =
        FileDescriptorSet::decode(splitproxy_proto::FILE_DESCRIPTOR_SET).expect("descriptors");
    let generated = (descriptors.file.iter())
        .filter(|file| file.package() == "splitproxy.v1alpha1")
        .flat_map(|file| &file.message_type)
        .find(|message| message.name() == "SyncResponse")
        .expect("SyncResponse is declared");
    let numbers: Vec<i32> = generated.field.iter().map(|f| f.number()).collect();
    assert_eq!(
        numbers,
        (1..=13).collect::<Vec<_>>(),
        "a field was added to SyncResponse: add it to wire::SyncResponse too"
    );

    let original = everything();
    let encoded = original.encode_to_vec();
    let wire = SyncResponse::decode(&*encoded).expect("the wire form decodes it");
    assert_eq!(
        wire.encode_to_vec(),
        encoded,
        "the same bytes, field for field"
    );
    assert_eq!(wire.upserted_services.len(), 2);
}

#[test]
fn an_entry_is_encoded_once_per_state_and_decodes_as_the_generated_message() {
    let encodings = Encodings::default();
    let web = Arc::new(service("web"));
    let first = encodings.of(&web);
    let again = encodings.of(&web);
    assert_eq!(first.as_ptr(), again.as_ptr(), "the same bytes, shared");
    assert_eq!(pb::Service::decode(&*first).expect("decodes"), *web);

    // An equal entry elsewhere is another entry, with its own encoding.
    let copy = Arc::new(service("web"));
    assert_ne!(encodings.of(&copy).as_ptr(), first.as_ptr());

    let response = SyncResponse {
        upserted_services: vec![first],
        upserted_endpoints: vec![encodings.of(&Arc::new(endpoints("web")))],
        ..Default::default()
    };
    let decoded = pb::SyncResponse::decode(&*response.encode_to_vec()).expect("decodes");
    assert_eq!(decoded.upserted_services, [service("web")]);
    assert_eq!(decoded.upserted_endpoints, [endpoints("web")]);
}
