//! Admission classes: `interactive`, `batch` and `background`, each with its own queue
//! deadline and share of a model's slots. A request's class is what it asks for (the
//! `x-ownerserve-class` header, else the body's vLLM `priority` or OpenAI `service_tier`),
//! never above its API key's class; without either, its key's class or the default one.

use std::time::Duration;

use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};

use ownerserve_shim::openai::{ParsedRequest, RequestError};

/// The request header naming a request's class.
pub const CLASS_HEADER: &str = "x-ownerserve-class";

/// An admission class, first served first (`Ord`: interactive < batch < background).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// A person or an agent waiting on the answer.
    #[default]
    Interactive,
    /// Work that can wait seconds to a minute (evaluations, offline agents).
    Batch,
    /// Work that takes what is left and is shed first.
    Background,
}

impl Class {
    pub const ALL: [Class; 3] = [Class::Interactive, Class::Batch, Class::Background];

    pub fn name(self) -> &'static str {
        match self {
            Class::Interactive => "interactive",
            Class::Batch => "batch",
            Class::Background => "background",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }

    fn parse(s: &str) -> Option<Class> {
        Class::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(s.trim()))
    }

    /// The engine priority rank of a step of this class (lower runs sooner, vLLM's
    /// convention): a returning agent step ahead of a new prompt of its class, every
    /// class behind the one above it.
    pub fn engine_rank(self, returning: bool) -> i8 {
        2 * self as i8 - i8::from(returning)
    }
}

/// One class's queue deadline and share.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClassSettings {
    /// Longest a request of the class waits for a slot (then a 503 `queue_timeout`).
    pub queue_timeout: Duration,
    /// Fraction of a model's slots requests of the class and of the classes below it may
    /// hold together (at least one slot): the rest is what the classes above always find
    /// free.
    pub share: f64,
}

/// Every class's settings, and the class of a request that names none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Classes {
    pub of: [ClassSettings; 3],
    pub default: Class,
}

impl Classes {
    pub fn get(&self, c: Class) -> ClassSettings {
        self.of[c.index()]
    }

    /// Slots of `capacity` class `c` may hold.
    pub fn limit(&self, c: Class, capacity: u32) -> u32 {
        ((self.get(c).share * f64::from(capacity)).floor() as u32).clamp(1, capacity.max(1))
    }
}

/// `[router.admission.classes.<name>]` as written: any key unset keeps its default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassTable {
    pub queue_timeout_ms: Option<u64>,
    pub share: Option<f64>,
}

/// `[router.admission.classes]` as written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassesTable {
    #[serde(default)]
    pub interactive: ClassTable,
    #[serde(default)]
    pub batch: ClassTable,
    #[serde(default)]
    pub background: ClassTable,
}

impl ClassesTable {
    /// The classes, with interactive's deadline defaulting to `queue_timeout`, batch's to
    /// a minute and background's to five; shares 1, 0.75, 0.5.
    pub fn resolve(&self, queue_timeout: Duration, default: Class) -> Result<Classes, String> {
        let defaults = [
            (queue_timeout, 1.0),
            (Duration::from_secs(60), 0.75),
            (Duration::from_secs(300), 0.5),
        ];
        let tables = [self.interactive, self.batch, self.background];
        let mut of = [ClassSettings {
            queue_timeout,
            share: 1.0,
        }; 3];
        for (i, (t, (timeout, share))) in tables.iter().zip(defaults).enumerate() {
            let share = t.share.unwrap_or(share);
            if !(share > 0.0 && share <= 1.0) {
                return Err(format!(
                    "{}.share must be in (0, 1], not {share}",
                    Class::ALL[i].name()
                ));
            }
            of[i] = ClassSettings {
                queue_timeout: t.queue_timeout_ms.map_or(timeout, Duration::from_millis),
                share,
            };
        }
        Ok(Classes { of, default })
    }
}

/// The class a client asked for: the header, else the body's `priority` (vLLM's: below 0
/// interactive, 1 batch, 2 or more background) or `service_tier` (`priority`:
/// interactive, `flex`: background). `None`: it named none.
pub fn asked(
    headers: &HeaderMap,
    parsed: &ParsedRequest<'_>,
) -> Result<Option<Class>, RequestError> {
    if let Some(v) = headers.get(CLASS_HEADER) {
        return v
            .to_str()
            .ok()
            .and_then(Class::parse)
            .map(Some)
            .ok_or_else(|| RequestError {
                message: format!(
                    "header `{CLASS_HEADER}` must be one of interactive, batch, background"
                ),
                param: Some(CLASS_HEADER.to_owned()),
                code: "invalid_value",
            });
    }
    let by_priority = parsed.priority.and_then(|p| match p {
        ..0 => Some(Class::Interactive),
        0 => None,
        1 => Some(Class::Batch),
        _ => Some(Class::Background),
    });
    let by_tier = parsed.service_tier.as_deref().and_then(|t| match t {
        "priority" => Some(Class::Interactive),
        "flex" => Some(Class::Background),
        _ => None,
    });
    Ok(by_priority.or(by_tier))
}

