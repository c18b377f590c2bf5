//! A fake Kubernetes API server on 127.0.0.1 for the discovery tests: the pods of one
//! namespace, served as `LIST` (`/api/v1/namespaces/{ns}/pods`) and as `WATCH` streams
//! (`?watch=true`, line-delimited events from a resource version), the way the real
//! `kube` client talks to an API server. The test changes pods and the fake tells the live
//! watches; it can also expire the history (a `410 Gone` `ERROR` event, forcing a re-list),
//! sever every watch, or change pods silently (seen only by a re-list).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// A pod as the fake serves it.
#[derive(Debug, Clone)]
pub struct FakePod {
    pub name: String,
    pub uid: String,
    pub ip: Option<String>,
    pub ready: bool,
    pub labels: Vec<(String, String)>,
    pub annotations: Vec<(String, String)>,
}

impl FakePod {
    /// A ready, running pod `name` at `ip`, labelled `app=sim` and engine `sim`.
    pub fn ready(name: &str, ip: &str) -> Self {
        Self {
            name: name.to_owned(),
            uid: format!("uid-{name}"),
            ip: Some(ip.to_owned()),
            ready: true,
            labels: vec![
                ("app".into(), "sim".into()),
                ("ownerserve.io/engine".into(), "sim".into()),
            ],
            annotations: Vec::new(),
        }
    }

    fn json(&self, rv: u64) -> Value {
        let map = |kv: &[(String, String)]| -> Value {
            kv.iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect::<serde_json::Map<_, _>>()
                .into()
        };
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": self.name, "namespace": "test", "uid": self.uid,
                "resourceVersion": rv.to_string(),
                "labels": map(&self.labels), "annotations": map(&self.annotations),
                "managedFields": [{"manager": "kubelet", "operation": "Update"}]
            },
            "spec": {"containers": [{"name": "engine", "image": "sim"}]},
            "status": {
                "phase": "Running",
                "podIP": self.ip,
                "conditions": [{"type": "Ready", "status": if self.ready { "True" } else { "False" }}]
            }
        })
    }
}

