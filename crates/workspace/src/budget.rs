//! Context budgets: the window minus the reserved system+tools and question+answer tokens is
//! the history budget, split into the state, summary and evidence blocks by weight.

use crate::config::BudgetWeights;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};

/// What the caller's context window holds besides the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetSpec {
    /// The model's context window (tokens).
    pub window: usize,
    /// Reserved for the system prompt and tool definitions.
    pub system_tools: usize,
    /// Reserved for the question and the answer.
    pub question_answer: usize,
}

/// A history budget split into blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// Tokens for the history (the sum of the three blocks).
    pub history: usize,
    /// State block.
    pub state: usize,
    /// Summary block.
    pub summary: usize,
    /// Evidence block.
    pub evidence: usize,
}

/// Splits the history budget by weight; the rounding remainder goes to the first blocks.
pub fn plan(spec: BudgetSpec, w: &BudgetWeights) -> Result<Plan> {
    let reserved = spec.system_tools + spec.question_answer;
    if reserved >= spec.window {
        return Err(Error::Budget(format!(
            "the reserved tokens ({} system+tools + {} question+answer = {reserved}) leave nothing of the {}-token window",
            spec.system_tools, spec.question_answer, spec.window
        )));
    }
    let history = spec.window - reserved;
    let total = (w.state + w.summary + w.evidence) as usize;
    if total == 0 {
        return Err(Error::Budget("the block weights sum to 0".into()));
    }
    let mut blocks = [w.state, w.summary, w.evidence].map(|x| history * x as usize / total);
    let mut rest = history - blocks.iter().sum::<usize>();
    for (b, wt) in blocks.iter_mut().zip([w.state, w.summary, w.evidence]) {
        if rest > 0 && wt > 0 {
            *b += 1;
            rest -= 1;
        }
    }
    Ok(Plan {
        history,
        state: blocks[0],
        summary: blocks[1],
        evidence: blocks[2],
    })
}
