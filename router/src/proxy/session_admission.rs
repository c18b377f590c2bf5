//! Session admission (`[router.sessions] admission`): a new session's first step waits
//! while the fleet's KV cannot hold its prompt beside the contexts of the sessions the
//! router tracks (`ownerserve_planner::lifecycle::admits`; why in its module doc). The
//! simulator holds first steps the same way (`eval/src/sim/run/admission.rs`).
//!
//! A first step is one of a session the router does not track whose conversation has no
//! assistant turn yet: a session back after its lease lapsed is not held again. Steps
//! without a session, token-id prompts and every later step go at once. A held step is
//! checked every `POLL`, and goes anyway after `admission_max_wait_ms`: admission orders
//! sessions, it never refuses one.

use std::time::Duration;

use tokio::time::Instant;

use ownerserve_planner::lifecycle::admission_room;
use ownerserve_shim::openai::ParsedRequest;

use super::admission::Ticket;
use super::identity::Identity;
use crate::ownership::sessions::now_ms;
use crate::server::state::AppState;

/// How often a held first step checks for room.
const POLL: Duration = Duration::from_millis(100);

/// Waits, if session admission is on and this is a new session's first step, until the
/// fleet's KV has room for it or its longest wait passed. A step that must wait drops its
/// request slot (`ticket`) first: held first steps never keep returning steps out.
pub(crate) async fn wait_for_room(
    st: &AppState,
    parsed: &ParsedRequest<'_>,
    id: &Identity<'_>,
    ticket: &mut Option<Ticket>,
) {
    let Some(max_wait) = st.cfg.sessions.admission else {
        return;
    };
    let Some(session) = id.tracked() else {
        return;
    };
    if !first_turn(parsed) || st.sessions.tracks(session) {
        return;
    }
    let tokens = u64::from(id.prompt_tokens());
    let deadline = Instant::now() + max_wait;
    let mut held = false;
    loop {
        // Without a known capacity (no engine reported one yet) nothing is held.
        let room = st
            .registry
            .healthy_kv_capacity(&parsed.model)
            .is_none_or(|capacity| {
                let room = admission_room(capacity, st.cfg.sessions.admission_headroom);
                st.sessions
                    .admit(session, &parsed.model, tokens, room, now_ms())
            });
        if room {
            st.metrics
                .lifecycle
                .admission(if held { "held" } else { "admitted" });
            return;
        }
        if Instant::now() >= deadline {
            st.metrics.lifecycle.admission("timed_out");
            return;
        }
        held = true;
        ticket.take();
        tokio::time::sleep(POLL).await;
    }
}

/// Whether the chat conversation has no assistant turn yet (a token-id or text prompt
/// has no turns: never held).
fn first_turn(parsed: &ParsedRequest<'_>) -> bool {
    parsed.template.messages_json.is_some() && !has_answer(parsed)
}

/// Whether the chat conversation already has an assistant turn: an agent's step back from
/// its tool (admission serves it ahead of new conversations of its class).
pub(crate) fn has_answer(parsed: &ParsedRequest<'_>) -> bool {
    parsed
        .template
        .messages_json
        .as_deref()
        .is_some_and(|m| m.contains("\"assistant\""))
}
