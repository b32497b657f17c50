//! Agent trajectories, as an agent harness writes them: what cairn reads
//! of one to judge an attempt by what happened, not by what the command
//! says happened.
//!
//! A trajectory is JSON: mini-swe-agent's (`{"info": {...}, "messages":
//! [...], "trajectory_format": "mini-swe-agent-1.1"}`), or any object with
//! a `messages` array of chat messages, or that array alone. Of it cairn
//! takes the model's turns (messages whose `role` is `assistant`), the
//! token counts of the model's responses (each turn's `usage`, or
//! mini-swe-agent's `extra.response.usage`), and, when the harness says
//! them, how it ended (`info.exit_status`), how many calls it made, the
//! limits it applied and its version.
//!
//! An attempt whose trajectory has no model turn, or whose responses hold
//! no completion token, is empty: the model produced nothing, so whatever
//! the grader says of the repository, it is never a pass (see
//! [`Trajectory::empty`]).

use serde_json::{Value, json};

/// What cairn read of one trajectory.
#[derive(Debug, Clone, PartialEq)]
pub struct Trajectory {
    /// Its `trajectory_format`, when it names one.
    pub format: Option<String>,
    /// How the harness says the run ended (`info.exit_status`).
    pub exit_status: Option<String>,
    /// Messages with the role `assistant`.
    pub model_turns: u64,
    /// Completion tokens summed over the model's turns that report them.
    pub completion_tokens: u64,
    /// Prompt tokens summed likewise.
    pub prompt_tokens: u64,
    /// Model turns that report no token counts.
    pub turns_without_usage: u64,
    /// Calls the harness made to the model (`info.model_stats.api_calls`),
    /// answered or not.
    pub model_calls: Option<u64>,
    /// The limits the harness applied (`info.config.agent`).
    pub step_limit: Option<u64>,
    pub cost_limit: Option<f64>,
    pub wall_time_limit_seconds: Option<f64>,
    /// The time limit of each command the agent ran
    /// (`info.config.environment.timeout`).
    pub command_timeout_seconds: Option<f64>,
    /// The harness's version (`info.mini_version`).
    pub harness_version: Option<String>,
}

impl Trajectory {
    /// Reads a trajectory from its bytes; the error says what is wrong.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| format!("is not JSON: {e}"))?;
        let messages = match &value {
            Value::Array(messages) => messages,
            Value::Object(map) => match map.get("messages") {
                Some(Value::Array(messages)) => messages,
                Some(_) => return Err("has `messages` that is not an array".to_owned()),
                None => return Err("has no `messages`".to_owned()),
            },
            _ => return Err("is neither an object nor an array of messages".to_owned()),
        };
        // The limits the harness applied, from its config.
        let agent = |name: &str| value.pointer("/info/config/agent")?.get(name);
        let mut trajectory = Trajectory {
            format: text(value.get("trajectory_format")),
            exit_status: text(value.pointer("/info/exit_status")),
            model_turns: 0,
            completion_tokens: 0,
            prompt_tokens: 0,
            turns_without_usage: 0,
            model_calls: value
                .pointer("/info/model_stats/api_calls")
                .and_then(Value::as_u64),
            step_limit: agent("step_limit").and_then(Value::as_u64),
            cost_limit: agent("cost_limit").and_then(Value::as_f64),
            wall_time_limit_seconds: agent("wall_time_limit_seconds").and_then(Value::as_f64),
            command_timeout_seconds: value
                .pointer("/info/config/environment/timeout")
                .and_then(Value::as_f64),
            harness_version: text(value.pointer("/info/mini_version")),
        };
        for message in messages {
            if message.get("role").and_then(Value::as_str) != Some("assistant") {
                continue;
            }
            trajectory.model_turns += 1;
            let usage = message
                .pointer("/extra/response/usage")
                .or_else(|| message.get("usage"))
                .filter(|u| u.is_object());
            let count = |name: &str| usage.and_then(|u| u.get(name)).and_then(Value::as_u64);
            match count("completion_tokens") {
                Some(tokens) => {
                    trajectory.completion_tokens += tokens;
                    trajectory.prompt_tokens += count("prompt_tokens").unwrap_or(0);
                }
                None => trajectory.turns_without_usage += 1,
            }
        }
        Ok(trajectory)
    }

    /// Why the trajectory is empty, if it is: no model turn, or no
    /// completion token in any response. Token counts missing from every
    /// turn cannot tell an empty answer from a full one, so they count as
    /// empty too: the check fails closed.
    pub fn empty(&self) -> Option<String> {
        if self.model_turns == 0 {
            Some("has no model turn".to_owned())
        } else if self.turns_without_usage == self.model_turns {
            Some(format!(
                "reports no token counts for any of its {} model turns, so an empty answer cannot be told from a real one",
                self.model_turns
            ))
        } else if self.completion_tokens == 0 {
            Some(format!(
                "holds 0 completion tokens over {} model turns",
                self.model_turns
            ))
        } else {
            None
        }
    }

    /// What is recorded with the item's result, under `trajectory`.
    pub fn to_json(&self) -> Value {
        json!({
            "format": self.format,
            "exit_status": self.exit_status,
            "model_turns": self.model_turns,
            "completion_tokens": self.completion_tokens,
            "prompt_tokens": self.prompt_tokens,
            "turns_without_usage": self.turns_without_usage,
            "model_calls": self.model_calls,
            "step_limit": self.step_limit,
            "cost_limit": self.cost_limit,
            "wall_time_limit_seconds": self.wall_time_limit_seconds,
            "command_timeout_seconds": self.command_timeout_seconds,
            "harness_version": self.harness_version,
        })
    }
}

