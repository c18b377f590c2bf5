//! Admission by class and tenant: requests admitted per class and how long they waited
//! for a slot, requests refused per class and reason, and tenants' budgets spent and
//! refused.

use std::time::Duration;

use prometheus::{HistogramVec, IntCounterVec, Registry};

use ownerserve_edge::exposition::{counter_vec, histogram_vec, LATENCY_BUCKETS};

use crate::proxy::admission::Class;

/// The admission counters.
#[derive(Debug, Clone)]
pub struct AdmissionMetrics {
    admitted: IntCounterVec,
    waited: HistogramVec,
    refused: IntCounterVec,
    tenant: IntCounterVec,
    tenant_tokens: IntCounterVec,
}

impl AdmissionMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = Self {
            admitted: counter_vec(
                registry,
                "ownerserve_admission_admitted_total",
                "Requests given a slot, by admission class (interactive, batch, background).",
                &["class"],
            )?,
            waited: histogram_vec(
                registry,
                "ownerserve_admission_wait_seconds",
                "Time an admitted request waited in its model's queue for a slot, by class.",
                &["class"],
                LATENCY_BUCKETS,
            )?,
            refused: counter_vec(
                registry,
                "ownerserve_admission_refused_total",
                "Requests refused by admission, by class and reason (queue_full: a 429, the queue held only requests ranked at or above it, or it was displaced by one ranked above; queue_timeout: a 503 after its class's queue deadline).",
                &["class", "reason"],
            )?,
            tenant: counter_vec(
                registry,
                "ownerserve_tenant_requests_total",
                "Requests of a configured tenant, by outcome (admitted; over_tokens: its fleet-wide tokens per minute spent; over_sessions: its fleet-wide concurrent sessions reached; budget_unavailable: the directory did not answer).",
                &["tenant", "outcome"],
            )?,
            tenant_tokens: counter_vec(
                registry,
                "ownerserve_tenant_tokens_total",
                "Tokens a tenant's admitted requests were charged (prompt, plus max_tokens per choice), by tenant.",
                &["tenant"],
            )?,
        };
        for c in Class::ALL {
            m.admitted.with_label_values(&[c.name()]);
            for reason in ["queue_full", "queue_timeout"] {
                m.refused.with_label_values(&[c.name(), reason]);
            }
        }
        Ok(m)
    }

    pub fn admitted(&self, class: Class, waited: Duration) {
        self.admitted.with_label_values(&[class.name()]).inc();
        self.waited
            .with_label_values(&[class.name()])
            .observe(waited.as_secs_f64());
    }

    pub fn refused(&self, class: Class, reason: &str) {
        self.refused
            .with_label_values(&[class.name(), reason])
            .inc();
    }

    /// Counts a tenant's request by outcome.
    pub fn tenant(&self, tenant: &str, outcome: &str) {
        self.tenant.with_label_values(&[tenant, outcome]).inc();
    }

    /// Counts the tokens a tenant's admitted request was charged.
    pub fn tenant_tokens(&self, tenant: &str, tokens: u64) {
        self.tenant_tokens
            .with_label_values(&[tenant])
            .inc_by(tokens);
    }
}
