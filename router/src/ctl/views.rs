//! How `ctl` shows each answer of the operator API: tables for lists, key/value lines for
//! one object. Missing fields show as `-`, so an older or newer server still prints.

use serde_json::Value;

use super::table::Table;

/// A JSON value as a table cell.
fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".to_owned(),
        Value::Bool(b) => if *b { "yes" } else { "no" }.to_owned(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        Value::Array(a) if a.is_empty() => "-".to_owned(),
        Value::Array(a) => a.iter().map(cell).collect::<Vec<_>>().join(","),
        Value::Object(_) => v.to_string(),
    }
}

/// A list under `key` as rows.
fn rows<'a>(answer: &'a Value, key: &str) -> &'a [Value] {
    answer[key].as_array().map_or(&[], Vec::as_slice)
}

/// One object as `key: value` lines, in the server's order.
fn fields(v: &Value) -> String {
    let Some(obj) = v.as_object() else {
        return cell(v) + "\n";
    };
    let width = obj.keys().map(String::len).max().unwrap_or(0);
    obj.iter()
        .map(|(k, v)| format!("{k:<width$}  {}\n", cell(v)))
        .collect()
}

fn owner_cells(o: &Value) -> Vec<String> {
    let copies: Vec<String> = o["locations"]
        .as_array()
        .map(|l| {
            l.iter()
                .map(|x| format!("{}:{}", cell(&x["worker"]), cell(&x["tier"]).to_lowercase()))
                .collect()
        })
        .unwrap_or_default();
    vec![
        cell(&o["key"]),
        cell(&o["owner"]["worker"]),
        cell(&o["owner"]["lease"]),
        cell(&o["epoch"]),
        format!("{}..{}", cell(&o["blocks"][0]), cell(&o["blocks"][1])),
        if copies.is_empty() {
            "-".to_owned()
        } else {
            copies.join(",")
        },
        cell(&o["ref_count"]),
        cell(&o["needs_recompute"]),
    ]
}

const OWNER_HEADERS: [&str; 8] = [
    "KEY",
    "WORKER",
    "LEASE",
    "EPOCH",
    "BLOCKS",
    "COPIES",
    "REFS",
    "RECOMPUTE",
];

/// `GET /admin/v1/owners`.
pub fn owners(answer: &Value) -> String {
    let mut t = Table::new(&OWNER_HEADERS);
    for o in rows(answer, "owners") {
        t.row(owner_cells(o));
    }
    t.render()
}

/// `GET /admin/v1/owners/{key}`.
pub fn owner(answer: &Value) -> String {
    let mut t = Table::new(&OWNER_HEADERS);
    t.row(owner_cells(answer));
    t.render()
}

fn lease_cells(l: &Value) -> Vec<String> {
    vec![
        cell(&l["id"]),
        cell(&l["worker"]),
        cell(&l["ttl_ms"]),
        cell(&l["remaining_ms"]),
        l["keys"].as_array().map_or(0, Vec::len).to_string(),
    ]
}

const LEASE_HEADERS: [&str; 5] = ["ID", "WORKER", "TTL_MS", "REMAINING_MS", "KEYS"];

/// `GET /admin/v1/leases`.
pub fn leases(answer: &Value) -> String {
    let mut t = Table::new(&LEASE_HEADERS);
    for l in rows(answer, "leases") {
        t.row(lease_cells(l));
    }
    t.render()
}

/// `GET /admin/v1/leases/{id}`.
pub fn lease(answer: &Value) -> String {
    let mut t = Table::new(&LEASE_HEADERS);
    t.row(lease_cells(answer));
    t.render()
}

fn session_cells(s: &Value) -> Vec<String> {
    vec![
        cell(&s["id"]),
        cell(&s["owner"]["worker"]),
        cell(&s["epoch"]),
        cell(&s["prefix"]),
        cell(&s["tail_tokens"]),
        cell(&s["root"]),
        // A fork's parent session, else the agent that spawned it.
        cell(if s["parent"].is_null() {
            &s["agent_parent"]
        } else {
            &s["parent"]
        }),
        cell(&s["forks"]),
        cell(&s["pinned"]),
        cell(&s["predicted_tool_gap_ms"]),
    ]
}

