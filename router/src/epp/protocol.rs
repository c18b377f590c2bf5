//! The endpoint-picker protocol on Envoy's ext_proc messages (GIE's proposal 004): the
//! headers and metadata keys, reading the gateway's subset hint and served endpoint, and
//! building the answers (the pick as a header mutation plus `envoy.lb` dynamic metadata,
//! an immediate error response, a body passed back in full-duplex streaming).

use std::collections::HashMap;

use axum::http::{HeaderMap, HeaderName, HeaderValue as HttpValue};
use envoy_types::pb::envoy::config::core::v3::{
    HeaderMap as ProtoHeaders, HeaderValue, HeaderValueOption, Metadata,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_response, BodyMutation, BodyResponse, CommonResponse, HeaderMutation,
    HeadersResponse, ImmediateResponse, ProcessingRequest, ProcessingResponse,
    StreamedBodyResponse, TrailersResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};

/// The kinds of answer (`ProcessingResponse.response`).
pub use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as ProcessingResponseKind;

/// The picked endpoints, `ip:port[,ip:port...]`, in the header and in `envoy.lb` metadata.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// The gateway's candidate endpoints, in the `envoy.lb.subset_hint` metadata namespace.
pub const SUBSET: &str = "x-gateway-destination-endpoint-subset";
/// The endpoint that actually served, in `envoy.lb` metadata (or a response header).
pub const SERVED: &str = "x-gateway-destination-endpoint-served";
/// The metadata namespace of the pick and of the served endpoint.
pub const LB_NAMESPACE: &str = "envoy.lb";
/// The metadata namespace of the subset hint.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
/// `HeaderValueOption.append_action` OVERWRITE_IF_EXISTS_OR_ADD.
const OVERWRITE: i32 = 2;
/// The ext_proc attribute with the upstream's address, another source of the served one.
const UPSTREAM_ADDRESS: &str = "upstream.address";

/// `processing_mode.request_body_mode` values Envoy announces in `protocol_config`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyMode {
    /// The body arrives in one message after the headers were answered.
    Buffered,
    /// Headers and body chunks arrive without waiting; the headers' answer is held until
    /// the body ends, and the body is passed back in streamed responses.
    FullDuplex,
}

impl BodyMode {
    /// From `ProtocolConfiguration.request_body_mode` (4 is `FULL_DUPLEX_STREAMED`).
    pub fn of(request_body_mode: i32) -> Self {
        if request_body_mode == 4 {
            BodyMode::FullDuplex
        } else {
            BodyMode::Buffered
        }
    }
}

/// Envoy's headers as an HTTP header map (pseudo-headers skipped), and the `:path`.
pub fn http_headers(proto: Option<&ProtoHeaders>) -> (HeaderMap, String) {
    let mut out = HeaderMap::new();
    let mut path = String::new();
    for h in proto.map(|p| p.headers.as_slice()).unwrap_or_default() {
        let value = if h.raw_value.is_empty() {
            h.value.as_bytes()
        } else {
            &h.raw_value
        };
        if h.key == ":path" {
            path = String::from_utf8_lossy(value).into_owned();
            continue;
        }
        if let (Ok(name), Ok(v)) = (
            HeaderName::from_bytes(h.key.as_bytes()),
            HttpValue::from_bytes(value),
        ) {
            out.append(name, v);
        }
    }
    (out, path)
}

/// The gateway's subset hint, if it sent one (a list of strings, or one comma-separated
/// string).
pub fn subset_hint(req: &ProcessingRequest) -> Option<Vec<String>> {
    let value = field(req.metadata_context.as_ref(), SUBSET_NAMESPACE, SUBSET)?;
    Some(strings(value))
}

/// The endpoint that served: `envoy.lb`'s served key, else the response header, else the
/// upstream address attribute.
pub fn served_endpoint(req: &ProcessingRequest, headers: &HeaderMap) -> Option<String> {
    if let Some(v) = field(req.metadata_context.as_ref(), LB_NAMESPACE, SERVED) {
        return strings(v).into_iter().next();
    }
    if let Some(v) = headers.get(SERVED).and_then(|v| v.to_str().ok()) {
        return Some(v.to_owned());
    }
    req.attributes
        .values()
        .find_map(|s| s.fields.get(UPSTREAM_ADDRESS))
        .and_then(|v| strings(v).into_iter().next())
}

