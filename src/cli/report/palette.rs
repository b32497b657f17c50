//! One colour per stage state, shared by `cairn dag --state` and the
//! report: the states a run records (`ran`, `fresh`, …) and those `status`
//! evaluates (`stale`, `never run`).

/// The fill colour of a stage in `state`.
pub fn fill(state: &str) -> &'static str {
    match state {
        "ran" => "#66bb6a",
        "fresh" => "#c8e6c9",
        "restored" => "#81d4fa",
        "remote" => "#4fc3f7",
        "stale" => "#ffcc80",
        "never run" => "#e0e0e0",
        "failed" => "#e57373",
        "partial" => "#fff176",
        "blocked" => "#bdbdbd",
        "stopped" => "#eeeeee",
        "interrupted" => "#ce93d8",
        _ => "#ffffff",
    }
}

/// The fill colour of an item outcome class: `ok` green, the infra and
/// error classes red and orange, verdicts in a fixed cycle.
pub fn class(class: &str) -> &'static str {
    const VERDICTS: [&str; 6] = [
        "#7986cb", "#ba68c8", "#4db6ac", "#a1887f", "#90a4ae", "#f06292",
    ];
    match class {
        "ok" => "#66bb6a",
        "infra" => "#ef5350",
        "error" => "#ffa726",
        "running" => "#bdbdbd",
        "abandoned" => "#9e9e9e",
        other => {
            let hash = other
                .bytes()
                .fold(0usize, |h, b| h.wrapping_mul(31) + b as usize);
            VERDICTS[hash % VERDICTS.len()]
        }
    }
}