const SESSION_HEADERS: [&str; 10] = [
    "ID", "WORKER", "EPOCH", "PREFIX", "TAIL", "ROOT", "PARENT", "FORKS", "PINNED", "GAP_MS",
];

/// `GET /admin/v1/sessions`.
pub fn sessions(answer: &Value) -> String {
    let mut t = Table::new(&SESSION_HEADERS);
    for s in rows(answer, "sessions") {
        t.row(session_cells(s));
    }
    t.render()
}

/// `GET /admin/v1/sessions/{id}`.
pub fn session(answer: &Value) -> String {
    let mut t = Table::new(&SESSION_HEADERS);
    t.row(session_cells(answer));
    t.render()
}

/// `GET /admin/v1/lifecycle`: what session admission counts, then one row per session.
pub fn lifecycle(answer: &Value) -> String {
    let per_model = |key: &str| {
        answer[key]
            .as_object()
            .filter(|m| !m.is_empty())
            .map_or_else(
                || "-".to_owned(),
                |m| {
                    m.iter()
                        .map(|(k, v)| format!("{k} {}", cell(v)))
                        .collect::<Vec<_>>()
                        .join(", ")
                },
            )
    };
    let mut out = format!(
        "lifecycle: {}, admission: {}, sessions: {}\nlive tokens: {}\nadmitted, not started: {}\n",
        cell(&answer["lifecycle"]),
        cell(&answer["admission"]),
        cell(&answer["count"]),
        per_model("live_tokens"),
        per_model("admitted_tokens"),
    );
    let mut t = Table::new(&[
        "SESSION",
        "OWNER",
        "MODEL",
        "TOKENS",
        "IN_FLIGHT",
        "IDLE_MS",
        "HOLD",
        "KV",
        "WAITS_ON",
    ]);
    for s in rows(answer, "sessions") {
        t.row(vec![
            cell(&s["session"]),
            cell(&s["owner"]),
            cell(&s["model"]),
            cell(&s["tokens"]),
            cell(&s["in_flight"]),
            cell(&s["idle_ms"]),
            cell(&s["hold"]),
            cell(&s["kv"]),
            cell(&s["ending"]),
        ]);
    }
    out.push_str(&t.render());
    out
}

/// `GET /admin/v1/workers`.
pub fn workers(answer: &Value) -> String {
    let mut t = Table::new(&[
        "NAME",
        "ROLE",
        "ENGINE",
        "HEALTHY",
        "INDEX",
        "DRAINING",
        "IN_FLIGHT",
        "RUNNING",
        "WAITING",
        "KV_USAGE",
        "STORED",
        "URL",
    ]);
    for w in rows(answer, "workers") {
        let usage = w["load"]["kv_usage"]
            .as_f64()
            .map_or_else(|| "-".to_owned(), |u| format!("{:.1}%", u * 100.0));
        t.row(vec![
            cell(&w["id"]),
            cell(&w["role"]),
            cell(&w["engine"]),
            cell(&w["healthy"]),
            // How far the router's index of its cache can be trusted.
            cell(&w["index"]),
            cell(&w["draining"]),
            cell(&w["in_flight"]),
            cell(&w["load"]["running"]),
            cell(&w["load"]["waiting"]),
            usage,
            // Stored responses it holds (with a directory): what a drain leaves there.
            cell(&w["stored_responses"]),
            cell(&w["url"]),
        ]);
    }
    format!("policy: {}\n{}", cell(&answer["policy"]), t.render())
}

/// `POST|DELETE /admin/v1/workers/{name}/drain`.
pub fn drain(answer: &Value) -> String {
    let now = if answer["draining"] == Value::Bool(true) {
        "draining"
    } else {
        "not draining"
    };
    let before = if answer["was_draining"] == Value::Bool(true) {
        "draining"
    } else {
        "not draining"
    };
    format!("{}: {now} (was {before})", cell(&answer["worker"]))
}