fn field<'a>(meta: Option<&'a Metadata>, namespace: &str, key: &str) -> Option<&'a Value> {
    meta?.filter_metadata.get(namespace)?.fields.get(key)
}

fn strings(v: &Value) -> Vec<String> {
    match &v.kind {
        Some(Kind::StringValue(s)) => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        Some(Kind::ListValue(l)) => l.values.iter().flat_map(strings).collect(),
        _ => Vec::new(),
    }
}

fn string_value(s: String) -> Value {
    Value {
        kind: Some(Kind::StringValue(s)),
    }
}

/// The pick as a common response: the destination header set, the route cache cleared.
fn pick_common(endpoints: &str) -> CommonResponse {
    CommonResponse {
        header_mutation: Some(HeaderMutation {
            set_headers: vec![HeaderValueOption {
                header: Some(HeaderValue {
                    key: DESTINATION.to_owned(),
                    value: String::new(),
                    raw_value: endpoints.as_bytes().to_vec(),
                }),
                // A client's own value never survives (OVERWRITE_IF_EXISTS_OR_ADD).
                append_action: OVERWRITE,
                ..HeaderValueOption::default()
            }],
            remove_headers: Vec::new(),
        }),
        clear_route_cache: true,
        ..CommonResponse::default()
    }
}

/// The pick's `envoy.lb` dynamic metadata (the same value as the header).
fn pick_metadata(endpoints: &str) -> Struct {
    let lb = Struct {
        fields: HashMap::from([(DESTINATION.to_owned(), string_value(endpoints.to_owned()))]),
    };
    Struct {
        fields: HashMap::from([(
            LB_NAMESPACE.to_owned(),
            Value {
                kind: Some(Kind::StructValue(lb)),
            },
        )]),
    }
}

/// The pick answered on the request headers (full duplex, or a request without a body).
pub fn pick_on_headers(endpoints: &str) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::RequestHeaders(
            HeadersResponse {
                response: Some(pick_common(endpoints)),
            },
        )),
        dynamic_metadata: Some(pick_metadata(endpoints)),
        ..ProcessingResponse::default()
    }
}

/// The pick answered on the buffered request body.
pub fn pick_on_body(endpoints: &str) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::RequestBody(BodyResponse {
            response: Some(pick_common(endpoints)),
        })),
        dynamic_metadata: Some(pick_metadata(endpoints)),
        ..ProcessingResponse::default()
    }
}

/// "Go on unchanged" for the request's or the response's headers.
pub fn continue_headers(response_side: bool) -> ProcessingResponse {
    let h = HeadersResponse { response: None };
    let response = if response_side {
        processing_response::Response::ResponseHeaders(h)
    } else {
        processing_response::Response::RequestHeaders(h)
    };
    ProcessingResponse {
        response: Some(response),
        ..ProcessingResponse::default()
    }
}

/// "Go on unchanged" for a buffered response body chunk.
pub fn continue_response_body() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::ResponseBody(BodyResponse {
            response: None,
        })),
        ..ProcessingResponse::default()
    }
}

/// A body chunk passed back in full-duplex streaming (`response_side`: the response's).
pub fn streamed_body(
    body: Vec<u8>,
    end_of_stream: bool,
    response_side: bool,
) -> ProcessingResponse {
    let common = CommonResponse {
        body_mutation: Some(BodyMutation {
            mutation: Some(body_mutation::Mutation::StreamedResponse(
                StreamedBodyResponse {
                    body,
                    end_of_stream,
                    ..StreamedBodyResponse::default()
                },
            )),
        }),
        ..CommonResponse::default()
    };
    let r = BodyResponse {
        response: Some(common),
    };
    ProcessingResponse {
        response: Some(if response_side {
            processing_response::Response::ResponseBody(r)
        } else {
            processing_response::Response::RequestBody(r)
        }),
        ..ProcessingResponse::default()
    }
}

