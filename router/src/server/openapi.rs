//! `GET /admin/v1/openapi.json`: the router's OpenAPI document, `docs/openapi.json`,
//! written by hand and held by the tests below to the routes the router serves.

use axum::http::header;
use axum::response::{IntoResponse, Response};

/// `docs/openapi.json`.
const DOCUMENT: &str = include_str!("../../../docs/openapi.json");

/// `GET /admin/v1/openapi.json` (read scope).
pub(super) async fn document() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], DOCUMENT).into_response()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::Value;

    use super::*;
    use crate::api::endpoints::ENDPOINTS;

    /// Routes `app` serves outside the client API and the operator API.
    const PROBES: [(&str, &str); 3] = [
        ("/health", "get"),
        ("/metrics", "get"),
        ("/metrics/targets", "get"),
    ];

    const METHODS: [&str; 8] = [
        "get", "put", "post", "delete", "options", "head", "patch", "trace",
    ];

    fn parsed() -> Value {
        serde_json::from_str(DOCUMENT).expect("docs/openapi.json is JSON")
    }

    /// Every route the router can serve: the client API, the probes, its operator API and
    /// the directory's (a remote cluster's through `replica_admin`, or the embedded node's,
    /// as that node's own document lists them).
    fn served() -> BTreeSet<(String, String)> {
        let mut out = BTreeSet::new();
        let mut add = |path: &str, method: &str| {
            out.insert((path.to_owned(), method.to_ascii_lowercase()));
        };
        for e in &ENDPOINTS {
            add(e.path, e.method.as_str());
        }
        for (path, method) in PROBES {
            add(path, method);
        }
        for (path, method, _) in crate::server::admin_routes() {
            add(path, method.as_str());
        }
        for (path, method, _) in crate::ownership::replica_admin::table() {
            add(path, method.as_str());
        }
        let node = ownerserve_ownership::node::admin::document();
        for (path, ops) in node["paths"].as_object().expect("the node's paths") {
            for method in ops.as_object().expect("operations").keys() {
                add(path, method);
            }
        }
        out
    }

    fn documented(doc: &Value) -> BTreeSet<(String, String)> {
        let paths = doc["paths"].as_object().expect("paths is an object");
        paths
            .iter()
            .flat_map(|(path, item)| {
                let item = item.as_object().expect("a path item is an object");
                item.keys()
                    .filter(|k| METHODS.contains(&k.as_str()))
                    .map(|m| (path.clone(), m.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn the_openapi_document_names_every_route_served_and_no_other() {
        let doc = parsed();
        assert!(
            doc["openapi"]
                .as_str()
                .is_some_and(|v| v.starts_with("3.1")),
            "OpenAPI 3.1"
        );
        let (served, documented) = (served(), documented(&doc));
        let missing: Vec<_> = served.difference(&documented).collect();
        let extra: Vec<_> = documented.difference(&served).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "served but not in docs/openapi.json: {missing:?}; in docs/openapi.json but not served: {extra:?}"
        );
    }

    #[test]
    fn the_openapi_document_is_canonical_and_its_references_resolve() {
        let doc = parsed();
        assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
        // Sorted keys, two-space indents (`jq -S .` prints the same): diffs stay small.
        let canonical = serde_json::to_string_pretty(&doc).unwrap();
        assert!(
            DOCUMENT.trim_end() == canonical,
            "docs/openapi.json is not in canonical form: rewrite it with `jq -S . docs/openapi.json`"
        );
        let mut refs = Vec::new();
        collect_refs(&doc, &mut refs);
        assert!(!refs.is_empty());
        for r in refs {
            let pointer = r.strip_prefix('#').unwrap_or_else(|| panic!("{r}: local"));
            assert!(doc.pointer(pointer).is_some(), "{r} resolves");
        }
    }

    fn collect_refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("$ref", Value::String(r)) => out.push(r.clone()),
                        _ => collect_refs(v, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| collect_refs(v, out)),
            _ => {}
        }
    }

    #[tokio::test]
    async fn the_openapi_document_is_served_as_json() {
        let r = document().await;
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        let bytes = axum::body::to_bytes(r.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(bytes, DOCUMENT.as_bytes());
    }
}