/// The class a request runs in: what it asked, never above `ceiling` (its API key's
/// class); what it did not ask, the key's class or `default`.
pub fn resolve(asked: Option<Class>, ceiling: Option<Class>, default: Class) -> Class {
    match (asked, ceiling) {
        (Some(a), Some(c)) => a.max(c),
        (Some(a), None) => a,
        (None, Some(c)) => c,
        (None, None) => default,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ownerserve_shim::openai::{parse, Endpoint};

    fn asked_of(header: Option<&str>, body: &str) -> Result<Option<Class>, RequestError> {
        let mut headers = HeaderMap::new();
        if let Some(h) = header {
            headers.insert(CLASS_HEADER, h.parse().unwrap());
        }
        let parsed = parse(body.as_bytes(), Endpoint::ChatCompletions).unwrap();
        asked(&headers, &parsed)
    }

    const PLAIN: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

    #[test]
    fn the_header_then_the_bodys_priority_or_service_tier_name_the_class() {
        assert_eq!(asked_of(None, PLAIN), Ok(None));
        assert_eq!(asked_of(Some("Batch"), PLAIN), Ok(Some(Class::Batch)));
        let with = |extra: &str| PLAIN.replacen('{', &format!("{{{extra},"), 1);
        assert_eq!(
            asked_of(None, &with(r#""priority":-5"#)),
            Ok(Some(Class::Interactive))
        );
        assert_eq!(asked_of(None, &with(r#""priority":0"#)), Ok(None));
        assert_eq!(
            asked_of(None, &with(r#""priority":1"#)),
            Ok(Some(Class::Batch))
        );
        assert_eq!(
            asked_of(None, &with(r#""priority":7"#)),
            Ok(Some(Class::Background))
        );
        assert_eq!(
            asked_of(None, &with(r#""service_tier":"flex""#)),
            Ok(Some(Class::Background))
        );
        // The header wins over the body.
        assert_eq!(
            asked_of(Some("interactive"), &with(r#""priority":3"#)),
            Ok(Some(Class::Interactive))
        );
        let bad = asked_of(Some("urgent"), PLAIN).unwrap_err();
        assert_eq!(bad.param.as_deref(), Some(CLASS_HEADER));
    }

    #[test]
    fn a_key_caps_the_class_and_fills_in_for_a_request_that_names_none() {
        use Class::*;
        assert_eq!(resolve(Some(Interactive), Some(Batch), Interactive), Batch);
        assert_eq!(
            resolve(Some(Background), Some(Batch), Interactive),
            Background
        );
        assert_eq!(resolve(None, Some(Background), Interactive), Background);
        assert_eq!(resolve(None, None, Batch), Batch);
        assert_eq!(resolve(Some(Interactive), None, Batch), Interactive);
    }

    #[test]
    fn ranks_put_returns_first_within_a_class_and_classes_in_order() {
        let ranks: Vec<i8> = Class::ALL
            .into_iter()
            .flat_map(|c| [c.engine_rank(true), c.engine_rank(false)])
            .collect();
        assert_eq!(ranks, [-1, 0, 1, 2, 3, 4]);
    }

    #[test]
    fn shares_give_each_class_at_least_one_slot_and_refuse_nonsense() {
        let t = ClassesTable::default();
        let c = t
            .resolve(Duration::from_secs(10), Class::Interactive)
            .unwrap();
        assert_eq!(c.limit(Class::Interactive, 8), 8);
        assert_eq!(c.limit(Class::Batch, 8), 6);
        assert_eq!(c.limit(Class::Background, 8), 4);
        assert_eq!(c.limit(Class::Background, 1), 1);
        assert_eq!(
            c.get(Class::Interactive).queue_timeout,
            Duration::from_secs(10)
        );
        let bad = ClassesTable {
            batch: ClassTable {
                share: Some(1.5),
                queue_timeout_ms: None,
            },
            ..t
        };
        assert!(bad.resolve(Duration::from_secs(1), Class::Batch).is_err());
    }
}