/// "Go on unchanged" for trailers.
pub fn continue_trailers(response_side: bool) -> ProcessingResponse {
    let t = TrailersResponse::default();
    ProcessingResponse {
        response: Some(if response_side {
            processing_response::Response::ResponseTrailers(t)
        } else {
            processing_response::Response::RequestTrailers(t)
        }),
        ..ProcessingResponse::default()
    }
}

/// The gateway answers the client at once with `status` and `body` (a JSON error).
pub fn immediate(status: u16, body: Vec<u8>) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::ImmediateResponse(
            ImmediateResponse {
                status: Some(HttpStatus {
                    code: i32::from(status),
                }),
                headers: Some(HeaderMutation {
                    set_headers: vec![HeaderValueOption {
                        header: Some(HeaderValue {
                            key: "content-type".to_owned(),
                            value: String::new(),
                            raw_value: b"application/json".to_vec(),
                        }),
                        ..HeaderValueOption::default()
                    }],
                    remove_headers: Vec::new(),
                }),
                body,
                ..ImmediateResponse::default()
            },
        )),
        ..ProcessingResponse::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::ListValue;

    fn with_lb(namespace: &str, key: &str, v: Value) -> ProcessingRequest {
        ProcessingRequest {
            metadata_context: Some(Metadata {
                filter_metadata: HashMap::from([(
                    namespace.to_owned(),
                    Struct {
                        fields: HashMap::from([(key.to_owned(), v)]),
                    },
                )]),
                ..Metadata::default()
            }),
            ..ProcessingRequest::default()
        }
    }

    #[test]
    fn the_subset_hint_is_a_list_or_a_comma_string_and_absent_is_none() {
        let list = Value {
            kind: Some(Kind::ListValue(ListValue {
                values: vec![
                    string_value("10.0.0.1:8000".into()),
                    string_value("10.0.0.2:8000".into()),
                ],
            })),
        };
        let got = subset_hint(&with_lb(SUBSET_NAMESPACE, SUBSET, list));
        assert_eq!(
            got,
            Some(vec!["10.0.0.1:8000".into(), "10.0.0.2:8000".into()])
        );
        let s = string_value("10.0.0.1:8000, 10.0.0.3:8000".into());
        let got = subset_hint(&with_lb(SUBSET_NAMESPACE, SUBSET, s));
        assert_eq!(
            got,
            Some(vec!["10.0.0.1:8000".into(), "10.0.0.3:8000".into()])
        );
        assert_eq!(subset_hint(&ProcessingRequest::default()), None);
        let empty = string_value(String::new());
        assert_eq!(
            subset_hint(&with_lb(SUBSET_NAMESPACE, SUBSET, empty)),
            Some(vec![])
        );
    }

    #[test]
    fn the_pick_is_the_same_in_the_header_and_the_metadata() {
        let r = pick_on_body("10.0.0.1:8000,10.0.0.2:8000");
        let Some(processing_response::Response::RequestBody(b)) = &r.response else {
            panic!("a body response");
        };
        let common = b.response.as_ref().expect("common");
        assert!(common.clear_route_cache);
        let header = &common
            .header_mutation
            .as_ref()
            .expect("mutation")
            .set_headers[0];
        let header = header.header.as_ref().expect("header");
        assert_eq!(header.key, DESTINATION);
        let lb = r
            .dynamic_metadata
            .as_ref()
            .expect("metadata")
            .fields
            .get(LB_NAMESPACE);
        let Some(Value {
            kind: Some(Kind::StructValue(lb)),
        }) = lb
        else {
            panic!("envoy.lb struct");
        };
        assert_eq!(
            strings(lb.fields.get(DESTINATION).expect("destination")).join(","),
            String::from_utf8_lossy(&header.raw_value)
        );
    }

    #[test]
    fn the_served_endpoint_comes_from_metadata_then_header() {
        let r = with_lb(LB_NAMESPACE, SERVED, string_value("10.0.0.9:8000".into()));
        assert_eq!(
            served_endpoint(&r, &HeaderMap::new()).as_deref(),
            Some("10.0.0.9:8000")
        );
        let mut h = HeaderMap::new();
        h.insert(SERVED, HttpValue::from_static("10.0.0.8:8000"));
        assert_eq!(
            served_endpoint(&ProcessingRequest::default(), &h).as_deref(),
            Some("10.0.0.8:8000")
        );
    }
}