fn text(value: Option<&Value>) -> Option<String> {
    value.and_then(Value::as_str).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(tokens: Option<u64>) -> Value {
        match tokens {
            Some(n) => json!({"role": "assistant", "content": "x",
                "extra": {"response": {"usage": {"completion_tokens": n, "prompt_tokens": 10}}}}),
            None => json!({"role": "assistant", "content": "x"}),
        }
    }

    fn read(value: Value) -> Trajectory {
        Trajectory::parse(value.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn mini_swe_agent_trajectories_are_read_with_their_limits() {
        let t = read(json!({
            "trajectory_format": "mini-swe-agent-1.1",
            "info": {"exit_status": "Submitted", "mini_version": "2.4.6",
                     "model_stats": {"api_calls": 3},
                     "config": {"agent": {"step_limit": 200, "cost_limit": 0.0,
                                          "wall_time_limit_seconds": 1800},
                                "environment": {"timeout": 120}}},
            "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                         turn(Some(5)), {"role": "user", "content": "o"}, turn(Some(7))],
        }));
        assert_eq!(t.model_turns, 2);
        assert_eq!(t.completion_tokens, 12);
        assert_eq!(t.prompt_tokens, 20);
        assert_eq!(t.model_calls, Some(3));
        assert_eq!(t.step_limit, Some(200));
        assert_eq!(t.wall_time_limit_seconds, Some(1800.0));
        assert_eq!(t.command_timeout_seconds, Some(120.0));
        assert_eq!(t.exit_status.as_deref(), Some("Submitted"));
        assert_eq!(t.harness_version.as_deref(), Some("2.4.6"));
        assert_eq!(t.empty(), None);
    }

    #[test]
    fn no_turn_zero_tokens_and_no_counts_are_empty() {
        let none = read(json!({"messages": [{"role": "user", "content": "u"}]}));
        assert_eq!(none.empty().as_deref(), Some("has no model turn"));
        let zero = read(json!([turn(Some(0)), turn(Some(0))]));
        assert!(
            zero.empty().unwrap().contains("0 completion tokens"),
            "{zero:?}"
        );
        let uncounted = read(json!([turn(None)]));
        assert!(uncounted.empty().unwrap().contains("no token counts"));
        // One counted turn with tokens is enough.
        let some = read(json!([turn(None), turn(Some(3))]));
        assert_eq!(some.empty(), None);
        assert_eq!(some.turns_without_usage, 1);
    }

    #[test]
    fn what_is_not_a_trajectory_says_why() {
        assert!(Trajectory::parse(b"{").unwrap_err().contains("not JSON"));
        assert!(
            Trajectory::parse(b"{\"info\": {}}")
                .unwrap_err()
                .contains("no `messages`")
        );
        assert!(Trajectory::parse(b"3").unwrap_err().contains("neither"));
    }
}