/// `GET /admin/v1/cluster`: a node's own status, or (from routers) every node's and
/// each router's replica.
pub fn cluster(answer: &Value) -> String {
    if answer.get("nodes").is_none() {
        return fields(answer);
    }
    let mut nodes = Table::new(&[
        "NODE", "URL", "STATE", "LEADER", "TERM", "APPLIED", "VOTERS", "RELEASE", "VERSION",
    ]);
    for n in rows(answer, "nodes") {
        match n.get("error") {
            Some(e) => nodes.row(vec![
                "-".into(),
                cell(&n["url"]),
                format!("unreachable: {}", cell(e)),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ]),
            None => nodes.row(vec![
                cell(&n["id"]),
                cell(&n["url"]),
                cell(&n["state"]),
                cell(&n["leader"]),
                cell(&n["term"]),
                cell(&n["last_applied"]),
                cell(&n["members"]),
                cell(&n["release"]),
                cell(&n["version"]["runs"]),
            ]),
        }
    }
    let mut routers = Table::new(&[
        "ROUTER",
        "APPLIED",
        "CONNECTED",
        "LAST_ENTRY_AGE_MS",
        "RECONNECTS",
    ]);
    for r in rows(answer, "routers") {
        let replica = &r["replica"];
        routers.row(vec![
            cell(&r["router"]),
            cell(&replica["applied"]),
            cell(&replica["connected"]),
            cell(&replica["last_entry_age_ms"]),
            cell(&replica["reconnects"]),
        ]);
    }
    format!("{}\n{}", nodes.render(), routers.render())
}

/// Directory writes: the committed outcome.
pub fn write(answer: &Value) -> String {
    if answer.is_null() {
        return "done".to_owned();
    }
    format!(
        "{} (log index {})",
        cell(&answer["outcome"]),
        cell(&answer["log_index"])
    )
}

