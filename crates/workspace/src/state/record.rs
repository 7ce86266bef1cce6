//! The record types of protected state: a record's type, status and extras, one stored
//! version ([`Record`]), a record to write ([`Draft`]), what a write did ([`WriteOutcome`]),
//! and a record's one-line rendering in a context.

use crate::route::Writer;
use serde::{Deserialize, Serialize};

/// A record's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordType {
    /// What the work is for.
    Goal,
    /// A hard rule.
    Constraint,
    /// Something the agent may do.
    Permission,
    /// When the work counts as done.
    AcceptanceCriterion,
    /// Something still unresolved.
    OpenIssue,
    /// A decision, with rationale and alternatives.
    Decision,
    /// Something completed.
    Done,
    /// A reference to an event (not a copy of it).
    EvidenceRef,
}

impl RecordType {
    /// Every type, in the order state is rendered.
    pub const ALL: [RecordType; 8] = [
        Self::Goal,
        Self::Constraint,
        Self::Permission,
        Self::AcceptanceCriterion,
        Self::OpenIssue,
        Self::Decision,
        Self::Done,
        Self::EvidenceRef,
    ];
    /// The type's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Goal => "goal",
            Self::Constraint => "constraint",
            Self::Permission => "permission",
            Self::AcceptanceCriterion => "acceptance_criterion",
            Self::OpenIssue => "open_issue",
            Self::Decision => "decision",
            Self::Done => "done",
            Self::EvidenceRef => "evidence_ref",
        }
    }
    /// Parses a type name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }
    /// Types only the user or the owner may write.
    pub fn needs_authority(self) -> bool {
        matches!(
            self,
            Self::Goal | Self::Constraint | Self::Permission | Self::AcceptanceCriterion
        )
    }
    /// Types an assembled context always loads (it fails rather than drop them).
    pub fn always_loaded(self) -> bool {
        self.needs_authority() || self == Self::OpenIssue
    }
}

/// A record's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// In force.
    Valid,
    /// Superseded by a later version (kept for the audit history).
    Replaced,
    /// A candidate waiting for an authorized confirm event.
    PendingConfirmation,
    /// Lost a merge conflict, or was dropped by review.
    Rejected,
}

impl Status {
    /// The status's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Valid => "valid",
            Self::Replaced => "replaced",
            Self::PendingConfirmation => "pending_confirmation",
            Self::Rejected => "rejected",
        }
    }
    /// Parses a status name.
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Valid,
            Self::Replaced,
            Self::PendingConfirmation,
            Self::Rejected,
        ]
        .into_iter()
        .find(|t| t.as_str() == s)
    }
}

/// Per-type extras.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Detail {
    /// A decision's rationale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rationale: Option<String>,
    /// A decision's alternatives.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alternatives: Vec<String>,
    /// The event that confirmed a candidate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmed_by: Option<i64>,
    /// Why a record was rejected or changed (merge rule, judge score).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A stored record (one version).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Record {
    /// Row id (one per version).
    pub id: i64,
    /// Session.
    pub session: String,
    /// Branch (`main` or a branch name).
    pub branch: String,
    /// The field this record is a version of.
    pub key: String,
    /// Type.
    #[serde(rename = "type")]
    pub kind: RecordType,
    /// Canonical value, verbatim from the source.
    pub value: String,
    /// Source event ids.
    pub sources: Vec<i64>,
    /// Who wrote the source.
    pub writer: Writer,
    /// When (ms since the epoch).
    pub time_ms: i64,
    /// Scope (`session` or a narrower one).
    pub scope: String,
    /// Version of `key`, from 1.
    pub version: i64,
    /// Status.
    pub status: Status,
    /// Extras.
    pub detail: Detail,
    /// Whether a source event was deleted.
    pub source_deleted: bool,
    /// Session-wide write counter at this write (orders writes, detects moved branch bases).
    pub stamp: i64,
}

/// A record to write.
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    /// Type.
    pub kind: RecordType,
    /// Verbatim value.
    pub value: String,
    /// Field key; derived from type and value when absent (`goal` for goals).
    pub key: Option<String>,
    /// Scope; `session` when absent.
    pub scope: Option<String>,
    /// Extras.
    pub detail: Detail,
}

impl Draft {
    /// A draft of `kind` with `value`.
    pub fn new(kind: RecordType, value: &str) -> Self {
        Self {
            kind,
            value: value.to_string(),
            key: None,
            scope: None,
            detail: Detail::default(),
        }
    }
    /// Sets the key.
    pub fn key(mut self, key: &str) -> Self {
        self.key = Some(key.to_string());
        self
    }
    /// The field key.
    pub fn field_key(&self) -> String {
        if let Some(k) = &self.key {
            return k.clone();
        }
        if self.kind == RecordType::Goal {
            return "goal".into();
        }
        let words: Vec<String> = self
            .value
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .take(10)
            .map(str::to_lowercase)
            .collect();
        format!("{}:{}", self.kind.as_str(), words.join("-"))
    }
}

/// What a write did.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteOutcome {
    /// A new valid version.
    Written(Record),
    /// Kept as a candidate waiting for confirmation.
    Pending(Record),
    /// The same value is already in force.
    Unchanged(Record),
}

impl WriteOutcome {
    /// The record written or found.
    pub fn record(&self) -> &Record {
        match self {
            Self::Written(r) | Self::Pending(r) | Self::Unchanged(r) => r,
        }
    }
}

/// Longest value of an evidence reference: it points at an event, it does not copy it.
pub const EVIDENCE_REF_MAX_CHARS: usize = 160;

/// Renders one record as a state line: `- [type vN · writer · event 3] value`.
pub fn render(r: &Record) -> String {
    let srcs: Vec<String> = r.sources.iter().map(|s| s.to_string()).collect();
    let mut line = format!(
        "- [{} v{} · {} · event {}{}] {}",
        r.kind.as_str(),
        r.version,
        r.writer.as_str(),
        srcs.join(","),
        if r.source_deleted {
            " (source deleted)"
        } else {
            ""
        },
        r.value
    );
    if let Some(why) = &r.detail.rationale {
        line.push_str(&format!(" — because {why}"));
    }
    if !r.detail.alternatives.is_empty() {
        line.push_str(&format!(" — over: {}", r.detail.alternatives.join("; ")));
    }
    line
}
