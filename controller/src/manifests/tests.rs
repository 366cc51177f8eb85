use super::*;

const WEB: &str = include_str!("../../tests/fixtures/web.yaml");

fn service_names(objects: &Objects) -> Vec<String> {
    objects
        .services
        .keys()
        .map(|(ns, n)| format!("{ns}/{n}"))
        .collect()
}

#[test]
fn kubectl_lists_and_multi_document_files_are_read() {
    let objects = parse_documents(WEB).expect("fixture parses");
    let kinds: Vec<&str> = objects
        .iter()
        .map(|o| match o {
            Object::Service(_) => "Service",
            Object::EndpointSlice(_) => "EndpointSlice",
            Object::Node(_) => "Node",
            Object::ServiceCidr(_) => "ServiceCIDR",
        })
        .collect();
    assert_eq!(kinds, ["Service", "EndpointSlice", "EndpointSlice", "Node"]);
}

#[test]
fn other_kinds_are_ignored() {
    let objects =
        parse_documents("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n").expect("valid");
    assert!(objects.is_empty());
}

#[test]
fn an_invalid_document_names_its_position() {
    let err = parse_documents("apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\n: : bad")
        .expect_err("invalid");
    assert!(err.to_string().starts_with("document 2"), "{err}");
}

#[test]
fn a_file_that_stops_parsing_keeps_its_last_good_objects_and_a_removed_file_loses_them() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("web.yaml"), WEB).expect("write");
    std::fs::write(
        dir.path().join("other.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: other, namespace: demo}\nspec: {clusterIP: 10.96.0.11, ports: [{port: 80}]}\n",
    )
    .expect("write");
    let mut source = ManifestsDir::new(dir.path());
    assert_eq!(
        service_names(&source.rescan().expect("readable")),
        ["demo/other", "demo/web"]
    );

    std::fs::write(dir.path().join("web.yaml"), "kind: [unclosed").expect("write");
    assert_eq!(
        service_names(&source.rescan().expect("readable")),
        ["demo/other", "demo/web"]
    );

    std::fs::remove_file(dir.path().join("web.yaml")).expect("remove");
    assert_eq!(
        service_names(&source.rescan().expect("readable")),
        ["demo/other"]
    );
}

/// A Service manifest named `name` in `demo`.
fn service_manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: demo}}\nspec: {{clusterIP: 10.96.0.11, ports: [{{port: 80}}]}}\n"
    )
}

#[test]
fn a_refresh_reads_only_the_paths_named_and_drops_the_ones_gone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = |name: &str| dir.path().join(name);
    for name in ["a", "b", "c"] {
        std::fs::write(path(&format!("{name}.yaml")), service_manifest(name)).expect("write");
    }
    let mut source = ManifestsDir::new(dir.path());
    let objects = source.rescan().expect("readable");
    assert_eq!(service_names(&objects), ["demo/a", "demo/b", "demo/c"]);

    std::fs::write(path("a.yaml"), service_manifest("a2")).expect("write");
    std::fs::write(path("b.yaml"), service_manifest("b2")).expect("write");
    std::fs::remove_file(path("c.yaml")).expect("remove");
    std::fs::write(path("d.yaml"), service_manifest("d")).expect("write");
    std::fs::write(path(".e.yaml"), service_manifest("e")).expect("write");
    let named = ["a.yaml", "c.yaml", "d.yaml", ".e.yaml"].map(path);
    assert_eq!(
        service_names(&source.refresh(named)),
        ["demo/a2", "demo/b", "demo/d"],
        "b.yaml was not named, the hidden file is not a manifest"
    );

    std::fs::write(path("d.yaml"), "kind: [unclosed").expect("write");
    assert_eq!(
        service_names(&source.refresh([path("d.yaml"), path("b.yaml")])),
        ["demo/a2", "demo/b2", "demo/d"],
        "a file that stops parsing keeps its last good objects"
    );
}

#[tokio::test]
async fn a_file_replaced_by_rename_is_picked_up_while_running() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("web.yaml"), WEB).expect("write");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let source = ManifestsDir::new(dir.path());
    let task = tokio::spawn(source.run(move |objects| {
        let _ = tx.send(service_names(&objects));
    }));
    assert_eq!(rx.recv().await.expect("first scan"), ["demo/web"]);

    let replacement = dir.path().join(".web.yaml.tmp");
    std::fs::write(
        &replacement,
        WEB.replace(
            "name: web\n  namespace: demo\nspec",
            "name: web2\n  namespace: demo\nspec",
        ),
    )
    .expect("write");
    std::fs::rename(&replacement, dir.path().join("web.yaml")).expect("rename");
    let names = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let names = rx.recv().await.expect("source running");
            if names != ["demo/web"] {
                return names;
            }
        }
    })
    .await
    .expect("change seen within a minute");
    assert_eq!(names, ["demo/web2"]);
    task.abort();
}

#[test]
fn objects_kept_by_key_equal_the_files_read_whole_with_the_last_file_winning() {
    use rand::{Rng, SeedableRng};
    let dir = tempfile::tempdir().expect("temp dir");
    let files = ["a.yaml", "b.yaml", "c.yaml", "d.yaml"].map(|name| dir.path().join(name));
    // Four Services, a slice and a node that several files may hold at once, in several forms.
    let object = |rng: &mut rand::rngs::StdRng| match rng.random_range(0..3) {
        0 => format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{}, namespace: demo}}\nspec: {{clusterIP: 10.96.0.11, ports: [{{port: {}}}]}}\n",
            rng.random_range(0..4),
            rng.random_range(80..83)
        ),
        1 => format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: slice, namespace: demo, labels: {{kubernetes.io/service-name: svc-{}}}}}\naddressType: IPv4\nendpoints: []\n",
            rng.random_range(0..4)
        ),
        _ => format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: node, labels: {{zone: z{}}}}}\n",
            rng.random_range(0..3)
        ),
    };
    for seed in 1..=10 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut source = ManifestsDir::new(dir.path());
        for file in &files {
            let _ = std::fs::remove_file(file);
        }
        source.rescan().expect("readable");
        for step in 0..40 {
            let file = &files[rng.random_range(0..files.len())];
            if rng.random_ratio(1, 4) {
                let _ = std::fs::remove_file(file);
            } else {
                let documents: Vec<String> = (0..rng.random_range(1..4))
                    .map(|_| object(&mut rng))
                    .collect();
                std::fs::write(file, documents.join("---\n")).expect("write");
            }
            let kept = if rng.random_ratio(1, 5) {
                source.rescan().expect("readable")
            } else {
                source.refresh([file.clone()])
            };
            let mut whole = Vec::new();
            for file in files.iter().filter(|file| file.exists()) {
                let text = std::fs::read_to_string(file).expect("readable");
                whole.extend(parse_documents(&text).expect("parses"));
            }
            let whole = Objects::from_manifests(&whole);
            let context = format!("seed {seed}, step {step}");
            assert_eq!(kept.services, whole.services, "{context}");
            assert_eq!(kept.slices, whole.slices, "{context}");
            assert_eq!(kept.nodes, whole.nodes, "{context}");
        }
    }
}
