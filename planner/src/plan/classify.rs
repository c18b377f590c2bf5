//! What kind of agent step a request is (MISSION.md, "Step classes"). The class does not
//! pick the action — the costs do — but it is reported with every plan and explains the
//! typical choice.

use serde::Serialize;

/// The kinds of agent step the planner recognises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepClass {
    /// A session's first request with a long prompt (typically remote prefill).
    NewLongPrefix,
    /// A session's first request with a short prompt.
    NewShortPrompt,
    /// A few new tokens on top of the session's context (typically colocate).
    SmallIncrement,
    /// Many new tokens on top of the context, e.g. a tool's output (remote or hybrid).
    LongToolOutput,
    /// No new prompt beyond what the owner holds: keep decoding there.
    DecodeContinuation,
    /// Several samples or branches share the prefix (`n > 1` or a fork header).
    ForkedRollout,
    /// The session's decode state is gone (lease lapsed, owner lost): fetch or recompute.
    ColdResume,
}

impl StepClass {
    /// Every class, for metrics that list them all.
    pub const ALL: [StepClass; 7] = [
        StepClass::NewLongPrefix,
        StepClass::NewShortPrompt,
        StepClass::SmallIncrement,
        StepClass::LongToolOutput,
        StepClass::DecodeContinuation,
        StepClass::ForkedRollout,
        StepClass::ColdResume,
    ];

    /// The class's name in plans and metrics.
    pub fn name(self) -> &'static str {
        match self {
            StepClass::NewLongPrefix => "new_long_prefix",
            StepClass::NewShortPrompt => "new_short_prompt",
            StepClass::SmallIncrement => "small_increment",
            StepClass::LongToolOutput => "long_tool_output",
            StepClass::DecodeContinuation => "decode_continuation",
            StepClass::ForkedRollout => "forked_rollout",
            StepClass::ColdResume => "cold_resume",
        }
    }
}

/// Thresholds between the classes, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ClassThresholds {
    /// A first prompt at least this long is a long prefix.
    pub long_prefix: u64,
    /// At least this many new tokens in a turn make a long tool output.
    pub long_delta: u64,
    /// At most this many new tokens continue decoding.
    pub continuation: u64,
}

impl Default for ClassThresholds {
    fn default() -> Self {
        Self {
            long_prefix: 4_096,
            long_delta: 2_048,
            continuation: 16,
        }
    }
}

/// What the router knows about a step when it classifies it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepFacts {
    pub prompt_tokens: u64,
    /// Whether the directory knows the session (it has a decode owner).
    pub session_known: bool,
    /// Leading prompt tokens the session's decode owner holds (KV index match).
    pub owner_cached_tokens: u64,
    /// Choices requested (`n`).
    pub samples: u32,
    /// The client marked the request as a fork of the session.
    pub fork: bool,
}

/// Classifies a step.
pub fn classify(f: &StepFacts, t: &ClassThresholds) -> StepClass {
    if f.samples > 1 || f.fork {
        return StepClass::ForkedRollout;
    }
    if !f.session_known {
        return if f.prompt_tokens >= t.long_prefix {
            StepClass::NewLongPrefix
        } else {
            StepClass::NewShortPrompt
        };
    }
    if f.owner_cached_tokens == 0 && f.prompt_tokens > t.continuation {
        return StepClass::ColdResume;
    }
    // Against what the owner holds, so a client that trims its history is measured by
    // what actually has to be computed.
    let delta = f.prompt_tokens.saturating_sub(f.owner_cached_tokens);
    if delta <= t.continuation {
        StepClass::DecodeContinuation
    } else if delta >= t.long_delta {
        StepClass::LongToolOutput
    } else {
        StepClass::SmallIncrement
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_is_recognised() {
        let t = ClassThresholds::default();
        let new = |prompt| StepFacts {
            prompt_tokens: prompt,
            samples: 1,
            ..StepFacts::default()
        };
        let turn = |prompt, held| StepFacts {
            prompt_tokens: prompt,
            session_known: true,
            owner_cached_tokens: held,
            samples: 1,
            fork: false,
        };
        let cases = [
            (new(30_000), StepClass::NewLongPrefix),
            (new(500), StepClass::NewShortPrompt),
            (turn(30_300, 30_000), StepClass::SmallIncrement),
            (turn(40_000, 30_000), StepClass::LongToolOutput),
            (turn(30_010, 30_000), StepClass::DecodeContinuation),
            (
                StepFacts {
                    samples: 4,
                    ..turn(30_300, 30_000)
                },
                StepClass::ForkedRollout,
            ),
            (
                StepFacts {
                    fork: true,
                    ..new(500)
                },
                StepClass::ForkedRollout,
            ),
            (turn(30_300, 0), StepClass::ColdResume),
            // A trimmed history: the owner holds only the first 2,000 tokens of it.
            (turn(20_000, 2_000), StepClass::LongToolOutput),
        ];
        for (facts, class) in cases {
            assert_eq!(classify(&facts, &t), class, "{facts:?}");
        }
    }
}