/// `POST /admin/v1/plan/explain`: the choice, then every candidate cheapest first.
pub fn explain(answer: &Value) -> String {
    let names: Vec<(u64, String)> = rows(answer, "workers")
        .iter()
        .filter_map(|w| Some((w["id"].as_u64()?, cell(&w["name"]))))
        .collect();
    let name = |v: &Value| {
        v.as_u64()
            .and_then(|id| names.iter().find(|(i, _)| *i == id))
            .map_or_else(|| cell(v), |(_, n)| n.clone())
    };
    let chosen = &answer["chosen"];
    let mut out = format!(
        "class:   {}\naction:  {} (compute on {}, decode on {})\nreason:  {}\n\n",
        cell(&answer["class"]),
        cell(&answer["action"]),
        name(&chosen["compute_on"]),
        name(&chosen["decode_on"]),
        cell(&answer["reason"]),
    );
    let mut t = Table::new(&[
        "",
        "ACTION",
        "COMPUTE_ON",
        "DECODE_ON",
        "SOURCE",
        "COMPUTE_TOK",
        "REUSED_TOK",
        "TOTAL_S",
        "QUEUE_S",
        "COMPUTE_S",
        "NETWORK_S",
        "RESTORE_S",
        "HBM_MB",
        "INTERF_S",
        "DECODE_S",
    ]);
    let secs = |v: &Value| {
        v.as_f64()
            .map_or_else(|| "-".to_owned(), |x| format!("{x:.4}"))
    };
    for c in rows(answer, "candidates") {
        let cost = &c["cost"];
        let is_chosen = c["action"] == chosen["action"]
            && c["compute_on"] == chosen["compute_on"]
            && c["decode_on"] == chosen["decode_on"];
        t.row(vec![
            if is_chosen { "*" } else { "" }.to_owned(),
            cell(&c["action"]),
            name(&c["compute_on"]),
            name(&c["decode_on"]),
            if c["source"].is_null() {
                "-".to_owned()
            } else {
                name(&c["source"])
            },
            cell(&c["compute_tokens"]),
            cell(&c["reused_tokens"]),
            secs(&cost["total"]),
            secs(&cost["queue_s"]),
            secs(&cost["compute_s"]),
            secs(&cost["network_s"]),
            secs(&cost["restore_s"]),
            cost["hbm_bytes"]
                .as_f64()
                .map_or_else(|| "-".to_owned(), |b| format!("{:.1}", b / 1e6)),
            secs(&cost["interference_s"]),
            secs(&cost["decode_s"]),
        ]);
    }
    out.push_str(&t.render());
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn workers_show_load_as_percent_and_missing_load_as_dash() {
        let answer = json!({"policy": "ownerserve", "workers": [
            {"id": "decode-0", "role": "decode", "engine": "sim", "healthy": true,
             "index": "degraded", "draining": false, "in_flight": 0, "url": "http://127.0.0.1:1",
             "load": {"running": 1.0, "waiting": 0.0, "kv_usage": 0.125}},
            {"id": "prefill-0", "role": "prefill", "engine": "sim", "healthy": false,
             "draining": true, "in_flight": 2, "url": "http://127.0.0.1:2", "load": null},
        ]});
        let text = workers(&answer);
        assert!(text.starts_with("policy: ownerserve\nNAME"), "{text}");
        assert!(text.contains("12.5%"), "{text}");
        assert!(text.contains("degraded"), "{text}");
        let prefill = text
            .lines()
            .find(|l| l.starts_with("prefill-0"))
            .expect("row");
        assert!(
            prefill.contains("no") && prefill.contains("yes"),
            "{prefill}"
        );
    }

    #[test]
    fn lifecycle_shows_what_admission_counts_and_each_sessions_course() {
        let answer = json!({"lifecycle": true, "admission": true, "count": 2,
            "live_tokens": {"tiny": 9144}, "admitted_tokens": {},
            "sessions": [
                {"session": "a", "owner": "e0", "model": "tiny", "tokens": 9144,
                 "in_flight": 0, "idle_ms": 1500, "hold": "keep", "kv": "hbm",
                 "ending": "tool_call"},
                {"session": "b", "owner": "e0", "model": "tiny", "tokens": 800,
                 "in_flight": 1, "idle_ms": null, "hold": null, "kv": "hbm"}]});
        let text = lifecycle(&answer);
        assert!(
            text.starts_with("lifecycle: yes, admission: yes, sessions: 2\n"),
            "{text}"
        );
        assert!(
            text.contains("live tokens: tiny 9144\nadmitted, not started: -"),
            "{text}"
        );
        let a = text.lines().find(|l| l.starts_with("a ")).expect("row a");
        assert!(
            a.contains("keep") && a.contains("1500") && a.contains("tool_call"),
            "{a}"
        );
    }

    #[test]
    fn explain_marks_the_chosen_candidate_and_names_workers() {
        let c = |action: &str, on: u64| {
            json!({"action": action, "compute_on": on, "decode_on": on,
            "source": null, "compute_tokens": 10, "reused_tokens": 0,
            "cost": {"total": 0.5, "queue_s": 0.0, "compute_s": 0.5, "network_s": 0.0,
                     "restore_s": 0.0, "hbm_bytes": 2e6, "interference_s": 0.0}})
        };
        let answer = json!({"class": "new_short_prompt", "action": "colocate",
            "reason": "cheapest", "chosen": c("colocate", 1),
            "workers": [{"id": 0, "name": "p"}, {"id": 1, "name": "d"}],
            "candidates": [c("colocate", 1), c("colocate", 0)]});
        let text = explain(&answer);
        assert!(text.contains("compute on d, decode on d"), "{text}");
        let starred: Vec<&str> = text.lines().filter(|l| l.starts_with('*')).collect();
        assert_eq!(starred.len(), 1, "{text}");
        assert!(starred[0].contains("colocate  d"), "{text}");
    }
}