#[derive(Default)]
struct Inner {
    pods: BTreeMap<String, (u64, FakePod)>,
    rv: u64,
    /// Events by resource version, from `horizon` on.
    log: Vec<(u64, &'static str, Value)>,
    horizon: u64,
    watches: Vec<mpsc::UnboundedSender<Bytes>>,
    lists: u64,
}

/// The fake API server's state, shared with its handlers.
#[derive(Clone, Default)]
pub struct FakeKube {
    inner: Arc<Mutex<Inner>>,
    /// The server's task (it ends with the test's runtime).
    tasks: tokio_util::task::TaskTracker,
}

impl FakeKube {
    /// Serves the fake on a free port of 127.0.0.1; returns it and its URL.
    pub async fn start() -> (FakeKube, String) {
        let fake = FakeKube::default();
        let app = Router::new()
            .route("/api/v1/namespaces/{ns}/pods", get(pods))
            .with_state(fake.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        fake.tasks
            .spawn(async move { axum::serve(listener, app).await });
        (fake, url)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds or changes a pod, telling the watches.
    pub fn apply(&self, pod: FakePod) {
        let mut s = self.lock();
        s.rv += 1;
        let rv = s.rv;
        let kind = if s.pods.contains_key(&pod.name) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        let object = pod.json(rv);
        s.pods.insert(pod.name.clone(), (rv, pod));
        broadcast(&mut s, rv, kind, object);
    }

    /// Deletes a pod, telling the watches.
    pub fn delete(&self, name: &str) {
        let mut s = self.lock();
        let Some((_, pod)) = s.pods.remove(name) else {
            return;
        };
        s.rv += 1;
        let rv = s.rv;
        broadcast(&mut s, rv, "DELETED", pod.json(rv));
    }

    /// Changes the pods without any event (what only a re-list shows).
    pub fn silently(&self, change: impl FnOnce(&mut BTreeMap<String, FakePod>)) {
        let mut s = self.lock();
        let mut pods: BTreeMap<String, FakePod> = s
            .pods
            .values()
            .map(|(_, p)| (p.name.clone(), p.clone()))
            .collect();
        change(&mut pods);
        s.rv += 1;
        let rv = s.rv;
        s.pods = pods.into_iter().map(|(k, p)| (k, (rv, p))).collect();
    }

    /// Forgets the history and ends every watch with `410 Gone`: the client must re-list.
    pub fn expire(&self) {
        let mut s = self.lock();
        s.horizon = s.rv;
        s.log.clear();
        let gone = json!({"type": "ERROR", "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "too old resource version", "reason": "Expired", "code": 410}});
        let line = Bytes::from(format!("{gone}\n"));
        for w in s.watches.drain(..) {
            let _ = w.send(line.clone());
        }
    }

    /// Cuts every watch stream (a load balancer dropping idle connections).
    pub fn sever(&self) {
        self.lock().watches.clear();
    }

    /// How many times the pods were listed.
    pub fn lists(&self) -> u64 {
        self.lock().lists
    }

    /// How many watches are open.
    pub fn watching(&self) -> usize {
        let mut s = self.lock();
        s.watches.retain(|w| !w.is_closed());
        s.watches.len()
    }
}

fn broadcast(s: &mut Inner, rv: u64, kind: &'static str, object: Value) {
    let line = Bytes::from(format!("{}\n", json!({"type": kind, "object": object})));
    s.log.push((rv, kind, object));
    s.watches.retain(|w| w.send(line.clone()).is_ok());
}

fn selected(pod: &FakePod, selector: Option<&str>) -> bool {
    selector.is_none_or(|sel| {
        sel.split(',').filter(|t| !t.is_empty()).all(|term| {
            let (k, v) = term.split_once('=').unwrap_or((term, ""));
            pod.labels.iter().any(|(lk, lv)| lk == k && lv == v)
        })
    })
}

/// The query string's pairs, percent-decoded.
fn query(raw: Option<&str>) -> BTreeMap<String, String> {
    let decode = |s: &str| {
        let b = s.replace('+', " ").into_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok());
            match (b[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
                (b'%', Some(v)) => {
                    out.push(v);
                    i += 3;
                }
                (c, _) => {
                    out.push(c);
                    i += 1;
                }
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    raw.unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

async fn pods(State(fake): State<FakeKube>, RawQuery(raw): RawQuery) -> Response {
    let q = query(raw.as_deref());
    let selector = q.get("labelSelector").map(String::as_str);
    if q.get("watch").map(String::as_str) == Some("true") {
        return watch(&fake, &q, selector);
    }
    let mut s = fake.lock();
    s.lists += 1;
    let items: Vec<Value> = s
        .pods
        .values()
        .filter(|(_, p)| selected(p, selector))
        .map(|(rv, p)| p.json(*rv))
        .collect();
    let body = json!({"apiVersion": "v1", "kind": "PodList",
        "metadata": {"resourceVersion": s.rv.to_string()}, "items": items});
    axum::Json(body).into_response()
}

fn watch(fake: &FakeKube, q: &BTreeMap<String, String>, selector: Option<&str>) -> Response {
    let from: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
    {
        let mut s = fake.lock();
        if from < s.horizon {
            drop(s);
            fake.expire_one(&tx);
        } else {
            for (rv, kind, object) in s.log.iter().filter(|(rv, ..)| *rv > from) {
                let _ = rv;
                let line = format!("{}\n", json!({"type": kind, "object": object}));
                let _ = tx.send(Bytes::from(line));
            }
            s.watches.push(tx);
        }
    }
    let _ = selector;
    let stream = futures_util::stream::poll_fn(move |cx| {
        rx.poll_recv(cx).map(|o| o.map(Ok::<_, Infallible>))
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap()
}

impl FakeKube {
    fn expire_one(&self, tx: &mpsc::UnboundedSender<Bytes>) {
        let gone = json!({"type": "ERROR", "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "too old resource version", "reason": "Expired", "code": 410}});
        let _ = tx.send(Bytes::from(format!("{gone}\n")));
    }
}
